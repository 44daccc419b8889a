"""Terminal rendering of the status object (rich). Pure formatting: no I/O beyond the console.

Every value from a run, a log or a host goes through `esc`: rich reads `[disk_full]` as markup and
would drop it. Run ids never wrap or shorten (a user copies them into `lab logs`/`lab stop`); the
free-text columns give way instead."""

from __future__ import annotations

import time

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from eaglelab import display
from eaglelab.figures import clock_duration as fmt_duration
from eaglelab.figures import engine_words
from eaglelab.fsutil import parse_iso
from eaglelab.lab_status import RunStatus, StageStatus, Status
from eaglelab.model import ACTIVE, FINAL, RunState, StageState

from .foresight.forecast import describe

STATE_STYLE = {StageState.COMPLETED: "green", StageState.RUNNING: "cyan", StageState.FAILED: "red",
               StageState.KILLED: "red", StageState.STALLED: "yellow", StageState.UNREACHABLE: "magenta",
               StageState.PENDING: "dim"}
SLURM_WAITING = ("PENDING", "REQUEUED", "CONFIGURING")  # Slurm's own words (squeue), not run states


def esc(v) -> str:
    """A value as literal text for rich markup ("" for None)."""
    return "" if v is None else escape(str(v))


def fmt_clock(iso: str | None) -> str:
    return display.clock(parse_iso(iso))


def _run(run: RunStatus | dict | None, now: float) -> RunStatus | None:
    """A run of the status object (tests pass its JSON: read once here)."""
    return run if isinstance(run, RunStatus) or run is None else RunStatus.from_json(run, now)


def _count(v: float | None) -> str:
    return "" if v is None else str(int(v)) if v == int(v) else str(v)


def progress_text(run: RunStatus | dict | None) -> str:
    rs = _run(run, time.time())
    if rs is None:
        return ""
    serving = serving_text(rs)
    if serving is not None:
        return serving
    p, log = rs.progress, rs.log
    parts = []
    fail = log.failure if log else None
    bar = f"{_count(p.n)}/{_count(p.total)} {p.unit}".rstrip() if p and p.total else ""
    if rs.run.state in FINAL:
        # An ended run shows its end, never the phase it was last in ("completed ▸ generating")
        end = fmt_clock(rs.run.ended_at)
        parts.append(f"ended {end}" if end else "ended")
        if bar and rs.run.state != RunState.COMPLETED:
            parts.append(f"at {bar}")
        if fail:
            parts.append(f"[{fail.get('reason')}]")
        return " ".join(parts)
    if log and log.phase:
        parts.append(log.phase)
    if bar:
        parts.append(bar)
    if fail:
        parts.append(f"[{fail.get('reason')}]")
    return " ".join(parts)


def slurm_queue_lines(st: Status) -> list[str]:
    """One line per latest run queued in Slurm: its reason, place and Slurm's start estimate."""
    out = []
    for s in st.stages:
        r = st.run(s.latest_run)
        sl = (r.run.slurm if r else None) or {}
        if sl.get("state") in SLURM_WAITING or (sl and s.state == StageState.PENDING):
            bits = [f"{s.name}: Slurm job {sl.get('job_id')} {sl.get('state') or RunState.PENDING}"
                    + (f" ({sl['reason']})" if sl.get("reason") else "")]
            if sl.get("queue_position"):
                bits.append(f"#{sl['queue_position']} in {sl.get('partition')}")
            if sl.get("start_estimate"):
                bits.append(f"Slurm expects it to start {fmt_clock(sl['start_estimate'])}")
            if sl.get("queued_s") is not None:
                bits.append(f"queued {fmt_duration(sl['queued_s'])}")
            out.append(", ".join(bits))
    return out


def serving_text(run: RunStatus | dict | None) -> str | None:
    """A ready service's figures (vLLM's latest periodic stats) in place of progress and ETA: its
    weight-loading bar is long finished and it has no end to predict. None for anything else."""
    rs = _run(run, time.time())
    ls = (rs.run.log_state if rs else None) or {}
    # a ready server whose log went quiet (no requests) is up, not stalled
    if rs is None or rs.run.kind != "service" or rs.run.state != RunState.RUNNING or not ls.get("ready"):
        return None
    metrics = ls.get("metrics") or {}

    def last(name: str):
        series = metrics.get(name) or []
        return series[-1][1] if series and len(series[-1]) >= 2 else None

    gen, prompt, reqs = (last(f"vllm/{k}") for k in ("gen_tokens_per_s", "prompt_tokens_per_s", "running_reqs"))
    parts = ["up, serving"] + ([f"{gen:.1f} tok/s generated"] if gen is not None else []) \
        + ([f"{prompt:.1f} prompt tok/s"] if prompt is not None else []) \
        + ([f"{reqs:.0f} requests running"] if reqs is not None else [])
    return " · ".join(parts) if len(parts) > 1 else "up, serving (no request stats logged yet)"


