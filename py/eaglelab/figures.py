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
