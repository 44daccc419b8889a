"""One run's state machine: lines and frames in, the state JSON (schema 1) out.

Pure: no files, no clock of its own. The tailer (live) passes the time each line was read; `lab
parse` passes none and durations come from the log's own timestamps. See docs/interfaces.md for
the JSON and README "Watching logs" for the rules in words.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from eaglelab.figures import seconds
from eaglelab.fsutil import utcnow_iso
from eaglelab.model import RunState, StageState, decide_end

from . import markers, prefilter, speculators, training, vllm
from .ansi import strip_ansi
from .bars import BarBook, BarTrack, line_timestamp
from .events import END, FAILURE, METRIC, PHASE_END, PHASE_START, READY, STALL_HINT, TRAIN_PLAN, TRAIN_STEP, Event
from .failures import GENERIC, ROOT_CAUSES, WRAPPER_PAUSE, Candidate, FailureRecognizer
from .prefixes import follower, split_prefix
from .progress import nested_position, parse_bar, parse_cut_frames, split_glued
from .records import LogClock, parse_record
from .stall import check_stall

SCHEMA = 1
MAX_CANDIDATES = 64
MAX_PHASES = 512
MAX_METRICS = 256
MAX_POINTS = 1000  # per metric; past it every other point goes (the curve keeps its whole span)
FAILURE_GRACE_S = 30.0  # live: a failure line with no exit yet is only "suspected" this long
_RECOGNIZERS = (markers.recognize, vllm.recognize, speculators.recognize, training.recognize)
_BAR_PHASES = {**vllm.BAR_PHASES, **speculators.BAR_PHASES}
_LEAD_ONLY = frozenset((TRAIN_STEP, TRAIN_PLAN))
_MOVING = frozenset((METRIC, PHASE_START, PHASE_END, READY, TRAIN_STEP))
# ... except the shutdown: a server that shuts down after an error line (vLLM's `EngineDeadError`,
# then uvicorn's `Shutting down`) did not survive it, its shutdown follows from it.
_WINDING_DOWN = "shutdown"
# A wrapper script's prompt once its program has exited (a Windows `.bat`'s `pause`, in English or
# Chinese): after a bar left part way and no failure line, the program died without a word.
_WRAPPER_PAUSE_RE = re.compile("|".join(map(re.escape, WRAPPER_PAUSE)))
# `cat -v` writes a carriage return as the two characters `^M`: a log pasted that way (a README's
# output block) still holds a bar's frames, one after another on one line.
_CARET_CR = "^M"


# (observations, total, label, tqdm's printed remaining) -> (eta_s, eta_low_s, eta_high_s): the
# estimator, given by whoever runs the parser (eaglelab.eta.bar_eta); without one, tqdm's number.
BarEta = Callable[[list, "float | None", str, "float | None"], tuple]


def _tqdm_only(observations: list, total: float | None, label: str, remaining_s: float | None,
               prior_s_per_item: float | None = None, prior_run: tuple | None = None) -> tuple:
    return remaining_s, None, None


class LogState:
    def __init__(self, expected_phase_s: dict[str, float] | None = None, bar_eta: BarEta | None = None) -> None:
        self.bar_eta = bar_eta or _tqdm_only
        # Called with (track, frame's Progress) after every bar observation: `lab eta replay` reads
        # the bars through this state machine, so its rows are what the tailer's snapshot shows.
        self.on_bar: Callable[[BarTrack, object], None] | None = None
        self.lines = 0            # newline-terminated lines read (the caller counts them)
        self.bad_lines = 0        # lines a recognizer choked on (counted, skipped)
        self.garbled = 0          # lines the reader had to mend: invalid UTF-8, over-long (the caller counts them)
        self.frames = 0           # \r-frames looked at
        self.bars = BarBook()
        self.training = training.TrainingSteps()  # steps, epochs: the train stage's main progress
        self.clock = LogClock()
        self.expected_phase_s = expected_phase_s
        self._failures = FailureRecognizer()
        self.candidates: list[tuple[Candidate, float | None]] = []
        self.dismissed = 0
        self.done_line: int | None = None
        self.done_message = ""
        self.shutdown_line: int | None = None
        self.ready_line: int | None = None
        self.phases: list[dict] = []
        self._open: dict | None = None
        self._open_t: tuple[float | None, float | None] = (None, None)  # (log time, clock) at start
        self.metrics: dict[str, list[list[float]]] = {}
        self._metric_count: dict[str, int] = {}
        self._step_in: object = None   # the last step given to _add_metric, and its x
        self._step_x: float | int = 0
        self.last_activity_at: float | None = None
        self.stuck_stats = 0
        self.stats_message = ""
        self._log_t: float | None = None
        self.last_line = ""       # the last non-blank line: what a failure without a named reason shows
        self.last_line_no: int | None = None
        self._ended = False
        self._wrapper_pause: tuple[int, str] | None = None  # (line, prefix) of a wrapper's pause prompt
        self.shapes = prefilter.Shapes()  # line shapes seen, and whether they can matter


    # ---- input -------------------------------------------------------------------------------

    def feed_line(self, text: str, lineno: int, now: float | None = None) -> None:
        """A line's visible text (after the last \\r of the line)."""
        try:
            self._feed(text, lineno, now)
        except Exception:  # noqa: BLE001 - a garbled line is counted, never fatal
            self.bad_lines += 1

    def feed_block(self, blk: bytes, first: int, max_line: int, now: float | None = None) -> int | None:
        """blk: complete lines (valid UTF-8, no \\r) numbered from first: the same state as feed_line
        on each, through the prefilter; returns how many, or None (none fed) if one is over max_line."""
        return prefilter.feed_block(self, blk, first, max_line, now)

    def feed_frame(self, text: str, lineno: int, now: float | None = None) -> None:
        """A \\r-terminated frame of line lineno (a progress bar being redrawn, usually)."""
        self.frames += 1
        try:
            self._feed(text, lineno, now)
        except Exception:  # noqa: BLE001 - as feed_line
            self.bad_lines += 1

    def feed_provisional(self, text: str, lineno: int, now: float | None = None) -> None:
        """The newest, not yet terminated frame (live tailing): only a progress bar is read from it.

        It comes again once terminated; the bar book takes the repeat as no news.
        """
        try:
            split = split_prefix(strip_ansi(text))
            p = parse_bar(split.message, split.prefix)
            if p is not None:
                self._on_bar(p, lineno, now, text)
        except Exception:  # noqa: BLE001 - as feed_line
            self.bad_lines += 1

    def _feed(self, text: str, lineno: int, now: float | None) -> None:
        if not text:
            return
        if _CARET_CR in text:  # frames written out by `cat -v`: each is read as the frame it was
            *frames, text = text.split(_CARET_CR)
            for frame in frames:
                self.frames += 1
                self._feed(frame, lineno, now)
            if not text:
                return
        split = split_prefix(strip_ansi(text))
        prefix, msg = split.prefix, split.message
        if msg and not msg.isspace():
            self.last_line, self.last_line_no = msg, lineno
        if msg.endswith("]"):
            p = parse_bar(msg, prefix)
            if p is not None:
                self._on_bar(p, lineno, now, text)
                return
        elif "]" in msg:
            glued = split_glued(msg)
            if glued is not None:
                p = parse_bar(glued[0], prefix)
                if p is not None:
                    self._on_bar(p, lineno, now, text)
                    msg = glued[1]
        if "%|" in msg and not msg.rstrip().endswith("]"):
            cut, rest = parse_cut_frames(msg, prefix)  # frames cut at the terminal's width
            for p in cut:
                self._on_bar(p, lineno, now, text)
            if cut:
                if not rest.strip():
                    return
                msg = rest  # a log line glued after the last cut frame
        rec = parse_record(msg)
        if rec.time is not None:
            self._log_t = self.clock.seconds(rec)
        events: list[Event] = []
        for recognize in _RECOGNIZERS:
            events = recognize(rec.message)
            if events:
                break
        if events:
            moved = False  # a metric, a phase, readiness: the process shows it goes on
            lead = not prefix or not follower(prefix)
            for ev in events:
                if ev.kind == METRIC:  # most events of a training log: kept short
                    if lead:  # a replica rank's metrics would interleave with rank 0's curve
                        self._add_metric(ev.name, float(ev.value), ev.step)
                    moved = True
                else:
                    self._on_event(ev, prefix, lineno, now)
                    moved = moved or ev.kind in _MOVING and ev.name != _WINDING_DOWN
            if moved:
                self._activity(prefix, now)
        cand = self._failures.feed(prefix, rec.level, rec.message, lineno)
        if cand is not None:
            self._add_candidate(cand, now)
        elif _WRAPPER_PAUSE_RE.search(msg):
            self._wrapper_pause = (lineno, prefix)

    def _on_bar(self, p, lineno: int, now: float | None, text: str = "") -> None:
        p.position = nested_position(text)
        line_ts = None
        if p.elapsed_s is None:  # (tqdm's `[?<?]`): the line's own timestamp is the bar's clock
            ts = line_timestamp(strip_ansi(text))
            line_ts = ts[0] if ts else None
        lead = not follower(p.prefix)
        track, advanced = self.bars.observe(p, lineno, now, line_ts, lead)
        epoch_bar = training.EPOCH_BAR_RE.match(p.label) if lead and p.label.startswith("Epoch ") else None
        if epoch_bar is not None and self.training.source != "steps":
            self.training.epoch_bar(int(epoch_bar.group("e")), p.n, p.total, p.elapsed_s, lineno, now)
        if self.on_bar is not None:
            self.on_bar(track, p)
        phase = _BAR_PHASES.get(p.label)
        if phase is not None and (self._open is None or self._open["name"] != phase) and not track.finished:
            self._start_phase(phase, "", lineno, now)
        # A bar moving on shows the process goes on; a bar seen for the first time part way through
        # does not survive a failure line: tqdm redraws a bar once more when an exception closes it.
        if advanced:
            self._activity(p.prefix, now, survives=track.observations > 1 or p.n == 0)

    def _on_event(self, ev: Event, prefix: str, lineno: int, now: float | None) -> None:
        kind = ev.kind
        if kind == METRIC:
            self._add_metric(ev.name, float(ev.value), ev.step)
        elif kind == PHASE_START:
            self._start_phase(ev.name, ev.detail, lineno, now)
        elif kind == PHASE_END:
            self._end_phase(ev.name, lineno, now, ev.value)
        elif kind == READY:
            self.ready_line = lineno
            self._dismiss(None)
        elif kind == END:
            if ev.name == "done":
                self.done_line, self.done_message = lineno, ev.message
                self.training.ended = True
                self._dismiss(None)
                self._end_phase(None, lineno, now, None)
            else:
                self.shutdown_line = lineno
                # a clean shutdown after `received SIGTERM`: a stop that was asked for, not a failure
                self.candidates = [(c, t) for c, t in self.candidates if c.reason != "killed"]
        elif kind == STALL_HINT:
            self.stuck_stats = self.stuck_stats + 1 if ev.value else 0
            self.stats_message = ev.message
        elif kind == FAILURE:
            self._add_candidate(Candidate(ev.name, ev.message, lineno, prefix, True), now)
        elif kind in _LEAD_ONLY and follower(prefix):
            return  # rank N > 0 of a distributed training: rank 0's steps and plan are the stage's
        elif kind == TRAIN_STEP:
            clock = ("log", self._log_t) if self._log_t is not None else ("read", now) if now is not None else None
            self.training.source = "steps"
            self.training.observe(float(ev.value), None if ev.step is None else int(ev.step), lineno, clock, now)
        elif kind == TRAIN_PLAN:
            self.training.plan(ev.name, float(ev.value))

    # ---- phases, metrics, failures ----------------------------------------------------------

    def _start_phase(self, name: str, detail: str, lineno: int, now: float | None) -> None:
        if self._open is not None:
            self._end_phase(None, lineno, now, None)
        ph: dict = {"name": name, "started_line": lineno, "ended_line": None, "duration_s": None}
        if detail:
            ph["detail"] = detail
        if now is not None:
            ph["started_at"] = utcnow_iso(now)
        self.phases.append(ph)
        if len(self.phases) > MAX_PHASES:
            del self.phases[0]
        self._open = ph
        self._open_t = (self._log_t, now)

    def _end_phase(self, name: str | None, lineno: int, now: float | None, printed_s: float | None) -> None:
        ph = self._open
        if ph is None or (name is not None and ph["name"] != name):
            if name is not None and printed_s is not None and (ph is None or ph["name"] != name):
                # An end without its start (the start line scrolled by, or it has none): still a phase.
                done = {"name": name, "started_line": None, "ended_line": lineno, "duration_s": printed_s}
                self.phases.append(done)
            return
        log_t0, clock_t0 = self._open_t
        duration = printed_s
        if duration is None and log_t0 is not None and self._log_t is not None:
            duration = self._log_t - log_t0
        if duration is None and clock_t0 is not None and now is not None:
            duration = now - clock_t0
        ph["ended_line"] = lineno
        ph["duration_s"] = None if duration is None else round(float(duration), 3)
        if now is not None:
            ph["ended_at"] = utcnow_iso(now)
        self._open = None

    def _add_metric(self, name: str, value: float, step: float | int | None) -> None:
        series = self.metrics.get(name)
        if series is None:
            if len(self.metrics) >= MAX_METRICS:
                return
            series = self.metrics[name] = []
        index = self._metric_count.get(name, 0)
        self._metric_count[name] = index + 1
        if step is None:
            x = index
        elif step is self._step_in:
            x = self._step_x  # the same step object as the metric before (one line's metrics share it)
        else:
            x = float(step)
            x = int(x) if x.is_integer() else x
            self._step_in, self._step_x = step, x
        series.append([x, value])
        if len(series) > MAX_POINTS:
            self.metrics[name] = series[::2]

    def _add_candidate(self, cand: Candidate, now: float | None) -> None:
        if len(self.candidates) < MAX_CANDIDATES:
            self.candidates.append((cand, now))
        elif cand.specific and not any(c.specific for c, _ in self.candidates):
            self.candidates[-1] = (cand, now)

    def _activity(self, prefix: str, now: float | None, survives: bool = True) -> None:
        """The process showed it goes on: failure lines from the same process were survived."""
        if now is not None:
            self.last_activity_at = now
        if self.candidates and survives:
            self._dismiss(prefix)

    def _dismiss(self, prefix: str | None) -> None:
        keep = [(c, t) for c, t in self.candidates if prefix is not None and c.prefix != prefix]
        self.dismissed += len(self.candidates) - len(keep)
        self.candidates = keep

    def end_of_log(self) -> None:
        """The log is complete (a finished file, or a run that has exited): a traceback still open
        is where the process died (the rule is README "Watching logs"). Idempotent."""
        if self._ended:
            return
        self._ended = True
        for cand in self._failures.open_tracebacks():
            self._add_candidate(cand, None)
        self._died_before_the_pause()

    def _died_before_the_pause(self) -> None:
        """A wrapper's pause prompt after a bar left part way, with no failure line and no end: the
        program exited (the wrapper went on to `pause`) in the middle of the bar, a silent death."""
        if self._wrapper_pause is None or self.candidates or self.done_line is not None:
            return
        cur = self.bars.current
        if cur is None or cur.finished or cur.latest.total is None or cur.last_line > self._wrapper_pause[0]:
            return
        lineno, prefix = self._wrapper_pause
        n, total = cur.latest.n, cur.latest.total
        self._add_candidate(Candidate(
            "lost", f"the program exited at {n:g}/{total:g} of {cur.label or 'its bar'!r} with no error line "
                    f"(its wrapper's pause prompt follows); last line: {self.last_line}", lineno, prefix, True), None)

    def failure(self) -> Candidate | None:
        """The root cause among the failure lines not survived: the first with a named cause (cuda_oom,
        nccl_error, ...), else the first specific one (`other`), else the first."""
        if not self.candidates:
            return None
        for root in ROOT_CAUSES:  # what the others follow from: a time limit's SIGTERM, an assert's NCCL error
            for c, _ in self.candidates:
                if c.reason == root:
                    return c
        for c, _ in self.candidates:
            if c.specific and c.reason not in GENERIC:
                return c
        for c, _ in self.candidates:
            if c.specific:
                return c
        return self.candidates[0][0]

    # ---- output ------------------------------------------------------------------------------

    def bar_histories(self) -> dict[tuple[str, str, int], list[tuple]]:
        """(prefix, label, position) -> [(n, total, elapsed_s, s/it), ...] for every bar: the ETA estimator's input."""
        return {k: list(t.history) for k, t in self.bars.bars.items()}

    def snapshot(self, now: float | None = None, alive: bool | None = None,
                 exit_info: dict | None = None, include_history: bool = False) -> dict:
        cur = self.bars.current
        fail = self.failure()
        suspect = None
        if fail is not None and alive and exit_info is None:
            seen_at = next(t for c, t in self.candidates if c is fail)
            if now is not None and seen_at is not None and now - seen_at < FAILURE_GRACE_S:
                suspect, fail = fail, None
        stall = None
        if alive and exit_info is None or (alive is None and exit_info is None):
            stall = check_stall(
                now=now if alive else None, last_activity_at=self.last_activity_at,
                bar_unfinished=cur is not None and not cur.finished,
                bar_s_per_it=cur.latest.rate_s_per_it if cur else None,
                stuck_stats_lines=self.stuck_stats, stats_message=self.stats_message,
                phase=self._open["name"] if self._open else None, phase_started_at=self._open_t[1],
                expected_phase_s=self.expected_phase_s)
        if fail is not None:
            state = RunState.FAILED
        elif self.done_line is not None or self.shutdown_line is not None and suspect is None:
            state = RunState.COMPLETED
        elif stall is not None:
            state = StageState.STALLED
        else:
            state = RunState.RUNNING
        out: dict = {
            "schema": SCHEMA,
            "state": state,
            "failure": _failure_json(fail),
            "progress": self._main_progress(cur),
            "phase": self._open["name"] if self._open else None,
            "phases": [dict(p) for p in self.phases],
            "metrics": {k: [list(x) for x in v] for k, v in self.metrics.items()},
            "lines": self.lines,
            "bad_lines": self.bad_lines + self.garbled,
            "frames": self.frames,
            "ready": self.ready_line is not None,
            "end_marker": self.done_message or None,
            "last_line": self.last_line.strip()[:500] or None,
            "stall": None if stall is None else {"reason": stall.reason, "message": stall.message, "idle_s": stall.idle_s},
            "failures_survived": self.dismissed,
            "progress_bars": [_bar_summary(t, include_history) for t in self.bars.bars.values()],
        }
        if self.training.step is not None:
            out["training"] = _training_json(self.training, self.bar_eta)
        if suspect is not None:
            out["suspect"] = _failure_json(suspect)
        if exit_info is not None:
            out = combine_with_exit(out, exit_info)
        return out


    def _main_progress(self, cur: BarTrack | None) -> dict | None:
        """The progress the stage is at: the last bar seen, except while the log goes on (live) and
        there is no bar or the last is a sub-bar done (checkpoint shards written) while training
        counts steps: then training's steps, else the unfinished bar the finished one ran inside."""
        steps = self.training
        if cur is not None and steps.step is not None and follower(cur.prefix):
            cur = None  # a replica rank's bar (the only bar so far): rank 0's steps say more
        if not self._ended and steps.step is not None and not steps.finished and (
                cur is None or cur.finished and steps.total is not None):
            return _steps_progress(steps, self.bar_eta)  # an unfinished bar is where training is
        if cur is None:
            return None
        if not self._ended and cur.finished:
            outer = [t for t in self.bars.bars.values()
                     if not t.finished and t.first_line < cur.first_line and t.observations > 1]
            if outer:
                return _progress_json(max(outer, key=lambda t: t.last_line), self.bar_eta)
        return _progress_json(cur, self.bar_eta)


