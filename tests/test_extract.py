"""The extract stage's own paths on a tiny model made here: the hs file writer (read back by
safetensors and by speculators' own check), the overlapped writes giving the same files as inline
ones, and samples at the serving length cap (issue #13, item 2): with either backend they are
trimmed by one token and counted instead of failing every run, and the rows train reads match
the trimmed files. The vLLM backend runs against a real vLLM CPU extraction server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CAP = 96  # the servers' --max-model-len here
AUX = "1 2 3"
LENGTHS = [CAP, CAP + 20, 40, CAP - 1]  # at the cap, over it, short, exactly what fits


def run_stage(name: str, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "py"))
    p = subprocess.run([sys.executable, "-m", f"eaglelab.stages.{name}", *args], capture_output=True, text=True,
                       env=env, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{name} {args} -> {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    return p


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    """A tiny Llama target and prepared rows of LENGTHS tokens (random ids, the second half supervised)."""
    import random

    root = tmp_path_factory.mktemp("extract")
    run_stage("tiny_model", "--out", str(root / "model"), "--num-prompts", "4", "--num-eval-prompts", "2")
    rng = random.Random(7)
    with open(root / "rows.jsonl", "w") as f:
        for i, n in enumerate(LENGTHS):
            f.write(json.dumps({"id": f"r{i}", "input_ids": [rng.randrange(8, 4000) for _ in range(n)],
                                "loss_mask": [0] * (n // 2) + [1] * (n - n // 2)}) + "\n")
    run_stage("prepare", "--model", str(root / "model"), "--data", str(root / "rows.jsonl"),
              "--out", str(root / "prepared"), "--seq-length", "512")
    return root


def test_hs_file_reads_back_with_safetensors_and_speculators_check(tmp_path):
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file
    from speculators.data_generation.offline import check_hidden_states

    from eaglelab.stages.extract import write_hs_file

    hidden = torch.randn(37, 4, 24).to(torch.bfloat16)
    ids = [int(x) for x in torch.randint(0, 50_000, (37,))]
    path = tmp_path / "hs_0.safetensors"
    write_hs_file(path, hidden, ids)
    got = load_file(path)
    assert torch.equal(got["hidden_states"], hidden) and got["hidden_states"].dtype == torch.bfloat16
    assert got["token_ids"].tolist() == ids and got["token_ids"].dtype == torch.long
    check_hidden_states(got, ids)
    with safe_open(path, framework="pt") as f:
        assert sorted(f.keys()) == ["hidden_states", "token_ids"]
    assert not list(tmp_path.glob(".*.tmp"))  # written through a tmp file, renamed


def test_overlapped_writes_give_the_files_of_inline_writes(lab, tmp_path):
    import torch
    from datasets import load_from_disk
    from safetensors.torch import load_file

    from eaglelab.stages import extract

    ds = load_from_disk(str(lab / "prepared"))
    model = extract.load_hf_model(lab / "model", "cpu")
    todo = list(range(len(ds)))
    runs = {}
    for name, threads in (("inline", 0), ("overlap", 2)):
        (tmp_path / name).mkdir()
        runs[name] = extract.run_transformers(lab / "model", ds, todo, tmp_path / name, [1, 2, 3], "cpu", 3,
                                              writer_threads=threads, model=model)
    assert runs["overlap"]["tokens"] == sum(LENGTHS) == runs["inline"]["tokens"]
    for i in todo:
        a = load_file(tmp_path / "inline" / f"hs_{i}.safetensors")
        b = load_file(tmp_path / "overlap" / f"hs_{i}.safetensors")
        assert a["hidden_states"].shape == (int(ds[i]["seq_len"]), 4, 128)
        assert torch.equal(a["hidden_states"], b["hidden_states"]) and torch.equal(a["token_ids"], b["token_ids"])


def check_trimmed(out: Path, lab: Path, log: str) -> None:
    """Rows over CAP - 1 tokens are cut to CAP - 1, counted, and the rows train reads match each file."""
    import torch
    from datasets import load_from_disk
    from safetensors.torch import load_file

    prepared = load_from_disk(str(lab / "prepared"))
    lengths = [int(n) for n in prepared["seq_len"]]  # prepare may reorder the rows
    assert sorted(lengths) == sorted(LENGTHS)
    man = json.loads((out / "manifest.json").read_text())
    over = [i for i, n in enumerate(lengths) if n > CAP - 1]
    assert man["counts"]["trimmed"] == len(over) == 2 and man["extra"]["trimmed_indices"] == over
    assert man["params"]["trim_to"] == CAP - 1 and man["extra"]["max_model_len"] == CAP
    assert f"{len(over)} samples longer than max_model_len - 1 = {CAP - 1} tokens" in log
    rows = load_from_disk(str(out / man["extra"]["dataset"]))
    for i, n in enumerate(lengths):
        keep = min(n, CAP - 1)
        d = load_file(out / f"hs_{i}.safetensors")
        assert d["hidden_states"].shape == (keep, 4, 128)
        assert d["token_ids"].tolist() == prepared[i]["input_ids"].tolist()[:keep]
        # what speculators' trainer compares (torch.equal) and the mask it takes from the row
        assert torch.equal(d["token_ids"], rows[i]["input_ids"]) and len(rows[i]["loss_mask"]) == keep
        assert int(rows[i]["seq_len"]) == keep


def test_transformers_backend_trims_samples_at_the_cap(lab, tmp_path):
    out = tmp_path / "hs"
    p = run_stage("extract", "--backend", "transformers", "--device", "cpu", "--model", str(lab / "model"),
                  "--data", str(lab / "prepared"), "--out", str(out), "--aux-layers", AUX,
                  "--batch-size", "2", "--max-model-len", str(CAP))
    check_trimmed(out, lab, p.stdout + p.stderr)
    again = run_stage("extract", "--backend", "transformers", "--device", "cpu", "--model", str(lab / "model"),
                      "--data", str(lab / "prepared"), "--out", str(out), "--aux-layers", AUX,
                      "--max-model-len", str(CAP))
    assert "is complete" in again.stdout  # a rerun neither fails nor redoes anything


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def extract_server(lab):
    """`serve --mode extract` (real vLLM, CPU) of the tiny target at --max-model-len CAP."""
    port, staging = free_port(), lab / "hs_staging"
    env = dict(os.environ, PYTHONPATH=str(REPO / "py"))
    log = open(lab / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "eaglelab.stages.serve", "--mode", "extract", "--device", "cpu",
                             "--model", str(lab / "model"), "--host", "127.0.0.1", "--port", str(port),
                             "--max-model-len", str(CAP), "--aux-layers", AUX, "--hidden-states-path", str(staging),
                             "--kv-cache-gib", "1"], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        deadline = time.time() + 600
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise AssertionError(f"vLLM did not come up:\n{(lab / 'serve.log').read_text()[-4000:]}") from None
                time.sleep(1)
        yield f"http://127.0.0.1:{port}", staging
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()


def test_vllm_backend_trims_samples_at_the_cap_asking_the_server(lab, extract_server, tmp_path):
    import torch
    from safetensors.torch import load_file

    endpoint, staging = extract_server
    out = tmp_path / "hs"
    p = run_stage("extract", "--backend", "vllm", "--model", str(lab / "model"), "--data", str(lab / "prepared"),
                  "--out", str(out), "--aux-layers", AUX, "--endpoint", endpoint,
                  "--server-hidden-states-path", str(staging), "--concurrency", "2")
    check_trimmed(out, lab, p.stdout + p.stderr)  # the cap came from the server's /v1/models
    # the transformers backend, given the same cap, writes the same rows (bf16 rounding apart)
    mine = tmp_path / "hs_t"
    run_stage("extract", "--backend", "transformers", "--device", "cpu", "--model", str(lab / "model"),
              "--data", str(lab / "prepared"), "--out", str(mine), "--aux-layers", AUX, "--max-model-len", str(CAP))
    for i in range(len(LENGTHS)):
        a, b = load_file(out / f"hs_{i}.safetensors"), load_file(mine / f"hs_{i}.safetensors")
        assert torch.equal(a["token_ids"], b["token_ids"])
        cos = torch.nn.functional.cosine_similarity(a["hidden_states"].float().flatten(),
                                                    b["hidden_states"].float().flatten(), dim=0)
        assert cos > 0.999, (i, float(cos))


def test_vllm_backend_without_trimming_fails_at_the_cap(lab, extract_server, tmp_path):
    """The failure this guards against: told a cap above the server's, nothing is trimmed, the server
    refuses the rows at its cap, and the stage says which samples have no hidden states."""
    endpoint, staging = extract_server
    p = run_stage("extract", "--backend", "vllm", "--model", str(lab / "model"), "--data", str(lab / "prepared"),
                  "--out", str(tmp_path / "hs"), "--aux-layers", AUX, "--endpoint", endpoint,
                  "--server-hidden-states-path", str(staging), "--concurrency", "2",
                  "--max-model-len", str(10 * CAP), check=False)
    assert p.returncode != 0, p.stdout[-2000:]
    from datasets import load_from_disk

    lengths = [int(n) for n in load_from_disk(str(lab / "prepared"))["seq_len"]]
    assert not (tmp_path / "hs" / "manifest.json").exists()
    assert not any((tmp_path / "hs" / f"hs_{i}.safetensors").exists() for i, n in enumerate(lengths) if n >= CAP)
    assert "maximum" in (p.stdout + p.stderr).lower()  # vLLM's refusal, as speculators logged it
