"""The verifier's hidden states for every prepared sample, one `hs_{i}.safetensors` each.

Two backends write the identical format (key `hidden_states` bf16 [seq_len, n_aux+1, hidden], aux
layers first and the final layer last; key `token_ids` int64 [seq_len] = the row's input_ids):

  vllm          speculators' offline generation (`generate-offline-data`) against the extraction
                server (`serve --mode extract`), which writes the files; they are validated and moved.
  transformers  a local forward pass: aux layer k = `output_hidden_states[k]` (the residual stream
                after k decoder layers) and the final layer = the INPUT of the final norm (a forward
                pre-hook), not HF's last hidden state, which is after the norm. Runs where vLLM
                cannot (the GPU machines without vLLM) and needs no server.

Resumable (finished hs files are skipped; writes are atomic, so a killed run leaves none half
written), sharded across hosts with --world-size/--rank (speculators' split of the indices), and
checked: disk space before, shapes and layer count after, layer ids against the server's and
recorded in the manifest for the train stage to compare with its own.

    python -m eaglelab.stages.extract --backend transformers --model data/demo/model \
        --data data/demo/prepared --out data/demo/hidden_states --aux-layers "1 2 3"
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import click

from .. import manifest
from ..errors import StageError
from ..fsutil import read_json
from . import common
from .serve import SERVER_INFO, extraction_layers


def hs_path(out: Path, idx: int) -> Path:
    return out / f"hs_{idx}.safetensors"


def rank_indices(num_samples: int, max_samples: int | None, world_size: int, rank: int) -> list[int]:
    """All indices this rank owns (done or not), as speculators splits them."""
    from speculators.data_generation.offline import get_indices_to_process

    return get_indices_to_process(num_samples, max_samples, [], world_size, rank)


def pending_indices(out: Path, mine: list[int]) -> list[int]:
    """Indices of `mine` without a readable hs file (an unreadable one is deleted, to be redone)."""
    from speculators.data_generation.offline import find_corrupt_hidden_state_indices

    have = [i for i in mine if hs_path(out, i).is_file()]
    corrupt = find_corrupt_hidden_state_indices(out, have)
    for i, why in corrupt.items():
        click.echo(f"extract: {hs_path(out, i)} is unreadable ({why}); redoing it")
        hs_path(out, i).unlink()
    done = set(have) - set(corrupt)
    return [i for i in mine if i not in done]


def check_disk(out: Path, seq_lens: list[int], n_layers: int, hidden: int) -> int:
    need = sum(seq_lens) * n_layers * hidden * 2 + 4096 * len(seq_lens)
    free = shutil.disk_usage(out).free
    if need > free * 0.95:
        raise StageError(f"{out}: hidden states need ~{need / 1e9:.1f} GB, only {free / 1e9:.1f} GB free; "
                         "free space or point --out at a bigger filesystem (keep vLLM's staging dir on it too)")
    return need


def check_file(path: Path, seq_len: int, n_layers: int, hidden: int) -> None:
    """Header-only shape check (cheap, no tensor data read)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        keys = set(f.keys())
        if not {"hidden_states", "token_ids"} <= keys:
            raise StageError(f"{path}: keys {sorted(keys)}, expected hidden_states and token_ids; delete it and rerun")
        hs = tuple(f.get_slice("hidden_states").get_shape())
        ids = tuple(f.get_slice("token_ids").get_shape())
    if hs != (seq_len, n_layers, hidden) or ids != (seq_len,):
        raise StageError(f"{path}: hidden_states {hs} / token_ids {ids}, expected ({seq_len}, {n_layers}, {hidden}) / "
                         f"({seq_len},): the server extracted other layers or another model; delete the "
                         "hidden-state files and rerun with matching --aux-layers")


# ---- transformers backend -------------------------------------------------------------------

def load_hf_model(model: Path, device: str):
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16)
    return m.to(device).eval()


def final_norm(model):
    inner = getattr(model, "model", None)
    norm = getattr(inner, "norm", None)
    if norm is None:
        raise StageError(f"{type(model).__name__}: no model.norm to hook; the transformers backend supports "
                         "Llama-style decoders (model.model.norm); use --backend vllm")
    return norm


