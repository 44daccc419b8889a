"""Does the drafter pay? The same load through the target alone and through target + drafter.

Two runs of this stage, against two servers (on a GPU host they cannot both be up: each takes all
the GPUs, so the pipeline runs them one after the other):

  --mode baseline   against `serve --mode plain`: the sweep without speculation (baseline.json)
  --mode spec       against `serve --mode eval`: the same sweep with speculation, vLLM's own
                    spec_decode counters per cell: acceptance rate = accepted / draft tokens, mean
                    acceptance length = 1 + accepted / drafts, per-position acceptance = accepted
                    at position i / drafts. With the baseline's cells: speedups, a table, and a
                    verdict, LOUD when the drafter makes serving slower (the seeds' drafter at 15%
                    acceptance did).

The sweep: every concurrency of --concurrency ("1 4 16 64"), greedy and (when --temperature > 0)
sampled, each cell --repeats times, measured by vLLM's serving benchmark (eval_bench.py): output
tokens/s, time per output token, inter-token latency, mean [min-max] over the repeats. Requests use
ignore_eos, so both servers generate the same number of tokens per prompt; sampled requests carry
--seed, so a sampled cell repeats. The verdict is decided at --decide-at (default: the largest
concurrency, the load a server is sized for) on the decoding the model is served with
(--decide-sampling auto: the sampled cell when --temperature > 0, else the greedy one), the other
decoding's cell beside it; each cell has its own verdict in the table. Greedy outputs are compared
with the baseline's, reasoning included.

What is measured: the first --max-tokens of each answer to the eval prompts, or, with --window-rows
and --window-offset N, the --max-tokens after the first N tokens of synth's responses (the prompt is
the conversation plus those N tokens as a continued assistant turn): for a thinking model, a window
past the reasoning's opening instead of the opening of <think>. The window is stated in the verdict.

    python -m eaglelab.stages.eval --mode spec --endpoint http://127.0.0.1:8102 --model data/demo/model \
        --prompts data/demo/eval_prompts.jsonl --baseline data/demo/eval/baseline.json --out data/demo/eval
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import click
import requests

from .. import manifest
from ..errors import StageError
from ..fsutil import atomic_write_json, read_json
from . import common, eval_bench, output_probe


def verdict(speedup: float | None, stats: dict | None,
            spread: tuple[float, float] | None = None) -> tuple[str, list[str]]:
    """('PAYS'|'NEUTRAL'|'SLOWER'|'LOW_ACCEPTANCE', reasons) from the figures (pure). `spread`: the
    lowest and highest speedup the repeats allow; a speedup whose spread reaches 1.0 is noise."""
    reasons = []
    if stats is not None:
        if stats["mean_acceptance_length"] < 1.5:
            reasons.append(f"mean acceptance length {stats['mean_acceptance_length']:.2f} < 1.5")
        if stats["acceptance_rate"] < 0.3:
            reasons.append(f"acceptance rate {stats['acceptance_rate']:.1%} < 30%")
    noise = spread is not None and spread[0] <= 1.0 <= spread[1]
    if speedup is not None and speedup < 0.97 and not noise:
        return "SLOWER", [f"speculative serving is {speedup:.2f}x the baseline's speed", *reasons]
    if reasons:
        return "LOW_ACCEPTANCE", reasons
    if speedup is not None and (speedup < 1.03 or noise):
        why = f" (repeats span {spread[0]:.2f}-{spread[1]:.2f}x)" if noise else ""
        return "NEUTRAL", [f"speedup {speedup:.2f}x is within noise{why}"]
    return "PAYS", [f"speedup {speedup:.2f}x" if speedup is not None else "no baseline"]


def decoding_of(choice: str, temperature: float) -> str:
    """The decoding the verdict is decided on (pure): `auto` is how the model is served, sampled when the
    eval samples (temperature > 0), else greedy."""
    if choice == "auto":
        return "sampled" if temperature > 0 else "greedy"
    if choice == "sampled" and temperature <= 0:
        raise StageError("--decide-sampling sampled with --temperature 0: there is no sampled sweep to decide on "
                         "(profile vars eval_decide_sampling, eval_temperature)")
    return choice


def cell_at(sweep: list[dict], sampling: str, decide_at: int) -> dict | None:
    """The figures of one served cell, {acceptance_rate, mean_acceptance_length, speedup, verdict}; None
    without it (pure)."""
    row = next((r for r in sweep if r["sampling"] == sampling and r["concurrency"] == decide_at), None)
    if row is None or "acceptance_rate" not in row["spec"]:
        return None
    return {"acceptance_rate": row["spec"]["acceptance_rate"],
            "mean_acceptance_length": row["spec"]["mean_acceptance_length"],
            "speedup": row["comparison"]["speedup"], "verdict": row["comparison"]["verdict"]}


def sampled_at(sweep: list[dict], decide_at: int, settings: dict) -> dict | None:
    """The served sampled figures beside the greedy verdict: the sampled cell at the same concurrency,
    with its sampling parameters (what the sampled forecast is compared with); None without one (pure)."""
    cell = next((r["spec"] for r in sweep if r["sampling"] == "sampled" and r["concurrency"] == decide_at), None)
    if cell is None or "acceptance_rate" not in cell:
        return None
    return {"acceptance_rate": cell["acceptance_rate"], "mean_acceptance_length": cell["mean_acceptance_length"],
            "concurrency": decide_at, **(settings.get("sampled") or [{}])[0]}


def parse_concurrency(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        levels = []
    if not levels or any(c < 1 for c in levels):
        raise StageError(f"--concurrency {text!r}: expected positive integers, e.g. '1 4 16 64' "
                         "(profile var eval_concurrency)")
    return sorted(set(levels))


def sweep_plan(levels: list[int], temperature: float, top_p: float,
               seed: int | None = None) -> list[tuple[str, int, dict]]:
    """(sampling name, concurrency, sampling params) per cell, greedy first (pure). `seed`: sent with
    every sampled request (vLLM seeds each request's sampler with it), so a sampled cell repeats."""
    modes = [("greedy", {"temperature": 0.0})]
    if temperature > 0:
        modes.append(("sampled", {"temperature": temperature, "top_p": top_p,
                                  **({"seed": seed} if seed is not None else {})}))
    return [(name, c, params) for name, params in modes for c in levels]


def cell_requests(concurrency: int, prompts: int, rounds: int) -> int:
    """Requests in one cell (pure): every prompt (rounds 0), or `rounds` waves of `concurrency`
    requests, at most every prompt. Each cell then lasts about `rounds` generations whatever its
    concurrency: at concurrency 1, 256 prompts x 512 tokens one at a time are hours on a 1 T model;
    4 rounds are 4 answers' worth, and the top cells still reach a steady state."""
    return prompts if rounds <= 0 else min(prompts, rounds * concurrency)


def spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "n": len(values)}


