"""Terminal rendering of the status object (rich). Pure formatting: no I/O beyond the console.

Every value from a run, a log or a host goes through `esc`: rich reads `[disk_full]` as markup and
would drop it. Run ids never wrap or shorten (a user copies them into `lab logs`/`lab stop`); the
free-text columns give way instead."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from eaglelab.figures import clock_duration as fmt_duration
from eaglelab.fsutil import parse_iso

STATE_STYLE = {"completed": "green", "running": "cyan", "failed": "red", "killed": "red",
               "stalled": "yellow", "unreachable": "magenta", "pending": "dim"}


def esc(v) -> str:
    """A value as literal text for rich markup ("" for None)."""
    return "" if v is None else escape(str(v))


def fmt_clock(iso: str | None) -> str:
    t = parse_iso(iso)
    if t is None:
        return ""
    import time as _t
    return _t.strftime("%H:%M", _t.localtime(t))


ENDED = ("completed", "failed", "killed")


def progress_text(run: dict) -> str:
    serving = serving_text(run)
    if serving is not None:
        return serving
    ls = run.get("log_state") or {}
    p = ls.get("progress")
    parts = []
    fail = ls.get("failure")
    if run.get("state") in ENDED:
        # An ended run shows its end, never the phase it was last in ("completed ▸ generating")
        end = fmt_clock(run.get("ended_at"))
        parts.append(f"ended {end}" if end else "ended")
        if p and p.get("total") and run.get("state") != "completed":
            parts.append(f"at {p.get('n')}/{p.get('total')} {p.get('unit') or ''}".rstrip())
        if fail:
            parts.append(f"[{fail.get('reason')}]")
        return " ".join(parts)
    if ls.get("phase"):
        parts.append(str(ls["phase"]))
    if p and p.get("total"):
        parts.append(f"{p.get('n')}/{p.get('total')} {p.get('unit') or ''}".rstrip())
    if fail:
        parts.append(f"[{fail.get('reason')}]")
    return " ".join(parts)


def slurm_queue_lines(st: dict, runs: dict) -> list[str]:
    """One line per latest run queued in Slurm: its reason, place and Slurm's start estimate."""
    out = []
    for s in st["stages"]:
        sl = (runs.get(s["latest_run"] or "") or {}).get("slurm") or {}
        if sl.get("state") in ("PENDING", "REQUEUED", "CONFIGURING") or (sl and s["state"] == "pending"):
            bits = [f"{s['name']}: Slurm job {sl.get('job_id')} {sl.get('state') or 'pending'}"
                    + (f" ({sl['reason']})" if sl.get("reason") else "")]
            if sl.get("queue_position"):
                bits.append(f"#{sl['queue_position']} in {sl.get('partition')}")
            if sl.get("start_estimate"):
                bits.append(f"Slurm expects it to start {fmt_clock(sl['start_estimate'])}")
            if sl.get("queued_s") is not None:
                bits.append(f"queued {fmt_duration(sl['queued_s'])}")
            out.append(", ".join(bits))
    return out


def serving_text(run: dict) -> str | None:
    """A ready service's figures (vLLM's latest periodic stats) in place of progress and ETA: its
    weight-loading bar is long finished and it has no end to predict. None for anything else."""
    ls = run.get("log_state") or {}
    # a ready server whose log went quiet (no requests) is up, not stalled
    if run.get("kind") != "service" or run.get("state") not in ("running", "stalled") or not ls.get("ready"):
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


def overdue_text(finish_at: float, now: float) -> str:
    """A finish time already past: "overdue by 12 min (estimate was 14:05)", never "in 0s"."""
    late = max(now - finish_at, 0.0)
    by = f"{late / 3600:.1f} h" if late >= 5400 else f"{max(late / 60, 1):.0f} min"
    return f"overdue by {by} (estimate was {fmt_clock_ts(finish_at)})"


def fmt_clock_ts(t: float) -> str:
    import time as _t
    return _t.strftime("%H:%M", _t.localtime(t))


def eta_text(run: dict, now: float | None = None) -> str:
    if serving_text(run) is not None:
        return ""  # a ready service: nothing to wait for
    if run.get("state") == "stalled" or (run.get("eta") or {}).get("source") == "stalled":
        return "unknown (stalled)"  # no progress (or a bar stuck past its estimate): any finish time would be made up
    eta = run.get("eta") or {}
    if not eta.get("finish_at"):
        return ""
    import time as _t
    now = _t.time() if now is None else now
    at = parse_iso(eta["finish_at"])
    if at is not None and at <= now - 30:
        return overdue_text(at, now)
    lo, hi = eta.get("finish_low_at"), eta.get("finish_high_at")
    rng = f" ({fmt_clock(lo)}–{fmt_clock(hi)})" if lo and hi else ""
    return fmt_clock(eta["finish_at"]) + rng


