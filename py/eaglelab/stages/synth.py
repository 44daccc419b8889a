"""On-policy responses from the served target (speculators' `regenerate-responses`, checked).

The library does the work (concurrency, retries, `--resume` by id, failures to
`<out>.errors.jsonl`, the tqdm bar `Generating responses` with postfix `ok=, err=, trunc=, rps=,
tps=`); this stage checks the prompts and the server first, and afterwards counts what the run
produced: conversations done, errors by reason (only those not recovered by a later resume),
finish reasons, truncations, and for reasoning models whether the reasoning was captured (the
seeds' first run silently stored empty reasoning on every row). Ends with one summary line:

    synth summary: prompts=64 done=64 errors=0 truncated=12 cut_in_reasoning=0 finish_reasons={"length": 12, "stop": 52}

Before the long run a probe (synth_probe.py) sends the first few prompts and stops within minutes
when the answers are empty, the reasoning is missing or the chat template is wrong.

While synth runs it reads vLLM's own spec-decode counters from the server's /metrics every
--spec-every-s seconds (ServedAcceptance): when the server drafts (a target served with a
drafter), each read that saw new drafts prints the acceptance since synth started, as the serving
smoke does,

    served/acceptance_rate=0.1830, served/mean_acceptance_length=1.5490, served/drafts=48, served/pos_0=...

and the last figures go into the manifest (`extra.served_spec`). A server without a drafter counts
no drafts: nothing is printed.

A response cut at the cap inside <think> has empty `content` under a reasoning parser, and
speculators 0.9.0 records it as an error ("empty assistant generation"); greedy generation would
reproduce it on every resume, and above 5% synth would fail for good. Those rows are kept instead
(their reasoning tokens are exactly what the drafter must learn to draft), as truncated rows with
`metadata.cut_in_reasoning`, and counted; the error budget counts real failures only. Once the
real failures exceed the budget (--max-error-fraction of the prompts) the run stops at once rather
than finishing hours of work that would fail anyway; finished conversations are kept for a resume.

    python -m eaglelab.stages.synth --endpoint http://127.0.0.1:8100 --model data/demo/model \
        --prompts data/demo/prompts.jsonl --out data/demo/synth

--reuse DIR takes the conversations an earlier synth already made (the pilot's own window makes the
first rows in `synth_head`, docs/foresight.md): when DIR's manifest was written with the same
prompts, model, sampling and cap, its rows of our prompts are copied in before the run and the
resume skips them; with other settings nothing is taken (said in the log), so no row made
otherwise enters the data.
"""

from __future__ import annotations

import collections
import json
import re
import threading
import time
from pathlib import Path

import click
import requests

from .. import manifest
from ..errors import StageError
from ..fsutil import atomic_write_bytes
from . import common, synth_probe
from .spec_metrics import parse_spec_metrics, spec_stats

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
         "cut_in_reasoning": sum(1 for r in rows if (r.get("metadata") or {}).get("cut_in_reasoning")),
         "completion_tokens": sum(sum(r.get("loss_mask") or []) for r in rows),
         "tokens": sum(len(r.get("input_ids") or []) for r in rows)}
    if reasoning:
        got = [reasoning_of(r) for r in rows]
        s["reasoning_rows"] = sum(1 for g in got if g)
        s["reasoning_empty"] = sum(1 for g in got if not g)
    return s


def keep_cut_reasoning(sample_from_response):
    """speculators' response-to-row function, except that a generation cut at the cap with no
    `content` (all of it reasoning, split off by the reasoning parser) becomes a truncated row."""
    def wrapped(data: dict, **kw):
        choice = (data.get("choices") or [{}])[0]
        msg = choice.get("message") or {}
        cut = (not msg.get("content") and not msg.get("tool_calls") and choice.get("finish_reason") == "length"
               and choice.get("token_ids"))
        if not cut:
            return sample_from_response(data, **kw)
        reasoning = synth_probe.reasoning_text(msg)
        stand_in = {**data, "choices": [{**choice, "message": {**msg, "content": reasoning or " "}}]}
        sample, assistant_msg, tool_calls = sample_from_response(stand_in, **kw)
        sample["metadata"]["cut_in_reasoning"] = True  # input_ids/loss_mask are the generated tokens as they came
        return sample, assistant_msg, tool_calls
    wrapped.keeps_cut_reasoning = True
    return wrapped


