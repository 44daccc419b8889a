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
from . import common, shards
from .common import SERVER_INFO, TRIMMED_DATA, extraction_layers, hs_path


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


PAD_MULTIPLE = 64  # on a GPU a batch is right-padded to a multiple of this (a fresh process ran at a third
                   # of the warm speed on 400 samples of 50 distinct lengths: a new plan per shape)


def forward_stacked(model, batch_ids: list[list[int]], aux_layers: list[int], pad_multiple: int = PAD_MULTIPLE):
    """One right-padded forward: [B, T, n_aux+1, hidden] bf16 on the model's device (not copied out)."""
    import torch

    device = next(model.parameters()).device
    longest = max(len(x) for x in batch_ids)
    pinned = device.type == "cuda"
    if pinned and pad_multiple > 1:  # few distinct shapes: cuDNN builds an attention plan per new shape
        longest = -(-longest // pad_multiple) * pad_multiple
    # Pinned, so the upload does not block this thread until the GPU has finished the previous batch
    # (a copy from pageable memory does): the host prepares batch k+1 while batch k runs.
    ids = torch.zeros((len(batch_ids), longest), dtype=torch.long, pin_memory=pinned)
    mask = torch.zeros((len(batch_ids), longest), dtype=torch.long, pin_memory=pinned)
    for b, x in enumerate(batch_ids):
        ids[b, : len(x)] = torch.tensor(x)
        mask[b, : len(x)] = 1
    ids, mask = ids.to(device, non_blocking=pinned), mask.to(device, non_blocking=pinned)
    captured: list = []
    hook = final_norm(model).register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    try:
        with torch.inference_mode():
            out = model.model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
            layers = [out.hidden_states[k] for k in aux_layers] + [captured[0]]
            return torch.stack(layers, dim=2).to(torch.bfloat16)
    finally:
        hook.remove()


def forward_hidden_states(model, batch_ids: list[list[int]], aux_layers: list[int]):
    """[(seq_len_i, n_aux+1, hidden) bf16 on CPU] for a right-padded batch (blocking; tests, profiling)."""
    stacked = forward_stacked(model, batch_ids, aux_layers).cpu()
    return [stacked[b, : len(x)].contiguous() for b, x in enumerate(batch_ids)]


def write_hs_file(path: Path, hidden, token_ids) -> None:
    """An hs file in the safetensors format, written straight from `hidden`'s memory (a pinned buffer):
    file.write of a memoryview releases the GIL, so writer threads do not slow the forward loop's
    Python (safetensors' save_file first copies every tensor into a bytes object, holding the GIL).
    Atomic: a tmp file renamed, so a killed run leaves no half-written hs file."""
    import json
    import struct

    import numpy as np
    import torch

    hidden = hidden.contiguous()
    ids = np.asarray(token_ids, dtype="<i8")
    hs_bytes = hidden.numel() * 2
    header = json.dumps({
        "hidden_states": {"dtype": "BF16", "shape": list(hidden.shape), "data_offsets": [0, hs_bytes]},
        "token_ids": {"dtype": "I64", "shape": [len(ids)], "data_offsets": [hs_bytes, hs_bytes + ids.nbytes]},
    }, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # the format pads the header to 8 bytes
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.write(memoryview(hidden.view(torch.uint8).numpy()).cast("B"))  # bf16 bytes as they are (little endian)
        f.write(ids.tobytes())
    os.replace(tmp, path)


def save_atomic(path: Path, hidden, token_ids) -> None:
    write_hs_file(path, hidden, token_ids)


class HostBuffers:
    """Page-locked host buffers the hidden states are copied into on a side CUDA stream: the copy of
    batch k overlaps the forward of batch k+1 and the loop never waits for it (a copy into pageable
    memory blocks the host and ran at a fraction of the bus speed: 73% of device time on an H200).
    `count` buffers circulate between the forward loop and the writers: the loop waits for a free one
    when every buffer is still being written (that wait is the writers' back pressure)."""

    def __init__(self, count: int, device: str):
        import queue

        import torch

        self.cuda = device.startswith("cuda")
        self.stream = torch.cuda.Stream() if self.cuda else None
        self.free: queue.Queue = queue.Queue()
        for _ in range(max(count, 1)):
            self.free.put(torch.empty(0, dtype=torch.uint8, pin_memory=self.cuda))
        self.wait_s = 0.0

    def copy_out(self, stacked, lengths: list[int], timer: DeviceTimer | None = None):
        """Start the device->host copy of each sample's rows; returns (buffer, views, done event).
        The views are valid once the event has completed; the buffer goes back with release()."""
        import torch

        n, hidden = stacked.shape[2], stacked.shape[3]
        need = sum(lengths) * n * hidden * 2
        t0 = time.perf_counter()
        buf = self.free.get()
        self.wait_s += time.perf_counter() - t0
        if buf.numel() < need:  # batches come longest first, so this happens about once
            buf = torch.empty(need, dtype=torch.uint8, pin_memory=self.cuda)
        views, off = [], 0
        for length in lengths:
            nbytes = length * n * hidden * 2
            views.append(buf[off: off + nbytes].view(torch.bfloat16).view(length, n, hidden))
            off += nbytes
        if not self.cuda:  # CPU: the states already are in host memory
            c0 = timer.start() if timer else None
            for b, (v, length) in enumerate(zip(views, lengths)):
                v.copy_(stacked[b, :length])
            if timer:
                timer.stop("copy", c0)
            return buf, views, None
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            c0 = timer.start(self.stream) if timer else None  # after the wait: the copy alone is timed
            for b, (v, length) in enumerate(zip(views, lengths)):
                v.copy_(stacked[b, :length], non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
            if timer:
                timer.stop("copy", c0, self.stream)
        stacked.record_stream(self.stream)  # the allocator must not reuse it before the copy ran
        return buf, views, done

    def release(self, buf) -> None:
        self.free.put(buf)


class Writer:
    """Writes hs files on background threads while the next batches run forward: on a GPU the disk
    writes otherwise stall the forward passes (measured 0.57x of forward-only throughput on an H200).
    A bounded queue keeps memory in check: the forward loop waits when `depth` batches are pending.
    An item is a whole batch: (the copy's done event or None, [(path, hidden, ids)], on_done).
    The first error a writer hits is raised in the forward loop's thread at the next put or close."""

    def __init__(self, threads: int = 2, depth: int = 4):
        import queue
        import threading

        self.queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self.error: BaseException | None = None
        self.written = 0
        self.wait_s = 0.0  # time the forward loop spent blocked on a full queue
        self.busy_s = 0.0  # time the writers spent writing (summed over threads)
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
                done, files, on_done = item
                try:
                    if self.error is None:
                        if done is not None:
                            done.synchronize()  # the device->host copy of this batch (releases the GIL)
                        t0 = time.perf_counter()
                        for path, hidden, ids in files:
                            write_hs_file(path, hidden, ids)
                        with self._lock:
                            self.written += len(files)
                            self.busy_s += time.perf_counter() - t0
                finally:
                    if on_done is not None:
                        on_done()
            except BaseException as e:  # noqa: BLE001 - handed to the forward loop's thread
                self.error = self.error or e
            finally:
                self.queue.task_done()

    def _raise(self) -> None:
        if self.error is not None:
            raise StageError(f"writing hidden states failed: {self.error}; finished files are kept, "
                             "run again to resume") from self.error

    def put(self, done, files: list, on_done=None) -> None:
        self._raise()
        t0 = time.perf_counter()
        self.queue.put((done, files, on_done))
        self.wait_s += time.perf_counter() - t0

    def close(self) -> None:
        for _ in self._threads:
            self.queue.put(None)
        for t in self._threads:
            t.join()
        self._raise()


class DeviceTimer:
    """Device time of the forward passes and of the copies: CUDA events read at the end (reading them
    as we go would make the loop wait for the GPU); on CPU, where every op is synchronous, the clock."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.pairs: dict[str, list] = {"forward": [], "copy": []}

    def start(self, stream=None):
        if not self.cuda:
            return time.perf_counter()
        import torch

        e = torch.cuda.Event(enable_timing=True)
        e.record(stream)
        return e

    def stop(self, what: str, begin, stream=None) -> None:
        self.pairs[what].append((begin, self.start(stream)))

    def seconds(self) -> dict[str, float]:
        if not self.cuda:
            return {k: sum(b - a for a, b in v) for k, v in self.pairs.items()}
        return {k: sum(a.elapsed_time(b) for a, b in v) / 1000 for k, v in self.pairs.items()}


def row_ids(dataset, i: int) -> list[int]:
    ids = dataset[i]["input_ids"]  # a tensor in prepare's (torch) format: one tolist, not an int() per token
    return [int(t) for t in (ids.tolist() if hasattr(ids, "tolist") else ids)]


def run_transformers(model_dir: Path, dataset, todo: list[int], out: Path, aux_layers: list[int], device: str,
                     batch_size: int, writer_threads: int = 2, forward_only: bool = False,
                     host_buffers: int = 3, model=None, pad_multiple: int = PAD_MULTIPLE) -> dict:
    """Forward passes on this thread; the copies to host on a side stream into pinned buffers; the file
    writes on `writer_threads` others (0: copy and write inline, no overlap: the old way, a baseline).
    forward_only: no copy, no write (a benchmark's ceiling for the same batches).
    model: one already loaded (a benchmark comparing modes in one process)."""
    import torch
    from tqdm import tqdm

    model = model if model is not None else load_hf_model(model_dir, device)
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    timer = DeviceTimer(cuda)
    overlap = writer_threads > 0 and not forward_only
    writer = Writer(writer_threads, depth=host_buffers) if overlap else None
    buffers = HostBuffers(host_buffers, device) if overlap else None
    ok, t0, tokens = 0, time.perf_counter(), 0
    order = sorted(todo, key=lambda i: -int(dataset[i]["seq_len"]))  # similar lengths batch together
    try:
        with tqdm(total=len(todo), desc="Extracting hidden states", unit="sample", dynamic_ncols=True) as bar:
            for start in range(0, len(order), batch_size):
                chunk = order[start: start + batch_size]
                rows = [row_ids(dataset, i) for i in chunk]
                paths = [hs_path(out, i) for i in chunk]
                f0 = timer.start()
                stacked = forward_stacked(model, rows, aux_layers, pad_multiple)
                timer.stop("forward", f0)
                if forward_only:
                    pass
                elif buffers is not None:
                    buf, views, done = buffers.copy_out(stacked, [len(r) for r in rows], timer)
                    del stacked  # the copy stream holds it until the copy ran
                    writer.put(done, list(zip(paths, views, rows)), lambda b=buf: buffers.release(b))
                else:  # the baseline: a blocking copy to pageable memory, then the writes, on this thread
                    c0 = timer.start()
                    host = stacked.cpu()
                    timer.stop("copy", c0)
                    for b, (path, ids) in enumerate(zip(paths, rows)):
                        write_hs_file(path, host[b, : len(ids)], ids)
                ok += len(chunk)
                tokens += sum(len(r) for r in rows)
                el = time.perf_counter() - t0
                bar.set_postfix({"ok": ok, "err": 0, "rps": f"{ok / el:.1f}", "tps": f"{tokens / el:.0f}"}, refresh=False)
                bar.update(len(chunk))
        sync()
    finally:
        if writer is not None:
            writer.close()  # every queued file is on disk before the stage checks them
    el = time.perf_counter() - t0
    dev = timer.seconds()
    timing = {"seconds": el, "samples": ok, "tokens": tokens, "forward_s": dev["forward"], "copy_s": dev["copy"],
              "write_wait_s": (writer.wait_s + buffers.wait_s) if writer else 0.0,
              "write_busy_s": writer.busy_s if writer else 0.0, "forward_only": forward_only}
    mode = ("no copies, no writes (forward only)" if forward_only else
            f"pinned copies on a side stream, {writer_threads} writer thread(s)" if overlap else
            "blocking copies and writes inline")
    click.echo(f"extract: Timing: {el:.1f}s elapsed, {ok / el:.1f} samples/s, {tokens / el:.0f} tokens/s ({device}); "
               f"device time: forward {dev['forward']:.1f}s, copy {dev['copy']:.1f}s; waiting on writers "
               f"{timing['write_wait_s']:.1f}s, writing {timing['write_busy_s']:.1f}s; {mode}")
    return timing


# ---- the length cap --------------------------------------------------------------------------



def server_max_model_len(endpoint: str, timeout: float = 30.0) -> int:
    """The extraction server's max_model_len, as its /v1/models answers."""
    import json
    import urllib.request

    url = f"{endpoint}/v1/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            models = json.load(r).get("data") or []
    except (OSError, ValueError) as e:
        raise StageError(f"{url}: could not read the server's max_model_len ({e}); is serve_extract up? "
                         "Or give --max-model-len (the server's --max-model-len)") from None
    cap = models[0].get("max_model_len") if models else None
    if not isinstance(cap, int) or cap < 2:
        raise StageError(f"{url}: no max_model_len in the answer ({models[:1]}); give --max-model-len "
                         "(the server's --max-model-len)")
    return cap


def capped_lengths(seq_lens: list[int], max_model_len: int | None) -> dict[int, int]:
    """{index: tokens to keep} for the rows that cannot be extracted whole: vLLM extracts by generating
    one token after the sample, so a sample needs at most max_model_len - 1 tokens (one cut at the cap
    of synth or prepare is exactly max_model_len long and would be refused on every run)."""
    if max_model_len is None:
        return {}
    keep = max_model_len - 1
    return {i: keep for i, n in enumerate(seq_lens) if n > keep}


def write_trimmed_dataset(dataset, trims: dict[int, int], out: Path) -> Path:
    """<out>/dataset: the prepared rows with the trimmed ones cut (input_ids, loss_mask, seq_len), in the
    prepared format. The train stage reads its rows from here, so that each row matches its hs file."""
    dest = out / TRIMMED_DATA
    if dest.is_dir():
        return dest  # made by an earlier run with the same params (else claim moved the directory)
    fmt = dataset.format

    def cut(row, idx):
        keep = trims.get(idx)
        if keep is None:
            return row
        return {**row, "input_ids": row["input_ids"][:keep], "loss_mask": row["loss_mask"][:keep], "seq_len": keep}

    trimmed = dataset.with_format(None).map(cut, with_indices=True, desc="trimming rows at the length cap")
    trimmed.set_format(type=fmt["type"], columns=fmt["columns"], output_all_columns=fmt["output_all_columns"])
    tmp = out / f".{TRIMMED_DATA}.{os.getpid()}.tmp"  # ranks sharing the directory may race here
    shutil.rmtree(tmp, ignore_errors=True)
    trimmed.save_to_disk(str(tmp))
    try:
        os.replace(tmp, dest)
    except OSError:
        if not dest.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another rank made the same one first
    return dest


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
@click.option("--pad-multiple", default=PAD_MULTIPLE, show_default=True,
              help="transformers on a GPU: pad each batch to a multiple of this many tokens (1: no padding)")
@click.option("--max-model-len", type=int, default=None,
              help="the serving max_model_len: longer samples are trimmed to max_model_len - 1 tokens "
                   "(vllm: default the server's; transformers: default no cap)")
@click.option("--max-samples", type=int, default=None)
@click.option("--world-size", default=1, show_default=True,
              help="shards of the extraction (GPUs, over every host taking part)")
@click.option("--rank", "rank_arg", default="0", show_default=True,
              help="the shard(s) run here: R (this process), 'all' (every shard, one process per GPU of "
                   "this host), A-B (shards A..B here, one process each)")
@click.option("--spawned", is_flag=True, hidden=True, help="a shard started by --rank all/A-B (its parent merges)")
def main(backend: str, model: Path, data: Path, out_dir: Path, aux_layers: str, endpoint: str,
         server_hidden_states_path: Path | None, concurrency: int, request_timeout: float, device: str,
         batch_size: int, writer_threads: int, forward_only: bool, pad_multiple: int, max_model_len: int | None,
         max_samples: int | None, world_size: int, rank_arg: str, spawned: bool) -> None:
    """Extract the target's hidden states for the prepared samples."""
    local_ranks = shards.parse_ranks(rank_arg, world_size)
    rank = local_ranks[0]
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
    if max_model_len is None and backend == "vllm":
        max_model_len = server_max_model_len(endpoint.rstrip("/"))
    trims = capped_lengths(seq_lens, max_model_len)
    params = {"data": prep["fingerprint"], "aux_layers": aux, "layer_ids": layer_ids, "max_samples": max_samples,
              "world_size": world_size}
    if trims:  # only then: outputs without any trimmed row keep their fingerprint
        params["trim_to"] = max_model_len - 1
    if len(local_ranks) > 1:
        if manifest.is_complete(out_dir, params):
            click.echo(f"extract: {out_dir} is complete ({manifest.read(out_dir)['counts']}); skipping")
            return
        run_shards(out_dir, params, dataset, trims, local_ranks, world_size, max_samples,
                   cuda=backend == "transformers" and common.resolve_device(device) == "cuda")
        return
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
    data_path = data
    if trims:
        data_path = write_trimmed_dataset(dataset, trims, out_dir)
        dataset = load_from_disk(str(data_path))
        cut = sum(seq_lens[i] - k for i, k in trims.items())
        click.echo(f"extract: {len(trims)} samples longer than max_model_len - 1 = {max_model_len - 1} tokens "
                   f"(the extraction request needs room for 1 generated token) trimmed to {max_model_len - 1}: "
                   f"{cut} tokens dropped; the rows, trimmed, are in {data_path} (train reads them from there)")
        seq_lens = [int(x) for x in dataset["seq_len"]]
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
            run_vllm(endpoint.rstrip("/"), data_path, out_dir, max_samples, concurrency, world_size, rank, request_timeout)
        else:
            run_transformers(model, dataset, todo, out_dir, aux, common.resolve_device(device), batch_size,
                             writer_threads, forward_only, pad_multiple=pad_multiple)
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
                                 "layers": len(layer_ids), "hidden_size": hidden,
                                 "trimmed": sum(i in trims for i in mine)},
                         extra={"backend": backend, "rank": rank, "max_model_len": max_model_len,
                                **({"dataset": TRIMMED_DATA, "trimmed_indices": sorted(i for i in trims if i in mine)}
                                   if trims else {})})
    click.echo(f"extract: Saved {len(todo)} new data points to {out_dir}; {len(mine)} in all, "
               f"{doc['total_bytes'] / 1e6:.1f} MB (manifest {doc['fingerprint']})")
    if spawned:  # the parent merges, and says when the whole stage is complete
        click.echo(f"extract: rank {rank} finished its shard")
        return
    if world_size > 1:
        merge_ranks(out_dir, world_size, params, len(dataset), max_samples)
    click.echo("extract: Data generation complete!")


def run_shards(out_dir: Path, params: dict, dataset, trims: dict[int, int], local_ranks: list[int],
               world_size: int, max_samples: int | None, cuda: bool) -> None:
    """--rank all / A-B: every local shard in a process of its own (eaglelab.stages.shards)."""
    every = len(local_ranks) == world_size  # all of them here: no other host writes into out_dir
    moved = manifest.claim(out_dir, "extract", params, may_move=every)
    if moved:
        click.echo(f"extract: {out_dir} held hidden states of other data or layers; moved to {moved} "
                   "(delete it to free the disk)")
    if trims:  # once, before the shards start (each would otherwise make the same copy)
        write_trimmed_dataset(dataset, trims, out_dir)
    names = {e.name for e in os.scandir(out_dir)}
    parts = []
    for r in local_ranks:
        mine = rank_indices(len(dataset), max_samples, world_size, r)
        parts.append(shards.Shard(r, len(mine), base=sum(hs_path(out_dir, i).name in names for i in mine)))
    click.echo(f"extract: {len(parts)} shards of {world_size} on this host (ranks {local_ranks[0]}-{local_ranks[-1]}), "
               f"{sum(p.total for p in parts)} samples, {sum(p.base for p in parts)} already done")
    shards.run_local_shards(shards.without_rank(sys.argv[1:]), parts, cuda)
    merge_ranks(out_dir, world_size, params, len(dataset), max_samples)
    if not every:
        click.echo(f"extract: ranks {local_ranks[0]}-{local_ranks[-1]} finished")
        return
    if not manifest.is_complete(out_dir, params):
        raise StageError(f"{out_dir}: every shard exited 0 but the merged manifest is not complete; "
                         "run the stage again (each shard redoes only what it lacks)")
    click.echo(f"extract: all {world_size} shards finished; {manifest.read(out_dir)['counts']}")
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
                           "layers": docs[0]["counts"]["layers"], "hidden_size": docs[0]["counts"]["hidden_size"],
                           "trimmed": sum(d["counts"].get("trimmed", 0) for d in docs)},
                   extra={"ranks": world_size, **({"dataset": TRIMMED_DATA} if "trim_to" in params else {})})


if __name__ == "__main__":
    sys.exit(main())