def aggregate(runs: list[dict]) -> dict:
    """One cell's repeats: tokens/s, TPOT, ITL, TTFT as mean/min/max; spec counters summed (pure)."""
    cell = {"repeats": len(runs), "requests": runs[0]["completed"], "output_tokens": runs[0]["output_tokens"]}
    for key in ("tokens_per_s", "tpot_ms_median", "tpot_ms_p99", "itl_ms_median", "itl_ms_p99", "ttft_ms_median"):
        cell[key] = spread([r[key] for r in runs])
    if all("drafts" in r for r in runs):
        drafts = sum(r["drafts"] for r in runs)
        accepted = sum(r["accepted_tokens"] for r in runs)
        draft_tokens = sum(r["draft_tokens"] for r in runs)
        width = max(len(r["per_position"]) for r in runs)
        per_pos = [sum(r["per_position"][i] * r["drafts"] for r in runs if i < len(r["per_position"])) / drafts
                   if drafts else 0.0 for i in range(width)]
        cell.update({"drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted,
                     "acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
                     "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0,
                     "per_position_acceptance": per_pos})
    cell["texts"] = runs[0]["texts"]
    return cell


def compare(base: dict, spec: dict, sampling: str) -> dict:
    """A spec cell against the baseline cell of the same load: speedup with its spread, verdict (pure)."""
    b, s = base["tokens_per_s"], spec["tokens_per_s"]
    speedup = s["mean"] / b["mean"]
    lo, hi = s["min"] / b["max"], s["max"] / b["min"]
    stats = {k: spec[k] for k in ("acceptance_rate", "mean_acceptance_length")} if "drafts" in spec else None
    v, reasons = verdict(speedup, stats, (lo, hi) if spec["repeats"] > 1 and base["repeats"] > 1 else None)
    same = sum(a == c for a, c in zip(spec["texts"], base["texts"])) if sampling == "greedy" else None
    return {"speedup": speedup, "speedup_min": lo, "speedup_max": hi, "verdict": v, "reasons": reasons,
            "same_output_as_baseline": same,
            "tpot_ratio": spec["tpot_ms_median"]["mean"] / base["tpot_ms_median"]["mean"]}


