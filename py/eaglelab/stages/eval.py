"""Does the drafter pay? The same prompts through the target alone and through target + drafter.

Two runs of this stage, against two servers (on a GPU host they cannot both be up: each takes all
the GPUs, so the pipeline runs them one after the other):

  --mode baseline   against `serve --mode plain`: output tokens/s without speculation
  --mode spec       against `serve --mode eval`: tokens/s with speculation, and vLLM's own
                    spec_decode counters from /metrics (read before and after, so only these
                    requests count): acceptance rate = accepted / draft tokens, mean acceptance
                    length = 1 + accepted / drafts, per-position acceptance = accepted at
                    position i / drafts. With the baseline's report: the speedup and a verdict,
                    LOUD when the drafter makes serving slower (the seeds' drafter at 15%
                    acceptance did).

Requests are greedy with ignore_eos, so both runs generate the same number of tokens per prompt.

    python -m eaglelab.stages.eval --mode spec --endpoint http://127.0.0.1:8102 --model data/demo/model \
        --prompts data/demo/eval_prompts.jsonl --baseline data/demo/eval/baseline.json --out data/demo/eval
"""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import click
import requests

from .. import manifest
from ..errors import StageError
from ..fsutil import atomic_write_json, read_json
from . import common

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


def verdict(speedup: float | None, stats: dict | None) -> tuple[str, list[str]]:
    """('PAYS'|'NEUTRAL'|'SLOWER'|'LOW_ACCEPTANCE', reasons) from the figures (pure)."""
    reasons = []
    if stats is not None:
        if stats["mean_acceptance_length"] < 1.5:
            reasons.append(f"mean acceptance length {stats['mean_acceptance_length']:.2f} < 1.5")
        if stats["acceptance_rate"] < 0.3:
            reasons.append(f"acceptance rate {stats['acceptance_rate']:.1%} < 30%")
    if speedup is not None and speedup < 0.97:
        return "SLOWER", [f"speculative serving is {speedup:.2f}x the baseline's speed", *reasons]
    if reasons:
        return "LOW_ACCEPTANCE", reasons
    if speedup is not None and speedup < 1.03:
        return "NEUTRAL", [f"speedup {speedup:.2f}x is within noise"]
    return "PAYS", [f"speedup {speedup:.2f}x" if speedup is not None else "no baseline"]


def chat(endpoint: str, model: str, messages: list, max_tokens: int, timeout: float) -> dict:
    payload = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
               "ignore_eos": True}
    t0 = time.perf_counter()
    r = requests.post(f"{endpoint}/v1/chat/completions", json=payload, timeout=timeout)
    if not r.ok:
        raise StageError(f"{endpoint}/v1/chat/completions: HTTP {r.status_code}: {r.text[:300]}")
    data = r.json()
    return {"seconds": time.perf_counter() - t0, "completion_tokens": data["usage"]["completion_tokens"],
            "text": data["choices"][0]["message"].get("content") or ""}


def metrics_text(endpoint: str) -> str:
    r = requests.get(f"{endpoint}/metrics", timeout=30)
    r.raise_for_status()
    return r.text


def measure(endpoint: str, model: str, prompts: list[dict], max_tokens: int, concurrency: int,
            timeout: float) -> dict:
    from tqdm import tqdm

    chat(endpoint, model, prompts[0]["messages"], 8, timeout)  # warm-up, not counted
    results: list[dict | None] = [None] * len(prompts)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool, \
            tqdm(total=len(prompts), desc="Evaluating", unit="req", dynamic_ncols=True) as bar:
        futs = {pool.submit(chat, endpoint, model, p["messages"], max_tokens, timeout): i for i, p in enumerate(prompts)}
        for f in concurrent.futures.as_completed(futs):
            results[futs[f]] = f.result()
            done = [r for r in results if r]
            el = time.perf_counter() - t0
            bar.set_postfix({"tps": f"{sum(r['completion_tokens'] for r in done) / el:.1f}"}, refresh=False)
            bar.update(1)
    wall = time.perf_counter() - t0
    tokens = sum(r["completion_tokens"] for r in results)
    return {"requests": len(prompts), "completion_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "mean_latency_s": sum(r["seconds"] for r in results) / len(results),
            "texts": [r["text"] for r in results]}


def load_prompts(path: Path, limit: int | None) -> list[dict]:
    if not path.is_file():
        raise StageError(f"{path}: eval prompts not found (demo: the model stage writes them)")
    rows, bad = common.read_jsonl(path)
    rows = [r for r in rows if isinstance(r.get("messages"), list) and r["messages"]]
    if not rows:
        raise StageError(f"{path}: no rows with a `messages` list")
    return rows[:limit] if limit else rows


def check_served(endpoint: str, model: str) -> None:
    try:
        served = [m["id"] for m in requests.get(f"{endpoint}/v1/models", timeout=10).json()["data"]]
    except (requests.RequestException, ValueError, KeyError) as e:
        raise StageError(f"{endpoint}: no server answers ({e}); start the service this eval needs") from None
    if model not in served:
        raise StageError(f"{endpoint} serves {served}, not {model!r}")


