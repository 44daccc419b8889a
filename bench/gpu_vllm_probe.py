"""The output probe and the sampled forecast against vLLM on a GPU (#30; docs/foresight.md, "The output probe").

On this machine's vLLM (0.32.0, CPU) an EAGLE-3 drafter breaks sampling, so the demo's served sampled
acceptance measures the fault. This runs the same checks against vLLM 0.26.0 on CUDA (the release whose
torch pin, 2.11.0 with CUDA 13, is the device's own; bench/gpu_vllm_probe.sh installs it), with the demo's
tiny target and its trained drafter (a `make demo` clone's data/demo, carried):

1. the target alone (the control), then the target with the drafter, each through the output probe;
2. greedy: the drafter's server against the target's, output for output, and its served acceptance;
3. sampled (T=1, top-p 0.95, one seed per request): the drafter's served acceptance from vLLM's counters,
   against the offline forecast (eaglelab.stages.acceptance, the sampled chain) on ON-POLICY rows: the
   target alone's own sampled answers to the same prompts (not made by the engine under test), and on the
   very paths the drafter's server served;
4. the target's own word (transformers, float32) on the near-greedy tokens each server emitted.

    bash bench/gpu_vllm_probe.sh stage1; bash bench/gpu_vllm_probe.sh stage2    # on the device: the served side
    OUT=bench/results .venv/bin/python bench/gpu_vllm_probe.py --demo DEMO_CLONE/data/demo-like-dir \
        --raw bench/results/gpu_vllm_probe_h200_raw.json                          # here: the offline figures
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "py"))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))  # target_judge: the target's own word, as the tests take it

from eaglelab.stages import acceptance, eval_bench, extract, output_probe, spec_metrics

K, AUX, TOKENS = 3, [1, 2, 3], 64


def get(url: str) -> dict:
    return json.loads(urllib.request.urlopen(url, timeout=30).read())


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=600).read())


def serve(model: Path, port: int, drafter: Path | None, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port),
           "--host", "127.0.0.1", "--max-model-len", "1280", "--seed", "0", "--enforce-eager",
           "--gpu-memory-utilization", "0.2", "--attention-backend", "TRITON_ATTN"]
    if drafter:
        cmd += ["--speculative-config", json.dumps({"method": "eagle3", "model": str(drafter),
                                                    "num_speculative_tokens": K})]
    p = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    t0 = time.time()
    while time.time() - t0 < 480:
        if p.poll() is not None:
            raise SystemExit(f"vLLM exited {p.returncode}: {log.read_text()[-3000:]}")
        try:
            get(f"http://127.0.0.1:{port}/v1/models")
            print(f"vLLM ready on {port} after {time.time() - t0:.0f} s", flush=True)
            return p
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(2)
    p.kill()
    raise SystemExit(f"vLLM not ready in 480 s: {log.read_text()[-3000:]}")


def counters(ep: str) -> dict:
    """vLLM's spec_decode counters now (eaglelab.stages.spec_metrics, as the eval and synth read them)."""
    return spec_metrics.parse_spec_metrics(urllib.request.urlopen(f"{ep}/metrics", timeout=30).read().decode())


def completions(ep: str, model: str, texts: list[str], temperature: float, top_p: float, seeds: list[int | None]):
    """(prompt ids, token ids) per prompt and seed, one request at a time."""
    out = []
    for seed in seeds:
        for t in texts:
            body = {"model": model, "prompt": t, "max_tokens": TOKENS, "temperature": temperature, "top_p": top_p,
                    "ignore_eos": True, "return_token_ids": True, **({"seed": seed} if seed is not None else {})}
            c = post(f"{ep}/v1/completions", body)["choices"][0]
            out.append((c["prompt_token_ids"], c["token_ids"]))
    return out


def side(model: Path, drafter: Path | None, port: int, texts: list[str], seeds: int, out: Path) -> dict:
    name = "drafter" if drafter else "target"
    p = serve(model, port, drafter, out / f"serve_{name}.log")
    ep, res = f"http://127.0.0.1:{port}", {}
    try:
        res["probe"] = output_probe.probe(ep, str(model), texts[:4], 32, 1.0, 0.95)
        print(f"{name}: {output_probe.words(res['probe'])}", flush=True)
        for label, t, tp, sd in (("greedy", 0.0, 1.0, [None]), ("near_greedy", 0.01, 1.0, [0]),
                                 ("sampled", 1.0, 0.95, list(range(seeds)))):
            before = counters(ep) if drafter else {}
            res[label] = completions(ep, str(model), texts, t, tp, sd)
            if drafter:
                st = spec_metrics.spec_stats(before, counters(ep))
                d = {"num_drafts": st["drafts"], "num_draft_tokens": st["draft_tokens"],
                     "num_accepted_tokens": st["accepted_tokens"]}  # the keys bench/results/*_raw.json keep
                res[f"{label}_served"] = {**d, "rate": st["acceptance_rate"]}
                print(f"{name} {label}: served acceptance {res[f'{label}_served']['rate']:.2%} "
                      f"({d['num_accepted_tokens']:.0f}/{d['num_draft_tokens']:.0f})", flush=True)
    finally:
        p.terminate()
        p.wait(60)
    return res