def run_sweep(endpoint: str, model: str, dataset: Path, prompts: int, plan, repeats: int, max_tokens: int,
              logs: Path, trust_remote_code: bool, label: str, rounds: int = 0) -> list[dict]:
    cells = []
    for sampling, conc, params in plan:
        runs = []
        requests = cell_requests(conc, prompts, rounds)  # the first N prompts: the same N with and without the drafter
        for rep in range(repeats):
            argv = eval_bench.bench_argv(endpoint, model, dataset, requests, conc, max_tokens, params,
                                         trust_remote_code)
            runs.append(eval_bench.run_cell(argv, logs / f"{label}-{sampling}-c{conc}-r{rep}.log"))
            click.echo(f"eval {label}: {sampling} concurrency {conc} run {rep + 1}/{repeats}: "
                       f"{runs[-1]['tokens_per_s']:.1f} tokens/s, TPOT {runs[-1]['tpot_ms_median']:.1f} ms")
        cells.append({"sampling": sampling, "concurrency": conc, "params": params, **aggregate(runs)})
    return cells


def table(rows: list[dict]) -> str:
    """The sweep table printed at the end of eval (pure)."""
    def mm(d: dict, fmt: str) -> str:
        return f"{d['mean']:{fmt}} [{d['min']:{fmt}}-{d['max']:{fmt}}]"
    head = (f"{'sampling':<8} {'conc':>4}  {'tok/s base':>22}  {'tok/s spec':>22}  {'speedup':>16}  "
            f"{'TPOT ms b/s':>13}  {'ITL ms b/s':>13}  {'accept':>6}  {'MAL':>4}  {'per position':<18} "
            f"{'same':>5}  verdict")
    out = [head]
    for r in rows:
        b, s, c = r["baseline"], r["spec"], r["comparison"]
        pos = ",".join(f"{p:.2f}" for p in s.get("per_position_acceptance", []))
        same = "-" if c["same_output_as_baseline"] is None else f"{c['same_output_as_baseline']}/{s['requests']}"
        out.append(f"{r['sampling']:<8} {r['concurrency']:>4}  {mm(b['tokens_per_s'], '.1f'):>22}  "
                   f"{mm(s['tokens_per_s'], '.1f'):>22}  "
                   f"{c['speedup']:>5.2f}x [{c['speedup_min']:.2f}-{c['speedup_max']:.2f}]  "
                   f"{b['tpot_ms_median']['mean']:>6.1f}/{s['tpot_ms_median']['mean']:<6.1f}  "
                   f"{b['itl_ms_median']['mean']:>6.1f}/{s['itl_ms_median']['mean']:<6.1f}  "
                   f"{s.get('acceptance_rate', 0):>6.1%}  {s.get('mean_acceptance_length', 1):>4.2f}  {pos:<18} "
                   f"{same:>5}  {c['verdict']}")
    return "\n".join(out)


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