def forward_hidden_states(model, batch_ids: list[list[int]], aux_layers: list[int]):
    """[(seq_len_i, n_aux+1, hidden) bf16 on CPU] for a right-padded batch."""
    import torch

    device = next(model.parameters()).device
    longest = max(len(x) for x in batch_ids)
    ids = torch.zeros((len(batch_ids), longest), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, x in enumerate(batch_ids):
        ids[b, : len(x)] = torch.tensor(x)
        mask[b, : len(x)] = 1
    captured: list = []
    hook = final_norm(model).register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    try:
        with torch.inference_mode():
            out = model.model(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True,
                              use_cache=False)
    finally:
        hook.remove()
    layers = [out.hidden_states[k] for k in aux_layers] + [captured[0]]
    stacked = torch.stack(layers, dim=2).to(torch.bfloat16).cpu()  # [B, T, n, H]
    return [stacked[b, : len(x)].contiguous() for b, x in enumerate(batch_ids)]


def save_atomic(path: Path, hidden, token_ids) -> None:
    import torch
    from safetensors.torch import save_file

    tmp = path.with_name(f".{path.name}.tmp")
    save_file({"hidden_states": hidden, "token_ids": torch.as_tensor(token_ids, dtype=torch.long)}, str(tmp))
    os.replace(tmp, path)


class Writer:
    """Writes hs files on background threads while the next batches run forward: on a GPU the disk
    writes otherwise stall the forward passes (measured 0.57x of forward-only throughput on an H200).
    A bounded queue keeps memory in check: the forward loop waits when `depth` batches are pending.
    The first error a writer hits is raised in the forward loop's thread at the next put or close."""

    def __init__(self, threads: int = 2, depth: int = 4):
        import queue
        import threading

        self.queue: "queue.Queue" = queue.Queue(maxsize=max(depth, 1))
        self.error: BaseException | None = None
        self.written = 0
        self.wait_s = 0.0  # time the forward loop spent blocked on a full queue
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._work, daemon=True, name=f"hs-writer-{i}")
                         for i in range(max(threads, 1))]
        for t in self._threads:
            t.start()

    def _work(self) -> None:
        while True:
            item = self.queue.get()
            try:
                if item is None:
                    return
                if self.error is None:
                    path, hidden, ids = item
                    save_atomic(path, hidden, ids)
                    with self._lock:
                        self.written += 1
            except BaseException as e:  # noqa: BLE001 - handed to the forward loop's thread
                self.error = self.error or e
            finally:
                self.queue.task_done()

    def _raise(self) -> None:
        if self.error is not None:
            raise StageError(f"writing hidden states failed: {self.error}; finished files are kept, "
                             "run again to resume") from self.error

    def put(self, path: Path, hidden, ids) -> None:
        self._raise()
        t0 = time.perf_counter()
        self.queue.put((path, hidden, ids))
        self.wait_s += time.perf_counter() - t0

    def close(self) -> None:
        for _ in self._threads:
            self.queue.put(None)
        for t in self._threads:
            t.join()
        self._raise()


