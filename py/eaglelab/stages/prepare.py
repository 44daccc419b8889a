"""speculators' data preparation: the synth rows -> a HF dataset (input_ids, loss_mask, seq_len)
plus token_freq.pt (token id -> count over supervised tokens), checked and described.

Rows that already carry input_ids/loss_mask (what synth writes) pass straight through; natural-
language conversations are rendered by the server's chat template (`--render-endpoint`, which
needs vLLM started with --enable-scale-out). The manifest records the sizes the next stages need
before they start: samples, tokens, and Σ seq_len, from which extraction's disk use follows.

    python -m eaglelab.stages.prepare --model data/demo/model --data data/demo/synth --out data/demo/prepared
"""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from .. import manifest
from ..errors import StageError
from . import common


def input_files(data: Path) -> list[Path]:
    """A synth output directory (its manifest is checked) or JSONL files given directly."""
    if data.is_dir():
        manifest.require(data, "synth", f"run the synth stage (lab run synth) to fill {data}")
        return [data / "responses.jsonl"]
    if data.is_file() and data.suffix in (".jsonl", ".json"):
        return [data]
    raise StageError(f"{data}: not a synth output directory or a .jsonl file; point --data at synth's --out")


def describe_dataset(out: Path, vocab_size: int) -> dict:
    """Counts over the saved dataset and token_freq.pt; StageError if they disagree (pure reads)."""
    import torch
    from datasets import load_from_disk

    ds = load_from_disk(str(out))
    missing = {"input_ids", "loss_mask", "seq_len"} - set(ds.column_names)
    if missing:
        raise StageError(f"{out}: dataset lacks columns {sorted(missing)}; speculators version skew? "
                         "(this toolkit pins speculators 0.9.0)")
    if len(ds) == 0:
        raise StageError(f"{out}: the prepared dataset is empty; check synth's output")
    ds = ds.with_format("torch")
    tokens = supervised = max_len = 0
    max_id = -1
    for row in ds:
        ids, mask = row["input_ids"], row["loss_mask"]
        if ids.shape != mask.shape:
            raise StageError(f"{out}: a row has input_ids {tuple(ids.shape)} but loss_mask {tuple(mask.shape)}")
        tokens += ids.numel()
        supervised += int(mask.sum())
        max_len = max(max_len, ids.numel())
        max_id = max(max_id, int(ids.max()))
    if max_id >= vocab_size:
        raise StageError(f"{out}: token id {max_id} >= the target's vocab_size {vocab_size}: the data was made "
                         "with another tokenizer; rerun synth against this target")
    freq = torch.load(out / "token_freq.pt", weights_only=True)
    freq_total = sum(int(v) for v in freq.values())
    if freq_total != supervised:
        raise StageError(f"{out / 'token_freq.pt'}: counts {freq_total} tokens but the dataset supervises "
                         f"{supervised}; it is stale (speculators reuses an existing file): delete it and rerun")
    return {"samples": len(ds), "tokens": tokens, "supervised_tokens": supervised, "max_seq_len": max_len,
            "distinct_supervised_tokens": len(freq)}


@click.command()
@click.option("--model", required=True, type=click.Path(path_type=Path), help="target model (tokenizer, config)")
@click.option("--data", required=True, type=click.Path(path_type=Path), help="synth output dir or JSONL")
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path))
@click.option("--seq-length", default=8192, show_default=True)
@click.option("--max-samples", type=int, default=None)
@click.option("--render-endpoint", default=None, help="vLLM base URL, for natural-language conversations")
@click.option("--workers", default=1, show_default=True, help="preprocessing processes (= render concurrency)")
@click.option("--min-supervised-tokens", type=int, default=None, help="drop rows with fewer trainable tokens")
@click.option("--trust-remote-code/--no-trust-remote-code", default=False, help="the tokenizer needs custom code")
def main(model: Path, data: Path, out_dir: Path, seq_length: int, max_samples: int | None,
         render_endpoint: str | None, workers: int, min_supervised_tokens: int | None, trust_remote_code: bool) -> None:
    """Prepare the dataset and token frequencies for training."""
    cfg = common.model_config(model)
    files = input_files(data)
    params = {"inputs": {str(f): manifest.sha256_file(f) for f in files}, "seq_length": seq_length,
              "max_samples": max_samples, "min_supervised_tokens": min_supervised_tokens}
    if manifest.is_complete(out_dir, params):
        click.echo(f"prepare: {out_dir} is complete ({manifest.read(out_dir)['counts']}); skipping")
        return
    if out_dir.exists():
        click.echo(f"prepare: {out_dir} is stale or half-written; rebuilding it")
        shutil.rmtree(out_dir)  # speculators skips a dir with arrow files in it, and reuses token_freq.pt

    from speculators.cli.prepare_data import prepare_data

    prepare_data(model=str(model), data=[str(f) for f in files], output=str(out_dir), seq_length=seq_length,
                 max_samples=max_samples, token_freq_path=None, render_endpoint=render_endpoint, seed=0,
                 num_preprocessing_workers=workers, minimum_valid_tokens=min_supervised_tokens,
                 overwrite=False, allow_empty_output=False, trust_remote_code=trust_remote_code, skip_token_freq=False)
    counts = describe_dataset(out_dir, cfg["vocab_size"])
    written = [p for p in out_dir.iterdir() if p.is_file() and p.name != manifest.NAME]
    doc = manifest.write(out_dir, "prepare", written, params=params, counts=counts,
                         extra={"bytes_per_token_per_layer": cfg["hidden_size"] * 2,
                                "hidden_size": cfg["hidden_size"], "vocab_size": cfg["vocab_size"]})
    click.echo("prepare summary: " + " ".join(f"{k}={v}" for k, v in counts.items()))
    click.echo(f"prepare: done, {counts['samples']} samples in {out_dir} (manifest {doc['fingerprint']})")


if __name__ == "__main__":
    main()
