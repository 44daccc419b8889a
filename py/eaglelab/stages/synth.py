"""On-policy responses from the served target (speculators' `regenerate-responses`, checked).

The library does the work (concurrency, retries, `--resume` by id, failures to
`<out>.errors.jsonl`, the tqdm bar `Generating responses` with postfix `ok=, err=, trunc=, rps=,
tps=`); this stage checks the prompts and the server first, and afterwards counts what the run
produced: conversations done, errors by reason (only those not recovered by a later resume),
finish reasons, truncations, and for reasoning models whether the reasoning was captured (the
seeds' first run silently stored empty reasoning on every row). Ends with one summary line:

    synth summary: prompts=64 done=64 errors=0 truncated=12 finish_reasons={"length": 12, "stop": 52}

    python -m eaglelab.stages.synth --endpoint http://127.0.0.1:8100 --model data/demo/model \
        --prompts data/demo/prompts.jsonl --out data/demo/synth
"""

from __future__ import annotations

import collections
import json
import re
import shutil
import time
from pathlib import Path

import click
import requests

from .. import manifest
from ..errors import StageError
from . import common

OUT_NAME = "responses.jsonl"
ERR_NAME = "responses.errors.jsonl"


def check_prompts(path: Path) -> list[dict]:
    """The prompt rows; StageError naming the file and line kind if the schema is off."""
    if not path.is_file():
        raise StageError(f"{path}: prompts file not found; make it (demo: the model stage writes it) "
                         "or set the profile's `prompts` var")
    rows, bad = common.read_jsonl(path)
    if bad:
        raise StageError(f"{path}: {bad} line(s) are not JSON objects; fix or remove them")
    if not rows:
        raise StageError(f"{path}: no prompts")
    ids = collections.Counter()
    for i, r in enumerate(rows):
        has_turns = any(isinstance(r.get(k), list) and r.get(k) for k in ("messages", "conversations"))
        if not has_turns and not isinstance(r.get("prompt"), str):
            raise StageError(f"{path}: row {i + 1} has none of messages/conversations (a list of turns) "
                             "or prompt (a string)")
        if r.get("id") not in (None, ""):
            ids[str(r["id"])] += 1
    dup = [k for k, n in ids.items() if n > 1]
    if dup:
        raise StageError(f"{path}: duplicate ids {dup[:5]}: resume keys on `id`, make them unique")
    return rows


def check_server(endpoint: str, model: str) -> None:
    try:
        r = requests.get(f"{endpoint}/v1/models", timeout=10)
        r.raise_for_status()
        served = [m["id"] for m in r.json().get("data", [])]
    except (requests.RequestException, ValueError, KeyError) as e:
        raise StageError(f"{endpoint}/v1/models: the target server does not answer ({e}); "
                         "start the serve_target stage (lab run serve_target)") from None
    if model not in served:
        raise StageError(f"{endpoint} serves {served}, not {model!r}: synth's --model must be the path the "
                         "server was started with (it is also the tokenizer synth loads)")


THINK = re.compile(r"<think>(.*?)(</think>|$)", re.S)


def reasoning_of(row: dict) -> str | None:
    """The reasoning text of a row (between <think> tags in its text), None if it has no tags."""
    m = THINK.search(row.get("text") or "")
    return m.group(1).strip() if m else None


def summarize(rows: list[dict], errors: list[dict], prompt_ids: list[str], reasoning: bool) -> dict:
    """Counts over the output and error rows (pure)."""
    done = {str(r.get("primary_id") or r.get("id")) for r in rows}
    finish = collections.Counter(str((r.get("metadata") or {}).get("finish_reason")) for r in rows)
    open_errors = [e for e in errors if str(e.get("id")) not in done]
    reasons = collections.Counter(re.sub(r"\(.*", "", str((e.get("metadata") or {}).get("error", "?")))[:80]
                                  for e in open_errors)
    s = {"prompts": len(prompt_ids), "done": len(done & set(prompt_ids)) if prompt_ids else len(done),
         "rows": len(rows), "errors": len({str(e.get('id')) for e in open_errors}),
         "error_reasons": dict(reasons), "finish_reasons": dict(finish), "truncated": finish.get("length", 0),
         "completion_tokens": sum(sum(r.get("loss_mask") or []) for r in rows),
         "tokens": sum(len(r.get("input_ids") or []) for r in rows)}
    if reasoning:
        got = [reasoning_of(r) for r in rows]
        s["reasoning_rows"] = sum(1 for g in got if g)
        s["reasoning_empty"] = sum(1 for g in got if not g)
    return s


def check_rows(rows: list[dict], path: Path) -> None:
    for i, r in enumerate(rows):
        ids, mask = r.get("input_ids"), r.get("loss_mask")
        if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask) or not ids:
            raise StageError(f"{path}: row {i + 1} (id {r.get('id')}) lacks input_ids/loss_mask of equal length; "
                             "the server must support return_token_ids (vLLM >= 0.10)")
        if not any(mask):
            raise StageError(f"{path}: row {i + 1} (id {r.get('id')}) has no supervised token (empty response)")


