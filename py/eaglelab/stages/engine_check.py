"""The engine check: is vLLM serving this drafter as well as the drafter drafts? (docs/foresight.md)

The seeds' drafter trained fine, yet vLLM's EAGLE-3 path for their target accepted ~15%, which they
found only at the final eval. Offline figures cannot see an engine that mis-serves a drafter (aux
layer ids it reads differently, a d2t it maps wrongly, a config key it ignores). So, while synth
runs with a drafter already known for the target (the profile's `engine_check:`; synth's server
`serve_synth` is the target WITH that drafter), this job, beside synth once it has made --rows rows:

1. takes synth's first --rows rows in prompt order (the pilot's slice: eaglelab.stages.pilot);
2. reads vLLM's own spec_decode counters from synth's server (/metrics: every draft since it started,
   all of them synth's), or, if synth has finished and its server is gone, the same counters synth
   recorded in its manifest (`extra.served_spec`);
3. computes the SAME drafter's offline acceptance on those rows: prepare, a transformers forward pass
   of the target for the hidden states at the drafter's aux layers (extract), then the estimate of
   eaglelab.stages.acceptance walked as vLLM drafts (the greedy chain; the sampled chain when synth
   samples). `--offline-rate` gives a figure measured elsewhere instead, where the target cannot run
   beside synth's server (Kimi-K2.5 on its 8 GPUs);
4. prints `engine/served_rate=..., engine/offline_rate=..., engine/ratio=..., engine/min_ratio=...,
   engine/drafts=..., engine/rows=..., engine/alarm=0|1`, writes <out>/manifest.json, and when the
   served figure is below --min-ratio x the offline one fails with

       engine-path alarm: vLLM served the drafter D at 0.4% acceptance (612 drafts), its offline acceptance
       on the same 16 synth rows is 16.4%: 0.02x, below min_ratio 0.6 ...

   which `lab status`, the status page and the webhooks carry (the `failed` event of engine_check).
   Fewer than --min-drafts drafts counted, or an offline figure of 0, is no judgement (exit 0, said so).

    python -m eaglelab.stages.engine_check --synth data/demo/synth --model data/demo/model \
        --drafter data/demo/checkpoints/5 --endpoint http://127.0.0.1:8104 --rows 16 --out data/demo/engine_check
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import click
import requests

from .. import manifest
from ..errors import StageError
from ..fsutil import atomic_write_json, read_json
from . import acceptance, common, eval_bench, output_probe, pilot
from .spec_metrics import parse_spec_metrics, spec_stats

PREFIX = "engine/"  # the metric line's keys (the log parser keeps k=v lines as metrics)


def read_served(endpoint: str, get=None) -> dict | None:
    """vLLM's spec_decode figures since the server started, or None when it does not answer or drafts nothing."""
    get = get or (lambda url: requests.get(url, timeout=10))
    try:
        r = get(f"{endpoint}/metrics")
        r.raise_for_status()
        now = parse_spec_metrics(r.text)
    except Exception:  # noqa: BLE001 - gone (synth done, its server stopped) or not vLLM: the caller falls back
        return None
    stats = spec_stats({"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_pos": {}}, now)
    return stats if stats["drafts"] > 0 else None


def served_from_manifest(synth_dir: Path) -> dict | None:
    """The counters synth recorded at its end (extra.served_spec), when synth has finished."""
    doc = read_json(synth_dir / manifest.NAME)
    spec = ((doc or {}).get("extra") or {}).get("served_spec") if isinstance(doc, dict) else None
    return spec if isinstance(spec, dict) and spec.get("drafts") else None


def judge(served: float, offline: float, drafts: int, min_ratio: float, min_drafts: int) -> dict:
    """The comparison (pure): ratio, alarm, and why there is no judgement when there is none. The rates are
    taken to 4 decimals, as the metric line prints them: the alarm's words and the page's say the same."""
    served, offline = round(served, 4), round(offline, 4)
    ratio = served / offline if offline > 0 else None
    why = (f"vLLM counted {drafts} draft(s), fewer than --min-drafts {min_drafts}" if drafts < min_drafts else
           "the offline acceptance is 0: nothing to compare against" if ratio is None else None)
    return {"served_rate": served, "offline_rate": offline, "ratio": ratio, "min_ratio": min_ratio,
            "drafts": drafts, "alarm": why is None and ratio < min_ratio, "no_judgement": why}