def run_transformers(model_dir: Path, dataset, todo: list[int], out: Path, aux_layers: list[int], device: str,
                     batch_size: int, writer_threads: int = 2, forward_only: bool = False) -> dict:
    """Forward passes on this thread, file writes on `writer_threads` others (0: inline, no overlap).
    forward_only: write nothing (a benchmark's ceiling for the same batches)."""
    import torch
    from tqdm import tqdm

    model = load_hf_model(model_dir, device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    ok, t0, tokens, fwd_s = 0, time.perf_counter(), 0, 0.0
    writer = Writer(writer_threads) if writer_threads > 0 and not forward_only else None
    order = sorted(todo, key=lambda i: -int(dataset[i]["seq_len"]))  # similar lengths batch together
    try:
        with tqdm(total=len(todo), desc="Extracting hidden states", unit="sample", dynamic_ncols=True) as bar:
            for start in range(0, len(order), batch_size):
                chunk = order[start: start + batch_size]
                rows = [[int(t) for t in dataset[i]["input_ids"]] for i in chunk]
                f0 = time.perf_counter()
                states = forward_hidden_states(model, rows, aux_layers)  # on CPU: the copy waits for the GPU
                sync()
                fwd_s += time.perf_counter() - f0
                for i, ids, hs in zip(chunk, rows, states):
                    if forward_only:
                        pass
                    elif writer is not None:
                        writer.put(hs_path(out, i), hs, ids)
                    else:
                        save_atomic(hs_path(out, i), hs, ids)
                    ok += 1
                    tokens += len(ids)
                el = time.perf_counter() - t0
                bar.set_postfix({"ok": ok, "err": 0, "rps": f"{ok / el:.1f}", "tps": f"{tokens / el:.0f}"}, refresh=False)
                bar.update(len(chunk))
    finally:
        if writer is not None:
            writer.close()  # every queued file is on disk before the stage checks them
    el = time.perf_counter() - t0
    timing = {"seconds": el, "samples": ok, "tokens": tokens, "forward_s": fwd_s,
              "write_wait_s": writer.wait_s if writer else 0.0, "forward_only": forward_only}
    click.echo(f"extract: Timing: {el:.1f}s elapsed, {ok / el:.1f} samples/s, {tokens / el:.0f} tokens/s ({device}); "
               f"forward+copy {fwd_s:.1f}s, waiting on writers {timing['write_wait_s']:.1f}s, "
               f"{'no writes (forward only)' if forward_only else f'{writer_threads} writer thread(s)'}")
    return timing


# ---- vllm backend -----------------------------------------------------------------------------

def server_layers(staging: Path) -> dict:
    info = read_json(staging / SERVER_INFO)
    if not info:
        raise StageError(f"{staging / SERVER_INFO}: missing; --server-hidden-states-path must be the "
                         "--hidden-states-path of a running `serve --mode extract` (lab run serve_extract)")
    return info


def run_vllm(endpoint: str, data: Path, out: Path, max_samples: int | None, concurrency: int, world_size: int,
             rank: int, timeout: float) -> None:
    from speculators.cli.generate_offline_data import generate_offline_data

    try:
        generate_offline_data(model=None, endpoint=f"{endpoint}/v1", preprocessed_data=str(data), output=str(out),
                              max_samples=max_samples, concurrency=concurrency, validate_outputs=True,
                              request_timeout=timeout, max_retries=3, fail_on_error=False,
                              max_consecutive_errors=None, world_size=world_size, rank=rank)
    except SystemExit as e:  # the library exits 1 on failure, 130 on Ctrl-C
        if e.code not in (0, None):
            raise StageError(f"speculators generate-offline-data failed (exit {e.code}) against {endpoint}; "
                             "finished files are kept, run again to resume") from None


@click.command()
@click.option("--backend", type=click.Choice(["vllm", "transformers"]), default="vllm", show_default=True)
@click.option("--model", required=True, type=click.Path(path_type=Path), help="target model directory")
@click.option("--data", required=True, type=click.Path(path_type=Path), help="prepare's output directory")
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="hs_*.safetensors go here")
@click.option("--aux-layers", default="", help="aux layer ids WITHOUT the last layer (as train's --target-layer-ids)")
@click.option("--endpoint", default="http://127.0.0.1:8000", show_default=True, help="vllm: the extraction server")
@click.option("--server-hidden-states-path", type=click.Path(path_type=Path), default=None,
              help="vllm: the server's --hidden-states-path (its layer ids are read from there)")