def offline(doc: dict, model: Path, drafter: Path) -> dict:
    """The figures: the probes, the target's word on the near-greedy tokens, greedy identity, and the offline
    forecast (the sampled chain, as vLLM drafts) on the target's own sampled answers (on-policy, not made by
    the engine under test) and on the paths the drafter's server served. CPU is enough (a tiny model)."""
    from bench_sampled_rows import rows_as_samples

    from target_judge import argmax_share

    link = Path("data/demo/model")  # the drafter names its verifier as the demo lab has it
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(model.resolve())
    hf = extract.load_hf_model(model, "cpu")
    lm_head = acceptance.verifier_lm_head(model, "cpu")
    fig = {k: doc.get(k) for k in ("vllm", "torch", "gpu")}
    for who in ("target", "drafter"):
        r = doc[who]
        fig[f"{who}_probe"] = output_probe.figures(r["probe"])
        fig[f"{who}_probe_fault"] = r["probe"]["verdict"]["fault"]
        fig[f"{who}_near_greedy_argmax_share"] = argmax_share(model, [
            {"prompt_token_ids": p, "token_ids": t} for p, t in r["near_greedy"]])
    fig["greedy_identical"] = sum(a == b for a, b in zip(doc["target"]["greedy"], doc["drafter"]["greedy"]))
    fig["greedy_requests"] = len(doc["target"]["greedy"])
    for label in ("greedy", "sampled"):
        fig[f"served_{label}"] = doc["drafter"][f"{label}_served"]
    with acceptance.eager():  # speculators compiles on first use otherwise (inductor, on CPU: minutes)
        draft = acceptance.load_checkpoint(drafter)
        for rows_of, key, label in (("target", "sampled", "sampled_on_policy_rows"),
                                    ("drafter", "sampled", "sampled_served_paths"),
                                    ("target", "greedy", "greedy_rows")):
            rows = [(list(p) + list(t), len(p)) for p, t in doc[rows_of][key]]
            est = acceptance.estimate(draft, lm_head, rows_as_samples(hf, rows, AUX), K, 1.0, 0.95)
            fig[f"forecast_{label}"] = {"greedy_chain": est["chain"]["acceptance_rate"],
                                        "sampled_chain": est["sampled"]["acceptance_rate"], "rows": len(rows)}
    return fig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo", type=Path, required=True, help="holds model/, drafter/, eval_prompts.jsonl")
    ap.add_argument("--seeds", type=int, default=8, help="sampled answers per prompt (a seed each)")
    ap.add_argument("--raw", type=Path, default=None,
                    help="the served side already measured (gpu_vllm_probe_raw.json): only the offline figures")
    ap.add_argument("--serve-only", action="store_true", help="the served side only (on the device)")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT") or "/tmp/gpu_vllm_probe")
    out.mkdir(parents=True, exist_ok=True)
    model, drafter = args.demo / "model", args.demo / "drafter"
    if args.raw:
        doc = json.loads(args.raw.read_text())
    else:
        prompts = [json.loads(x) for x in (args.demo / "eval_prompts.jsonl").read_text().splitlines() if x.strip()]
        texts = eval_bench.rendered_prompts(prompts, str(model))
        import torch  # on the device only: its torch and the vLLM carried there
        import vllm

        doc = {"vllm": vllm.__version__, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
        doc["target"] = side(model, None, 8601, texts, args.seeds, out)
        doc["drafter"] = side(model, drafter, 8602, texts, args.seeds, out)
        (out / "gpu_vllm_probe_raw.json").write_text(json.dumps(doc))
        if args.serve_only:
            return
    fig = offline(doc, model, drafter)
    (out / "gpu_vllm_probe.json").write_text(json.dumps(fig, indent=1))
    print(json.dumps(fig, indent=1))


if __name__ == "__main__":
    main()
