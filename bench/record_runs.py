"""Record real progress-bar logs on this machine for the ETA benchmark (bench/corpus/recorded/).

These are real computations, not sleeps: a tiny causal transformer trained on CPU with tqdm
writing to a file (as a stage's log would be), one run at a constant sequence length and one with
a growing sequence length (a curriculum: the per-step time drifts up for a real reason), and a
tokenizer pass over generated text. One thread, small sizes: the machine is shared.

    /work/main/.venv/bin/python bench/record_runs.py [OUT_DIR]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm


def train(log_path: Path, steps: int, seq_len_at, desc: str) -> None:
    torch.manual_seed(0)
    vocab, dim = 512, 128
    layer = torch.nn.TransformerEncoderLayer(dim, 4, 4 * dim, batch_first=True)
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, dim), torch.nn.TransformerEncoder(layer, 2),
                                torch.nn.Linear(dim, vocab))
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    with open(log_path, "w") as log:
        bar = tqdm(range(steps), desc=desc, file=log, mininterval=0.5, ascii=False)
        for step in bar:
            seq = seq_len_at(step)
            x = torch.randint(0, vocab, (8, seq))
            mask = torch.nn.Transformer.generate_square_subsequent_mask(seq)
            h = model[0](x)
            h = model[1](h, mask=mask, is_causal=True)
            loss = torch.nn.functional.cross_entropy(model[2](h)[:, :-1].reshape(-1, vocab), x[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            bar.set_postfix(loss=f"{loss.item():.3f}", seq=seq)


def tokenize(log_path: Path, docs: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer  # noqa: F401 - only to prove the real library is there

    words = [f"w{i % 997}x{(i * 7) % 113}" for i in range(20000)]
    text = [" ".join(words[(d * 37) % 19000:(d * 37) % 19000 + 50 + (d % 400)]) for d in range(docs)]
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(text[:200], trainers.BpeTrainer(vocab_size=2000, show_progress=False))
    with open(log_path, "w") as log:
        for d in tqdm(text, desc="Tokenizing", file=log, mininterval=0.2):
            tok.encode(d)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "corpus" / "recorded")
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    t0 = time.time()
    train(out / "train_constant_seq.log", 1500, lambda s: 64, "Training")
    train(out / "train_curriculum_seq.log", 420, lambda s: 16 + s, "Training (curriculum)")
    tokenize(out / "tokenize.log", 60000)
    print(f"recorded in {time.time() - t0:.0f}s to {out}")


if __name__ == "__main__":
    main()
