"""Fast tests of the pipeline stages' own logic: manifests, input checks, argv building, counts,
coverage, metrics parsing, verdicts, and the transformers hidden-state backend on a tiny model made
here. No vLLM server (tests/test_pipeline_e2e.py runs the real pipeline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eaglelab import config, manifest
from eaglelab.errors import StageError
from eaglelab.stages import common, eval_bench, serve, spec_metrics, synth, synth_probe, train, vocab
from eaglelab.stages import eval as eval_stage

REPO = Path(__file__).resolve().parents[1]


def run_stage(name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "py"))
    p = subprocess.run([sys.executable, "-m", f"eaglelab.stages.{name}", *args], capture_output=True, text=True,
                       env=env, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"{name} {args} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    run_stage("tiny_model", "--out", str(root / "model"), "--prompts-out", str(root / "prompts.jsonl"),
              "--eval-prompts-out", str(root / "eval.jsonl"), "--num-prompts", "8", "--num-eval-prompts", "4")
    return root


# ---- manifest ---------------------------------------------------------------------------------

def test_manifest_roundtrip_and_damage(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x" * 100)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("hello")
    doc = manifest.write(tmp_path, "demo", [tmp_path / "a.bin", tmp_path / "sub" / "b.txt"], params={"k": 1},
                         counts={"n": 2})
    assert doc["files"]["sub/b.txt"]["size"] == 5 and "sha256" in doc["files"]["a.bin"]
    assert doc["total_bytes"] == 105
    assert manifest.is_complete(tmp_path, {"k": 1})
    assert not manifest.is_complete(tmp_path, {"k": 2})
    assert manifest.require(tmp_path, "demo", "fix")["fingerprint"] == doc["fingerprint"]
    with pytest.raises(StageError, match="written by stage 'demo', expected 'other'"):
        manifest.require(tmp_path, "other", "fix")
    (tmp_path / "a.bin").write_bytes(b"x" * 50)  # truncated
    assert not manifest.is_complete(tmp_path)
    with pytest.raises(StageError, match=r"a\.bin: size 50 != 100"):
        manifest.require(tmp_path, "demo", "rerun demo")
    (tmp_path / "sub" / "b.txt").unlink()
    assert any("missing" in p for p in manifest.problems(tmp_path))


def test_manifest_missing_names_the_file_and_fix(tmp_path):
    with pytest.raises(StageError, match=r"manifest\.json: missing or unreadable.*Fix: run it"):
        manifest.require(tmp_path, "prepare", "run it")


def test_fingerprint_changes_with_content(tmp_path):
    (tmp_path / "f").write_text("one")
    a = manifest.write(tmp_path, "s", [tmp_path / "f"])["fingerprint"]
    (tmp_path / "f").write_text("two")
    assert manifest.write(tmp_path, "s", [tmp_path / "f"])["fingerprint"] != a


# ---- common checks ----------------------------------------------------------------------------

def test_aux_layer_checks():
    assert common.parse_layers("2 16, 29", "--aux-layers") == [2, 16, 29]
    with pytest.raises(StageError, match="space-separated integers"):
        common.parse_layers("2 x", "--aux-layers")
    assert common.default_aux_layers(61) == [2, 30, 58]
    assert common.default_aux_layers(4) == [1, 2]  # speculators' [2, 2, 1] has a duplicate
    common.check_aux_layers([1, 2, 3], 4, "--aux-layers")
    for bad in ([1, 1], [0, 4], [], [-1]):
        with pytest.raises(StageError):
            common.check_aux_layers(bad, 4, "--aux-layers")


def test_model_config_errors(tmp_path):
    with pytest.raises(StageError, match="config.json: not found"):
        common.model_config(tmp_path)
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    with pytest.raises(StageError, match="num_hidden_layers"):
        common.model_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(
        {"text_config": {"hidden_size": 8, "num_hidden_layers": 2, "vocab_size": 10}}))
    assert common.model_config(tmp_path)["num_hidden_layers"] == 2


# ---- serve ------------------------------------------------------------------------------------

def _argv(mode, device="cpu", **kw):
    base = dict(python="py", model="m", host="127.0.0.1", port=8000, mode=mode, device=device, max_model_len=1024,
                served_name=None, tensor_parallel=1, gpu_memory_utilization=0.85, enforce_eager=None,
                scale_out=True, aux_layers=[1, 2, 3], num_layers=4, hidden_states_path="/hs", drafter="/ck",
                num_speculative_tokens=3, extra=["--x"])
    base.update(kw)
    return serve.build_argv(**base)


def test_serve_argv_extract_cpu_uses_cpu_connector_and_appends_last_layer():
    argv = _argv("extract")
    assert argv[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["method"] == "extract_hidden_states"
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3, 4]
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv["kv_connector"] == "CpuHiddenStatesConnector"
    assert kv["kv_connector_module_path"] == "eaglelab.vllm_cpu_connector"
    assert kv["kv_connector_extra_config"]["shared_storage_path"] == "/hs"
    assert "--enforce-eager" in argv and "--enable-scale-out" in argv and argv[-1] == "--x"
    assert "--gpu-memory-utilization" not in argv  # not a CPU flag


@pytest.mark.parametrize("device, choice, eager", [
    ("cpu", None, True), ("cuda", None, False), ("cuda", True, True), ("cpu", False, False)])
def test_serve_enforce_eager_only_on_cpu_unless_asked(device, choice, eager):
    for mode in ("plain", "extract", "eval"):
        assert ("--enforce-eager" in _argv(mode, device=device, enforce_eager=choice)) is eager, (mode, device)


def test_serve_dry_run_on_cuda_keeps_cuda_graphs(tiny):
    for device, eager in (("cuda", False), ("cpu", True)):
        p = run_stage("serve", "--model", str(tiny / "model"), "--device", device, "--dry-run")
        assert ("--enforce-eager" in p.stdout) is eager, p.stdout


def test_serve_argv_cuda_and_eval():
    kv = json.loads(_argv("extract", device="cuda", tensor_parallel=8)[-2])
    assert kv["kv_connector"] == "ExampleHiddenStatesConnector" and "kv_connector_module_path" not in kv
    argv = _argv("eval", device="cuda", tensor_parallel=8)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": "/ck", "num_speculative_tokens": 3}
    assert "--speculative-config" not in _argv("plain")


def test_serve_dry_run_and_drafter_mismatch(tiny, tmp_path):
    p = run_stage("serve", "--model", str(tiny / "model"), "--mode", "extract", "--aux-layers", "1 2 3",
                  "--hidden-states-path", str(tmp_path / "hs"), "--device", "cpu", "--dry-run")
    assert "extract_hidden_states" in p.stdout
    info = json.loads((tmp_path / "hs" / serve.SERVER_INFO).read_text())
    assert info["layer_ids"] == [1, 2, 3, 4]
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [1, 2]}))
    (ck / "model.safetensors").write_bytes(b"")
    p = run_stage("serve", "--model", str(tiny / "model"), "--mode", "eval", "--aux-layers", "1 2 3",
                  "--drafter", str(ck), "--device", "cpu", "--dry-run", check=False)
    assert p.returncode == 1 and "acceptance would collapse" in p.stderr


# ---- synth ------------------------------------------------------------------------------------

def test_synth_prompt_checks(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "messages": [{"role": "user", "content": "x"}]}\n{"id": "a", "prompt": "y"}\n')
    with pytest.raises(StageError, match="duplicate ids"):
        synth.check_prompts(f)
    f.write_text('{"id": "a"}\n')
    with pytest.raises(StageError, match="row 1 has none of messages"):
        synth.check_prompts(f)
    f.write_text("not json\n")
    with pytest.raises(StageError, match="not JSON objects"):
        synth.check_prompts(f)
    with pytest.raises(StageError, match="prompts file not found"):
        synth.check_prompts(tmp_path / "nope.jsonl")


def test_synth_summary_counts_recovered_errors_and_reasoning():
    rows = [{"id": "a_gen0", "primary_id": "a", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1],
             "text": "u <think>because</think> ok", "metadata": {"finish_reason": "stop"}},
            {"id": "b_gen0", "primary_id": "b", "input_ids": [1, 2], "loss_mask": [0, 1],
             "text": "u <think></think> cut", "metadata": {"finish_reason": "length"}}]
    errors = [{"id": "a", "metadata": {"error": "RuntimeError('HTTP 500')"}},  # recovered by a resume
              {"id": "c", "metadata": {"error": "TimeoutError()"}}]
    s = synth.summarize(rows, errors, ["a", "b", "c"], reasoning=True)
    assert s["done"] == 2 and s["errors"] == 1 and s["error_reasons"] == {"TimeoutError": 1}
    assert s["finish_reasons"] == {"stop": 1, "length": 1} and s["truncated"] == 1
    assert s["reasoning_rows"] == 1 and s["reasoning_empty"] == 1
    assert s["completion_tokens"] == 3 and s["tokens"] == 5
    with pytest.raises(StageError, match="no supervised token"):
        synth.check_rows([{"id": "x", "input_ids": [1], "loss_mask": [0]}], Path("r.jsonl"))


def vllm_chat_response(content, reasoning, finish="length", tokens=(7, 8, 9)):
    """The shape of vLLM 0.32's /v1/chat/completions answer with return_token_ids."""
    return {"prompt_token_ids": [1, 2, 3], "usage": {"completion_tokens": len(tokens)},
            "choices": [{"finish_reason": finish, "token_ids": list(tokens),
                         "message": {"role": "assistant", "content": content, "reasoning": reasoning}}]}