def run_probe(endpoint: str, model: str, dataset: Path, prompts: int, max_tokens: int, temperature: float, top_p: float,
              seed: int, mode: str) -> dict | None:
    """The output probe over the sweep's first `prompts` prompts (as the benchmark sent them), said aloud."""
    if not prompts:
        return None
    texts = [json.loads(x)["prompt"] for x in dataset.read_text().splitlines() if x.strip()][:prompts]
    try:
        doc = output_probe.probe(endpoint, model, texts, max_tokens, temperature, top_p, None if seed < 0 else seed)
    except requests.RequestException as e:
        raise StageError(f"{endpoint}: the output probe's request failed ({e}); eval_output_probe 0 turns it off") from None
    who = "vLLM with the drafter" if mode == "spec" else "vLLM without a drafter"
    click.echo(f"eval: output probe: {output_probe.words(doc, who)}")
    return doc


def probe_fault(spec: dict | None, baseline: dict | None) -> str | None:
    """The fault in words when the drafter's server fails the probe (pure); the baseline's figure beside it,
    which tells a broken drafting path (baseline clean) from a server that samples wrongly on its own."""
    if not spec or not spec["verdict"]["fault"]:
        return None
    base = ""
    if baseline:
        base = (f"; without the drafter {'the same fault' if baseline['verdict']['fault'] else 'none'}: "
                + output_probe.figures(baseline))
    return output_probe.words(spec, "vLLM with the drafter") + base


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
@click.option("--concurrency", "concurrency_text", default="1", show_default=True,
              help="the sweep's concurrency levels, e.g. '1 4 16 64'")
@click.option("--repeats", default=2, show_default=True, help="runs per cell (the spread)")
@click.option("--temperature", default=0.0, show_default=True, help="> 0: also a sampled sweep at this temperature")
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--seed", default=0, show_default=True, type=int,
              help="the seed of every sampled request (-1: unseeded), so the sampled cells repeat (profile var eval_seed)")
@click.option("--decide-sampling", type=click.Choice(["auto", "greedy", "sampled"]), default="auto",
              show_default=True, help="the cell the verdict is decided on: as served (auto: sampled when "
              "--temperature > 0), greedy or sampled; the other beside it (profile var eval_decide_sampling)")
@click.option("--window-rows", "window_rows_text", default="",
              help="synth rows (responses.jsonl): prompts are their conversations plus the response's first "
                   "--window-offset tokens, continued (profile var eval_window_rows)")
@click.option("--window-offset", default=0, show_default=True, type=click.IntRange(min=0),
              help=">0 with --window-rows: measure the --max-tokens after this many response tokens, e.g. past "
                   "a reasoning model's opening (profile var eval_window_offset; 0: the eval prompts' openings)")
@click.option("--decide-at", "decide_text", default="", help="the concurrency the verdict is decided at (default/empty: the largest)")
@click.option("--limit", type=int, default=None)
@click.option("--rounds", default=0, show_default=True, type=click.IntRange(min=0),
              help=">0: each cell sends rounds x its concurrency requests (at most --limit): every cell lasts "
                   "about as long, instead of the low-concurrency cells taking hours (profile var eval_rounds)")
@click.option("--output-probe", "probe_prompts", default=4, show_default=True, type=click.IntRange(min=0),
              help="after the sweep, this many prompts through the output probe (eaglelab.stages.output_probe: "
                   "does the server still sample its target's distribution? 0: off; profile var eval_output_probe)")
