"""The demo's train stage on CPU with its tensor memory measured, for the planner's calibration (issue 28).

    .venv/bin/python bench/measure_demo_train.py --root DIR [--epochs 2]
    # DIR holds model/ prepared/ hidden_states/ vocab/: tests/foresight_data.py's build(DIR, 64, 160)
    # makes the demo's data there (64 samples, 13,451 tokens, as `make demo`)

Runs `eaglelab.stages.train` unchanged, in this process, with the demo profile's arguments (seq_length
1024, draft vocabulary 128, 3 TTT steps, the acceptance estimate after each epoch) under torch's profiler
with `profile_memory`: every CPU allocation and free is an event, so their running sum's peak is the most
tensor memory live at once (what `torch.cuda.max_memory_allocated` says on a GPU). The peak RSS above the
process's before the stage is written beside it, for the record (the runtime's own memory is in it).
Writes bench/results/demo_train_cpu.json, which bench/bench_plan.py compares with the planner.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "py"))


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2 ** 20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seq-length", type=int, default=1024)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "demo_train_cpu.json")
    a = ap.parse_args()
    import speculators.train.trainer as trainer
    import torch
    from torch.profiler import ProfilerActivity, profile

    from eaglelab.stages import train

    steps: list[int] = []
    original_profile = trainer._StepTimer.profile

    def step_profile(self, num_tokens):
        steps.append(int(num_tokens))
        return original_profile(self, num_tokens)

    trainer._StepTimer.profile = step_profile
    from torch.profiler import record_function

    from eaglelab.stages import acceptance

    def labelled(name, fn):
        def wrapper(*args, **kw):
            with record_function(f"phase:{name}"):
                return fn(*args, **kw)
        return wrapper

    trainer.Trainer.setup_model = labelled("setup", trainer.Trainer.setup_model)
    trainer.Trainer.train_epoch = labelled("steps", trainer.Trainer.train_epoch)
    trainer.Trainer.val_epoch = labelled("validation", trainer.Trainer.val_epoch)
    acceptance.estimate_checkpoint = labelled("estimate", acceptance.estimate_checkpoint)
    argv = ["--model", str(a.root / "model"), "--data", str(a.root / "prepared"),
            "--hidden-states", str(a.root / "hidden_states"), "--vocab", str(a.root / "vocab"),
            "--out", str(a.root / "checkpoints_measure"), "--aux-layers", "1 2 3", "--draft-vocab-size", "128",
            "--epochs", str(a.epochs), "--lr", "3e-3", "--loss-fn", "ce", "--total-seq-len", str(a.seq_length),
            "--device", "cpu", "--acceptance-k", "3", "--seed", "42"]
    import shutil
    shutil.rmtree(a.root / "checkpoints_measure", ignore_errors=True)  # else the stage skips: done
    rss0 = rss_mib()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        train.main(argv, standalone_mode=False)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    events = prof.profiler.kineto_results.events()
    windows = [(e.name().split(":", 1)[1], e.start_ns(), e.end_ns()) for e in events if e.name().startswith("phase:")]
    live = peak = 0
    phases: dict[str, dict] = {}
    for t, n in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        live += n
        peak = max(peak, live)
        for name, t0, t1 in windows:
            if t0 <= t <= t1:
                ph = phases.setdefault(name, {"peak_mib": 0.0})
                ph["peak_mib"] = max(ph["peak_mib"], live / 2 ** 20)
    config = json.loads((a.root / "model" / "config.json").read_text())
    rec = {"measure": "torch profiler, peak live CPU tensor bytes", "measured_mib": peak / 2 ** 20,
           "phases": phases, "max_tokens": max(steps) if steps else a.seq_length, "steps_tokens": steps, "draft_vocab": 128,
           "epochs": a.epochs, "seq_length": a.seq_length, "rss_before_mib": rss0, "peak_rss_mib": peak_rss,
           "torch": torch.__version__, "config": config,
           "note": "make demo's data (64 samples); the stage's own argv as the demo profile gives it, 2 epochs"}
    a.out.write_text(json.dumps(rec, indent=1))
    print(json.dumps({k: v for k, v in rec.items() if k not in ("config", "steps_tokens")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
