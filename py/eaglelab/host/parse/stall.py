"""Is a live run stuck? Pure rules over what the state machine saw, with the clock passed in.

1. The current bar is unfinished and nothing moved (no bar advanced, no metric, no phase) for
   much longer than the bar's own pace: max(STALL_MIN_S, STALL_FACTOR x seconds per item).
2. The phase has run STALL_FACTOR_PHASE x longer than earlier runs of the same phase took
   (when the caller knows them: `expected_phase_s`), with nothing moving for STALL_MIN_S.
3. vLLM says requests are running while it generates 0 tokens/s, STATS_STUCK_LINES stats
   lines in a row (the log itself shows it, so this one needs no clock).
Only a process that is alive can be stalled; the caller says whether it is.
"""

from __future__ import annotations

from dataclasses import dataclass

STALL_MIN_S = 300.0
STALL_FACTOR = 10.0
STALL_FACTOR_PHASE = 3.0
STATS_STUCK_LINES = 3
DEFAULT_PACE_S = 60.0  # seconds per item assumed for a bar that printed no rate


@dataclass(frozen=True, slots=True)
class Stall:
    reason: str
    message: str
    idle_s: float | None


def check_stall(*, now: float | None, last_activity_at: float | None, bar_unfinished: bool,
                bar_s_per_it: float | None, stuck_stats_lines: int, stats_message: str = "",
                phase: str | None = None, phase_started_at: float | None = None,
                expected_phase_s: dict[str, float] | None = None) -> Stall | None:
    if stuck_stats_lines >= STATS_STUCK_LINES:
        return Stall("no_throughput", f"{stuck_stats_lines} stats lines in a row with requests running "
                     f"and 0 tokens/s: {stats_message}", None)
    if now is None or last_activity_at is None:
        return None
    idle = now - last_activity_at
    if bar_unfinished:
        pace = bar_s_per_it if bar_s_per_it else DEFAULT_PACE_S
        limit = max(STALL_MIN_S, STALL_FACTOR * pace)
        if idle > limit:
            return Stall("no_progress", f"no progress for {idle:.0f} s; the bar's pace is {pace:.3g} s/it "
                         f"(limit {limit:.0f} s)", idle)
    if phase and expected_phase_s and phase in expected_phase_s and phase_started_at is not None:
        expected = expected_phase_s[phase]
        ran = now - phase_started_at
        if ran > STALL_FACTOR_PHASE * expected and idle > STALL_MIN_S:
            return Stall("phase_overdue", f"phase {phase} has run {ran:.0f} s; earlier runs took {expected:.0f} s", idle)
    return None