def test_synth_keeps_a_response_cut_inside_the_reasoning_as_truncated():
    import importlib

    regen = importlib.import_module("speculators.cli.regenerate_responses")

    kw = dict(detokenize=lambda ids: "<think>" + " ".join(map(str, ids)), conv_id="c", sample_index=0, idx=0,
              endpoint="e", sampling_params={})
    cut = vllm_chat_response(None, "let me see")  # the reasoning parser left no content: cut at the cap
    with pytest.raises(ValueError, match="empty assistant generation"):  # speculators 0.9.0 on its own
        regen._sample_from_response(cut, **kw)
    keep = synth.keep_cut_reasoning(regen._sample_from_response)
    sample, assistant, _ = keep(cut, **kw)
    assert sample["input_ids"] == [1, 2, 3, 7, 8, 9] and sample["loss_mask"] == [0, 0, 0, 1, 1, 1]
    assert sample["metadata"]["cut_in_reasoning"] and sample["metadata"]["finish_reason"] == "length"
    assert assistant["content"] == "let me see"
    # an empty answer that was NOT cut at the cap is a real error, still raised
    with pytest.raises(ValueError, match="empty assistant generation"):
        keep(vllm_chat_response("", "hm", finish="stop"), **kw)
    ok, _, _ = keep(vllm_chat_response("4", "2+2"), **kw)
    assert "cut_in_reasoning" not in ok["metadata"]
    rows = [sample, dict(ok, primary_id="d")]
    s = synth.summarize(rows, [], ["c", "d"], reasoning=True)
    assert s["cut_in_reasoning"] == 1 and s["truncated"] == 2 and s["errors"] == 0 and s["reasoning_rows"] == 2


def test_synth_stops_as_soon_as_the_error_budget_is_spent():
    import asyncio

    async def conversation(i):
        await asyncio.sleep(0)  # a request: the workers interleave
        if i % 2:
            raise RuntimeError(f"HTTP 500 on {i}")
        return False

    seen = {}
    guarded = synth.stop_when_budget_spent(conversation, budget=2, seen=seen)
    finished = []

    async def worker(items):  # the shape of speculators' _worker: every Exception becomes an error row
        for i in items:
            try:
                await guarded(i)
                finished.append(i)
            except Exception:  # noqa: BLE001 - as speculators' worker does: the error is the row, not a crash
                pass

    async def run():
        await asyncio.gather(worker(range(0, 100, 2)), worker(range(1, 100, 2)))

    asyncio.run(run())
    # after the 3rd failure (> budget 2) nothing more is sent: the rest fail at once, retried on resume
    assert seen["errors"] == 3 and "HTTP 500" in seen["last"] and len(finished) < 5
    assert seen["skipped"] == 100 - 3 - len(finished)


