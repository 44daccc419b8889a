"""The target's own word on tokens a server emitted: a transformers forward pass in float32 over the
prompt and the tokens, independent of vLLM's logprobs (tests of the output probe,
eaglelab.stages.output_probe)."""

from __future__ import annotations

from pathlib import Path


def argmax_share(model_dir: Path, requests: list[dict]) -> float:
    """Of the generated tokens, the share that is the target's argmax after its prompt and the tokens before
    it: ~1 for a server that samples near-greedily as it should (T=0.01), far below for one that does not."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()
    hit = total = 0
    for r in requests:
        prompt, out = r["prompt_token_ids"], r["token_ids"]
        assert prompt and out, r  # the probe keeps both (return_token_ids)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out])).logits[0]
        pred = logits[len(prompt) - 1:-1].argmax(-1)
        hit += int((pred == torch.tensor(out)).sum())
        total += len(out)
    return hit / total
