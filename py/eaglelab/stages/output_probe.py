"""Does the engine still sample its target's distribution? Ask it, and read its own logprobs.

Speculative decoding must not change what is generated: greedy outputs stay token for token, sampled
ones keep the target's distribution. An engine whose drafting path breaks sampling (vLLM 0.32.0 on CPU
with an EAGLE-3 drafter: docs/foresight.md, "The output probe") writes rows that are not the target's
and serves sampled acceptance figures that say nothing about the drafter. Counting acceptance cannot
see that; the target's own probabilities can, and vLLM returns them with every token it emits
(`logprobs`, computed from the target's logits at that position, raw: before temperature and top-p).

A few short requests (`settings`: near-greedy T=0.01, and the serving temperature/top-p), each token's
logprob and the top-20 beside it (`return_tokens_as_token_ids`, so two tokens that decode alike stay
apart), and one question per token: could a correct sampler have drawn it? `impossible` says no when

- its tempered probability is below e^-20 of the top token's (`RATIO_NATS`): over a 163,840-token
  vocabulary all such tokens together hold < 4e-4 of the mass, so a correct engine all but never emits
  one; at T=0.01 that is any token 0.2 nats below the top one, and
- for top-p < 1 at T <= 1, the tokens ranked above it already hold top_p of the tempered mass (vLLM's
  top-p keeps a token only while the mass above it is below top_p), by a lower bound on that mass
  from the listed top-k (the unlisted rest bounded by R * p_k^(1/T - 1), R their raw mass, p_k the
  smallest listed probability).

A correct engine scores ~0% on both settings (the baseline server, without a drafter, is the control);
the CPU build's EAGLE-3 path scores 98% at T=0.01 (docs/foresight.md). Pure except `request_tokens`.

    python -m eaglelab.stages.output_probe --endpoint http://127.0.0.1:8102 --model data/demo/model \
        --prompts data/demo/eval_prompts.jsonl --temperature 1.0 --top-p 0.95
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click

from . import eval_bench

NEAR_GREEDY_T = 0.01   # through the sampling path, as near greedy as a float allows: one token is right
RATIO_NATS = 20.0      # tempered odds against the top token beyond e^-20: no correct sampler draws it
NUCLEUS_SLACK = 1e-3   # float rounding between the engine's probabilities and ours from its logprobs
TOP_LOGPROBS = 20      # vLLM's default max_logprobs
MAX_SHARE = 0.02       # above this share of impossible tokens: the engine's sampling is broken
MIN_TOKENS = 50        # fewer tokens judged: no verdict
EXAMPLES = 3           # impossible tokens kept in the record, to show


def token_id(key: str) -> int:
    """vLLM's `token_id:123` (return_tokens_as_token_ids) as 123."""
    return int(str(key).rsplit(":", 1)[-1])


def impossible(logprob: float, rivals: dict[int, float], temperature: float, top_p: float) -> bool:
    """Could a correct sampler at `temperature`/`top_p` not have drawn a token of raw `logprob`, given the
    raw logprobs of the tokens listed beside it (its own entry may be among them)? (pure)"""
    t = max(temperature, 1e-6)
    listed = sorted(rivals.values(), reverse=True)
    if listed and (listed[0] - logprob) / t > RATIO_NATS:
        return True
    if top_p >= 1.0 or t > 1.0 or not listed:
        return False
    top = listed[0]
    weights = [math.exp((lp - top) / t) for lp in listed]  # p^(1/T), scaled by p_top^(-1/T)
    rest_raw = max(0.0, 1.0 - sum(math.exp(lp) for lp in listed))
    smallest = listed[-1]
    # the unlisted tokens: raw mass rest_raw, each <= p_k, so sum p^(1/T) <= rest_raw * p_k^(1/T - 1)
    rest = rest_raw * math.exp((smallest - top) / t) / math.exp(smallest) if rest_raw else 0.0
    above = sum(w for lp, w in zip(listed, weights) if lp > logprob)
    return above / (sum(weights) + rest) >= top_p + NUCLEUS_SLACK


def judge(tokens: list[tuple[int, float, dict[int, float]]], temperature: float, top_p: float) -> dict:
    """One setting's tokens (id, raw logprob, listed rivals) -> the count of impossible ones (pure)."""
    bad = [(tid, lp, max(r.values())) for tid, lp, r in tokens if impossible(lp, r, temperature, top_p)]
    n = len(tokens)
    return {"temperature": temperature, "top_p": top_p, "tokens": n, "impossible": len(bad),
            "share": len(bad) / n if n else None,
            "examples": [{"token": tid, "logprob": round(lp, 2), "top_logprob": round(top, 2)}
                         for tid, lp, top in bad[:EXAMPLES]]}