def test_synth_probe_names_each_problem():
    def sample(resp, prompt_text="<|user|>hello there<|assistant|>", user="hello there"):
        return {"id": "p1", "user": user, "response": resp, "prompt_text": prompt_text}
    good = sample(vllm_chat_response("hi", "greet back", finish="stop"))
    assert synth_probe.problems([good], reasoning=True) == []
    empty = synth_probe.problems([sample(vllm_chat_response("", None, finish="stop", tokens=()))], reasoning=False)
    assert len(empty) == 1 and "empty response" in empty[0]
    in_content = synth_probe.problems([sample(vllm_chat_response("<think>hm</think>hi", None))], reasoning=True)
    assert any("--reasoning-parser" in m for m in in_content)
    off = synth_probe.problems([sample(vllm_chat_response("hi", None))], reasoning=True)
    assert any("thinking mode is off" in m for m in off)
    assert synth_probe.problems([sample(vllm_chat_response("hi", None))], reasoning=False) == []
    bare = synth_probe.problems([sample(vllm_chat_response("hi", None), prompt_text="hello there")], reasoning=False)
    assert any("applies no chat template" in m for m in bare)
    dropped = synth_probe.problems([sample(vllm_chat_response("hi", None), prompt_text="<|user|><|assistant|>")],
                                   reasoning=False)
    assert any("drops it" in m for m in dropped)
    no_ids = dict(vllm_chat_response("hi", None), prompt_token_ids=None)
    assert any("return_token_ids" in m for m in synth_probe.problems([sample(no_ids)], reasoning=False))


def test_synth_refuses_a_dead_server(tiny, tmp_path):
    p = run_stage("synth", "--endpoint", "http://127.0.0.1:9", "--model", str(tiny / "model"),
                  "--prompts", str(tiny / "prompts.jsonl"), "--out", str(tmp_path / "s"), check=False)
    assert p.returncode == 1 and "does not answer" in p.stderr and "serve_target" in p.stderr


# ---- vocab ------------------------------------------------------------------------------------

def test_vocab_mapping_and_coverage():
    import numpy as np
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    freq = {5: 50, 7: 30, 2: 15, 9: 5}
    d2t, t2d = build_vocab_mappings_from_distribution(freq, 2, 12)
    d2t, t2d = d2t.numpy(), t2d.numpy()
    vocab.check_mapping(d2t, t2d, freq)
    targets = (np.arange(2) + d2t).tolist()
    assert sorted(targets) == [5, 7]
    rep = vocab.coverage_report(freq, targets, 12)
    assert rep["coverage"] == pytest.approx(0.8) and rep["covered_tokens"] == 80
    bad = t2d.copy()
    bad[9] = True
    with pytest.raises(StageError, match="disagree"):
        vocab.check_mapping(d2t, bad, freq)
    with pytest.raises(StageError, match="left out"):
        vocab.check_mapping(np.array([2, 8]), _t2d([2, 9], 12), freq)  # picks 2 and 9 over 5, 7


def _t2d(ids, n):
    import numpy as np

    t = np.zeros(n, dtype=bool)
    t[ids] = True
    return t


# ---- train ------------------------------------------------------------------------------------

def test_train_loss_preflight_and_argv(tmp_path):
    train.check_loss("eager", "cpu", "2.11.0")
    with pytest.raises(StageError, match="needs a GPU"):
        train.check_loss("fused", "cpu", "2.13.0")
    with pytest.raises(StageError, match="crashes with torch 2.11"):
        train.check_loss("fused", "cuda", "2.11.0+cu130")
    argv = train.speculators_argv(model=Path("m"), data=Path("d"), hidden_states=Path("h"), vocab=Path("v"),
                                  out=Path("o"), aux=[1, 2, 3], draft_vocab_size=64, epochs=2, lr=1e-3, seq_len=512,
                                  loss="eager", attn="sdpa", workers=0, max_steps=None, ttt_steps=3, extra=[])
    i = argv.index("--target-layer-ids")
    assert argv[i + 1: i + 4] == ["1", "2", "3"] and argv[argv.index("--d2t-path") + 1] == "v/d2t.npy"
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "config.json").write_text("{}")
    (tmp_path / "0" / "model.safetensors").write_text("")
    (tmp_path / "1").mkdir()  # half-written epoch: no weights
    (tmp_path / "checkpoint_best").symlink_to("0")
    assert train.completed_epochs(tmp_path) == [0]


# ---- eval -------------------------------------------------------------------------------------

METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 90.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 50.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 10.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_eval_metrics_and_verdicts():
    after = spec_metrics.parse_spec_metrics(METRICS)
    assert after["drafts"] == 100 and after["per_pos"] == {0: 50, 1: 30, 2: 10}
    before = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_pos": {}}
    s = spec_metrics.spec_stats(before, after)
    assert s["acceptance_rate"] == pytest.approx(0.3)
    assert s["mean_acceptance_length"] == pytest.approx(1.9)
    assert s["per_position_acceptance"] == pytest.approx([0.5, 0.3, 0.1])
    assert eval_stage.verdict(0.8, s)[0] == "SLOWER"
    assert eval_stage.verdict(1.6, s)[0] == "PAYS"
    low = dict(s, acceptance_rate=0.15, mean_acceptance_length=1.2)
    v, reasons = eval_stage.verdict(1.1, low)
    assert v == "LOW_ACCEPTANCE" and any("1.20 < 1.5" in r for r in reasons)
    assert eval_stage.verdict(1.0, s)[0] == "NEUTRAL"


