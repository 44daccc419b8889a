"""How figures are rounded where they are produced for output (state JSON, `lab status --json`,
/api/status, `lab eta replay` rows).

The estimators compute in floating point whose last bits differ between CPUs and BLAS builds; what
a person or a test reads should not. Seconds to 0.1 s, rates and other measured ratios to 4
significant digits: finer than any ETA can be right, coarse enough to be the same everywhere
(but for a value that lands on a rounding boundary, which tests compare with a tolerance).
"""

from __future__ import annotations

import math

SECONDS_DECIMALS = 1
SIGNIFICANT = 4


def seconds(v: float | None) -> float | None:
    """A duration or a time left, to 0.1 s (None stays None)."""
    if v is None:
        return None
    return round(float(v), SECONDS_DECIMALS) + 0.0  # + 0.0: never -0.0


def sig(v: float | None, digits: int = SIGNIFICANT) -> float | None:
    """A rate or a ratio, to `digits` significant digits (None, 0, inf and nan as they are)."""
    if v is None:
        return None
    v = float(v)
    if v == 0.0 or not math.isfinite(v):
        return v
    return round(v, digits - 1 - math.floor(math.log10(abs(v)))) + 0.0


# -- durations for people (one place: the terminal, the page and the notifications) --------------

def human_duration(s: float | None) -> str:
    """`2d 3h`, `1h 04m`, `5m 07s`, `42s`; "" for None (negative durations read as 0)."""
    if s is None:
        return ""
    s = int(round(max(float(s), 0)))
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    if d:
        return f"{d}d {h}h"
    if h:
        return f"{h}h {m:02d}m"
    if m:
        return f"{m}m {sec:02d}s"
    return f"{sec}s"


def clock_duration(s: float | None) -> str:
    """`1:02:03` or `2:03`, for columns that line up; "" for None."""
    if s is None:
        return ""
    s = int(round(max(float(s), 0)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def engine_words(eng: dict) -> str:
    """The engine check's figures in words (docs/foresight.md, "The engine check"): served by vLLM vs
    offline on the same synth rows, the ratio and the floor it is held to, and the output probe's share
    of impossible tokens when it ran (pure)."""
    below = eng["ratio"] < eng["min_ratio"]
    out = (f"vLLM served the drafter at {eng['served_rate']:.1%} acceptance ({eng['drafts']} drafts), offline "
           f"{eng['offline_rate']:.1%} on the same synth rows: {eng['ratio']:.2f}x, "
           f"{'below' if below else 'at or above'} min_ratio {eng['min_ratio']:g}")
    if isinstance(eng.get("outputs_impossible"), (int, float)):
        out += (f"; its outputs: {eng['outputs_impossible']:.0%} of the probed tokens impossible by the logprobs of "
                f"its own target ({'NOT' if eng.get('outputs_fault') else 'within'} the target distribution; "
                "a correct engine: ~0)")  # no apostrophe: the page escapes one, and its tests compare the words
    return out