def metric_line(j: dict, rows: int, probe: dict | None = None) -> str:
    ratio = j["ratio"] if j["ratio"] is not None else 0.0
    outputs = ""
    if probe and probe["verdict"]["worst"]:  # the output probe's worst share of impossible tokens
        outputs = (f", {PREFIX}outputs_impossible={probe['verdict']['worst']['share']:.4f}, "
                   f"{PREFIX}outputs_fault={int(probe['verdict']['fault'])}")
    return (f"{PREFIX}served_rate={j['served_rate']:.4f}, {PREFIX}offline_rate={j['offline_rate']:.4f}, "
            f"{PREFIX}ratio={ratio:.4f}, {PREFIX}min_ratio={j['min_ratio']:.4f}, {PREFIX}drafts={j['drafts']}, "
            f"{PREFIX}rows={rows}{outputs}, {PREFIX}alarm={int(bool(j['alarm']))}")


def output_alarm_text(probe: dict, served_drafter: str, synth_samples: bool, j: dict | None = None,
                      rows: int = 0) -> str:
    """The output probe's alarm, its figures first (a failure reason is cut at 400 characters), then the
    acceptance alarm's figures when that fired too (`j`), then what follows."""
    both = (f"; and it served it at {j['served_rate']:.1%} acceptance ({j['drafts']} drafts) where its offline "
            f"acceptance on the same {rows} synth rows is {j['offline_rate']:.1%} ({j['ratio']:.2f}x, below min_ratio "
            f"{j['min_ratio']:g})") if j else ""
    rows_words = ("synth's sampled rows through it are not the target's (serve synth without the drafter: remove "
                  "engine_check)" if synth_samples else "synth's greedy rows are unaffected (greedy verification "
                  "keeps the target's tokens), but sampled serving with a drafter on this engine is broken")
    return (f"engine-path alarm: with the drafter {served_drafter}, vLLM emits tokens its own target ranks impossible "
            f"({output_probe.figures(probe)}; a correct engine: ~0){both}. Speculative decoding must not change the "
            "output distribution: this engine's drafting path breaks sampling (vLLM's own logprobs of what it emits), "
            f"and its sampled acceptance measures the fault, not the drafter; {rows_words}. Check this vLLM build's "
            "EAGLE-3 sampling (engine_check output_probe: 0 turns the probe off)")


def probe_skipped(prompts: int, temperature: float, source: str) -> str | None:
    """Why the output probe does not run on synth's server now, or None (pure). Only beside a sampled synth: a
    greedy synth's requests would share batches with the probe's sampled ones, and an engine that samples
    wrongly spoils greedy requests batched with sampled ones (vllm 0.32.0 on CPU emptied one of 48 greedy
    synth answers that way: docs/foresight.md). The eval probes such an engine after its sweep, alone."""
    if not prompts:
        return "engine_check output_probe is 0"
    if not source.endswith("/metrics"):
        return "synth has finished and its server is gone"
    if temperature <= 0:
        return ("synth is greedy, and a sampled probe batched with its requests could change its rows on an engine "
                "that samples wrongly (the eval probes its servers after its sweep)")
    return None


def prompt_ids(lines: list[str], n: int) -> list[list[int]]:
    """The first n synth rows' prompts as token ids: each row's input_ids up to its first supervised token (pure)."""
    out = []
    for line in lines[:n]:
        r = json.loads(line)
        ids, mask = r.get("input_ids") or [], r.get("loss_mask") or []
        start = next((i for i, m in enumerate(mask) if m), None)
        if start:
            out.append(ids[:start])
    return out


def alarm_text(j: dict, served_drafter: str, drafter: str, rows: int, source: str) -> str:
    same = "" if served_drafter == drafter else f" (served copy {served_drafter} of {drafter})"
    return (f"engine-path alarm: vLLM served the drafter {drafter}{same} at {j['served_rate']:.1%} acceptance "
            f"({j['drafts']} drafts, {source}); its offline acceptance on the same {rows} synth rows is "
            f"{j['offline_rate']:.1%}: {j['ratio']:.2f}x, below min_ratio {j['min_ratio']:g}. The engine mis-serves "
            "this drafter (its aux layer ids, d2t mapping or speculative config as vLLM reads them); a drafter "
            "trained for this engine will be served the same way. Check the served copy and vLLM's EAGLE-3 "
            "support for this target before training")