def bench_cell(tps, tpot=5.0, drafts=None, accepted=0, per_pos=(), texts=("a", "b")):
    """What eval_bench.figures makes of one `vllm bench serve` result."""
    f = {"completed": 2, "failed": 0, "output_tokens": 64, "duration_s": 1.0, "tokens_per_s": tps,
         "tpot_ms_median": tpot, "tpot_ms_p99": tpot, "itl_ms_median": tpot, "itl_ms_p99": tpot,
         "ttft_ms_median": 1.0, "ttft_ms_p99": 1.0, "texts": list(texts)}
    if drafts is not None:
        f.update(drafts=drafts, draft_tokens=3 * drafts, accepted_tokens=accepted, per_position=list(per_pos))
    return f


def test_eval_sweep_cells_spread_and_verdicts():
    assert eval_stage.parse_concurrency("4, 1 16") == [1, 4, 16]
    with pytest.raises(StageError, match="eval_concurrency"):
        eval_stage.parse_concurrency("1 zero")
    assert [(n, c) for n, c, _ in eval_stage.sweep_plan([1, 4], 0.0, 1.0)] == [("greedy", 1), ("greedy", 4)]
    plan = eval_stage.sweep_plan([1, 4], 1.0, 0.95)
    assert [(n, c) for n, c, _ in plan][2:] == [("sampled", 1), ("sampled", 4)]
    assert plan[2][2] == {"temperature": 1.0, "top_p": 0.95}
    assert eval_stage.sweep_plan([4], 1.0, 0.95, seed=7)[1][2] == {"temperature": 1.0, "top_p": 0.95, "seed": 7}

    base = eval_stage.aggregate([bench_cell(100.0, 10.0), bench_cell(110.0, 9.0)])
    assert base["tokens_per_s"] == {"mean": 105.0, "min": 100.0, "max": 110.0, "n": 2} and "drafts" not in base
    spec = eval_stage.aggregate([bench_cell(150.0, 6.0, 10, 15, (0.8, 0.5, 0.2), texts=("a", "x")),
                                 bench_cell(160.0, 6.0, 30, 45, (0.6, 0.5, 0.4), texts=("a", "x"))])
    assert spec["drafts"] == 40 and spec["acceptance_rate"] == pytest.approx(60 / 120)
    assert spec["mean_acceptance_length"] == pytest.approx(2.5)
    assert spec["per_position_acceptance"] == pytest.approx([0.65, 0.5, 0.35])  # weighted by drafts
    c = eval_stage.compare(base, spec, "greedy")
    assert c["speedup"] == pytest.approx(155 / 105) and c["speedup_min"] == pytest.approx(150 / 110)
    assert c["verdict"] == "PAYS" and c["same_output_as_baseline"] == 1
    assert eval_stage.compare(base, spec, "sampled")["same_output_as_baseline"] is None
    # a speedup whose repeats reach 1.0 is noise, not a loss
    noisy = eval_stage.aggregate([bench_cell(70.0, 6.0, 10, 15, (0.5,) * 3), bench_cell(120.0, 6.0, 10, 15, (0.5,) * 3)])
    n = eval_stage.compare(base, noisy, "greedy")
    assert n["speedup"] < 0.97 and n["verdict"] == "NEUTRAL" and "repeats span" in n["reasons"][0]
    slow = eval_stage.aggregate([bench_cell(50.0, 6.0, 10, 15, (0.5,) * 3), bench_cell(52.0, 6.0, 10, 15, (0.5,) * 3)])
    assert eval_stage.compare(base, slow, "greedy")["verdict"] == "SLOWER"
    row = {"sampling": "greedy", "concurrency": 4, "baseline": base, "spec": spec, "comparison": c}
    text = eval_stage.table([row])
    assert "105.0 [100.0-110.0]" in text and "155.0 [150.0-160.0]" in text and "PAYS" in text and "1/2" in text
    # the served sampled cell at the verdict's concurrency, beside the greedy one (the sampled forecast's match)
    sweep = [row, {**row, "sampling": "sampled", "spec": noisy}, {**row, "sampling": "sampled", "concurrency": 1}]
    settings = {"sampled": [{"temperature": 1.0, "top_p": 0.95}]}
    assert eval_stage.sampled_at(sweep, 4, settings) == {
        "acceptance_rate": noisy["acceptance_rate"], "mean_acceptance_length": noisy["mean_acceptance_length"],
        "concurrency": 4, "temperature": 1.0, "top_p": 0.95}
    assert eval_stage.sampled_at([row], 4, {"sampled": []}) is None


def test_eval_bench_argv_and_figures(tiny, tmp_path):
    argv = eval_bench.bench_argv("http://127.0.0.1:1", "m", tmp_path / "d.jsonl", 8, 4, 32,
                                 {"temperature": 1.0, "top_p": 0.9}, trust_remote_code=True)
    from vllm.benchmarks import serve as bench
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    bench.add_cli_args(parser)
    args = parser.parse_args(argv)  # vLLM's own parser accepts every flag we give it
    assert (args.max_concurrency, args.num_prompts, args.temperature, args.top_p) == (4, 8, 1.0, 0.9)
    assert args.ignore_eos and args.backend == "openai" and args.endpoint == "/v1/completions"
    assert args.trust_remote_code and args.dataset_name == "custom" and not args.extra_body
    seeded = parser.parse_args(eval_bench.bench_argv("http://127.0.0.1:1", "m", tmp_path / "d.jsonl", 8, 4, 32,
                                                     {"temperature": 1.0, "seed": 3}))
    assert seeded.extra_body == {"seed": 3}  # each sampled request carries the seed: the cell repeats
    rows = [json.loads(x) for x in (tiny / "eval.jsonl").read_text().splitlines()]
    eval_bench.render_prompts(rows, str(tiny / "model"), 32, tmp_path / "d.jsonl", trust_remote_code=False)
    out = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert len(out) == len(rows) and all(o["output_tokens"] == 32 for o in out)
    assert rows[0]["messages"][-1]["content"] in out[0]["prompt"] and out[0]["prompt"].endswith("\n\n")
    assert out[0]["prompt"].count("<|begin_of_text|>") <= 1
    f = eval_bench.figures({"completed": 8, "failed": 0, "total_output_tokens": 256, "duration": 2.0,
                            "output_throughput": 128.0, "median_tpot_ms": 5.0, "p99_tpot_ms": 9.0,
                            "median_itl_ms": 4.0, "p99_itl_ms": 8.0, "median_ttft_ms": 20.0, "p99_ttft_ms": 30.0,
                            "spec_decode_num_drafts": 10, "spec_decode_draft_tokens": 30,
                            "spec_decode_accepted_tokens": 12, "spec_decode_per_position_acceptance_rates": [0.6, 0.4, 0.2],
                            "generated_texts": ["<think>a</think>b"]})
    assert f["tokens_per_s"] == 128.0 and f["drafts"] == 10 and f["per_position"] == [0.6, 0.4, 0.2]
    assert f["texts"] == ["<think>a</think>b"] and f["tpot_ms_p99"] == 9.0