def eta_text(run: RunStatus | dict, now: float | None = None) -> str:
    now = time.time() if now is None else now
    rs = _run(run, now)
    if rs is None:
        return ""
    if serving_text(rs) is not None:
        return ""  # a ready service: nothing to wait for
    if rs.stalled or (rs.eta is not None and rs.eta.stalled):
        return display.STALLED_WORDS  # no progress (or a bar stuck past its estimate): any time would be made up
    fin = rs.eta.finish if rs.eta else None
    return "" if fin is None else display.eta_line(fin, now)


def stage_eta_text(stage: StageStatus | dict, run: RunStatus | dict | None, now: float | None = None) -> str:
    """A running run's ETA; for a stage still to run, its predicted finish and what it rests on
    (prior, learned, history: docs/interfaces.md "ETA")."""
    now = time.time() if now is None else now
    st = stage if isinstance(stage, StageStatus) else StageStatus.from_json(stage, now)
    rs = _run(run, now)
    if rs is not None and rs.run.state == RunState.RUNNING:
        return eta_text(rs, now)
    if rs is not None and rs.run.state in FINAL and st is not None and st.state == rs.run.state:
        return ""  # it ended: progress_text says when
    est = st.eta if st else None
    if st is None or st.state == StageState.COMPLETED or est is None or est.finish is None or est.source == "done":
        return ""
    fin = est.finish
    rng = f" ({display.clock(fin.low, now)}–{display.clock(fin.high, now)})" if fin.low and fin.high else ""
    return f"{display.clock(fin.at, now)}{rng} {est.source}"


