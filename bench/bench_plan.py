"""The planner (`lab plan --offline`, eaglelab.sizing) against real figures (issue 28, item 3).

    .venv/bin/python bench/bench_plan.py            # the table (docs/planning.md holds a copy)
    .venv/bin/python bench/bench_plan.py --check    # exit 1 when a row is outside its tolerance

Rows:
- the kimi-k2.5 profile's plan (with conf/facts/kimi-k2.5.yaml) against the seeds' own stage
  figures (../shared/seeds/): time and disk within +-35%;
- the drafter's training memory by arithmetic against the train stage measured at Kimi-K2.5's size on
  an H200 (issue 29, bench/results/gpu_train_real_h200.json; the planner is given the largest step's
  tokens): peak allocated and reserved within +-25%;
- the demo's training memory against the real train stage on CPU (bench/results/demo_train_cpu.json,
  made by bench/measure_demo_train.py), when that file is there.
Which planner figures come from the seeds themselves (a prior set from them) is said per row: only
those marked "independent" test the planner's arithmetic.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "py"))

from eaglelab import config
from eaglelab.control.pipeline import fit
from eaglelab.sizing import facts as facts_mod
from eaglelab.sizing import memory

GIB = 2 ** 30
# The seeds' figures (../shared/seeds/000_*.txt, 003_*.txt): what a real run of this lab took.
SEEDS = {
    "synth": (5.3 * 3600, "s", "10,000 traces in ~5.3 h"),
    "load": (22.5 * 60, "s", "the 547 GB load: 22.5 min measured (its later loads: 45-60 min)"),
    "extract": (3.8 * 3600, "s", "10,000 samples in ~3.8 h"),
    "hidden states": (828e9, "B", "828 GB of hidden states"),
    "train": (2.6 * 3600, "s", "10 epochs on one GPU in ~2.6 h"),
}


def _row(what, planned, measured, unit, tol, source, independent, note=""):
    dev = planned / measured - 1
    return {"what": what, "planned": planned, "measured": measured, "unit": unit, "deviation": dev,
            "tolerance": tol, "ok": abs(dev) <= tol, "planner_source": source, "independent": independent,
            "note": note}


def kimi_rows() -> list[dict]:
    p = fit.make_fit_plan(config.load(None, "kimi-k2.5"))
    by = {e.stage: e for e in p.stages}
    rows = []
    for what, stage, dep in (("synth", "synth", False), ("load", "serve_extract", False),
                             ("extract", "extract", False), ("train", "train", True)):
        e = by[stage]
        rows.append(_row(what, e.seconds.value / 3600, SEEDS[what][0] / 3600, "h", 0.35, e.seconds.source, dep,
                         SEEDS[what][2]))
    hs = by["extract"].disk_bytes
    rows.append(_row("hidden states", hs.value / 1e9, SEEDS["hidden states"][0] / 1e9, "GB", 0.35, hs.source, False,
                     "tokens a sample (1,440) is a prior set from this very figure"))
    return rows


def measured_train_rows(m, runs: list[dict], name: str) -> list[dict]:
    """Steps (allocated, reserved) and the estimate of each measured length against the planner's arithmetic,
    given the largest step's tokens."""
    rows = []
    for r in sorted(runs, key=lambda r: int(r["length"])):
        tokens = max(s["tokens"] for s in r["record"]["steps"])
        got = memory.train_phases(m, 32000, tokens)
        ph = r["summary"]["phases"]
        label = f"{name} {r['length']:,} ({tokens:,} tokens)"
        rows.append(_row(f"{label}: steps, peak allocated", got["steps"], ph["steps"]["peak_allocated"], "GiB",
                         0.25, "arithmetic", True))
        rows.append(_row(f"{label}: steps, peak reserved", got["steps"] * memory.RESERVED_FACTOR,
                         max(ph["steps"]["peak_reserved"], ph["steps_first_epoch"]["peak_reserved"]), "GiB", 0.25,
                         "arithmetic x 1.15", True))
        rows.append(_row(f"{label}: acceptance estimate, peak allocated", got["estimate"],
                         ph["estimate"]["peak_allocated"], "GiB", 0.25, "arithmetic", True))
    return rows


