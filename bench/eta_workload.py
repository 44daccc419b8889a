"""A real two-stage job for the stage/pipeline ETA benchmark (bench/bench_eta_pipeline.py).

Real computation on CPU (one thread), with phases announced by eaglelab's markers and tqdm bars
written to stdout as a stage's log would be:

  extract: load (build a small transformer and save/load it in shards) -> encode (forward passes
           over batches of growing length, a tqdm bar) -> write (save the outputs)
  train:   warmup (a few steps, no bar) -> train (optimizer steps, a tqdm bar)

    python bench/eta_workload.py extract|train [--scale 1.0]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "py"))
from eaglelab.host.parse.markers import done_line, emit, phase_completed, phase_started

DIM, VOCAB = 128, 512


def model() -> torch.nn.Module:
    layer = torch.nn.TransformerEncoderLayer(DIM, 4, 4 * DIM, batch_first=True)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, DIM), torch.nn.TransformerEncoder(layer, 2),
                               torch.nn.Linear(DIM, VOCAB))


def extract(scale: float) -> None:
    emit(phase_started("load"))
    with tempfile.TemporaryDirectory() as tmp:
        m = model()
        for i, p in enumerate(m.state_dict().values()):
            torch.save(p, Path(tmp) / f"shard-{i}.pt")
        for i in range(len(m.state_dict())):
            torch.load(Path(tmp) / f"shard-{i}.pt")
        emit(phase_completed("load"))
        emit(phase_started("encode"))
        outs = []
        with torch.no_grad():
            for b in tqdm(range(int(120 * scale)), desc="Encoding batches", file=sys.stdout, mininterval=0.5):
                x = torch.randint(0, VOCAB, (8, 64 + b))  # longer and longer samples: the rate drifts
                outs.append(m(x).mean(dim=1))
        emit(phase_completed("encode"))
        emit(phase_started("write"))
        torch.save(torch.cat(outs), Path(tmp) / "hidden.pt")
        emit(phase_completed("write"))
    emit(done_line())


def train(scale: float) -> None:
    m = model()
    opt = torch.optim.AdamW(m.parameters(), 1e-3)

    def step() -> None:
        x = torch.randint(0, VOCAB, (8, 96))
        loss = torch.nn.functional.cross_entropy(m(x)[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    emit(phase_started("warmup"))
    for _ in range(int(20 * scale)):
        step()
    emit(phase_completed("warmup"))
    emit(phase_started("train"))
    for _ in tqdm(range(int(150 * scale)), desc="Training", file=sys.stdout, mininterval=0.5):
        step()
    emit(phase_completed("train"))
    emit(done_line())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=["extract", "train"])
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    (extract if args.stage == "extract" else train)(args.scale)


if __name__ == "__main__":
    main()