@click.option("--output-probe-tokens", "probe_tokens", default=32, show_default=True, type=click.IntRange(min=1))
@click.option("--trust-remote-code/--no-trust-remote-code", default=False)
@click.option("--fail-if-slower", is_flag=True, help="exit non-zero when the drafter makes serving slower")
def main(mode: str, endpoint: str, model: str, prompts: Path, out_dir: Path, baseline_file: Path | None,
         drafter: Path | None, max_tokens: int, concurrency_text: str, repeats: int, temperature: float,
         top_p: float, seed: int, decide_sampling: str, window_rows_text: str, window_offset: int,
         decide_text: str, limit: int | None, rounds: int, probe_prompts: int, probe_tokens: int,
         trust_remote_code: bool, fail_if_slower: bool) -> None:
    """Measure serving with and without the drafter over a concurrency sweep; report and verdict."""
    endpoint = endpoint.rstrip("/")
    levels = parse_concurrency(concurrency_text)
    if repeats < 1:
        raise StageError(f"--repeats {repeats}: at least 1 (profile var eval_repeats)")
    decide_at = int(decide_text) if decide_text.strip().isdigit() else levels[-1] if not decide_text.strip() else None
    if decide_at not in levels:
        raise StageError(f"--decide-at {decide_text!r}: not one of the sweep's concurrency levels {levels} "
                         "(profile vars eval_decide_at, eval_concurrency)")
    decision = decoding_of(decide_sampling, temperature)
    window = None
    window_rows = Path(window_rows_text.strip()) if window_rows_text.strip() else None
    if window_offset and window_rows is None:
        raise StageError(f"--window-offset {window_offset} without --window-rows: the window is cut from synth's rows "
                         "(profile vars eval_window_offset, eval_window_rows)")
    if window_offset and window_rows is not None:
        if not window_rows.is_file():
            raise StageError(f"{window_rows}: no such file (profile var eval_window_rows: synth's responses.jsonl)")
        cuts, short = eval_bench.window_prompts(common.read_jsonl(window_rows)[0], window_offset, limit,
                                                str(window_rows))
        rows = cuts
        window = {"rows": str(window_rows), "rows_sha256": manifest.sha256_file(window_rows), "offset": window_offset,
                  "prompts": len(cuts), "too_short": short}
        click.echo(f"eval: window: the {max_tokens} tokens after the first {window_offset} of each response, "
                   f"{len(cuts)} rows of {window_rows} ({short} with a shorter response passed over)")
    else:
        rows = load_prompts(prompts, limit)
    check_served(endpoint, model)
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = sweep_plan(levels, temperature, top_p, None if seed < 0 else seed)
    settings = {"prompts_sha256": manifest.sha256_file(prompts), "limit": limit, "max_tokens": max_tokens,
                "concurrency": levels, "repeats": repeats, "sampled": [p for n, _, p in plan if n == "sampled"][:1],
                **({"rounds": rounds} if rounds else {}), **({"window": window} if window else {})}
    if rounds:
        click.echo("eval: requests per cell: " + ", ".join(f"{cell_requests(c, len(rows), rounds)} at concurrency {c}"
                                                          for c in levels) + f" ({rounds} rounds, eval_rounds)")
    if len(rows) < 2 * levels[-1]:
        click.echo(f"eval: note: {len(rows)} prompts for concurrency up to {levels[-1]}: the top cells run one "
                   "short wave each (give eval_limit >= 2x the largest concurrency for a steady state)")
    dataset = out_dir / f"bench-{mode}.jsonl"
    if window:
        eval_bench.render_window(rows, model, max_tokens, dataset, trust_remote_code)
    else:
        eval_bench.render_prompts(rows, model, max_tokens, dataset, trust_remote_code)
    window_words = (f"tokens {window_offset}-{window_offset + max_tokens} of each response" if window
                    else f"the first {max_tokens} tokens of each answer")
    cells = run_sweep(endpoint, model, dataset, len(rows), plan, repeats, max_tokens, out_dir / "bench-logs",
                      trust_remote_code, mode, rounds)
    probe = run_probe(endpoint, model, dataset, probe_prompts, probe_tokens, temperature, top_p, seed, mode)

    if mode == "baseline":
        first = next(c for c in cells if c["sampling"] == decision and c["concurrency"] == decide_at)
        doc = {"schema": 2, "mode": "baseline", "settings": settings, "cells": cells,
               "tokens_per_s": first["tokens_per_s"]["mean"], "requests": len(rows),
               **({"output_probe": probe} if probe else {})}
        atomic_write_json(out_dir / "baseline.json", doc)
        for c in cells:
            click.echo(f"eval baseline: {c['sampling']} concurrency {c['concurrency']}: "
                       f"{c['tokens_per_s']['mean']:.1f} tokens/s [{c['tokens_per_s']['min']:.1f}-"
                       f"{c['tokens_per_s']['max']:.1f}] without speculation")
        return

    baseline_file = baseline_file or out_dir / "baseline.json"
    base = read_json(baseline_file)
    if base is None:
        raise StageError(f"{baseline_file}: no baseline; run the baseline first (lab run eval_baseline)")
    if base.get("settings") != settings:
        raise StageError(f"{baseline_file}: measured with {base.get('settings')}, not {settings}; rerun the baseline "
                         "(lab run eval_baseline --force)")
    base_cells = {(c["sampling"], c["concurrency"]): c for c in base["cells"]}
    sweep = []
    for c in cells:
        if "drafts" not in c or c["drafts"] == 0:
            raise StageError(f"{endpoint}/metrics: no spec_decode drafts counted; is this server running with "
                             "the drafter (serve --mode eval)?")
        b = base_cells[(c["sampling"], c["concurrency"])]
        sweep.append({"sampling": c["sampling"], "concurrency": c["concurrency"], "baseline": b, "spec": c,
                      "comparison": compare(b, c, c["sampling"])})
    decided = next(r for r in sweep if r["sampling"] == decision and r["concurrency"] == decide_at)
    d, cmp_ = decided["spec"], decided["comparison"]
    v, reasons = cmp_["verdict"], cmp_["reasons"]
    speedup = cmp_["speedup"]
    sampled = sampled_at(sweep, decide_at, settings)
    fault = probe_fault(probe, base.get("output_probe"))
    if fault and sampled:
        sampled = {**sampled, "engine_fault": fault}  # its acceptance is the broken path's, not the drafter's
    greedy = cell_at(sweep, "greedy", decide_at)  # beside a sampled verdict: the greedy cell, and vice versa
    pays_up_to = [r["concurrency"] for r in sweep if r["sampling"] == decision and r["comparison"]["verdict"] == "PAYS"]
    for r in sweep:  # the report keeps figures, not every generated text
        r["baseline"] = {k: val for k, val in r["baseline"].items() if k != "texts"}
        r["spec"] = {k: val for k, val in r["spec"].items() if k != "texts"}
    report = {"schema": 2, "settings": settings, "drafter": str(drafter) if drafter else None,
              "decided_at": {"concurrency": decide_at, "sampling": decision}, "window": window_words,
              "baseline_tokens_per_s": decided["baseline"]["tokens_per_s"]["mean"],
              "spec_tokens_per_s": d["tokens_per_s"]["mean"], "speedup": speedup,
              "speedup_min": cmp_["speedup_min"], "speedup_max": cmp_["speedup_max"],
              **{k: d[k] for k in ("drafts", "draft_tokens", "accepted_tokens", "acceptance_rate",
                                   "mean_acceptance_length", "per_position_acceptance")},
              "same_output_as_baseline": cmp_["same_output_as_baseline"], "requests": len(rows),
              "verdict": v, "reasons": reasons, "pays_at_concurrency": pays_up_to, "sweep": sweep,
              **({"output_probe": {"spec": probe, "baseline": base.get("output_probe"), "fault": fault}}
                 if probe else {})}
    atomic_write_json(out_dir / "report.json", report)
    per_cell = f"{rounds} x concurrency (at most {len(rows)})" if rounds else f"{len(rows)}"
    click.echo(f"eval sweep ({per_cell} requests x {max_tokens} tokens per cell, {repeats} repeat(s); "
               "mean [min-max]; TPOT/ITL medians in ms, baseline/spec; same = greedy outputs identical to the "
               "baseline's, reasoning included):")
    click.echo(table(sweep))
    pos = ", ".join(f"{p:.2f}" for p in d["per_position_acceptance"])
    click.echo(f"eval: at concurrency {decide_at} ({decision}, {window_words}): acceptance rate {d['acceptance_rate']:.1%}, mean "
               f"acceptance length {d['mean_acceptance_length']:.2f}, per position [{pos}] ({d['drafts']} drafts)")
    click.echo(f"eval: {d['tokens_per_s']['mean']:.1f} tokens/s with the drafter vs "
               f"{decided['baseline']['tokens_per_s']['mean']:.1f} without: speedup {speedup:.2f}x "
               f"[{cmp_['speedup_min']:.2f}-{cmp_['speedup_max']:.2f}]"
               + (f"; {cmp_['same_output_as_baseline']}/{d['requests']} outputs identical to the baseline's"
                  if cmp_["same_output_as_baseline"] is not None else ""))
    other = sampled if decision == "greedy" else greedy
    if other:
        click.echo(f"eval: beside it, {'greedy' if decision == 'sampled' else 'sampled'} at concurrency {decide_at}: "
                   f"acceptance rate {other['acceptance_rate']:.1%}, mean acceptance length "
                   f"{other['mean_acceptance_length']:.2f}")
    click.echo(f"eval summary: acceptance_rate={d['acceptance_rate']:.4f} "
               f"mean_acceptance_length={d['mean_acceptance_length']:.3f} speedup={speedup:.3f} verdict={v} "
               f"concurrency={decide_at} sampling={decision}" + (f" window_offset={window_offset}" if window else ""))
    reasons = [f"decided at concurrency {decide_at} ({decision}) on {window_words}, eval_decide_sampling {decide_sampling}",
               *reasons]
    if fault:
        bar = "!" * 78
        click.echo(f"{bar}\n!!! ENGINE OUTPUT FAULT: {fault}.\n!!! With the drafter this server's sampled outputs are "
                   "not the target's: the sampled cells measure a broken\n!!! sampling path, not the drafter (greedy "
                   f"cells are unaffected: their outputs are compared to the baseline's).\n{bar}")
        if decision == "sampled":
            reasons.append(f"ENGINE OUTPUT FAULT: {fault}")
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
                   counts={"requests": len(rows), "drafts": d["drafts"], "cells": len(sweep)},
                   extra={"verdict": v, "speedup": speedup, "acceptance_rate": d["acceptance_rate"],
                          "mean_acceptance_length": d["mean_acceptance_length"],
                          "decided_at": f"concurrency {decide_at}, {decision}", "decoding": decision,
                          "window": window_words,
                          "greedy": greedy,  # the greedy cell at the same concurrency (beside a sampled verdict)
                          "sampled": sampled,  # the sampled cell at the same concurrency (None: no sampled sweep)
                          **({"output_probe": {"fault": fault, "spec": output_probe.words(probe, "vLLM with the drafter"),
                                               **({"baseline": output_probe.words(base["output_probe"],
                                                                                  "vLLM without it")}
                                                  if base.get("output_probe") else {})}} if probe else {}),
                          "sweep": [{"sampling": r["sampling"], "concurrency": r["concurrency"],
                                     "speedup": r["comparison"]["speedup"], "verdict": r["comparison"]["verdict"],
                                     "acceptance_rate": r["spec"]["acceptance_rate"]} for r in sweep]})
    if fail_if_slower and v == "SLOWER":
        raise StageError(f"{out_dir / 'report.json'}: the drafter makes serving slower (speedup {speedup:.2f}x)")


if __name__ == "__main__":
    main()
