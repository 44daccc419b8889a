"""Record real progress-bar logs on a GPU machine for the ETA benchmark (bench/corpus/recorded/).

Real work, not sleeps, each with tqdm writing to a file as a stage's log would:
  gpu_train_constant.log    a causal transformer (bf16) trained at a fixed sequence length;
  gpu_train_curriculum.log  the same with the sequence length growing 128 -> 4096 (attention grows:
                            the per-step time drifts up for a real reason);
  gpu_shard_load.log        safetensors shards written to local disk, page cache dropped where
                            allowed, then loaded to the GPU one by one ("Loading safetensors
                            checkpoint shards", as vLLM names it);
  gpu_generate.log          greedy decoding of prompts with random output lengths, one at a time
                            ("Processed prompts": the per-item time varies with each prompt).
The number of steps is set from a short warm-up that is not logged, so each bar lasts about
TARGET_S seconds on whatever GPU runs it.

    python bench/record_runs_gpu.py OUT_DIR      (on the device machine; see bench/RESULTS.md)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

TARGET_S = 45.0


def model_and_opt(dim: int = 1024, layers: int = 8, vocab: int = 32000):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(dim, 16, 4 * dim, batch_first=True, norm_first=True)
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(vocab, dim), "body": torch.nn.TransformerEncoder(layer, layers),
                                 "head": torch.nn.Linear(dim, vocab)}).cuda().to(torch.bfloat16)
    return model, torch.optim.AdamW(model.parameters(), 1e-4), vocab


def train_step(model, opt, vocab: int, batch: int, seq: int) -> float:
    x = torch.randint(0, vocab, (batch, seq), device="cuda")
    mask = torch.nn.Transformer.generate_square_subsequent_mask(seq, device="cuda", dtype=torch.bfloat16)
    h = model["body"](model["emb"](x), mask=mask, is_causal=True)
    loss = torch.nn.functional.cross_entropy(model["head"](h)[:, :-1].float().reshape(-1, vocab), x[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.item())  # .item() syncs: the bar times real GPU work


def train(log_path: Path, seq_at, desc: str, mean_seq: int) -> None:
    model, opt, vocab = model_and_opt()
    t0 = time.time()
    for _ in range(5):
        train_step(model, opt, vocab, 8, mean_seq)
    per_step = (time.time() - t0) / 5
    steps = max(50, int(TARGET_S / per_step))
    with open(log_path, "w") as log:
        bar = tqdm(range(steps), desc=desc, file=log)
        for step in bar:
            seq = seq_at(step, steps)
            loss = train_step(model, opt, vocab, 8, seq)
            bar.set_postfix(loss=f"{loss:.3f}", seq=seq)


def shard_load(log_path: Path, work: Path, shards: int = 32, mb: int = 512) -> None:
    from safetensors.torch import load_file, save_file

    work.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    for i in range(shards):
        t = torch.randn(mb * 1024 * 1024 // 4 // 4, 4, generator=g)  # mb MiB of float32
        save_file({f"layer{i}.weight": t}, str(work / f"model-{i + 1:05d}-of-{shards:05d}.safetensors"))
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")  # read from disk, not from memory
    except OSError:
        print("page cache not dropped", file=sys.stderr)
    files = sorted(work.glob("*.safetensors"))
    with open(log_path, "w") as log:
        for f in tqdm(files, desc="Loading safetensors checkpoint shards", file=log):
            w = load_file(str(f), device="cuda")
            torch.cuda.synchronize()
            del w
    for f in files:
        f.unlink()


@torch.no_grad()
def generate(log_path: Path) -> None:
    model, _, vocab = model_and_opt(layers=12)
    model.eval()
    g = torch.Generator().manual_seed(1)

    def decode(prompt_len: int, new_tokens: int) -> None:
        x = torch.randint(0, vocab, (1, prompt_len), device="cuda")
        for _ in range(new_tokens):  # no KV cache: each token re-reads the whole sequence
            h = model["body"](model["emb"](x[:, -1024:]))
            nxt = model["head"](h[:, -1]).argmax(-1, keepdim=True)
            x = torch.cat([x, nxt], 1)
        torch.cuda.synchronize()

    t0 = time.time()
    decode(64, 64)
    per_prompt = (time.time() - t0) * (1 + 256 / 64) / 2  # mean output length ~ 160 tokens
    prompts = max(30, int(TARGET_S / per_prompt))
    lengths = torch.randint(16, 320, (prompts,), generator=g).tolist()
    with open(log_path, "w") as log:
        for n_new in tqdm(lengths, desc="Processed prompts", file=log, unit="it"):
            decode(int(torch.randint(16, 512, (1,), generator=g)), int(n_new))


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    train(out / "gpu_train_constant.log", lambda s, n: 1024, "Training", 1024)
    train(out / "gpu_train_curriculum.log", lambda s, n: 128 + (4096 - 128) * s // n, "Training (curriculum)", 2048)
    generate(out / "gpu_generate.log")
    shard_load(out / "gpu_shard_load.log", Path("/tmp/eta_shards"))
    print(f"recorded in {time.time() - t0:.0f}s on {torch.cuda.get_device_name()} to {out}")


if __name__ == "__main__":
    main()
