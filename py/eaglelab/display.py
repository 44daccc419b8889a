"""How the terminal (eaglelab.control.render) and the page (status_web) say a clock time, a run's end
and an ETA: one module, so `lab status` and the page never word the same estimate two ways. Pure:
times, the engine's `Finish` and `now` in, text out; neither front end estimates anything itself.
"""

from __future__ import annotations

import time

from .figures import human_duration
from .logstate import Finish

FAR_S = 20 * 3600  # a time this far from now shows its weekday (a prior's range can span days)
OVERDUE_AFTER_S = 30  # past its estimate by this much, a finish time is overdue, not "in 0s"


def clock(t: float | None, now: float | None = None) -> str:
    """Local HH:MM; with the weekday when `now` is given and t is 20 hours or more from it; "" for None."""
    if t is None:
        return ""
    far = now is not None and abs(t - now) >= FAR_S
    return time.strftime("%a %H:%M" if far else "%H:%M", time.localtime(t))


def overdue(fin: Finish, now: float) -> str:
    """How late a finish time is ("12 min", "1.6 h"), or "" when it is not past (by 30 s) yet."""
    late = now - fin.at
    if late < OVERDUE_AFTER_S:
        return ""
    return f"{late / 3600:.1f} h" if late >= 5400 else f"{max(late / 60, 1):.0f} min"


def eta_range(fin: Finish, now: float) -> str:
    """The estimate's range as clock times ("14:05–14:40"); as time from now when both ends fall in
    one minute; "" when the engine gave none or it is already past."""
    if fin.low is None or fin.high is None or fin.high <= now:
        return ""
    lo, hi = clock(fin.low, now), clock(fin.high, now)
    return f"{lo}–{hi}" if lo != hi else f"{human_duration(fin.low - now)}–{human_duration(fin.high - now)}"


def eta_words(fin: Finish, now: float) -> dict:
    """The page's words for a finish: clock, range, time left (`in`) and how overdue."""
    late = overdue(fin, now)
    return {"clock": clock(fin.at, now), "range": "" if late else eta_range(fin, now),
            "in": human_duration(fin.at - now), "overdue": late}


def eta_line(fin: Finish, now: float) -> str:
    """The terminal's: "14:05 (13:50–14:40)", or "overdue by 12 min (estimate was 14:05)"."""
    w = eta_words(fin, now)
    if w["overdue"]:
        return f"overdue by {w['overdue']} (estimate was {w['clock']})"
    return w["clock"] + (f" ({w['range']})" if w["range"] else "")


STALLED_WORDS = "unknown (stalled)"  # a stalled run's ETA: any finish time would be made up


def end_short(signal: int | None, exit_code: int | None, orphans: bool = False, orphaned: bool = False) -> str:
    """A run's end in a narrow column: " sig 9", " rc 1", then " +orphans" (its group outlived it:
    GPU memory may still be held), " orphaned" (its jobwrap was killed; the stage runs on)."""
    out = f" sig {signal}" if signal else f" rc {exit_code}" if exit_code not in (None, 0) else ""
    return out + (" +orphans" if orphans else "") + (" orphaned" if orphaned else "")
