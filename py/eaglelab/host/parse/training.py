"""Where training is, in optimizer steps, from what trainers log: the stage's main progress when no
tqdm bar shows it (speculators logs metric lines, its Rich bar reaches the file only at an
epoch's end) or when a short sub-bar (checkpoint shards written) is the last bar seen.

Read from the recognizers' TRAIN_STEP / TRAIN_PLAN events:
  speculators  `... epoch=0, lr=..., global_step=10` (logged before the step counter moves on: 11
               steps done), `Training epoch 2/6 started` (6 epochs), the config dump's
               `trainer/max_steps=30` and `trainer/epochs=1`;
  eaglelab     `train: plan: 6 epochs x 12 steps per epoch` (the train stage, before step 0);
  HF Trainer   `Num Epochs = 3`, `Total optimization steps = 500` (its tqdm bar is the steps);
  Lightning    its `Epoch 3: 45%| | 45/100 [...]` bars (steps of an epoch, per epoch).
Steps per epoch not announced are learned when the second epoch starts. Total steps: epochs x
steps per epoch, capped by max_steps (either alone when the other is unknown). The history is in
the bar book's shape (n, total, elapsed_s, None), so the one bar estimator (eaglelab.eta.bar_eta)
gives its ETA; its clock is the log's own timestamps where the lines carry them, else the time
each line was read (live tailing).
"""

from __future__ import annotations

import re

from .events import TRAIN_PLAN, TRAIN_STEP, Event

MAX_HISTORY = 2048
LABEL = "training steps"

GATE = ("Num Epochs = ", "Total optimization steps = ", "Max steps = ", "plan: ")  # for the prefilter
_PLAN_RE = re.compile(r"plan: (?P<e>\d+) epochs x (?P<s>\d+) steps per epoch(?:, at most (?P<m>\d+) steps)?")
_HF_RE = re.compile(r"^\s*(?P<what>Num Epochs|Total optimization steps|Max steps) = (?P<n>[\d,]+)\s*$")
_HF_KEYS = {"Num Epochs": "epochs", "Total optimization steps": "total_steps", "Max steps": "max_steps"}
_SPEC_CONF_RE = re.compile(r"trainer/(?P<k>max_steps|epochs)=(?P<v>\d+)")
EPOCH_BAR_RE = re.compile(r"^Epoch (?P<e>\d+)$")  # Lightning's and speculators' per-epoch bars


def recognize(msg: str) -> list[Event]:
    """Training plans announced in words (eaglelab's plan line, HF Trainer's banner)."""
    if " = " in msg:
        m = _HF_RE.match(msg)
        if m:
            return [Event(TRAIN_PLAN, _HF_KEYS[m.group("what")], float(m.group("n").replace(",", "")))]
    if "plan: " in msg:
        m = _PLAN_RE.search(msg)
        if m:
            return [Event(TRAIN_PLAN, "epochs", float(m.group("e"))),
                    Event(TRAIN_PLAN, "steps_per_epoch", float(m.group("s")))] + (
                [Event(TRAIN_PLAN, "max_steps", float(m.group("m")))] if m.group("m") else [])
    return []


def speculators_config(msg: str) -> list[Event]:
    """`trainer/max_steps=30`, `trainer/epochs=1` from speculators' config dump (a wrapped line)."""
    return [Event(TRAIN_PLAN, m.group("k"), float(m.group("v"))) for m in _SPEC_CONF_RE.finditer(msg)]