def h200_rows() -> list[dict]:
    m = facts_mod.load_facts(REPO / "conf" / "facts" / "kimi-k2.5.yaml").model
    runs = json.loads((REPO / "bench" / "results" / "gpu_train_real_h200.json").read_text())
    # "full" measured the same to the MiB as "pilot" at 18,432
    rows = measured_train_rows(m, [r for r in runs if "summary" in r and r["run"] == "pilot"], "H200 train")
    rest = memory.train_phases(m, 32000, 0)["rest"]
    rows.insert(0, _row("H200 train: at rest (params, grads, optimizer, frozen)", rest, 11.556, "GiB", 0.25,
                        "arithmetic", True))
    return rows


def remote_config_rows() -> list[dict]:
    """Kimi-K2.5 as its own config class builds the drafter (--shape kimi_remote: no head_dim, so 7168 / 64 =
    112-wide heads; issue 29 item 5), the full train's argv, on the H200
    (bench/results/gpu_train_real_h200_kimi_remote.json). The planner is given head_dim 112; not tuned on."""
    path = REPO / "bench" / "results" / "gpu_train_real_h200_kimi_remote.json"
    if not path.is_file():
        return []
    m = replace(facts_mod.load_facts(REPO / "conf" / "facts" / "kimi-k2.5.yaml").model, head_dim=0)  # 7168 // 64
    runs = [r for r in json.loads(path.read_text()) if "summary" in r]
    rows = measured_train_rows(m, runs, "H200 train, Kimi's own config class (head 112)")
    rest = memory.train_phases(m, 32000, 0)["rest"]
    at_rest = [e["gpu_memory_gib"]["allocated_before"] for r in runs for e in r.get("estimates") or []]
    if at_rest:  # allocated when the estimate starts, between steps: parameters, grads, optimizer, frozen
        rows.insert(0, _row("H200 train, Kimi's own config class: at rest (params, grads, optimizer, frozen)", rest,
                            max(at_rest), "GiB", 0.25, "arithmetic", True))
    return rows


# the dense verifier bench/gpu_train_real.py builds for --shape llama8b (Llama-3-8B-like)
LLAMA8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
           "torch_dtype": "bfloat16"}


def dense_rows() -> list[dict]:
    """The second shape (issue 29 item 1): a dense Llama-3-8B-like verifier, the full train's argv, on the
    H200 (bench/results/gpu_train_real_h200_llama8b.json). Measured after the planner was written; not tuned on."""
    path = REPO / "bench" / "results" / "gpu_train_real_h200_llama8b.json"
    if not path.is_file():
        return []
    runs = [r for r in json.loads(path.read_text()) if "summary" in r]
    return measured_train_rows(facts_mod.from_config_json(LLAMA8B), runs, "H200 dense (Llama-3-8B-like) train")


def demo_rows() -> list[dict]:
    path = REPO / "bench" / "results" / "demo_train_cpu.json"
    if not path.is_file():
        return []
    d = json.loads(path.read_text())
    m = facts_mod.from_config_json(d["config"])
    got = memory.train_phases(m, d["draft_vocab"], d["max_tokens"], attention="sdpa")  # the stage's CPU choice
    label = f"demo train on CPU ({d['max_tokens']:,} tokens)"
    rows = [_row(f"{label}: peak tensor memory", max(got["steps"], got["estimate"]) * 1024, d["measured_mib"],
                 "MiB", 0.25, "arithmetic (sdpa's scores kept)", True)]
    if "estimate" in d.get("phases", {}):
        rows.append(_row(f"{label}: acceptance estimate", got["estimate"] * 1024, d["phases"]["estimate"]["peak_mib"],
                         "MiB", 0.25, "arithmetic", True))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a row is outside its tolerance")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = kimi_rows() + h200_rows() + remote_config_rows() + dense_rows() + demo_rows()
    if a.json:
        print(json.dumps({"rows": rows}, indent=1))
    else:
        print("| figure | planner | real | deviation | within | planner's source | independent of the real figure |")
        print("|---|---:|---:|---:|---|---|---|")
        for r in rows:
            print(f"| {r['what']} | {r['planned']:,.2f} {r['unit']} | {r['measured']:,.2f} {r['unit']} | "
                  f"{r['deviation']:+.0%} | {'yes' if r['ok'] else 'NO'} (±{r['tolerance']:.0%}) | "
                  f"{r['planner_source']} | {'yes' if r['independent'] else 'no: ' + (r['note'] or 'a prior from it')} |")
    return 1 if a.check and not all(r["ok"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
