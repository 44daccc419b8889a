"""vLLM's own speculative-decoding counters (`vllm:spec_decode_*_total` on /metrics), read and differenced.

Its own module, away from the eval: synth, the serving smoke and the engine check read the same counters,
and a stage's code fingerprint follows what it imports (eaglelab.control.stage_code), so synth's should
not change with the eval's code.
"""

from __future__ import annotations

SPEC_COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "accepted"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def parse_spec_metrics(text: str) -> dict:
    """spec_decode counters from a Prometheus exposition (summed over engines) (pure)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_pos": {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.endswith("_total"):
                continue
            base = s.name[: -len("_total")]
            if base in SPEC_COUNTERS:
                out[SPEC_COUNTERS[base]] += s.value
            elif base == PER_POS:
                pos = int(s.labels.get("position", 0))
                out["per_pos"][pos] = out["per_pos"].get(pos, 0.0) + s.value
    return out


def spec_stats(before: dict, after: dict) -> dict:
    """Acceptance figures from two counter snapshots (pure)."""
    drafts = after["drafts"] - before["drafts"]
    draft_tokens = after["draft_tokens"] - before["draft_tokens"]
    accepted = after["accepted"] - before["accepted"]
    positions = sorted(after["per_pos"])
    per_pos = [(after["per_pos"][p] - before["per_pos"].get(p, 0.0)) / drafts if drafts else 0.0 for p in positions]
    return {"drafts": int(drafts), "draft_tokens": int(draft_tokens), "accepted_tokens": int(accepted),
            "acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0,
            "per_position_acceptance": per_pos}
