"""The offline forecast on the rows the eval serves: its prompts, answered greedily and sampled (#30 item 3).

The train hook estimates on synth's held-out rows. The demo's synth is greedy, so those rows are the
target's greedy path, while a sampled eval verifies drafts on the target's sampled path. This bench
answers the eval's prompts with the target itself (transformers, on CPU), greedily and sampled at the
eval's temperature and top-p (seeded), takes the target's hidden states of those rows as extract does,
and runs the same estimate (eaglelab.stages.acceptance.estimate) over them with a checkpoint: the greedy
chain on the greedy answers, the sampled chain on the sampled answers (`--draws` answers per prompt).
Beside each, the eval's served figures (data/demo/eval/report.json). Reads only.

    .venv/bin/python bench/bench_sampled_rows.py DEMO_DIR [--epoch 5] [--draws 4] [--seed 0] [--aux-layers '1 2 3']
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "py"))

from eaglelab.stages import acceptance, extract


def rows_as_samples(model, rows: list[tuple[list[int], int]], aux_layers: list[int]):
    """(index, sample) as speculators' dataset yields them (shift_batch applied): the target's aux-layer
    hidden states, its pre-norm last layer, the answer's tokens supervised."""
    import torch
    from speculators.models.eagle3.data import shift_batch

    for i, (ids, prompt_len) in enumerate(rows):
        hs = extract.forward_hidden_states(model, [ids], aux_layers)[0]  # [seq, n_aux + 1, hidden]
        seq = len(ids)
        mask = torch.zeros(seq, dtype=torch.long)
        mask[prompt_len:] = 1
        yield i, shift_batch({"input_ids": torch.tensor(ids), "hidden_states": hs[:, :-1].reshape(seq, -1),
                              "verifier_last_hidden_states": hs[:, -1], "loss_mask": mask,
                              "lengths": torch.tensor([seq]), "position_ids": torch.arange(seq)})


def answers(model, tok, prompts: list[dict], max_tokens: int, temperature: float, top_p: float, draws: int,
            seed: int) -> list[tuple[list[int], int]]:
    """(prompt + answer ids, prompt length) per prompt and draw; greedy when temperature is 0."""
    import torch

    out = []
    for p in prompts:
        ids = tok.apply_chat_template(p["messages"], add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"]
        for d in range(draws if temperature > 0 else 1):
            torch.manual_seed(seed + d)
            with torch.no_grad():
                kw = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 else \
                    dict(do_sample=False)
                g = model.generate(ids, max_new_tokens=max_tokens, pad_token_id=tok.pad_token_id, **kw)
            out.append((g[0].tolist(), ids.shape[1]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("demo_dir", type=Path, help="where `make demo` ran (holds data/demo)")
    ap.add_argument("--epoch", type=int, default=None, help="the checkpoint (default: the last)")
    ap.add_argument("--draws", type=int, default=4, help="sampled answers per eval prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--aux-layers", default="1 2 3", help="as extract took them (the demo's aux_layers)")
    args = ap.parse_args()
    os.chdir(args.demo_dir.resolve())  # the checkpoints name their verifier relative to the lab
    d = Path("data") / "demo"
    report = json.loads((d / "eval" / "report.json").read_text())
    sp = (report["settings"].get("sampled") or [{}])[0]
    temp, top_p = float(sp.get("temperature", 1.0)), float(sp.get("top_p", 1.0))
    max_tokens = int(report["settings"].get("max_tokens") or 64)
    epoch = args.epoch if args.epoch is not None else max(
        int(p.name) for p in (d / "checkpoints").iterdir() if p.name.isdigit())
    drafter = acceptance.load_checkpoint(d / "checkpoints" / str(epoch))
    aux = [int(x) for x in args.aux_layers.split()]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d / "model")
    model = extract.load_hf_model(d / "model", "cpu")
    lm_head = acceptance.verifier_lm_head(d / "model", "cpu")
    prompts = [json.loads(x) for x in (d / "eval_prompts.jsonl").read_text().splitlines() if x.strip()]
    at = report["decided_at"]["concurrency"]
    served = {(r["sampling"], r["concurrency"]): r["spec"]["acceptance_rate"] for r in report["sweep"]}
    print(f"{args.demo_dir} checkpoint {epoch}: {len(prompts)} eval prompts, {max_tokens} tokens, aux layers {aux}, "
          f"sampled at T={temp:g}, top-p {top_p:g}")
    for label, t, draws in (("greedy answers", 0.0, 1), ("sampled answers", temp, args.draws)):
        rows = answers(model, tok, prompts, max_tokens, t, top_p, draws, args.seed)
        doc = acceptance.estimate(drafter, lm_head, rows_as_samples(model, rows, aux), 3, temp, top_p)
        ch, sd = doc["chain"], doc["sampled"]
        print(f"  {label} ({len(rows)} rows): greedy chain {ch['acceptance_rate']:.1%} / {ch['mean_acceptance_length']:.3f}"
              f" (served greedy c={at}: {served.get(('greedy', at), float('nan')):.1%}); sampled chain "
              f"{sd['acceptance_rate']:.2%} / {sd['mean_acceptance_length']:.3f} (served sampled c={at}: "
              f"{served.get(('sampled', at), float('nan')):.2%})")


if __name__ == "__main__":
    main()
