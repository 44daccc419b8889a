"""A SERVICE stage: the target model behind vLLM's OpenAI-compatible server.

Checks its inputs, builds vLLM's argv and execs it (so the service's pid is vLLM's, and `lab stop`
signals vLLM itself). Ready when the log says `Application startup complete` or GET /health answers.

Modes:
  plain    the target alone (synthetic data, the no-speculation baseline)
  extract  + the `extract_hidden_states` speculative method and a hidden-states KV connector that
           writes hs files to --hidden-states-path (on CPU: eaglelab.vllm_cpu_connector)
  eval     + the trained EAGLE-3 drafter (`--drafter CKPT`) with speculative decoding

The serving smoke (eval, `--smoke-checkpoints DIR`: the job smoke-serve_eval beside train): the same
server on the latest whole epoch checkpoint in DIR, a few requests, one metric line, stopped
(eaglelab.stages.serve_smoke).

    python -m eaglelab.stages.serve --model data/demo/model --port 8100 --mode plain --device cpu
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import click

from ..errors import StageError
from ..fsutil import atomic_write_json
from . import common, serve_smoke
from .common import SERVER_INFO, extraction_layers

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding `eaglelab/`


def kv_transfer_config(hidden_states_path: str, device: str) -> dict:
    cfg = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
           "kv_connector_extra_config": {"shared_storage_path": hidden_states_path}}
    if device == "cpu":  # the stock connector is CUDA-only (pinned memory, streams)
        cfg.update(kv_connector="CpuHiddenStatesConnector", kv_connector_module_path="eaglelab.vllm_cpu_connector")
    return cfg


def eager(device: str, choice: bool | None) -> bool:
    """--enforce-eager on CPU only, unless asked: on a GPU it turns off CUDA graphs and torch.compile,
    so a server measured that way is not the one anybody serves with (speedups come out wrong)."""
    return device == "cpu" if choice is None else choice


def build_argv(*, python: str, model: str, host: str, port: int, mode: str, device: str, max_model_len: int,
               served_name: str | None, tensor_parallel: int, gpu_memory_utilization: float | None,
               enforce_eager: bool | None, scale_out: bool, aux_layers: list[int], num_layers: int,
               hidden_states_path: str | None, drafter: str | None, num_speculative_tokens: int,
               extra: list[str]) -> list[str]:
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", host,
            "--port", str(port), "--max-model-len", str(max_model_len), "--seed", "0"]
    if served_name:
        argv += ["--served-model-name", served_name]
    if tensor_parallel > 1:
        argv += ["--tensor-parallel-size", str(tensor_parallel)]
    if gpu_memory_utilization is not None and device != "cpu":
        argv += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    if eager(device, enforce_eager):
        argv.append("--enforce-eager")
    if device == "cpu" and tensor_parallel == 1 and not any(a.startswith("--distributed-executor-backend")
                                                             for a in extra):
        # one process for the worker and the engine (and the engine in the API server's: VLLM_ENABLE_V1_MULTIPROCESSING=0):
        # each extra process imports torch and vLLM again, 9 s of a CPU start's 33 s each
        argv += ["--distributed-executor-backend", "uni"]
    if scale_out:
        argv.append("--enable-scale-out")  # speculators' render endpoint answers 403 without it
    if mode == "extract":
        if not hidden_states_path:
            raise StageError("--mode extract needs --hidden-states-path (where vLLM writes hs files)")
        spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                "draft_model_config": {"hf_config": {
                    "eagle_aux_hidden_state_layer_ids": extraction_layers(aux_layers, num_layers)}}}
        argv += ["--speculative-config", json.dumps(spec),
                 "--kv-transfer-config", json.dumps(kv_transfer_config(hidden_states_path, device))]
    elif mode == "eval":
        if not drafter:
            raise StageError("--mode eval needs --drafter CHECKPOINT_DIR")
        argv += ["--speculative-config", json.dumps(
            {"method": "eagle3", "model": drafter, "num_speculative_tokens": num_speculative_tokens})]
    return argv + extra


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--model", required=True, type=click.Path(path_type=Path), help="target model directory or hub id")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True)
@click.option("--mode", type=click.Choice(["plain", "extract", "eval"]), default="plain", show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--max-model-len", default=4096, show_default=True)
@click.option("--served-model-name", default=None)
@click.option("--tensor-parallel", default=1, show_default=True)
@click.option("--gpu-memory-utilization", type=float, default=None)
@click.option("--kv-cache-gib", default=1, show_default=True, help="VLLM_CPU_KVCACHE_SPACE on CPU")
@click.option("--enforce-eager/--no-enforce-eager", default=None,
              help="default: on CPU only (a GPU server keeps its CUDA graphs)")
@click.option("--scale-out/--no-scale-out", default=True, show_default=True, help="--enable-scale-out (render endpoint)")
@click.option("--aux-layers", default="", help="aux layer ids, space separated, WITHOUT the last layer")
@click.option("--hidden-states-path", default=None, help="extract: where vLLM writes hs files")
@click.option("--drafter", default=None, help="eval: the EAGLE-3 checkpoint directory")
@click.option("--num-speculative-tokens", default=3, show_default=True)
@click.option("--vllm-args", default="", help="more vLLM flags in one string (split like a shell would, never run by one)")
@click.option("--dry-run", is_flag=True, help="print the command and exit")
@click.option("--smoke-checkpoints", type=click.Path(path_type=Path), default=None,
              help="eval: a smoke instead of a service: serve the latest whole epoch checkpoint in this dir "
                   "(the train stage's --out; --drafter is ignored), measure a few requests, stop, exit")
@click.option("--smoke-wait-s", default=3600.0, show_default=True, help="smoke: how long to wait for a checkpoint")
@click.option("--smoke-ready-s", default=1800.0, show_default=True, help="smoke: how long vLLM may take to answer /health")
@click.option("--smoke-requests", default=4, show_default=True, help="smoke: chat completions measured")
@click.option("--smoke-max-tokens", default=32, show_default=True, help="smoke: tokens per request (ignore_eos)")
@click.option("--smoke-prompts", type=click.Path(path_type=Path), default=None,
              help="smoke: JSONL with `messages` rows (the eval prompts); default: one built-in prompt")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def main(model: Path, host: str, port: int, mode: str, device: str, max_model_len: int,
         served_model_name: str | None, tensor_parallel: int, gpu_memory_utilization: float | None,
         kv_cache_gib: int, enforce_eager: bool | None, scale_out: bool, aux_layers: str,
         hidden_states_path: str | None, drafter: str | None, num_speculative_tokens: int, vllm_args: str,
         dry_run: bool, smoke_checkpoints: Path | None, smoke_wait_s: float, smoke_ready_s: float,
         smoke_requests: int, smoke_max_tokens: int, smoke_prompts: Path | None, extra: tuple[str, ...]) -> None:
    """Exec vLLM's OpenAI server for the target (EXTRA args go to vLLM unchanged)."""
    device = common.resolve_device(device)
    cfg = common.model_config(model)
    layers = common.parse_layers(aux_layers, "--aux-layers") if aux_layers else common.default_aux_layers(cfg["num_hidden_layers"])
    if mode == "extract":
        common.check_aux_layers(layers, cfg["num_hidden_layers"], "--aux-layers")
        if not hidden_states_path:
            raise StageError("--mode extract needs --hidden-states-path (where vLLM writes hs files)")
        # Tell the extraction client which layers this server extracts, so it can check that
        # extraction and training agree before a single request is sent.
        Path(hidden_states_path).mkdir(parents=True, exist_ok=True)
        atomic_write_json(Path(hidden_states_path) / SERVER_INFO, {
            "schema": 1, "model": str(model), "aux_layers": layers,
            "layer_ids": extraction_layers(layers, cfg["num_hidden_layers"]), "device": device})
    if smoke_checkpoints is not None:
        if mode != "eval":
            raise StageError(f"--smoke-checkpoints with --mode {mode}: the serving smoke is of --mode eval")
        if smoke_requests < 1 or smoke_max_tokens < 1:
            raise StageError("--smoke-requests and --smoke-max-tokens: at least 1")
        drafter = str(serve_smoke.wait_for_checkpoint(smoke_checkpoints, smoke_wait_s, click.echo))
    if mode == "eval":
        if not drafter:
            raise StageError("--mode eval needs --drafter CHECKPOINT_DIR")
        try:
            common.check_drafter(Path(drafter), cfg, layers if aux_layers else None)
        except StageError as e:
            if smoke_checkpoints is None:
                raise
            raise StageError(f"serve smoke of checkpoint {drafter}: {e.message}") from None
    argv = build_argv(python=sys.executable, model=str(model), host=host, port=port, mode=mode, device=device,
                      max_model_len=max_model_len, served_name=served_model_name, tensor_parallel=tensor_parallel,
                      gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
                      scale_out=scale_out, aux_layers=layers, num_layers=cfg["num_hidden_layers"],
                      hidden_states_path=str(Path(hidden_states_path).resolve()) if hidden_states_path else None,
                      drafter=drafter, num_speculative_tokens=num_speculative_tokens,
                      extra=shlex.split(vllm_args) + list(extra))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
    if device == "cpu":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
        if "--distributed-executor-backend" in argv and argv[argv.index("--distributed-executor-backend") + 1] == "uni":
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in the API server's process
    click.echo(f"serve[{mode}]: {shlex.join(argv)}", err=True)
    if dry_run:
        click.echo(shlex.join(argv))
        return
    if smoke_checkpoints is not None:
        serve_smoke.run(argv, env, Path(drafter), host, port, served_model_name or str(model), smoke_prompts,
                        smoke_requests, smoke_max_tokens, smoke_ready_s, click.echo)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, env)


if __name__ == "__main__":
    main()