@click.option("--concurrency", default=4, show_default=True)
@click.option("--request-timeout", default=600.0, show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--batch-size", default=1, show_default=True, help="transformers: samples per forward")
@click.option("--writer-threads", default=2, show_default=True,
              help="transformers: threads writing hs files while the next batch runs (0: write inline)")
@click.option("--forward-only", is_flag=True, help="transformers: benchmark the forward passes, write nothing")
@click.option("--max-samples", type=int, default=None)
@click.option("--world-size", default=1, show_default=True, help="hosts sharing the extraction")
@click.option("--rank", default=0, show_default=True, help="this host's index in [0, world-size)")
def main(backend: str, model: Path, data: Path, out_dir: Path, aux_layers: str, endpoint: str,
         server_hidden_states_path: Path | None, concurrency: int, request_timeout: float, device: str,
         batch_size: int, writer_threads: int, forward_only: bool, max_samples: int | None, world_size: int,
         rank: int) -> None:
    """Extract the target's hidden states for the prepared samples."""
    if not 0 <= rank < world_size:
        raise StageError(f"--rank {rank}: must be in [0, --world-size {world_size})")
    cfg = common.model_config(model)
    n_layers, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    aux = common.parse_layers(aux_layers, "--aux-layers") if aux_layers else common.default_aux_layers(n_layers)
    layer_ids = extraction_layers(aux, n_layers)
    prep = manifest.require(data, "prepare", f"run the prepare stage (lab run prepare) to fill {data}")

    from datasets import load_from_disk

    dataset = load_from_disk(str(data))
    if len(dataset) != prep["counts"]["samples"]:
        raise StageError(f"{data}: {len(dataset)} rows but its manifest says {prep['counts']['samples']}; rerun prepare")
    seq_lens = [int(x) for x in dataset["seq_len"]]
    params = {"data": prep["fingerprint"], "aux_layers": aux, "layer_ids": layer_ids, "max_samples": max_samples,
              "world_size": world_size}
    rank_name = manifest.NAME if world_size == 1 else f"manifest.rank{rank}.json"
    if manifest.is_complete(out_dir, params, rank_name):
        click.echo(f"extract: {out_dir} is complete ({manifest.read(out_dir, rank_name)['counts']}); skipping")
        return
    # Other hosts may be writing into a shared directory: never move it under them.
    moved = manifest.claim(out_dir, "extract", params, may_move=world_size == 1)
    if moved:
        click.echo(f"extract: {out_dir} held hidden states of other data or layers; moved to {moved} "
                   "(delete it to free the disk)")
    mine = rank_indices(len(dataset), max_samples, world_size, rank)
    todo = pending_indices(out_dir, mine)
    if len(mine) - len(todo):
        click.echo(f"extract: Found {len(mine) - len(todo)} existing samples for rank {rank}.")
    if todo:
        need = check_disk(out_dir, [seq_lens[i] for i in todo], len(layer_ids), hidden)
        click.echo(f"extract: Processing {len(todo)} samples ({sum(seq_lens[i] for i in todo)} tokens, "
                   f"~{need / 1e6:.1f} MB) with the {backend} backend, layers {layer_ids}")
        if backend == "vllm":
            staging = server_hidden_states_path
            if staging is None:
                raise StageError("--backend vllm needs --server-hidden-states-path (the extraction server's "
                                 "--hidden-states-path): its layer ids are checked against --aux-layers")
            info = server_layers(staging)
            if info.get("layer_ids") != layer_ids:
                raise StageError(f"{staging / SERVER_INFO}: the server extracts layers {info.get('layer_ids')}, this "
                                 f"stage expects {layer_ids} (--aux-layers {aux} + last): restart serve_extract "
                                 "with the same aux layers; a mismatch collapses acceptance")
            if os.stat(staging).st_dev != os.stat(out_dir).st_dev:
                click.echo(f"extract: WARNING {staging} and {out_dir} are on different filesystems: every file is "
                           "copied, not moved (slow, and can fill the staging disk)")
            run_vllm(endpoint.rstrip("/"), data, out_dir, max_samples, concurrency, world_size, rank, request_timeout)
        else:
            run_transformers(model, dataset, todo, out_dir, aux, common.resolve_device(device), batch_size,
                             writer_threads, forward_only)
            if forward_only:
                click.echo("extract: --forward-only wrote nothing; done")
                return
    missing = pending_indices(out_dir, mine)
    if missing:
        raise StageError(f"{out_dir}: {len(missing)} of {len(mine)} samples of rank {rank} have no hidden states "
                         f"(first: {missing[:5]}); the errors are above. Run again to retry only those.")
    for i in mine:
        check_file(hs_path(out_dir, i), seq_lens[i], len(layer_ids), hidden)
    files = [hs_path(out_dir, i) for i in mine]
    doc = manifest.write(out_dir, "extract", files, params=params, hash_limit=0, name=rank_name,
                         counts={"samples": len(mine), "tokens": sum(seq_lens[i] for i in mine),
                                 "layers": len(layer_ids), "hidden_size": hidden},
                         extra={"backend": backend, "rank": rank})
    click.echo(f"extract: Saved {len(todo)} new data points to {out_dir}; {len(mine)} in all, "
               f"{doc['total_bytes'] / 1e6:.1f} MB (manifest {doc['fingerprint']})")
    if world_size > 1:
        merge_ranks(out_dir, world_size, params, len(dataset), max_samples)
    click.echo("extract: Data generation complete!")


def merge_ranks(out_dir: Path, world_size: int, params: dict, num_samples: int, max_samples: int | None) -> None:
    """When every rank's part is there (a shared filesystem), write the whole set's manifest.json."""
    docs = [manifest.read(out_dir, f"manifest.rank{r}.json") for r in range(world_size)]
    if any(d is None or d.get("params") != params for d in docs):
        click.echo(f"extract: {sum(d is not None for d in docs)} of {world_size} ranks finished in {out_dir}")
        return
    total = min(max_samples, num_samples) if max_samples is not None else num_samples
    files = [hs_path(out_dir, i) for i in range(total)]
    manifest.write(out_dir, "extract", files, params=params, hash_limit=0,
                   counts={"samples": total, "tokens": sum(d["counts"]["tokens"] for d in docs),
                           "layers": docs[0]["counts"]["layers"], "hidden_size": docs[0]["counts"]["hidden_size"]},
                   extra={"ranks": world_size})


if __name__ == "__main__":
    sys.exit(main())