class ErrorBudgetSpent(RuntimeError):
    """A conversation not attempted because the run's error budget is spent (retried on resume)."""


def stop_when_budget_spent(regenerate_conversation, budget: int, seen: dict):
    """speculators' per-conversation coroutine, counting failures; once more than `budget` failed,
    the rest are not sent (each fails at once, so the run ends in seconds, not hours). Stopping
    through the worker's own error path: a SystemExit out of asyncio corrupts CPython 3.11's state."""
    async def wrapped(*args, **kwargs):
        if seen.get("errors", 0) > budget:
            seen["skipped"] = seen.get("skipped", 0) + 1
            raise ErrorBudgetSpent("not attempted: synth's error budget was spent")
        try:
            return await regenerate_conversation(*args, **kwargs)
        except Exception as e:
            seen["errors"] = seen.get("errors", 0) + 1
            seen["last"] = f"{type(e).__name__}: {str(e)[:200]}"
            raise
    return wrapped


def served_line(stats: dict) -> str:
    """The served acceptance as one metric line the log parser reads (pure; spec_metrics.spec_stats' figures)."""
    pos = "".join(f", served/pos_{i}={p:.4f}" for i, p in enumerate(stats["per_position_acceptance"]))
    return (f"served/acceptance_rate={stats['acceptance_rate']:.4f}, "
            f"served/mean_acceptance_length={stats['mean_acceptance_length']:.4f}, served/drafts={stats['drafts']}"
            f"{pos}")