def _training_json(steps: training.TrainingSteps, bar_eta: BarEta) -> dict:
    out = steps.summary()
    out["step"] = _int(out["step"])
    if steps.finished:  # the trainer said it is over (or the steps reached the total)
        eta_s = low = high = 0.0
    elif steps.total:
        eta_s, low, high = bar_eta(steps.history, steps.total, training.LABEL, None)
    else:
        eta_s = low = high = None
    out.update(eta_s=seconds(eta_s), eta_low_s=seconds(low), eta_high_s=seconds(high),
               observed_at=_iso(steps.updated_at))
    return out


def _steps_progress(steps: training.TrainingSteps, bar_eta: BarEta) -> dict:
    """Training's steps in the shape of a bar's progress (what the page and `lab status` show)."""
    t = _training_json(steps, bar_eta)
    total, n = steps.total, steps.step
    hist = [[e, k] for k, _tot, e, _r in steps.history if e is not None]
    rate = None
    if len(hist) >= 2 and hist[-1][1] > hist[0][1]:
        rate = (hist[-1][0] - hist[0][0]) / (hist[-1][1] - hist[0][1])
    postfix = {"epoch": f"{(steps.epoch or 0) + 1}/{steps.epochs}" if steps.epochs else str((steps.epoch or 0) + 1)}
    return {"label": training.LABEL, "prefix": None, "n": _int(n), "total": total, "unit": "step",
            "percent": None if not total else round(100.0 * n / total, 1), "rate_s_per_it": seconds(rate),
            "elapsed_s": hist[-1][0] if hist else None,
            "eta_s": t["eta_s"], "eta_low_s": t["eta_low_s"], "eta_high_s": t["eta_high_s"],
            "observed_at": t["observed_at"], "tqdm_remaining_s": None, "postfix": postfix,
            "line": steps.last_line, "history": hist[-PROGRESS_HISTORY_POINTS:], "source": "training"}