def run(module: str, argv: list[str]) -> None:
    """`python -m eaglelab.stages.<module>` with its output passed through; StageError with its tail on failure."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", f"eaglelab.stages.{module}", *argv]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    sys.stdout.buffer.write(p.stdout)
    sys.stdout.flush()
    if p.returncode != 0:
        tail = "\n".join("    " + ln for ln in p.stdout.decode("utf-8", "replace").splitlines()[-15:])
        raise StageError(f"engine check: {module} of the synth rows failed (exit {p.returncode}):\n{tail}")


def all_rows(data: Path, hidden_states: Path):
    """(index, sample) for every prepared row, aligned as the trainer aligns them (acceptance.held_out_samples,
    all rows: the drafter was trained elsewhere, none of these rows is its training data)."""
    from hs_connectors import FileTransfer
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import ArrowDataset

    ds = ArrowDataset(max_len=1 << 30, datapath=str(data), transfer=FileTransfer(Path(hidden_states)),
                      on_missing="raise", train_ratio=1.0, split="train")
    for i in range(len(ds)):
        yield ds.start_file_idx + i, shift_batch(ds[i])


def offline_acceptance(drafter: Path, model: Path, out: Path, pick: dict, aux: list[int], seq_length: int,
                       device: str, k: int, temperature: float, top_p: float, trust_remote_code: bool, echo) -> dict:
    """The drafter's offline acceptance on the slice: its estimate document (acceptance.estimate)."""
    import torch


    d = {n: out / n for n in ("synth", "prepared", "hidden_states")}
    pilot.write_slice(d["synth"], pick, {"engine_check": True, "rows": len(pick["lines"])})
    tr = "--trust-remote-code" if trust_remote_code else "--no-trust-remote-code"
    run("prepare", ["--model", str(model), "--data", str(d["synth"]), "--out", str(d["prepared"]),
                    "--seq-length", str(seq_length), tr])
    run("extract", ["--backend", "transformers", "--model", str(model), "--data", str(d["prepared"]),
                    "--out", str(d["hidden_states"]), "--aux-layers", " ".join(map(str, aux)), "--device", device])
    echo(f"engine check: offline acceptance of {drafter} on {len(pick['lines'])} rows (k={k})")
    with acceptance.eager():
        dev = torch.device(device)
        lm_head = acceptance.verifier_lm_head(model, dev)
        draft = acceptance.load_checkpoint(drafter, device)
        return acceptance.estimate(draft, lm_head, all_rows(d["prepared"], d["hidden_states"]), k, temperature, top_p)


@click.command()
@click.option("--synth", "synth_dir", required=True, type=click.Path(path_type=Path), help="synth's --out (still growing)")
@click.option("--model", required=True, type=click.Path(path_type=Path), help="the target model directory")
@click.option("--drafter", required=True, type=click.Path(path_type=Path),
              help="the drafter (speculators format: config.json + model.safetensors) the offline estimate reads")
@click.option("--served-drafter", default="", help="what synth's vLLM loads, if not --drafter (named in the alarm)")
@click.option("--endpoint", required=True, help="synth's server, e.g. http://127.0.0.1:8104 (its /metrics)")
@click.option("--rows", default=16, show_default=True, type=click.IntRange(min=1), help="synth rows compared")
@click.option("--min-ratio", default=0.6, show_default=True, type=click.FloatRange(0, 1, min_open=True),
              help="served / offline acceptance below this: the engine-path alarm")
@click.option("--min-drafts", default=20, show_default=True, help="fewer drafts counted: no judgement")
@click.option("--k", default=3, show_default=True, type=click.IntRange(min=1), help="num_speculative_tokens")
@click.option("--temperature", default=0.0, show_default=True, help="synth's: > 0 compares the sampled chain")
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--seq-length", default=8192, show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path))
@click.option("--offline-rate", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="the drafter's offline acceptance measured elsewhere (instead of computing it here)")
@click.option("--wait-s", default=3600.0, show_default=True, help="wait this long for synth's rows")
@click.option("--probe-prompts", default=4, show_default=True, type=click.IntRange(min=0),
              help="this many synth prompts through the output probe on synth's server (eaglelab.stages.output_probe; "
                   "0: off)")