class TrainingSteps:
    """Steps done, epochs, the plan, and the (n, total, elapsed_s, None) history of the steps."""

    def __init__(self) -> None:
        self.step: float | None = None          # optimizer steps done
        self.epoch: int | None = None           # 0-based epoch the last step was in
        self.epochs: int | None = None
        self.steps_per_epoch: int | None = None
        self.max_steps: int | None = None
        self.announced_total: int | None = None  # HF's "Total optimization steps"
        self.history: list[tuple] = []
        self.last_line: int | None = None
        self.updated_at: float | None = None
        self._epoch_start_step: dict[int, float] = {}
        self._t0: float | None = None
        self._clock: str | None = None          # the clock's kind, fixed at the first step
        self._epoch_end: dict[int, float] = {}  # epoch -> its bar's last elapsed
        self.ended = False                      # the trainer said training is over
        self.source: str | None = None          # "steps" (metric lines) or "epoch bars": the first wins

    def plan(self, key: str, value: float) -> None:
        v = int(value)
        if key == "epochs":
            self.epochs = v
        elif key == "steps_per_epoch":
            self.steps_per_epoch = v
        elif key == "max_steps":
            self.max_steps = v or None
        elif key == "total_steps":
            self.announced_total = v

    @property
    def total(self) -> int | None:
        if self.announced_total:
            return self.announced_total
        planned = self.epochs * self.steps_per_epoch if self.epochs and self.steps_per_epoch else None
        if planned and self.max_steps:
            return min(planned, self.max_steps)
        return planned or self.max_steps

    @property
    def finished(self) -> bool:
        return self.ended or self.step is not None and self.total is not None and self.step >= self.total

    def observe(self, done: float, epoch: int | None, line: int, clock: tuple[str, float] | None,
                now: float | None) -> None:
        """`done` steps done; clock: (kind, seconds): the log's timestamp ("log"), the time the line
        was read ("read") or the epoch bars' elapsed ("bar"); one kind is kept from the first step."""
        if self.step is not None and done < self.step:
            self.history.clear()  # a rerun from an earlier step (a resume): its own pace
            self._t0 = None
        if epoch is not None:
            if epoch not in self._epoch_start_step:
                self._epoch_start_step[epoch] = done - 1
                if epoch >= 1 and (epoch - 1) in self._epoch_start_step and not self.steps_per_epoch:
                    # the first step of a new epoch: the previous one had this many
                    self.steps_per_epoch = int(round(done - 1 - self._epoch_start_step[epoch - 1])) or None
            self.epoch = epoch
        if self._clock is None and clock is not None:
            self._clock = clock[0]
        elapsed = None
        if clock is not None and clock[0] == self._clock:
            if self._t0 is None:
                self._t0 = clock[1]
            elapsed = clock[1] - self._t0
        self.step = done
        self.last_line = line
        if now is not None:
            self.updated_at = now
        self.history.append((done, self.total, elapsed, None))
        if len(self.history) > MAX_HISTORY:
            self.history = self.history[::2]

    def epoch_bar(self, epoch: int, n: float, total: float | None, elapsed: float | None, line: int,
                  now: float | None) -> None:
        """A per-epoch bar (`Epoch 3`: n of total steps): steps done = epoch x total + n, clocked by
        the bars' own elapsed (each epoch's added to the ones before)."""
        if not total:
            return
        self.source = "epoch bars"
        self.steps_per_epoch = int(total)
        clock = None
        if elapsed is not None:
            self._epoch_end[epoch] = elapsed
            clock = ("bar", sum(v for e, v in self._epoch_end.items() if e < epoch) + elapsed)
        self.observe(epoch * total + n, epoch, line, clock, now)

    def summary(self) -> dict:
        return {"source": self.source, "step": self.step, "total_steps": self.total, "epoch": self.epoch, "epochs": self.epochs,
                "steps_per_epoch": self.steps_per_epoch, "max_steps": self.max_steps, "line": self.last_line}


def train_step_events(pairs: dict[str, float]) -> list[Event]:
    """speculators' global_step (logged before it is incremented) as steps done, with its epoch.
    The train stage's own `acceptance/...=..., global_step=N` line is written after an epoch's last
    step, when the counter already says N steps are done."""
    gs = pairs.get("global_step")
    if gs is None:
        return []
    epoch = pairs.get("epoch")
    done = gs if any(k.startswith("acceptance/") for k in pairs) else gs + 1.0
    return [Event(TRAIN_STEP, "", done, None if epoch is None else float(epoch))]