def _int(v: float | None) -> float | int | None:
    return int(v) if v is not None and float(v).is_integer() else v


def _failure_json(c: Candidate | None) -> dict | None:
    if c is None:
        return None
    return {"reason": c.reason, "message": c.message[:2000], "line": c.line, "process": c.prefix or None}


def _progress_json(t: BarTrack, bar_eta: BarEta) -> dict:
    p = t.latest
    eta_s, eta_low_s, eta_high_s = bar_eta(t.history, p.total, t.label, p.remaining_s, t.prior_s_per_item,
                                     prior_run=t.prior_run)
    return {"label": t.label, "prefix": p.prefix or None, "n": p.n, "total": p.total, "unit": p.unit,
            "percent": p.percent, "rate_s_per_it": p.rate_s_per_it, "elapsed_s": p.elapsed_s,
            "eta_s": seconds(eta_s), "eta_low_s": seconds(eta_low_s), "eta_high_s": seconds(eta_high_s),
            "observed_at": _iso(t.updated_at), "tqdm_remaining_s": p.remaining_s, "postfix": p.postfix,
            "line": t.last_line, "history": _rate_history(t)}


PROGRESS_HISTORY_POINTS = 256  # state.json stays small: the status page plots time per item from these


def _rate_history(t: BarTrack) -> list[list[float]]:
    """The current bar's [elapsed_s, n] samples (for the status page's rate plot), evenly thinned to
    at most PROGRESS_HISTORY_POINTS, first and last kept."""
    pts = _elapsed_n(t)
    if len(pts) <= PROGRESS_HISTORY_POINTS:
        return pts
    step = (len(pts) - 1) / (PROGRESS_HISTORY_POINTS - 1)
    return [pts[round(i * step)] for i in range(PROGRESS_HISTORY_POINTS)]