def stage_eta_text(stage: dict, run: dict) -> str:
    """A running run's ETA; for a stage still to run, its predicted finish and what it rests on
    (prior, learned, history: docs/interfaces.md "ETA")."""
    if run.get("state") in ("running", "stalled"):
        return eta_text(run)
    if run.get("state") in ENDED and stage.get("state") == run.get("state"):
        return ""  # it ended: progress_text says when
    eta = stage.get("eta") or {}
    if stage.get("state") == "completed" or not eta.get("finish_at") or eta.get("source") == "done":
        return ""
    lo, hi = eta.get("finish_low_at"), eta.get("finish_high_at")
    rng = f" ({clock_days(lo)}–{clock_days(hi)})" if lo and hi else ""
    return f"{clock_days(eta['finish_at'])}{rng} {eta.get('source')}"


def clock_days(iso: str | None, now: float | None = None) -> str:
    """fmt_clock, with the weekday for a time 20 h or more away (a prior's range can span days)."""
    import time as _t
    t = parse_iso(iso)
    if t is None:
        return ""
    far = abs(t - (_t.time() if now is None else now)) >= 20 * 3600
    return _t.strftime("%a %H:%M" if far else "%H:%M", _t.localtime(t))


def print_status(st: dict, show_all: bool = False, console: Console | None = None) -> None:
    console = console or Console()
    hosts = Table(title="hosts", title_justify="left")
    for col in ("host", "reach", "state"):
        hosts.add_column(col, no_wrap=True)
    hosts.add_column("GPUs", overflow="fold")
    for h in st["hosts"]:
        if h.get("reachable") is None:
            state = "[dim]not contacted yet[/]"
        elif h["reachable"]:
            state = "ok"
        else:
            state = f"[magenta]unreachable since {esc(fmt_clock(h['unreachable_since']))}[/]"
        gpus = h.get("gpus")
        gtxt = "none" if gpus is None else ", ".join(
            f"{g.get('utilization_pct') or 0:.0f}% {(g.get('memory_used_mib') or 0) / 1024:.0f}/"
            f"{(g.get('memory_total_mib') or 0) / 1024:.0f}G" for g in gpus)
        hosts.add_row(esc(h["name"]), esc(h["reach"]), state, esc(gtxt))
    console.print(hosts)
    for h in st["hosts"]:
        for bad in h.get("bad_runs") or []:  # skipped, never fatal: say which and why
            console.print(f"[yellow]{esc(h['name'])}: skipped a run directory:[/] {esc(bad.get('error'))}",
                          soft_wrap=True)
    runs = {r["id"]: r for r in st["runs"]}
    id_width = max([len(str(r.get("id") or "")) for r in runs.values()] + [3])
    # Narrow terminals (an 80-column ssh window, a tmux split): three columns, two lines a stage:
    # stage over host, state over time, run id over progress and ETA. No cell wraps a word: the
    # state words stay whole and a long progress line is cut with an ellipsis, never wrapped.
    wide = console.width >= 2 * id_width + 70
    table = Table(title=f"pipeline (profile {esc(st.get('profile'))})", title_justify="left",
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
        w1 = max([len(str(x.get(k) or "")) for x in st["stages"] for k in ("name", "host")] + [5])
        w2 = max([len(str(x.get("state") or "")) for x in st["stages"]] + [12])  # "unreachable", "1:02:03 rc 1"
        w3 = max(id_width, console.width - w1 - w2 - 8)  # rich's padding between and around the columns
        table.add_column("stage", no_wrap=True, width=w1, overflow="ellipsis")
        table.add_column("state", no_wrap=True, width=w2, overflow="ellipsis")
        table.add_column("run · progress · ETA", no_wrap=True, overflow="ellipsis", width=w3)
    for s in st["stages"]:
        r = runs.get(s["latest_run"] or "") or {}
        state = s["state"]
        detail = ""
        if r.get("signal"):
            detail = f" sig {r['signal']}"
        elif r.get("exit_code") not in (None, 0):
            detail = f" rc {r['exit_code']}"
        if r.get("orphans"):  # processes of its group outlived it: GPU memory may still be held
            detail += " +orphans"
        if r.get("orphaned"):  # its jobwrap was killed; the stage runs on, unsupervised
            detail += " orphaned"
        if (r.get("attempts") or 1) > 1:  # Slurm started its run directory again (requeued)
            detail += f" attempts {r['attempts']}" + (" (refused)" if r.get("refused_start") else "")
        style = STATE_STYLE.get(state, "")
        prog, eta = progress_text(r), stage_eta_text(s, r)
        if wide:
            cells = [esc(s["name"]), esc(s["host"]),
                     f"[{style}]{esc(state + detail)}[/]" if style else esc(state + detail),
                     fmt_duration(r.get("duration_s")), esc(r.get("id", "")), esc(prog), esc(eta)]
        else:
            word = f"[{style}]{esc(state)}[/]" if style else esc(state)
            second = " ".join(x for x in (fmt_duration(r.get("duration_s")), detail.strip()) if x)
            below = " · ".join(x for x in (prog, f"ETA {eta}" if eta else "") if x)
            cells = [f"{esc(s['name'])}\n[dim]{esc(s['host'])}[/]", word + (f"\n{esc(second)}" if second else ""),
                     esc(r.get("id", "")) + (f"\n{esc(below)}" if below else "")]
        table.add_row(*cells)
    console.print(table)
    for r in runs.values():  # a start Slurm made again and `requeue: refuse` turned away: say why
        if r.get("refused_start") and r.get("id") in {s["latest_run"] for s in st["stages"]}:
            console.print(esc(f"{r['id']}: {r['refused_start']}"), style="yellow", soft_wrap=True)
    for line in slurm_queue_lines(st, runs):
        console.print(line, markup=False, highlight=False)
    for u in st.get("services") or []:  # idle services hold their host (and its GPUs) for nothing
        if not u.get("in_use_by"):
            holds = f"holds {u['gpus']} GPU(s) on {u['host']}" if u.get("gpus") else f"on {u['host']}"
            console.print(esc(f"service {u['service']} is IDLE ({holds}) for {fmt_duration(u.get('idle_s'))}; "
                              f"stops at {fmt_clock(u.get('stops_at'))} (keep_alive_s), or `lab stop {u['service']}`"),
                          style="yellow")
    pipe = st.get("pipeline") or {}
    active = any(r.get("state") in ("running", "pending") and r.get("kind", "job") == "job" for r in runs.values())
    rng = (f" ({fmt_clock(pipe.get('finish_low_at'))}–{fmt_clock(pipe.get('finish_high_at'))})"
           if pipe.get("finish_low_at") else "")
    if pipe.get("finish_at") and active:  # once nothing runs, the summary says how it went, not an "ETA"
        console.print(esc(f"pipeline finishes about {fmt_clock(pipe['finish_at'])}{rng}"))
    elif pipe.get("finish_at") and not runs:  # never ran: what the priors say
        rng = f" ({clock_days(pipe.get('finish_low_at'))}–{clock_days(pipe.get('finish_high_at'))})"
        console.print(esc(f"started now, the pipeline would finish about {clock_days(pipe['finish_at'])}{rng} "
                          f"(first-run priors: input sizes x declared throughputs)"))
    fc = pipe.get("forecast")
    if isinstance(fc, dict) and isinstance(fc.get("acceptance_rate"), (int, float)):
        from .forecast import describe  # docs/foresight.md
        console.print(esc("forecast: " + describe(fc)), markup=False, highlight=False)
    from eaglelab.figures import engine_words
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
        elif sj.get("state") in ("running", "pending") and sj.get("run"):
            console.print(esc(f"side job {sj['stage']} running beside {sj['beside']} ({sj['run']})"),
                          markup=False, highlight=False)
    if show_all:
        allruns = Table(title="all runs", title_justify="left")
        allruns.add_column("run", no_wrap=True)
        for col in ("stage", "host", "state", "exit", "signal", "started", "time"):
            allruns.add_column(col, overflow="fold")
        for r in st["runs"]:
            allruns.add_row(esc(r["id"]), esc(r["stage"]), esc(r["host"]), esc(r["state"]), esc(r.get("exit_code") or ""),
                            esc(r.get("signal") or ""), fmt_clock(r.get("started_at")), fmt_duration(r.get("duration_s")))
        console.print(allruns)

