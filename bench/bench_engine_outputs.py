"""Does serving with the drafter change what synth writes? (#30 item 1; docs/foresight.md, "The engine check")

On a lab where `make demo` ran (its target, prompts and trained drafter), the demo's synth is run again
against two servers of the same target on ports of this bench: serve_target's own command (no drafter)
and that command with `--mode eval --drafter D` (what serve_synth runs). Each server gets a greedy synth
and a sampled one (T and top-p of the demo's eval, unseeded: seeded streams differ with and without
speculation by construction, so the sampled comparison is of distributions), one request at a time.
Prints:
  - greedy: rows identical token for token (the claim: greedy verification keeps the target's tokens);
  - sampled: a two-sample test on the response-token frequencies (chi-square statistic of the 2 x K
    table, K = the tokens seen at least 10 times in both samples pooled plus one bucket for the rest, its
    p-value by permuting rows between the two samples) and on the response lengths (mean, and the same
    permutation on the mean difference);
  - synth's own generation seconds and tokens/s with and without the drafter (and vLLM's acceptance
    over synth, from its `served/...` counters).

    cd DEMO_CLONE && .venv/bin/python bench/bench_engine_outputs.py [--port 8680] [--limit 64] [--perm 2000]

Run it from the clone that ran `make demo` (its code and venv; logs and data are its own).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "py"))

from eaglelab.control.lab import Lab
from eaglelab.engine_check_stages import without


def set_opts(argv: list[str], opts: dict[str, str]) -> list[str]:
    """argv with each option of `opts` replaced (or added) by its value."""
    out = without(argv, tuple(opts))
    for k, v in opts.items():
        out += [k, v]
    return out


def wait_health(url: str, proc: subprocess.Popen, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"bench_engine_outputs: the server exited ({proc.returncode}) before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(1)
    sys.exit(f"bench_engine_outputs: {url} did not answer in {timeout:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def responses(out: Path) -> dict[str, list[int]]:
    rows = [json.loads(x) for x in (out / "responses.jsonl").read_text().splitlines() if x.strip()]
    return {r["id"]: [t for t, m in zip(r["input_ids"], r["loss_mask"]) if m] for r in rows}


def chi2(a: list[list[int]], b: list[list[int]], keep: list[int]) -> float:
    """The chi-square statistic of the 2 x (len(keep) + 1) table of token counts."""
    import numpy as np

    index = {t: i for i, t in enumerate(keep)}
    table = np.zeros((2, len(keep) + 1))
    for row, rows in ((0, a), (1, b)):
        for r in rows:
            for t in r:
                table[row, index.get(t, len(keep))] += 1
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    mask = expected > 0
    return float((((table - expected) ** 2)[mask] / expected[mask]).sum())


def two_sample(a: list[list[int]], b: list[list[int]], perms: int, seed: int = 0) -> dict:
    """Token-frequency chi-square and mean-length difference, each with its permutation p-value. a[i] and
    b[i] answer the same prompt: a permutation swaps the two answers of a prompt (each with probability
    1/2), so both samples keep the same prompts, as under the null hypothesis."""
    import random
    from collections import Counter

    pooled = Counter(t for r in a + b for t in r)
    keep = sorted(t for t, n in pooled.items() if n >= 10)
    obs_chi = chi2(a, b, keep)
    obs_len = abs(sum(map(len, a)) / len(a) - sum(map(len, b)) / len(b))
    rng = random.Random(seed)
    ge_chi = ge_len = 0
    for _ in range(perms):
        swap = [rng.random() < 0.5 for _ in a]
        x = [q if s else p for p, q, s in zip(a, b, swap)]
        y = [p if s else q for p, q, s in zip(a, b, swap)]
        ge_chi += chi2(x, y, keep) >= obs_chi
        ge_len += abs(sum(map(len, x)) / len(x) - sum(map(len, y)) / len(y)) >= obs_len - 1e-12
    return {"chi2": obs_chi, "df": len(keep), "p_tokens": (ge_chi + 1) / (perms + 1),
            "mean_len": (sum(map(len, a)) / len(a), sum(map(len, b)) / len(b)), "p_length": (ge_len + 1) / (perms + 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--port", type=int, default=8680, help="the servers' port (one at a time)")
    ap.add_argument("--limit", type=int, default=64, help="prompts per synth")
    ap.add_argument("--perm", type=int, default=2000, help="permutations per test")
    ap.add_argument("--out", default="bench-engine-outputs", help="a directory under the lab's data dir")
    ap.add_argument("--reuse", action="store_true", help="compare the rows an earlier run wrote (no servers)")
    args = ap.parse_args()
    lab = Lab.load(None, args.profile)
    cfg = lab.cfg
    serve = lab.launch_spec(cfg.stage("serve_target"))
    synth = lab.launch_spec(cfg.stage("synth"))
    v = cfg.vars_for(cfg.stage("eval"))
    drafter = Path(serve["cwd"], cfg.render(cfg.stage("eval"), "${data}/checkpoints/drafter", v)).resolve()
    if not drafter.is_dir():
        sys.exit(f"bench_engine_outputs: {drafter}: no trained drafter; run `make demo` here first")
    temp, top_p = v.get("eval_temperature", "1.0"), v.get("eval_top_p", "1.0")
    root = Path(serve["cwd"], cfg.render(cfg.stage("eval"), "${data}", v), args.out).resolve()
    endpoint = f"http://127.0.0.1:{args.port}"
    base = set_opts(serve["command"], {"--port": str(args.port), "--host": "127.0.0.1"})
    got = {}
    if args.reuse:
        for name in ("target", "drafter"):
            for sampling in ("greedy", "sampled"):
                out = root / f"{name}-{sampling}"
                man = json.loads((out / "manifest.json").read_text())
                got[(name, sampling)] = {"rows": responses(out), "seconds": man["extra"]["seconds"],
                                         "tokens": man["counts"]["completion_tokens"],
                                         "spec": (man.get("extra") or {}).get("served_spec") or {}}
    for name, argv in () if args.reuse else (("target", base), ("drafter", [*without(base, ("--mode",)), "--mode", "eval",
                                                       "--drafter", str(drafter)])):
        log = root / f"serve-{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        with open(log, "w") as f:
            proc = subprocess.Popen(argv, cwd=serve["cwd"], env={**os.environ, **serve.get("env", {})},
                                    stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_health(f"{endpoint}/health", proc, 900)
            print(f"{name}: server ready in {time.time() - t0:.0f} s", flush=True)
            for sampling, opts in (("greedy", {"--temperature": "0"}),
                                   ("sampled", {"--temperature": temp, "--top-p": top_p})):
                out = root / f"{name}-{sampling}"
                subprocess.run(["rm", "-rf", str(out)], check=True)
                cmd = set_opts(synth["command"], {"--endpoint": endpoint, "--out": str(out), "--limit": str(args.limit),
                                                  "--concurrency": "1", **opts})
                p = subprocess.run(cmd, cwd=synth["cwd"], env={**os.environ, **synth.get("env", {})},
                                   capture_output=True, text=True)
                if p.returncode:
                    sys.exit(f"bench_engine_outputs: synth ({name}, {sampling}) failed:\n{p.stderr[-2000:]}")
                man = json.loads((out / "manifest.json").read_text())
                spec = (man.get("extra") or {}).get("served_spec") or {}
                got[(name, sampling)] = {"rows": responses(out), "seconds": man["extra"]["seconds"],
                                         "tokens": man["counts"]["completion_tokens"], "spec": spec}
                g = got[(name, sampling)]
                print(f"{name} {sampling}: {len(g['rows'])} rows, {g['tokens']} tokens in {g['seconds']:.1f} s "
                      f"({g['tokens'] / g['seconds']:.1f} tokens/s)"
                      + (f", vLLM accepted {spec.get('acceptance_rate', 0):.1%} of {spec.get('drafts')} drafts"
                         if spec else ""), flush=True)
        finally:
            stop(proc)
    gt, gd = got[("target", "greedy")]["rows"], got[("drafter", "greedy")]["rows"]
    same = sum(gt[k] == gd.get(k) for k in gt)
    print(f"greedy: {same}/{len(gt)} rows identical token for token with and without the drafter")
    st, sd = got[("target", "sampled")]["rows"], got[("drafter", "sampled")]["rows"]
    ids = sorted(st)
    t = two_sample([st[k] for k in ids], [sd.get(k, []) for k in ids], args.perm)
    print(f"sampled (T {temp}, top-p {top_p}, unseeded): token frequencies chi2 {t['chi2']:.1f} over {t['df']} "
          f"tokens + rest, permutation p = {t['p_tokens']:.4f}; mean length {t['mean_len'][0]:.1f} vs "
          f"{t['mean_len'][1]:.1f} tokens, p = {t['p_length']:.3f} ({args.perm} permutations of "
          f"{len(st)} + {len(sd)} rows, the two answers of a prompt swapped)")
    from collections import Counter

    ct, cd = Counter(x for r in st.values() for x in r), Counter(x for r in sd.values() for x in r)
    top = sorted(set(ct) | set(cd), key=lambda x: -abs(ct[x] - cd[x]))[:5]
    print(f"sampled: {len(ct)} distinct tokens without the drafter, {len(cd)} with it; the largest differences "
          "(token: without, with): " + ", ".join(f"{x}: {ct[x]}, {cd[x]}" for x in top))
    for s in ("greedy", "sampled"):
        a, b = got[("target", s)], got[("drafter", s)]
        print(f"synth {s}: {a['tokens'] / a['seconds']:.1f} tokens/s without the drafter, "
              f"{b['tokens'] / b['seconds']:.1f} with it ({(b['tokens'] / b['seconds']) / (a['tokens'] / a['seconds']):.2f}x)")


if __name__ == "__main__":
    main()
