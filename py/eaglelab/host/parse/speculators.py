"""The speculators stages' lifecycle and metric lines, as events (speculators 0.9.0's CLI).

train:    `Training epoch 1/3 started|completed`, `Validation epoch 1/3 started|completed`,
          `Saving checkpoint to CK/0`, `Checkpoint saved to CK/0`, metric lines
          `train/loss=1.234, train/full_acc_0=0.500, profile/tokens_per_s=1.23e+04, epoch=0, lr=1.00e-04, global_step=10`
          and `val/loss_epoch=..., val/full_acc_0_epoch=..., epoch=0`.
generate-offline-data: `EAGLE Offline Data Generation`, `Processing N samples`,
          `Found N existing samples for rank R.`, `Timing: 12.3s elapsed, 4.5 samples/s, ...`,
          `Saved N new data points to DIR`, `Skipped N samples due to errors: [...]`, `Data generation complete!`.
prepare-data: `Preparing data`, `Done preparing data`, `Writing dataset to OUT`.
regenerate-responses: the `Generating responses` bar and `Pipeline complete in 12.3s: N conversations (a ok, b errors, c truncated)`.
"""

from __future__ import annotations

import re

from .events import END, METRIC, TRAIN_PLAN, Event, metric, num, phase_end, phase_start
from .training import speculators_config, train_step_events

_EPOCH_RE = re.compile(r"(?P<kind>Training|Validation) epoch (?P<e>\d+)/(?P<n>\d+) (?P<what>started|completed)")
_PROCESSING_RE = re.compile(r"^Processing (?P<n>\d+) samples")
_FOUND_RE = re.compile(r"^Found (?P<n>\d+) existing samples")
_TIMING_RE = re.compile(r"^Timing: (?P<el>[\d.]+)s elapsed, (?P<sps>[\d.]+) samples/s")
_SAVED_RE = re.compile(r"^Saved (?P<n>\d+) new data points")
_SKIPPED_RE = re.compile(r"Skipped (?P<n>\d+) samples due to errors")
_PIPELINE_RE = re.compile(r"Pipeline complete in (?P<s>[\d.]+)s: (?P<n>\d+) conversations \((?P<ok>\d+) ok, (?P<err>\d+) errors")
_COUNTERS = ("global_step", "step", "epoch")
# A metric line names something a trainer measures; `world_size=1, rank=0` (vLLM's setup) does not.
_METRIC_KEY_RE = re.compile(r"/|loss|acc|lr$|grad_norm|perplexity|tokens_per_s")
_METRIC_KEYS_RE = re.compile(_METRIC_KEY_RE.pattern, re.M)

_GATE = ("=", "epoch", "heckpoint", "Processing", "Found", "Timing", "Saved", "Skipped", "complete", "Preparing",
         "preparing", "Writing dataset", "EAGLE Offline")
_GATE_RE = re.compile("|".join(re.escape(g) for g in _GATE))


def recognize(msg: str) -> list[Event]:
    if _GATE_RE.search(msg) is None:
        return []
    if "=" in msg:
        events = _metric_line(msg)
        if events is not None:
            return events
    if "trainer/" in msg:  # the config dump: the training plan
        plan = speculators_config(msg)
        if plan:
            return plan
    m = _EPOCH_RE.search(msg)
    if m:
        name = "training" if m.group("kind") == "Training" else "validation"
        e, n = int(m.group("e")), int(m.group("n"))
        if m.group("what") == "started":
            return [phase_start(name, f"epoch {e}/{n}")] + ([Event(TRAIN_PLAN, "epochs", float(n))]
                                                            if name == "training" else [])
        out = [phase_end(name)]
        if name == "training" and e == n:
            out.append(Event(END, "done", message=msg.strip()))
        return out
    if msg.startswith("Saving checkpoint to"):
        return [phase_start("checkpointing", msg.partition(" to ")[2].strip())]
    if msg.startswith("Checkpoint saved to"):
        return [phase_end("checkpointing")]
    if "EAGLE Offline Data Generation" in msg:
        return [phase_start("data_generation_setup")]
    m = _PROCESSING_RE.match(msg)
    if m:
        return [phase_start("extracting"), metric("datagen/samples_to_process", float(m.group("n")), 0)]
    m = _FOUND_RE.match(msg)
    if m:
        return [metric("datagen/samples_existing", float(m.group("n")), 0)]
    m = _TIMING_RE.match(msg)
    if m:
        return [metric("datagen/samples_per_s", float(m.group("sps")))]
    m = _SAVED_RE.match(msg)
    if m:
        return [phase_end("extracting"), metric("datagen/samples_saved", float(m.group("n")))]
    m = _SKIPPED_RE.search(msg)
    if m:
        return [metric("datagen/samples_skipped", float(m.group("n")))]
    if "Data generation complete!" in msg:
        return [Event(END, "done", message=msg.strip())]
    m = _PIPELINE_RE.search(msg)
    if m:
        return [phase_end("generating", num(m.group("s"))),
                metric("regen/conversations_ok", float(m.group("ok"))),
                metric("regen/conversations_errors", float(m.group("err"))),
                Event(END, "done", message=msg.strip())]
    stripped = msg.strip().strip("=─━- ")
    if stripped == "Preparing data":
        return [phase_start("preparing")]
    if stripped == "Done preparing data":
        return [phase_end("preparing")]
    if stripped.startswith("Writing dataset to"):
        return [phase_start("writing_dataset")]
    return []


def _metric_line(msg: str) -> list[Event] | None:
    """Events for a line made only of k=v pairs (', ' or spaces between), None for any other line."""
    pairs: dict[str, float] = {}
    for item in msg.replace(",", " ").split():
        k, eq, v = item.partition("=")
        if not eq or not k or not (k[0].isalpha() or k[0] == "_"):
            return None
        try:
            pairs[k] = float(v)
        except ValueError:
            if v[:1] in ("'", '"'):
                continue  # a string value (speculators prints them with repr)
            return None
    # Keys hold no whitespace: one search over them all, one per line (`lr$` per line with re.M).
    if len(pairs) < 2 or _METRIC_KEYS_RE.search("\n".join(pairs)) is None:
        return None
    step = pairs.get("global_step", pairs.get("step"))
    if step is None and "epoch" in pairs and any(k.startswith("val/") for k in pairs):
        step = pairs["epoch"]
    return [Event(METRIC, k, v, step) for k, v in pairs.items() if k not in _COUNTERS] + train_step_events(pairs)


BAR_PHASES = {"Generating responses": "generating"}