def _iso(ts: float | None) -> str | None:
    """The live clock time of the bar's last advance (annotate counts the time since it)."""
    return None if ts is None else utcnow_iso(ts)


def _bar_summary(t: BarTrack, include_history: bool) -> dict:
    p = t.latest
    out = {"label": t.label, "prefix": t.prefix or None, "n": p.n, "total": p.total, "elapsed_s": p.elapsed_s,
           "rate_s_per_it": p.rate_s_per_it, "first_line": t.first_line, "last_line": t.last_line,
           "observations": t.observations, "restarts": t.restarts, "finished": t.finished}
    if include_history:
        out["history"] = _elapsed_n(t)  # the same shape as progress.history
    return out


def _elapsed_n(t: BarTrack) -> list[list[float]]:
    """A bar's [elapsed_s, n] samples: THE shape of a bar's history in the state JSON."""
    return [[e, n] for n, _total, e, _rate in t.history if e is not None and n is not None]


def combine_with_exit(log_state: dict, exit_info: dict) -> dict:
    """The run's final state from its log state and jobwrap's exit.json, by the one rule
    (eaglelab.model.decide_end): the reason the log named wins over the exit status's."""
    out = dict(log_state)
    code, sig = exit_info.get("exit_code"), exit_info.get("signal")
    out["exit"] = {"exit_code": code, "signal": sig, "signal_name": exit_info.get("signal_name")}
    out.pop("suspect", None)
    out["stall"] = None
    ending = decide_end(code, sig, stop_requested=bool(exit_info.get("stop_requested")),
                        named=log_state.get("failure") or log_state.get("suspect") or exit_info.get("failure"),
                        last_line=log_state.get("last_line"), signal_name=exit_info.get("signal_name"),
                        outputs_done=bool(exit_info.get("outputs_done")))
    out.update(state=ending.state.value, failure=ending.failure)
    return out