class ServedAcceptance:
    """vLLM's spec-decode counters on synth's server, since synth started (the first read is the base).

    poll() reads /metrics once: the figures since the base when the server drafted since the last
    poll that printed, else None. A read that fails (the server restarting, no /metrics) is skipped:
    synth goes on, the counters are advice. start()/stop(): poll every `every_s` on a daemon thread."""

    def __init__(self, endpoint: str, every_s: float, echo, get=None):
        self.url, self.every_s, self.echo = f"{endpoint}/metrics", every_s, echo
        self.get = get or (lambda url: requests.get(url, timeout=10))
        self.base: dict | None = None
        self.last: dict | None = None   # the last figures with drafts
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self) -> dict | None:
        try:
            r = self.get(self.url)
            r.raise_for_status()
            return parse_spec_metrics(r.text)
        except Exception:  # noqa: BLE001 - unreadable now: the next poll tries again
            return None

    def poll(self) -> dict | None:
        now = self.read()
        if now is None:
            return None
        if self.base is None:
            self.base = now
            return None
        stats = spec_stats(self.base, now)
        if stats["drafts"] <= 0 or (self.last and stats["drafts"] == self.last["drafts"]):
            return None
        self.last = stats
        self.echo(served_line(stats))
        return stats

    def start(self) -> ServedAcceptance:
        self.poll()  # the base, before synth's first request
        if self.every_s > 0:
            self._thread = threading.Thread(target=self._run, daemon=True, name="served-acceptance")
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.poll()

    def stop(self) -> dict | None:
        """Stop polling, read once more; the last figures with drafts (None: the server drafted nothing)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.poll()
        return self.last


def reuse_rows(src_dir: Path, out_path: Path, params: dict, prompt_ids: set[str]) -> str:
    """Append to out_path the conversations of src_dir (an earlier synth's output) that are ours and not
    there yet, when src_dir was made with our settings (its limit aside); what was done, in words."""
    doc = manifest.read(src_dir)
    if doc is None or manifest.problems(src_dir, doc):
        return f"--reuse {src_dir}: no finished synth output there (no sound manifest); nothing reused"
    theirs = {k: v for k, v in (doc.get("params") or {}).items() if k != "limit"}
    ours = json.loads(json.dumps({k: v for k, v in params.items() if k != "limit"}))
    if doc.get("stage") != "synth" or theirs != ours:
        diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        return f"--reuse {src_dir}: made with other settings ({', '.join(diff) or 'another stage'}); nothing reused"

    def conversation(line: bytes) -> str | None:  # speculators' resume key: primary_id (id in older files)
        try:
            row = json.loads(line)
            return str(row.get("primary_id") or row.get("id"))
        except (ValueError, AttributeError):
            return None  # a garbled line: that prompt is generated again

    have = {conversation(line) for line in out_path.read_bytes().splitlines()} if out_path.exists() else set()
    taken, ids = [], set()
    for line in (src_dir / OUT_NAME).read_bytes().splitlines(keepends=True):
        rid = conversation(line)
        if rid in prompt_ids and rid not in have and line.endswith(b"\n"):
            taken.append(line)
            ids.add(rid)
    if taken:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        with open(out_path, "ab") as f:  # before speculators opens it: its resume skips these ids
            f.writelines(taken)
    return (f"--reuse {src_dir}: {len(ids)} conversation(s) ({len(taken)} rows) taken; "
            f"{len(have & prompt_ids)} were here already")


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
@click.option("--temperature", type=float, default=None, help="sampling temperature (0: greedy); overrides --sampling-params")
@click.option("--top-p", type=float, default=None, help="nucleus sampling; overrides --sampling-params")
@click.option("--probe", "probe_n", default=3, show_default=True,
              help="send this many prompts first and stop if their answers are unusable (0: no probe)")
@click.option("--limit", type=int, default=None, help="only the first N prompts")
@click.option("--reasoning/--no-reasoning", default=False, show_default=True,
              help="a reasoning model: fail when the reasoning was not captured")
@click.option("--max-error-fraction", default=0.05, show_default=True, help="fail above this share of errors")
@click.option("--max-retries", default=3, show_default=True)
@click.option("--trust-remote-code/--no-trust-remote-code", default=False, help="the tokenizer needs custom code (e.g. Kimi's tiktoken)")
@click.option("--spec-every-s", default=30.0, show_default=True,
              help="read the server's spec-decode counters this often and print the served acceptance (0: at the end only)")
@click.option("--reuse", type=click.Path(path_type=Path), default=None,
              help="an earlier synth's output made with the same settings (synth_head): its conversations are kept")
def main(endpoint: str, model: str, prompts: Path, out_dir: Path, concurrency: int, max_tokens: int,
         sampling_params: str, temperature: float | None, top_p: float | None, probe_n: int, limit: int | None,
         reasoning: bool, max_error_fraction: float, max_retries: int, trust_remote_code: bool,
         spec_every_s: float, reuse: Path | None) -> None:
    """Generate on-policy responses from the served target."""
    endpoint = endpoint.rstrip("/")
    try:
        sampling = json.loads(sampling_params)
        assert isinstance(sampling, dict)
    except (ValueError, AssertionError):
        raise StageError(f"--sampling-params {sampling_params!r}: must be a JSON object") from None
    sampling.update({k: v for k, v in (("temperature", temperature), ("top_p", top_p)) if v is not None})
    if sampling.get("temperature", 0) < 0 or not 0 < sampling.get("top_p", 1) <= 1:
        raise StageError(f"synth sampling {sampling}: temperature must be >= 0 and top_p in (0, 1] "
                         "(profile vars synth_temperature, synth_top_p)")
    rows_in = check_prompts(prompts)
    if limit is not None:
        rows_in = rows_in[:limit]
    prompt_ids = [str(r["id"]) for r in rows_in if r.get("id") not in (None, "")]
    params = {"prompts_sha256": manifest.sha256_file(prompts), "limit": limit, "max_tokens": max_tokens,
              "sampling": sampling, "model": model}
    if manifest.is_complete(out_dir, params):
        click.echo(f"synth: {out_dir} is complete ({manifest.read(out_dir)['counts']}); skipping")
        return
    check_server(endpoint, model)
    if probe_n > 0:
        synth_probe.probe(endpoint, model, rows_in, sampling, max_tokens, reasoning, probe_n)
        click.echo(f"synth: probe of {min(probe_n, len(rows_in))} prompt(s) ok (sampling {json.dumps(sampling)})")
    moved = manifest.claim(out_dir, "synth", params)
    if moved:
        click.echo(f"synth: {out_dir} held responses made with other prompts or settings; moved to {moved}")
    if reuse is not None:
        click.echo("synth: " + reuse_rows(reuse, out_dir / OUT_NAME, params, set(prompt_ids)))

    import importlib

    from speculators.cli.regenerate_responses import regenerate_responses

    # the module, not its namesake function that speculators.cli re-exports (`import a.b as x` gives that)
    regen = importlib.import_module("speculators.cli.regenerate_responses")

    if trust_remote_code:  # speculators 0.9.0 loads the tokenizer without trust_remote_code
        from transformers import AutoTokenizer

        def detokenizer(name: str):
            tok = AutoTokenizer.from_pretrained(name, trust_remote_code=True)
            return lambda ids: tok.decode(ids, skip_special_tokens=False)

        regen.build_detokenizer = detokenizer
    if not getattr(regen._sample_from_response, "keeps_cut_reasoning", False):
        regen._sample_from_response = keep_cut_reasoning(regen._sample_from_response)
    budget, seen = int(max_error_fraction * len(rows_in)), {}
    regen.regenerate_conversation = stop_when_budget_spent(regen.regenerate_conversation, budget, seen)

    # speculators' --limit counts rows queued in this run, after skipping finished ids: with a resume
    # it would go past the first N prompts. Give it exactly the first N instead.
    dataset = prompts
    if limit is not None:
        dataset = out_dir / "prompts.limited.jsonl"
        atomic_write_bytes(dataset, "".join(json.dumps(r) + "\n" for r in rows_in).encode())
    t0 = time.monotonic()
    watch = ServedAcceptance(endpoint, spec_every_s, click.echo).start()
    try:
        regenerate_responses(endpoint=f"{endpoint}/v1/chat/completions", model=model, dataset=str(dataset),
                             limit=None, concurrency=concurrency, max_tokens=max_tokens,
                             sampling_params=json.dumps(sampling), outfile=str(out_dir / OUT_NAME), resume=True,
                             max_retries=max_retries, split=None, subset=None, language_filter=None,
                             reasoning_effort=None, temperature=None, seed=0)
    finally:
        served = watch.stop()
    if seen.get("skipped"):
        raise StageError(f"{out_dir / ERR_NAME}: stopped early: {seen['errors']} conversations failed in this run, "
                         f"more than {max_error_fraction:.0%} of {len(rows_in)} prompts (last: {seen.get('last')}); "
                         f"{seen['skipped']} were not sent. Fix the cause and run again: finished ids are kept (resume)")
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
        click.echo(f"synth: {s['truncated']} of {s['rows']} responses hit --max-tokens {max_tokens} (truncated), "
                   f"{s['cut_in_reasoning']} of them inside the reasoning (kept: their reasoning is supervised)")
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
                         counts={k: s[k] for k in ("prompts", "done", "rows", "errors", "truncated", "cut_in_reasoning",
                                                   "tokens", "completion_tokens")},
                         extra={"finish_reasons": s["finish_reasons"], "seconds": round(time.monotonic() - t0, 1),
                                "served_spec": served})
    click.echo(f"synth: done, {s['rows']} rows in {out_path} (manifest {doc['fingerprint']})")


if __name__ == "__main__":
    main()