def settings_for(temperature: float, top_p: float) -> list[tuple[str, float, float]]:
    """The probe's settings (pure): near-greedy always; the serving sampling when it is sampled."""
    out = [("near_greedy", NEAR_GREEDY_T, 1.0)]
    if temperature > 0 and (temperature, top_p) != (NEAR_GREEDY_T, 1.0):
        out.append(("serving", temperature, top_p))
    return out


def verdict(settings: list[dict], max_share: float = MAX_SHARE, min_tokens: int = MIN_TOKENS) -> dict:
    """`fault`: some setting's impossible share is above max_share over at least min_tokens (pure)."""
    judged = [s for s in settings if s["tokens"] >= min_tokens]
    worst = max(judged, key=lambda s: s["share"], default=None)
    fault = bool(worst and worst["share"] > max_share)
    return {"fault": fault, "max_share": max_share, "judged": len(judged),
            "worst": {"name": worst["name"], "share": worst["share"], "tokens": worst["tokens"]} if worst else None}


def figures(probe: dict) -> str:
    """The impossible tokens per setting, e.g. `93/128 (73%) at T=0.01; 82/128 (64%) at T=1, top-p 0.95`."""
    return "; ".join(f"{s['impossible']}/{s['tokens']} ({s['share']:.0%}) at T={s['temperature']:g}"
                     + (f", top-p {s['top_p']:g}" if s["top_p"] < 1 else "")
                     for s in probe["settings"] if s["tokens"]) or "no token judged"


def words(probe: dict, server: str = "vLLM") -> str:
    """The probe in a sentence."""
    head = (f"{server} emits tokens its own target ranks impossible" if probe["verdict"]["fault"]
            else f"{server} samples its target's distribution")
    return f"{head}: impossible tokens {figures(probe)} (a correct engine: ~0)"


def request_tokens(endpoint: str, model: str, prompt: str, max_tokens: int, temperature: float, top_p: float,
                   seed: int | None, post=None) -> tuple[list[int], list[tuple[int, float, dict[int, float]]]]:
    """One completion: the prompt's token ids as the server tokenized them, and each generated token with its
    logprobs: (id, raw logprob, {id: logprob} of the top-20 beside it)."""
    import requests

    post = post or (lambda url, body: requests.post(url, json=body, timeout=600))
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
            "ignore_eos": True, "logprobs": TOP_LOGPROBS, "return_tokens_as_token_ids": True,
            "return_token_ids": True, **({"seed": seed} if seed is not None else {})}
    r = post(f"{endpoint}/v1/completions", body)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    return (list(choice.get("prompt_token_ids") or []),
            [(token_id(t), float(v), {token_id(k): float(x) for k, x in (top or {}).items()})
             for t, v, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]) if v is not None])


def probe(endpoint: str, model: str, prompts: list[str], max_tokens: int, temperature: float, top_p: float,
          seed: int | None = 0, concurrency: int = 4, post=None) -> dict:
    """Each setting over every prompt; the judgement per setting and the verdict. The token ids are kept,
    the prompt's and the generated ones (the tests score them with the target in transformers, independently
    of vLLM's logprobs)."""
    out = []
    for name, t, p in settings_for(temperature, top_p):
        with ThreadPoolExecutor(max(1, concurrency)) as pool:
            got = list(pool.map(lambda q, t=t, p=p: request_tokens(endpoint, model, q, max_tokens, t, p, seed, post),
                                prompts))
        j = judge([tok for _, seq in got for tok in seq], t, p)
        out.append({"name": name, **j, "requests": [{"prompt_token_ids": ids, "token_ids": [tid for tid, _, _ in seq]}
                                                    for ids, seq in got]})
    return {"settings": out, "verdict": verdict(out), "prompts": len(prompts), "max_tokens": max_tokens}


@click.command()
@click.option("--endpoint", required=True, help="the vLLM server, e.g. http://127.0.0.1:8102")
@click.option("--model", required=True, help="the served model name (the target's path as served)")
@click.option("--prompts", required=True, type=click.Path(exists=True, path_type=Path),
              help="JSONL of {'messages': [...]}, rendered with the target's chat template")
@click.option("--limit", default=4, show_default=True)
@click.option("--max-tokens", default=32, show_default=True)
@click.option("--temperature", default=1.0, show_default=True, help="the serving temperature (0: near-greedy only)")
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--seed", default=0, show_default=True)
def main(endpoint: str, model: str, prompts: Path, limit: int, max_tokens: int, temperature: float, top_p: float,
         seed: int) -> None:
    """Probe a server's sampling with its own logprobs; exit 1 on a fault."""
    texts = eval_bench.rendered_prompts([json.loads(x) for x in prompts.read_text().splitlines() if x.strip()][:limit], model)
    doc = probe(endpoint.rstrip("/"), model, texts, max_tokens, temperature, top_p, seed)
    click.echo(words(doc))
    raise SystemExit(1 if doc["verdict"]["fault"] else 0)


if __name__ == "__main__":
    main()