def print_status(status: Status | dict, show_all: bool = False, console: Console | None = None) -> None:
    st = status if isinstance(status, Status) else Status.from_json(status, time.time())
    now = st.now
    console = console or Console()
    hosts = Table(title="hosts", title_justify="left")
    for col in ("host", "reach", "state"):
        hosts.add_column(col, no_wrap=True)
    hosts.add_column("GPUs", overflow="fold")
    for h in st.hosts:
        if h.reachable is None:
            state = "[dim]not contacted yet[/]"
        elif h.reachable:
            state = "ok"
        else:
            state = f"[magenta]unreachable since {esc(fmt_clock(h.unreachable_since))}[/]"
        gtxt = "none" if h.gpus is None else ", ".join(
            f"{g.utilization_pct or 0:.0f}% {(g.memory_used_mib or 0) / 1024:.0f}/"
            f"{(g.memory_total_mib or 0) / 1024:.0f}G" for g in h.gpus)
        hosts.add_row(esc(h.name), esc(h.reach), state, esc(gtxt))
    console.print(hosts)
    for h in st.hosts:
        for bad in h.bad_runs:  # skipped, never fatal: say which and why
            console.print(f"[yellow]{esc(h.name)}: skipped a run directory:[/] {esc(bad.get('error'))}",
                          soft_wrap=True)
    id_width = max([len(r.run.id) for r in st.runs] + [3])
    # Narrow terminals (an 80-column ssh window, a tmux split): three columns, two lines a stage:
    # stage over host, state over time, run id over progress and ETA. No cell wraps a word: the
    # state words stay whole and a long progress line is cut with an ellipsis, never wrapped.
    wide = console.width >= 2 * id_width + 70
    table = Table(title=f"pipeline (profile {esc(st.json.get('profile'))})", title_justify="left",
                  box=box.HEAVY_HEAD if wide else box.SIMPLE_HEAD, pad_edge=wide)
    if wide:
        table.add_column("stage", no_wrap=True)
        table.add_column("host", overflow="fold")
        table.add_column("state", no_wrap=True)
        table.add_column("time", no_wrap=True)
        table.add_column("run", no_wrap=False, min_width=id_width)
        table.add_column("progress", overflow="fold")
        table.add_column("ETA", overflow="fold")
    else:
        # the first two columns as wide as their longest line; the third takes what is left
        w1 = max([len(x) for s in st.stages for x in (s.name, s.host)] + [5])
        w2 = max([len(str(s.state or "")) for s in st.stages] + [12])  # "unreachable", "1:02:03 rc 1"
        w3 = max(id_width, console.width - w1 - w2 - 8)  # rich's padding between and around the columns
        table.add_column("stage", no_wrap=True, width=w1, overflow="ellipsis")
        table.add_column("state", no_wrap=True, width=w2, overflow="ellipsis")
        table.add_column("run · progress · ETA", no_wrap=True, overflow="ellipsis", width=w3)
    for s in st.stages:
        rs = st.run(s.latest_run)
        r = rs.run if rs else None
        state = str(s.state or "")
        detail = display.end_short(r.signal, r.exit_code, r.orphans, r.orphaned) if r else ""
        if r and (r.attempts or 1) > 1:  # Slurm started its run directory again (requeued)
            detail += f" attempts {r.attempts}" + (" (refused)" if r.refused_start else "")
        style = STATE_STYLE.get(s.state, "")
        prog, eta = progress_text(rs), stage_eta_text(s, rs, now)
        duration = fmt_duration(r.duration_s if r else None)
        if wide:
            cells = [esc(s.name), esc(s.host),
                     f"[{style}]{esc(state + detail)}[/]" if style else esc(state + detail),
                     duration, esc(r.id if r else ""), esc(prog), esc(eta)]
        else:
            word = f"[{style}]{esc(state)}[/]" if style else esc(state)
            second = " ".join(x for x in (duration, detail.strip()) if x)
            below = " · ".join(x for x in (prog, f"ETA {eta}" if eta else "") if x)
            cells = [f"{esc(s.name)}\n[dim]{esc(s.host)}[/]", word + (f"\n{esc(second)}" if second else ""),
                     esc(r.id if r else "") + (f"\n{esc(below)}" if below else "")]
        table.add_row(*cells)
    console.print(table)
    latest = {s.latest_run for s in st.stages}
    for rs in st.runs:  # a start Slurm made again and `requeue: refuse` turned away: say why
        if rs.run.refused_start and rs.run.id in latest:
            console.print(esc(f"{rs.run.id}: {rs.run.refused_start}"), style="yellow", soft_wrap=True)
    for line in slurm_queue_lines(st):
        console.print(line, markup=False, highlight=False)
    for u in st.json.get("services") or []:  # idle services hold their host (and its GPUs) for nothing
        if not u.get("in_use_by"):
            holds = f"holds {u['gpus']} GPU(s) on {u['host']}" if u.get("gpus") else f"on {u['host']}"
            console.print(esc(f"service {u['service']} is IDLE ({holds}) for {fmt_duration(u.get('idle_s'))}; "
                              f"stops at {fmt_clock(u.get('stops_at'))} (keep_alive_s), or `lab stop {u['service']}`"),
                          style="yellow")
    pipe = st.block("pipeline")
    fin = st.pipeline.finish if st.pipeline else None
    active = any(r.run.state in ACTIVE and (r.run.kind or "job") == "job" for r in st.runs)
    if fin is not None and active:  # once nothing runs, the summary says how it went, not an "ETA"
        rng = display.eta_range(fin, now)
        console.print(esc(f"pipeline finishes about {display.clock(fin.at, now)}" + (f" ({rng})" if rng else "")))
    elif fin is not None and not st.runs:  # never ran: what the priors say
        rng = f" ({display.clock(fin.low, now)}–{display.clock(fin.high, now)})"
        console.print(esc(f"started now, the pipeline would finish about {display.clock(fin.at, now)}{rng} "
                          f"(first-run priors: input sizes x declared throughputs)"))
    fc = pipe.get("forecast")
    if isinstance(fc, dict) and isinstance(fc.get("acceptance_rate"), (int, float)):
        console.print(esc("forecast: " + describe(fc)), markup=False, highlight=False)  # docs/foresight.md
    for sj in pipe.get("side_jobs") or []:  # docs/foresight.md: a smoke's failure is the next stage's
        eng = sj.get("engine") or {}
        if eng.get("alarm"):  # docs/foresight.md, "The engine check"
            console.print(esc(f"ENGINE-PATH ALARM: {engine_words(eng)} (lab logs {sj['run']})"),
                          markup=False, highlight=False)
        elif eng:
            console.print(esc(f"engine check: {engine_words(eng)} ({sj['run']})"), markup=False, highlight=False)
        elif sj.get("smoke_of") and sj.get("reason") and sj.get("current_config"):
            console.print(esc(f"{sj['smoke_of']} WILL FAIL: its smoke test {sj['run']} {sj['state']} beside "
                              f"{sj['beside']}: {sj['reason']} (lab logs {sj['run']})"), markup=False, highlight=False)
        elif sj.get("state") in ACTIVE and sj.get("run"):
            console.print(esc(f"side job {sj['stage']} running beside {sj['beside']} ({sj['run']})"),
                          markup=False, highlight=False)
    if show_all:
        allruns = Table(title="all runs", title_justify="left")
        allruns.add_column("run", no_wrap=True)
        for col in ("stage", "host", "state", "exit", "signal", "started", "time"):
            allruns.add_column(col, overflow="fold")
        for rs in st.runs:
            r = rs.run
            allruns.add_row(esc(r.id), esc(r.stage), esc(r.host), esc(r.state), esc(r.exit_code or ""),
                            esc(r.signal or ""), fmt_clock(r.started_at), fmt_duration(r.duration_s))
        console.print(allruns)