@click.command()
@click.option("--endpoint", required=True, help="server base URL, e.g. http://127.0.0.1:8100")
@click.option("--model", required=True, help="the path the server was started with (also the tokenizer)")
@click.option("--prompts", required=True, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path))
@click.option("--concurrency", default=8, show_default=True)
@click.option("--max-tokens", default=128, show_default=True, help="cap on prompt + response tokens")
@click.option("--sampling-params", default='{"temperature": 0.0}', show_default=True, help="JSON merged into requests")
@click.option("--limit", type=int, default=None, help="only the first N prompts")
@click.option("--reasoning/--no-reasoning", default=False, show_default=True,
              help="a reasoning model: fail when the reasoning was not captured")
@click.option("--max-error-fraction", default=0.05, show_default=True, help="fail above this share of errors")
@click.option("--max-retries", default=3, show_default=True)
@click.option("--trust-remote-code/--no-trust-remote-code", default=False, help="the tokenizer needs custom code (e.g. Kimi's tiktoken)")
def main(endpoint: str, model: str, prompts: Path, out_dir: Path, concurrency: int, max_tokens: int,
         sampling_params: str, limit: int | None, reasoning: bool, max_error_fraction: float, max_retries: int,
         trust_remote_code: bool) -> None:
    """Generate on-policy responses from the served target."""
    endpoint = endpoint.rstrip("/")
    try:
        sampling = json.loads(sampling_params)
        assert isinstance(sampling, dict)
    except (ValueError, AssertionError):
        raise StageError(f"--sampling-params {sampling_params!r}: must be a JSON object") from None
    rows_in = check_prompts(prompts)
    if limit is not None:
        rows_in = rows_in[:limit]
    prompt_ids = [str(r["id"]) for r in rows_in if r.get("id") not in (None, "")]
    params = {"prompts_sha256": manifest.sha256_file(prompts), "limit": limit, "max_tokens": max_tokens,
              "sampling": sampling, "model": model}
    if manifest.is_complete(out_dir, params):
        click.echo(f"synth: {out_dir} is complete ({manifest.read(out_dir)['counts']}); skipping")
        return
    old = manifest.read(out_dir)
    if old is not None and old.get("params") != params:
        click.echo(f"synth: inputs changed since {out_dir / manifest.NAME}; starting over")
        shutil.rmtree(out_dir)
    check_server(endpoint, model)
    out_dir.mkdir(parents=True, exist_ok=True)

    import speculators.cli.regenerate_responses as regen
    from speculators.cli.regenerate_responses import regenerate_responses

    if trust_remote_code:  # speculators 0.9.0 loads the tokenizer without trust_remote_code
        from transformers import AutoTokenizer

        def detokenizer(name: str):
            tok = AutoTokenizer.from_pretrained(name, trust_remote_code=True)
            return lambda ids: tok.decode(ids, skip_special_tokens=False)

        regen.build_detokenizer = detokenizer

    t0 = time.monotonic()
    regenerate_responses(endpoint=f"{endpoint}/v1/chat/completions", model=model, dataset=str(prompts),
                         limit=limit, concurrency=concurrency, max_tokens=max_tokens,
                         sampling_params=json.dumps(sampling), outfile=str(out_dir / OUT_NAME), resume=True,
                         max_retries=max_retries, split=None, subset=None, language_filter=None,
                         reasoning_effort=None, temperature=None, seed=0)
    out_path, err_path = out_dir / OUT_NAME, out_dir / ERR_NAME
    rows, bad = common.read_jsonl(out_path) if out_path.exists() else ([], 0)
    errors, _ = common.read_jsonl(err_path) if err_path.exists() else ([], 0)
    check_rows(rows, out_path)
    s = summarize(rows, errors, prompt_ids, reasoning)
    s["bad_lines"] = bad
    click.echo("synth summary: " + " ".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in s.items()))
    if s["error_reasons"]:
        click.echo(f"synth: failures by reason (details in {err_path}):")
        for reason, n in sorted(s["error_reasons"].items(), key=lambda kv: -kv[1]):
            click.echo(f"  {n:5d}  {reason}")
    if s["truncated"]:
        click.echo(f"synth: {s['truncated']} of {s['rows']} responses hit --max-tokens {max_tokens} (truncated)")
    if reasoning and s["rows"] and s["reasoning_empty"] > s["rows"] // 2:
        raise StageError(f"{out_path}: reasoning is empty in {s['reasoning_empty']} of {s['rows']} rows: the "
                         "server did not return the reasoning (check the reasoning parser / chat template's "
                         "thinking mode); training on this data would teach the drafter the wrong distribution")
    want = len(prompt_ids) or len(rows_in)
    if s["errors"] > max_error_fraction * want or s["done"] == 0:
        raise StageError(f"{err_path}: {s['errors']} of {want} prompts failed (> {max_error_fraction:.0%}); "
                         "fix the cause above and run again: finished ids are kept (resume)")
    files = [p for p in (out_path, err_path) if p.exists()]
    doc = manifest.write(out_dir, "synth", files, params=params,
                         counts={k: s[k] for k in ("prompts", "done", "rows", "errors", "truncated", "tokens",
                                                   "completion_tokens")},
                         extra={"finish_reasons": s["finish_reasons"], "seconds": round(time.monotonic() - t0, 1)})
    click.echo(f"synth: done, {s['rows']} rows in {out_path} (manifest {doc['fingerprint']})")


if __name__ == "__main__":
    main()
