"""Run the train stage (eaglelab.stages.train, unchanged) in this process with its phases measured.

    python bench/train_probe.py RECORD.json -- <the train stage's arguments>

Wraps speculators' Trainer and the acceptance hook from outside, so the stage's own code runs as the
pipeline runs it. Per phase (setup, each epoch's steps, checkpoint save, acceptance estimate,
validation): wall seconds, peak allocated and reserved GiB (peak stats reset at the phase's start),
allocated/reserved before and after, and the device's used memory after (cudaMemGetInfo: the CUDA
context and anything else on the GPU included). Per logged step: speculators' own step profile
(step_ms, tokens_per_s). The record is rewritten after every phase, so a crash keeps what came before
it, and names the phase it crashed in.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

GIB = 2**30


def main() -> int:
    record_path = Path(sys.argv[1])
    args = sys.argv[sys.argv.index("--") + 1:]
    import speculators.train.trainer as trainer
    import torch

    from eaglelab.stages import acceptance, train

    rec: dict = {"argv": args, "phases": [], "steps": [], "torch": torch.__version__, "error": None}
    state = {"epoch": None}

    def save():
        record_path.write_text(json.dumps(rec, indent=1))

    def mem() -> dict:
        free, total = torch.cuda.mem_get_info()
        return {"allocated": torch.cuda.memory_allocated() / GIB, "reserved": torch.cuda.memory_reserved() / GIB,
                "device_used": (total - free) / GIB}

    def measured(name, fn):
        def wrapper(*a, **k):
            if name == "steps":  # train_epoch(self, epoch): label the phase before it runs
                state["epoch"] = a[1] if len(a) > 1 else k.get("epoch")
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before, t0 = mem(), time.perf_counter()
            entry = {"phase": name, "epoch": state["epoch"], "before": before}
            rec["phases"].append(entry)
            try:
                return fn(*a, **k)
            except BaseException as e:
                entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                raise
            finally:
                torch.cuda.synchronize()
                entry.update(seconds=round(time.perf_counter() - t0, 2), after=mem(),
                             peak_allocated=torch.cuda.max_memory_allocated() / GIB,
                             peak_reserved=torch.cuda.max_memory_reserved() / GIB)
                save()
        return wrapper

    original_epoch = trainer.Trainer.train_epoch

    def train_epoch(self, epoch, *a, **k):
        state["epoch"] = epoch
        return original_epoch(self, epoch, *a, **k)

    trainer.Trainer.setup_model = measured("setup", trainer.Trainer.setup_model)
    trainer.Trainer.train_epoch = measured("steps", train_epoch)
    # wrapped before the acceptance hook wraps it: this phase is the save alone
    trainer.Trainer.maybe_save_checkpoint = measured("checkpoint_save", trainer.Trainer.maybe_save_checkpoint)
    trainer.Trainer.val_epoch = measured("validation", trainer.Trainer.val_epoch)
    acceptance.estimate_checkpoint = measured("estimate", acceptance.estimate_checkpoint)
    original_profile = trainer._StepTimer.profile

    def profile(self, num_tokens):
        p = original_profile(self, num_tokens)
        if p:
            rec["steps"].append({"epoch": state["epoch"], "tokens": num_tokens, "step_ms": round(p["step_ms"], 1),
                                 "tokens_per_s": round(p["tokens_per_s"], 1)})
        return p

    trainer._StepTimer.profile = profile
    t0 = time.perf_counter()
    rc = 0
    try:
        train.main(args, standalone_mode=False)
    except BaseException as e:  # noqa: BLE001 - recorded, then the exit code says it
        rec["error"] = f"{type(e).__name__}: {str(e)[:500]}"
        traceback.print_exc()
        rc = 1
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    import torch._dynamo.config as dynamo
    rec["recompile_limit"] = dynamo.recompile_limit
    save()
    return rc


if __name__ == "__main__":
    sys.exit(main())