@click.command()
@click.option("--mode", type=click.Choice(["baseline", "spec"]), required=True)
@click.option("--endpoint", required=True)
@click.option("--model", required=True, help="the served model name (the path the server got)")
@click.option("--prompts", required=True, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path))
@click.option("--baseline", "baseline_file", type=click.Path(path_type=Path), default=None,
              help="spec: the baseline run's baseline.json (default: <out>/baseline.json)")
@click.option("--drafter", type=click.Path(path_type=Path), default=None, help="spec: recorded in the report")
@click.option("--max-tokens", default=64, show_default=True)
@click.option("--concurrency", default=1, show_default=True)
@click.option("--limit", type=int, default=None)
@click.option("--timeout", default=600.0, show_default=True)
@click.option("--fail-if-slower", is_flag=True, help="exit non-zero when the drafter makes serving slower")
def main(mode: str, endpoint: str, model: str, prompts: Path, out_dir: Path, baseline_file: Path | None,
         drafter: Path | None, max_tokens: int, concurrency: int, limit: int | None, timeout: float,
         fail_if_slower: bool) -> None:
    """Measure serving with and without the drafter; report acceptance and speedup."""
    endpoint = endpoint.rstrip("/")
    rows = load_prompts(prompts, limit)
    check_served(endpoint, model)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = {"prompts_sha256": manifest.sha256_file(prompts), "limit": limit, "max_tokens": max_tokens,
                "concurrency": concurrency}

    if mode == "baseline":
        run = measure(endpoint, model, rows, max_tokens, concurrency, timeout)
        doc = {"schema": 1, "mode": "baseline", "settings": settings, **run}
        atomic_write_json(out_dir / "baseline.json", doc)
        click.echo(f"eval baseline: {run['completion_tokens']} tokens in {run['wall_s']:.1f}s = "
                   f"{run['tokens_per_s']:.1f} tokens/s without speculation")
        return

    baseline_file = baseline_file or out_dir / "baseline.json"
    base = read_json(baseline_file)
    if base is None:
        raise StageError(f"{baseline_file}: no baseline; run the baseline first (lab run eval_baseline)")
    if base.get("settings") != settings:
        raise StageError(f"{baseline_file}: measured with {base.get('settings')}, not {settings}; rerun the baseline")
    before = parse_spec_metrics(metrics_text(endpoint))
    run = measure(endpoint, model, rows, max_tokens, concurrency, timeout)
    stats = spec_stats(before, parse_spec_metrics(metrics_text(endpoint)))
    if stats["drafts"] == 0:
        raise StageError(f"{endpoint}/metrics: no spec_decode drafts counted; is this server running with "
                         "the drafter (serve --mode eval)?")
    speedup = run["tokens_per_s"] / base["tokens_per_s"]
    same = sum(a == b for a, b in zip(run["texts"], base["texts"]))
    v, reasons = verdict(speedup, stats)
    report = {"schema": 1, "settings": settings, "drafter": str(drafter) if drafter else None,
              "baseline_tokens_per_s": base["tokens_per_s"], "spec_tokens_per_s": run["tokens_per_s"],
              "speedup": speedup, **stats, "same_output_as_baseline": same, "requests": len(rows),
              "verdict": v, "reasons": reasons}
    atomic_write_json(out_dir / "report.json", report)
    pos = ", ".join(f"{p:.2f}" for p in stats["per_position_acceptance"])
    click.echo(f"eval: acceptance rate {stats['acceptance_rate']:.1%}, mean acceptance length "
               f"{stats['mean_acceptance_length']:.2f}, per position [{pos}] ({stats['drafts']} drafts)")
    click.echo(f"eval: {run['tokens_per_s']:.1f} tokens/s with the drafter vs {base['tokens_per_s']:.1f} without: "
               f"speedup {speedup:.2f}x; {same}/{len(rows)} outputs identical to the baseline's")
    click.echo(f"eval summary: acceptance_rate={stats['acceptance_rate']:.4f} "
               f"mean_acceptance_length={stats['mean_acceptance_length']:.3f} speedup={speedup:.3f} verdict={v}")
    if v in ("SLOWER", "LOW_ACCEPTANCE"):
        bar = "!" * 78
        click.echo(f"{bar}\n!!! VERDICT: {v}: " + "; ".join(reasons) +
                   ("\n!!! Serving WITH this drafter is SLOWER than without it: do not deploy it." if v == "SLOWER"
                    else "\n!!! This drafter accepts too few tokens to pay on real hardware.") +
                   "\n!!! Check: aux layer ids, on-policy data, chat template/thinking mode, more data or epochs."
                   f"\n{bar}")
    else:
        click.echo(f"eval: VERDICT {v}: " + "; ".join(reasons))
    manifest.write(out_dir, "eval", [out_dir / "report.json", baseline_file] if baseline_file.parent == out_dir
                   else [out_dir / "report.json"], params=settings,
                   counts={"requests": len(rows), "drafts": stats["drafts"]},
                   extra={"verdict": v, "speedup": speedup, "acceptance_rate": stats["acceptance_rate"],
                          "mean_acceptance_length": stats["mean_acceptance_length"]})
    if fail_if_slower and v == "SLOWER":
        raise StageError(f"{out_dir / 'report.json'}: the drafter makes serving slower (speedup {speedup:.2f}x)")


if __name__ == "__main__":
    main()