@click.option("--probe-tokens", default=32, show_default=True, type=click.IntRange(min=1))
@click.option("--trust-remote-code/--no-trust-remote-code", default=False)
def main(synth_dir: Path, model: Path, drafter: Path, served_drafter: str, endpoint: str, rows: int, min_ratio: float,
         min_drafts: int, k: int, temperature: float, top_p: float, seq_length: int, device: str, out_dir: Path,
         offline_rate: float | None, wait_s: float, probe_prompts: int, probe_tokens: int,
         trust_remote_code: bool) -> None:
    """Compare vLLM's served acceptance of a drafter with its offline acceptance on the same synth rows."""
    t0 = time.monotonic()
    echo = click.echo
    endpoint = endpoint.rstrip("/")
    served_drafter = served_drafter or str(drafter)
    cfg = common.model_config(model)
    dcfg = common.check_drafter(drafter, cfg, None)
    aux = dcfg.get("eagle_aux_hidden_state_layer_ids") or common.default_aux_layers(cfg["num_hidden_layers"])
    pick = pilot.wait_for_slice(synth_dir, rows, wait_s, lambda m: echo(m.replace("pilot:", "engine check:", 1)))
    served, source = read_served(endpoint), f"{endpoint}/metrics"
    if served is None:
        served, source = served_from_manifest(synth_dir), f"{synth_dir / manifest.NAME} extra.served_spec"
    if served is None:
        raise StageError(f"engine check: {endpoint}/metrics counts no spec_decode drafts and {synth_dir / manifest.NAME} "
                         "records none: synth's server does not serve with the drafter (is synth's --endpoint "
                         "serve_synth's, with --mode eval --drafter?)")
    echo(f"engine check: vLLM served {served['drafts']} drafts at {served['acceptance_rate']:.1%} acceptance "
         f"(mean length {served['mean_acceptance_length']:.2f}; {source}) after {len(pick['lines'])}+ synth rows")
    probe, skipped = None, probe_skipped(probe_prompts, temperature, source)
    if skipped:
        echo(f"engine check: output probe: skipped: {skipped}")
    else:  # after the counters are read: the probe's own drafts are not synth's
        texts = eval_bench.decoded_prompts(prompt_ids(pick["lines"], probe_prompts), str(model), trust_remote_code)
        probe = output_probe.probe(endpoint, str(model), texts, probe_tokens, temperature, top_p)
        echo(f"engine check: output probe: {output_probe.words(probe, 'vLLM with the drafter')}")
    if offline_rate is not None:
        offline, how = offline_rate, "given (--offline-rate)"
        doc = None
    else:
        doc = offline_acceptance(drafter, model, out_dir, pick, list(aux), seq_length, common.resolve_device(device),
                                 k, temperature, top_p, trust_remote_code, echo)
        chain = doc["sampled"] if temperature > 0 and doc.get("sampled") else doc["chain"]
        offline = chain["acceptance_rate"]
        how = (f"{'sampled' if temperature > 0 else 'greedy'} chain as vLLM drafts, {doc['samples']} rows "
               f"(every start: {doc['acceptance_rate']:.1%})")
    j = judge(served["acceptance_rate"], offline, served["drafts"], min_ratio, min_drafts)
    echo(f"engine check: offline acceptance {offline:.1%} ({how})")
    outputs_fault = bool(probe and probe["verdict"]["fault"])
    j["alarm"] = bool(j["alarm"] or outputs_fault)
    echo(metric_line(j, len(pick["lines"]), probe))
    extra = {**j, "outputs_fault": outputs_fault, "output_probe": probe, "output_probe_skipped": skipped,
             "model": str(model), "served": served, "served_source": source, "offline": doc, "offline_how": how, "drafter": str(drafter),
             "served_drafter": served_drafter, "seconds": round(time.monotonic() - t0, 1)}
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / "check.json", extra)
    manifest.write(out_dir, "engine_check", [out_dir / "check.json"], params={"drafter": str(drafter), "rows": rows},
                   counts={"rows": len(pick["lines"]), "drafts": served["drafts"]}, extra=extra)
    if outputs_fault:
        acceptance_too = j["ratio"] is not None and j["ratio"] < min_ratio and not j["no_judgement"]
        raise StageError(output_alarm_text(probe, served_drafter, temperature > 0, j if acceptance_too else None,
                                           len(pick["lines"])))
    if j["no_judgement"]:
        echo(f"engine check: no judgement: {j['no_judgement']}")
    elif j["alarm"]:
        raise StageError(alarm_text(j, served_drafter, str(drafter), len(pick["lines"]), source))
    else:
        echo(f"engine check: ok: served {j['served_rate']:.1%} is {j['ratio']:.2f}x the offline {offline:.1%} "
             f"(min_ratio {min_ratio:g}); {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