# ---- tiny model + transformers extraction backend ------------------------------------------------

def test_tiny_model_is_sharded_has_masks_and_is_idempotent(tiny):
    from transformers import AutoTokenizer

    model = tiny / "model"
    assert len(list(model.glob("model-*.safetensors"))) >= 3
    cfg = json.loads((model / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (128, 4, 4, 2)
    tok = AutoTokenizer.from_pretrained(model)
    assert len(tok) == 4096
    r = tok.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo there"}],
                                tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    mask = r["assistant_masks"]
    assert 0 < sum(mask) < len(mask) and mask[-1] == 1 and mask[0] == 0
    train_ids = {json.loads(x)["messages"][0]["content"] for x in (tiny / "prompts.jsonl").read_text().splitlines()}
    eval_ids = {json.loads(x)["messages"][0]["content"] for x in (tiny / "eval.jsonl").read_text().splitlines()}
    assert len(train_ids) == 8 and len(eval_ids) == 4 and not train_ids & eval_ids
    before = (model / "config.json").stat().st_mtime_ns
    p = run_stage("tiny_model", "--out", str(model), "--prompts-out", str(tiny / "prompts.jsonl"),
                  "--eval-prompts-out", str(tiny / "eval.jsonl"), "--num-prompts", "8", "--num-eval-prompts", "4")
    assert "skipping" in p.stdout and (model / "config.json").stat().st_mtime_ns == before


def top1_at_t1(model, tok, prompts: list[str]):
    """The target's largest probability at T=1 at every position of the prompts, and its argmax there."""
    import torch

    tops, argmaxes = [], []
    for text in prompts:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        tops.append(logits.softmax(-1).max(-1).values)
        argmaxes.append(logits.argmax(-1))
    return torch.cat(tops), torch.cat(argmaxes)


def test_logit_scale_peaks_the_target_at_t1_and_keeps_its_argmax(tiny):
    """HF's random init is near-uniform at T=1 (nothing is kept when sampling); logits x32 (the demo's
    --logit-scale) peak it and leaves every argmax, so greedy decoding, exactly as it was."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eaglelab.stages import tiny_model

    tok = AutoTokenizer.from_pretrained(tiny / "model")
    model = AutoModelForCausalLM.from_pretrained(tiny / "model").eval()
    prompts = [json.loads(x)["messages"][0]["content"] for x in (tiny / "eval.jsonl").read_text().splitlines()]
    flat, argmax = top1_at_t1(model, tok, prompts)
    assert flat.max() < 0.01, f"the unscaled random target should be near-uniform: top-1 up to {flat.max():.4f}"
    tiny_model.sharpen(model, 32.0)
    peaked, argmax32 = top1_at_t1(model, tok, prompts)
    assert peaked.mean() > 0.3 and peaked.min() > 0.05, f"top-1 at T=1: mean {peaked.mean():.3f}, min {peaked.min():.3f}"
    assert (argmax32 == argmax).all()


def test_tiny_model_cli_applies_logit_scale(tmp_path):
    """The option reaches the saved weights (in process: a subprocess's imports cost seconds more)."""
    import torch
    from click.testing import CliRunner
    from safetensors import safe_open

    from eaglelab.stages import tiny_model

    out = tmp_path / "model"
    args = ["--out", str(out), "--vocab-size", "300", "--text-glob", "/usr/share/common-licenses/GPL-3",
            "--hidden", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--intermediate", "64"]
    r = CliRunner().invoke(tiny_model.main, [*args, "--logit-scale", "0"])
    assert r.exit_code != 0 and "--logit-scale 0.0: must be > 0" in r.output + str(r.exception)
    r = CliRunner().invoke(tiny_model.main, [*args, "--logit-scale", "32"])
    assert r.exit_code == 0, r.output
    assert manifest.read(out)["params"]["logit_scale"] == 32.0
    w = {}
    for f in out.glob("*.safetensors"):
        with safe_open(str(f), "pt") as sf:
            w.update({k: sf.get_tensor(k).float() for k in sf.keys() if k in ("lm_head.weight", "model.norm.weight")})
    # the final norm's weight (HF: ones) carries the scale; lm_head, which a drafter copies, is HF's N(0, 0.02)
    assert torch.equal(w["model.norm.weight"], torch.full_like(w["model.norm.weight"], 32.0))
    assert 0.015 < w["lm_head.weight"].std() < 0.025


def test_transformers_backend_final_layer_is_pre_norm_and_batching_agrees(tiny):
    import torch

    from eaglelab.stages import extract

    model = extract.load_hf_model(tiny / "model", "cpu")
    rows = [[1, 5, 9, 33, 70, 2], [1, 44, 45]]
    single = [extract.forward_hidden_states(model, [r], [1, 2, 3])[0] for r in rows]
    batched = extract.forward_hidden_states(model, rows, [1, 2, 3])
    for s, b, r in zip(single, batched, rows):
        assert s.shape == b.shape == (len(r), 4, 128) and s.dtype == torch.bfloat16
        assert torch.allclose(s.float(), b.float(), atol=0.05)
    with torch.inference_mode():
        out = model.model(input_ids=torch.tensor([rows[0]]), output_hidden_states=True)
        normed = model.model.norm(single[0][:, 3].unsqueeze(0))
    # layer k is the residual stream after k layers; the last one is what goes INTO the final norm
    assert torch.allclose(single[0][:, 0].float(), out.hidden_states[1][0].float(), atol=0.02)  # aux id 1
    assert torch.allclose(single[0][:, 2].float(), out.hidden_states[3][0].float(), atol=0.02)  # aux id 3
    assert torch.allclose(normed[0].float(), out.last_hidden_state[0].float(), atol=0.05)
    assert not torch.allclose(single[0][:, 3].float(), out.last_hidden_state[0].float(), atol=0.05)


# ---- config: both profiles render, and the aux layers agree across stages ------------------------

@pytest.mark.parametrize("profile", ["demo", "kimi-k2.5"])
def test_profiles_render_and_aux_layers_agree(profile):
    from eaglelab.control.lab import Lab

    cfg = config.load(REPO / "conf", profile)
    names = set(cfg.stages)
    assert {"synth", "prepare", "extract", "vocab", "train", "eval", "serve_target", "serve_extract",
            "serve_eval", "eval_baseline"} <= names
    lab = Lab.__new__(Lab)
    lab.cfg, lab._executors = cfg, {}
    commands = {}
    for name, st in cfg.stages.items():
        variables = cfg.vars_for(st)
        commands[name] = [cfg.render(st, a, variables) for a in st.command]
        assert not any("${" in a for a in commands[name]), (name, commands[name])

    def flag(stage, f):
        argv = commands[stage]
        return argv[argv.index(f) + 1]

    aux = {s: flag(s, "--aux-layers") for s in ("serve_extract", "extract", "train", "serve_eval")}
    assert len(set(aux.values())) == 1, aux
    assert flag("train", "--draft-vocab-size") == flag("vocab", "--draft-vocab-size")
    assert flag("serve_eval", "--drafter").startswith(flag("train", "--out"))
    assert flag("eval", "--prompts") == flag("eval_baseline", "--prompts")
    assert flag("eval", "--max-tokens") == flag("eval_baseline", "--max-tokens")
    if profile == "kimi-k2.5":
        assert flag("vocab", "--draft-vocab-size") == "32000"
        assert flag("serve_extract", "--tensor-parallel") == "8"
        assert cfg.stage("serve_extract").gpus == 8 and cfg.hosts["gpu8"].gpus == 8
        assert aux["extract"] == "2 30 58"


def test_claim_sets_aside_outputs_of_other_params_and_never_mixes(tmp_path):
    out = tmp_path / "hidden_states"
    assert manifest.claim(out, "extract", {"aux_layers": [1, 2, 3]}) is None
    (out / "hs_0.safetensors").write_bytes(b"old")  # an interrupted run's file
    assert manifest.claim(out, "extract", {"aux_layers": [1, 2, 3]}) is None  # same params: resume
    assert (out / "hs_0.safetensors").exists()
    moved = manifest.claim(out, "extract", {"aux_layers": [2, 3, 4]})
    assert moved == tmp_path / "hidden_states.stale-partial" and (moved / "hs_0.safetensors").read_bytes() == b"old"
    assert not (out / "hs_0.safetensors").exists()
    manifest.write(out, "extract", [], params={"aux_layers": [2, 3, 4]})
    with pytest.raises(StageError, match="move it away"):
        manifest.claim(out, "extract", {"aux_layers": [9]}, may_move=False)
    fp = manifest.read(out)["fingerprint"]
    assert manifest.claim(out, "extract", {"aux_layers": [9]}) == tmp_path / f"hidden_states.stale-{fp}"



def test_kimi_gpu_host_uses_the_gpu_lock_and_shared_pins_agree():
    """The 8-GPU host must get CUDA vLLM/torch, not the CPU lock; shared pipeline packages agree."""
    from eaglelab import config
    from eaglelab.control.pipeline.preflight import lock_path, parse_lock

    cfg = config.load(profile="kimi-k2.5")
    gpu = parse_lock(lock_path(cfg.host("gpu8")).read_text())
    cpu = parse_lock((config.REPO_ROOT / "requirements.lock").read_text())
    assert "vllm" in gpu and "vllm-cpu" not in gpu
    assert "+cpu" not in gpu["torch"]
    for name in ("speculators", "transformers", "datasets", "safetensors", "hs-connectors", "pydantic", "click"):
        assert gpu[name] == cpu[name], name


def test_train_smoke_waits_for_the_first_samples_of_its_own_extraction(tmp_path):
    """The smoke starts with extraction (smoke.after 0) and waits itself for its first samples; files
    left by an extraction of other rows are never read, a wait that runs out names the directory."""
    import threading

    from datasets import Dataset

    from eaglelab.fsutil import atomic_write_json
    from eaglelab.stages.extract import hs_path

    data, hs, out = tmp_path / "prepared", tmp_path / "hidden_states", tmp_path / "checkpoints"
    Dataset.from_dict({"input_ids": [[1, 2]] * 6, "seq_len": [2] * 6}).save_to_disk(str(data))
    hs.mkdir()
    for i in range(6):  # a finished extraction of other rows: not these
        hs_path(hs, i).write_bytes(b"old")
    manifest.write(hs, "extract", [hs_path(hs, i) for i in range(6)], params={"data": "other"})
    with pytest.raises(StageError, match=r"hidden_states: no hidden states of these prepared rows after 0 s"):
        train.smoke_inputs(data, hs, out, "mine", need=2, wait_s=0.3, poll_s=0.05)

    def extraction():  # the new extraction sets the old files aside, claims, writes two samples
        import shutil
        import time
        time.sleep(0.3)
        shutil.rmtree(hs)
        hs.mkdir()
        atomic_write_json(hs / manifest.CLAIM, {"schema": 1, "stage": "extract", "params": {"data": "mine"}})
        for i in range(2):
            time.sleep(0.2)
            hs_path(hs, i).write_bytes(b"new")

    writer = threading.Thread(target=extraction)
    writer.start()
    rows, hs_dir, smoke_out = train.smoke_inputs(data, hs, out, "mine", need=2, wait_s=30, poll_s=0.05)
    writer.join()
    from datasets import load_from_disk
    assert len(load_from_disk(str(rows))) == 2 and hs_dir == hs and smoke_out == tmp_path / "checkpoints.smoke" / "checkpoints"


def test_serve_on_one_cpu_runs_engine_and_worker_in_its_own_process():
    for mode in ("plain", "extract", "eval"):
        argv = _argv(mode)
        assert argv[argv.index("--distributed-executor-backend") + 1] == "uni", mode
        assert "--distributed-executor-backend" not in _argv(mode, device="cuda")  # vLLM's own choice on GPUs
        assert "--distributed-executor-backend" not in _argv(mode, tensor_parallel=2)
    asked = _argv("plain", extra=["--distributed-executor-backend", "mp"])
    assert asked.count("--distributed-executor-backend") == 1 and asked[-1] == "mp"  # the profile's own wins


def test_a_stop_during_the_checkpoint_estimate_stops_training(tmp_path, monkeypatch):
    """speculators' TERM handler raises where the code is; after a checkpoint that is our estimate.
    Taken for a failed estimate, it once let `lab stop train` run training to its end (CI, stop 36)."""
    import speculators.train.trainer as trainer
    from speculators.train.graceful_shutdown import TrainingInterruptedError

    from eaglelab.stages import acceptance

    def save(self, epoch, local_step=0):
        (tmp_path / str(epoch)).mkdir()
        (tmp_path / str(epoch) / "model.safetensors").write_bytes(b"saved")

    def interrupted(*a, **kw):
        raise TrainingInterruptedError("SIGTERM")

    def broken(*a, **kw):
        raise ValueError("a bad row")

    monkeypatch.setattr(trainer.Trainer, "maybe_save_checkpoint", save)
    monkeypatch.setattr(acceptance, "estimate_checkpoint", interrupted)
    said: list[str] = []
    acceptance.install_trainer_hook(out_dir=tmp_path, verifier=tmp_path, data=tmp_path, hidden_states=tmp_path,
                                    k=3, train_data_ratio=0.9, max_samples=4, echo=said.append)

    class Fake:  # what the hook reads of a Trainer
        checkpointer = type("C", (), {"path": str(tmp_path)})()
        model = __import__("torch").nn.Linear(1, 1)

    with pytest.raises(TrainingInterruptedError):
        trainer.Trainer.maybe_save_checkpoint(Fake(), 0)
    monkeypatch.setattr(acceptance, "estimate_checkpoint", broken)
    trainer.Trainer.maybe_save_checkpoint(Fake(), 1)  # any other failure is advice: training goes on
    assert said == [f"acceptance: estimate of {tmp_path / '1'} failed (ValueError: a bad row); training goes on"]


def test_eval_rounds_size_each_cell_by_its_concurrency():
    """Kimi's sweep: 256 prompts x 512 tokens at concurrency 1 was hours a side; 4 rounds are 4 answers."""
    assert [eval_stage.cell_requests(c, 256, 4) for c in (1, 4, 16, 64)] == [4, 16, 64, 256]
    assert [eval_stage.cell_requests(c, 40, 4) for c in (1, 16)] == [4, 40]  # never more than the prompts
    assert [eval_stage.cell_requests(c, 256, 0) for c in (1, 64)] == [256, 256]  # 0: every prompt, every cell


def test_synth_reuses_the_heads_conversations_only_when_made_the_same_way(tmp_path):
    """synth --reuse (the pilot's own window): synth_head's rows of our prompts are taken before the run
    (speculators' resume skips them); rows of other settings, garbled or torn lines, and conversations
    already here are not."""
    params = {"prompts_sha256": "abc", "limit": 4, "max_tokens": 64, "sampling": {"temperature": 1.0}, "model": "m"}
    head = tmp_path / "synth_head"
    head.mkdir()
    rows = [{"id": f"p{i}_gen0", "primary_id": f"p{i}", "input_ids": [1], "loss_mask": [1]} for i in range(4)]
    lines = [json.dumps(r) + "\n" for r in rows] + ["{garbled\n"]
    (head / synth.OUT_NAME).write_text("".join(lines))
    manifest.write(head, "synth", [head / synth.OUT_NAME], params=params, counts={"rows": 4})
    out = tmp_path / "synth" / synth.OUT_NAME
    out.parent.mkdir()
    out.write_text(lines[1])  # p1 was made here already
    ours = {f"p{i}" for i in range(100) if i != 3}  # p3 is not one of our prompts (say, another prompt file's)
    said = synth.reuse_rows(head, out, {**params, "limit": 100}, ours)
    assert said.endswith("2 conversation(s) (2 rows) taken; 1 were here already"), said
    got = [json.loads(line)["primary_id"] for line in out.read_text().splitlines()]
    assert got == ["p1", "p0", "p2"]
    # other sampling: nothing taken, and the log says which setting differs
    other = synth.reuse_rows(head, out, {**params, "sampling": {"temperature": 0.0}}, ours)
    assert "made with other settings (sampling); nothing reused" in other and len(out.read_text().splitlines()) == 3
    assert "no finished synth output" in synth.reuse_rows(tmp_path / "nowhere", out, params, ours)


def test_eval_decides_on_the_served_decoding_with_the_other_beside():
    """#28 item 5: the verdict's cell is the decoding the model is served with (auto: sampled when the eval
    samples), the other decoding's figures beside it; asking for a sampled verdict without a sampled sweep
    is refused naming the vars."""
    assert eval_stage.decoding_of("auto", 1.0) == "sampled" and eval_stage.decoding_of("auto", 0.0) == "greedy"
    assert eval_stage.decoding_of("greedy", 1.0) == "greedy"  # the demo: decided greedy although it samples too
    with pytest.raises(StageError, match="eval_decide_sampling, eval_temperature"):
        eval_stage.decoding_of("sampled", 0.0)
    base = eval_stage.aggregate([bench_cell(100.0, 10.0), bench_cell(100.0, 10.0)])
    greedy = eval_stage.aggregate([bench_cell(150.0, 6.0, 10, 15, (0.8, 0.5, 0.2)), bench_cell(150.0, 6.0, 10, 15, (0.8, 0.5, 0.2))])
    sampled = eval_stage.aggregate([bench_cell(90.0, 6.0, 10, 3, (0.1, 0.0, 0.0)), bench_cell(90.0, 6.0, 10, 3, (0.1, 0.0, 0.0))])
    sweep = [{"sampling": s, "concurrency": 4, "baseline": base, "spec": c, "comparison": eval_stage.compare(base, c, s)}
             for s, c in (("greedy", greedy), ("sampled", sampled))]
    g, s = eval_stage.cell_at(sweep, "greedy", 4), eval_stage.cell_at(sweep, "sampled", 4)
    assert g == {"acceptance_rate": pytest.approx(0.5), "mean_acceptance_length": pytest.approx(2.5),
                 "speedup": pytest.approx(1.5), "verdict": "PAYS"}
    assert s["acceptance_rate"] == pytest.approx(0.1) and s["speedup"] == pytest.approx(0.9)
    assert s["verdict"] == "SLOWER"  # what a kimi-like model served sampled would be told, greedy's PAYS beside
    assert eval_stage.cell_at(sweep, "sampled", 1) is None
    # through the command itself: refused before any server is asked, naming the vars
    from click.testing import CliRunner

    common_args = ["--mode", "spec", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--prompts", "p.jsonl",
                   "--out", "o", "--concurrency", "4"]
    r = CliRunner().invoke(eval_stage.main, [*common_args, "--decide-sampling", "sampled"], standalone_mode=False)
    assert isinstance(r.exception, StageError) and "eval_decide_sampling, eval_temperature" in str(r.exception)
    r = CliRunner().invoke(eval_stage.main, [*common_args, "--temperature", "1.0", "--window-offset", "8"], standalone_mode=False)
    assert isinstance(r.exception, StageError) and "without --window-rows" in str(r.exception)
    r = CliRunner().invoke(eval_stage.main, [*common_args, "--window-offset", "8", "--window-rows", "nowhere.jsonl"], standalone_mode=False)
    assert isinstance(r.exception, StageError) and "nowhere.jsonl: no such file" in str(r.exception)


def test_eval_window_cut_from_synth_rows(tiny, tmp_path):
    """#28 item 5: the window's prompts are the conversation plus the response's first N tokens (a continued
    assistant turn), from the last rows whose response is longer than N; too short rows are counted."""
    rows = [{"input_ids": [1, 10, 11, 20, 21, 22, 23], "loss_mask": [0, 0, 0, 1, 1, 1, 1]},   # response of 4
            {"input_ids": [1, 12, 30, 31], "loss_mask": [0, 0, 1, 1]},                         # of 2: too short
            {"input_ids": [1, 13, 14, 15, 40, 41, 42, 43, 44], "loss_mask": [0, 0, 0, 0, 1, 1, 1, 1, 1]}]
    cuts, short = eval_bench.window_prompts(rows, 3, None, "r.jsonl")
    assert cuts == [[1, 10, 11, 20, 21, 22], [1, 13, 14, 15, 40, 41, 42]] and short == 1
    assert eval_bench.window_prompts(rows, 3, 1, "r.jsonl")[0] == [[1, 13, 14, 15, 40, 41, 42]]  # the last rows
    with pytest.raises(StageError, match="no row has a response longer than --window-offset 9"):
        eval_bench.window_prompts(rows, 9, None, "r.jsonl")
    with pytest.raises(StageError, match="r.jsonl: row 1 has no input_ids/loss_mask"):
        eval_bench.window_prompts([{"messages": []}], 3, None, "r.jsonl")
    with pytest.raises(StageError, match="eval_window_offset"):
        eval_bench.window_prompts(rows, 0, None, "r.jsonl")
    # on the tiny model: the chat-templated conversation, then the response's opening, continued
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny / "model"))
    text = tok.apply_chat_template([{"role": "user", "content": "say something"}], add_generation_prompt=True,
                                   tokenize=False)
    conv = tok(text, add_special_tokens=False).input_ids
    answer = tok("alpha beta gamma delta epsilon", add_special_tokens=False).input_ids
    row = {"input_ids": conv + answer, "loss_mask": [0] * len(conv) + [1] * len(answer)}
    cut, _ = eval_bench.window_prompts([row], 2, None, "r.jsonl")
    eval_bench.render_window(cut, str(tiny / "model"), 16, tmp_path / "w.jsonl", trust_remote_code=False)
    (line,) = [json.loads(x) for x in (tmp_path / "w.jsonl").read_text().splitlines()]
    assert line["output_tokens"] == 16 and "say something" in line["prompt"]
    assert line["prompt"].endswith(tok.decode(answer[:2])) and not line["prompt"].endswith(tok.decode(answer[:3]))
    assert line["prompt"].count(tok.bos_token) <= 1


def test_kimis_eval_window_is_cut_from_answers_to_the_eval_prompts_not_from_training_rows():
    """The window's rows must be held out: the eval prompts' own answers (eval_openings), never synth's rows,
    which prepare turns into the drafter's training data; their length covers the offset."""
    cfg = config.load(None, "kimi-k2.5")

    def arg(stage: str, flag: str) -> str:
        s = cfg.stage(stage)
        argv = [cfg.render(s, a, cfg.vars_for(s)) for a in s.command]
        return argv[argv.index(flag) + 1]

    openings = cfg.render(cfg.stage("eval_openings"), cfg.stage("eval_openings").outputs[0],
                          cfg.vars_for(cfg.stage("eval_openings")))
    for stage in ("eval_baseline", "eval"):
        assert arg(stage, "--window-rows").startswith(openings + "/")
        assert int(arg(stage, "--window-offset")) < int(arg("eval_openings", "--max-tokens"))
    assert arg("eval_openings", "--prompts") == arg("eval", "--prompts") != arg("synth", "--prompts")
    assert not arg("prepare", "--data").startswith(openings) and "eval_openings" in cfg.stage("eval_baseline").depends_on
