"""Terminal rendering of the status object (rich). Pure formatting: no I/O beyond the console."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .fsutil import parse_iso

STATE_STYLE = {"completed": "green", "running": "cyan", "failed": "red", "killed": "red",
               "stalled": "yellow", "unreachable": "magenta", "pending": "dim"}


def fmt_duration(s: float | None) -> str:
    if s is None:
        return ""
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def fmt_clock(iso: str | None) -> str:
    t = parse_iso(iso)
    if t is None:
        return ""
    import time as _t
    return _t.strftime("%H:%M", _t.localtime(t))


def progress_text(run: dict) -> str:
    ls = run.get("log_state") or {}
    p = ls.get("progress")
    parts = []
    if ls.get("phase"):
        parts.append(str(ls["phase"]))
    if p and p.get("total"):
        parts.append(f"{p.get('n')}/{p.get('total')} {p.get('unit') or ''}".rstrip())
    fail = ls.get("failure")
    if fail:
        parts.append(f"[{fail.get('reason')}]")
    return " ".join(parts)


def eta_text(run: dict) -> str:
    eta = run.get("eta") or {}
    if not eta.get("finish_at"):
        return ""
    lo, hi = eta.get("finish_low_at"), eta.get("finish_high_at")
    rng = f" ({fmt_clock(lo)}–{fmt_clock(hi)})" if lo and hi else ""
    return fmt_clock(eta["finish_at"]) + rng


def print_status(st: dict, show_all: bool = False, console: Console | None = None) -> None:
    console = console or Console()
    hosts = Table(title="hosts", title_justify="left")
    for col in ("host", "reach", "state", "GPUs"):
        hosts.add_column(col)
    for h in st["hosts"]:
        state = "ok" if h["reachable"] else f"[magenta]unreachable since {fmt_clock(h['unreachable_since'])}[/]"
        gpus = h.get("gpus")
        gtxt = "none" if gpus is None else ", ".join(
            f"{g.get('utilization_pct', 0):.0f}% {g.get('memory_used_mib', 0) / 1024:.0f}/"
            f"{g.get('memory_total_mib', 0) / 1024:.0f}G" for g in gpus)
        hosts.add_row(h["name"], h["reach"], state, gtxt)
    console.print(hosts)
    runs = {r["id"]: r for r in st["runs"]}
    table = Table(title=f"pipeline (profile {st.get('profile')})", title_justify="left")
    for col in ("stage", "host", "state", "run", "time", "progress", "ETA"):
        table.add_column(col)
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
        style = STATE_STYLE.get(state, "")
        table.add_row(s["name"], s["host"], f"[{style}]{state}{detail}[/]" if style else state + detail,
                      r.get("id", ""), fmt_duration(r.get("duration_s")), progress_text(r), eta_text(r))
    console.print(table)
    pipe = st.get("pipeline") or {}
    if pipe.get("finish_at"):
        console.print(f"pipeline finishes about {fmt_clock(pipe['finish_at'])}"
                      + (f" ({fmt_clock(pipe.get('finish_low_at'))}–{fmt_clock(pipe.get('finish_high_at'))})"
                         if pipe.get("finish_low_at") else ""))
    if show_all:
        allruns = Table(title="all runs", title_justify="left")
        for col in ("run", "stage", "host", "state", "exit", "signal", "started", "time"):
            allruns.add_column(col)
        for r in st["runs"]:
            allruns.add_row(r["id"], r["stage"], r["host"], r["state"], str(r.get("exit_code") or ""),
                            str(r.get("signal") or ""), fmt_clock(r.get("started_at")), fmt_duration(r.get("duration_s")))
        console.print(allruns)
