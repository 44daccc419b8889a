"""Several shards of the extract stage on one host: one child process per shard (per GPU), one log.

`extract --world-size 8 --rank all` on an 8-GPU host starts `extract ... --rank r` for r in 0..7,
child r on GPU r (`CUDA_VISIBLE_DEVICES`, taken from the parent's own list when it has one; on CPU
simply 8 processes sharing the cores). `--rank 8-15` runs ranks 8..15 here (the second of two
8-GPU hosts sharing a 16-way split). The parent:

  - prefixes every line of child r with `[rank<r>]: ` (the parser strips it, and keeps the process
    apart for failures);
  - prints ONE progress bar for the stage, `Extracting hidden states` over all its shards' samples
    (sum of done / sum of totals, one rate, one ETA), with each shard's count in the postfix
    (`r0=120/500, r1=118/500`). The children's own bars are read (that is where their counts come
    from) and not copied to the log: the tailer then sees one bar that only moves forward, and needs
    no rule to guess whether same-named bars of several processes are shards to add up (here) or
    replicas to pick one of (DDP training, where every rank counts the same steps);
  - waits for every child, and fails if any failed, naming the rank, its exit and its last lines;
  - writes the merged manifest when every rank's part is there.

Each child is an ordinary `--rank r` run: resumable on its own (it skips the hs files it finds), its
rank manifest written when its shard is whole. Rerunning the parent after a kill redoes only the
samples each shard lacks.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import click

from ..errors import StageError
from ..host.parse.ansi import strip_ansi
from ..host.parse.progress import parse_bar

LABEL = "Extracting hidden states"
BAR_LABELS = (LABEL, "")  # the transformers backend's bar; speculators' offline generation has no desc
TAIL_LINES = 20           # a failed child's last lines, in the parent's error
FRAME_EVERY_S = 0.5       # the combined bar is redrawn at most this often (and when a shard ends)
_PROCESSING_RE = re.compile(r"Processing (?P<n>\d+) samples")


def parse_ranks(text: str, world_size: int) -> list[int]:
    """`--rank`: `R` (this process is rank R), `all` (every rank of --world-size, here), `A-B` (ranks
    A..B here, inclusive)."""
    t = text.strip()
    try:
        if t == "all":
            ranks = list(range(world_size))
        elif "-" in t:
            a, b = (int(x) for x in t.split("-", 1))
            ranks = list(range(a, b + 1))
        else:
            ranks = [int(t)]
    except ValueError:
        raise StageError(f"--rank {text!r}: expected a rank (0), a range (0-3) or 'all'") from None
    if not ranks or any(not 0 <= r < world_size for r in ranks):
        raise StageError(f"--rank {text!r}: every rank must be in [0, --world-size {world_size}); "
                         "with extract_world_size N on one host, set extract_rank to 'all'")
    return ranks


def without_rank(argv: list[str]) -> list[str]:
    """argv without its `--rank X` / `--rank=X`."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--rank":
            skip = True
        elif not a.startswith("--rank="):
            out.append(a)
    return out


@dataclass
class Shard:
    rank: int
    total: int                 # samples this rank owns
    base: int = 0              # done before its bar started (found on disk)
    bar_n: int = 0             # its bar's count
    ended: bool = False
    exit_code: int | None = None
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    @property
    def done(self) -> int:
        return self.total if self.ended and self.exit_code == 0 else min(self.base + self.bar_n, self.total)


class Combined:
    """The stage's progress from its shards' (pure: lines and times in, frames out)."""

    def __init__(self, shards: list[Shard]) -> None:
        self.shards = {s.rank: s for s in shards}
        self.started: float | None = None  # the first shard bar seen: the combined bar's clock starts
        self.initial = sum(s.base for s in shards)

    @property
    def n(self) -> int:
        return sum(s.done for s in self.shards.values())

    @property
    def total(self) -> int:
        return sum(s.total for s in self.shards.values())

    def segment(self, rank: int, text: str, now: float) -> bool:
        """One segment (a line or a \\r-frame) of child `rank`: True when it is the child's bar (the
        parent keeps it out of the log)."""
        shard = self.shards[rank]
        m = _PROCESSING_RE.search(text)
        if m is not None:  # the child's own count of what it has left (it also checked the files)
            shard.base = max(shard.total - int(m.group("n")), 0)
            return False
        if "]" not in text:
            return False
        p = parse_bar(strip_ansi(text).strip())
        if p is None or p.label not in BAR_LABELS:
            return False
        if self.started is None:
            self.started = now
            self.initial = sum(s.base for s in self.shards.values())
        shard.bar_n = int(p.n)
        return True

    def frame(self, now: float) -> str:
        from tqdm import tqdm

        elapsed = 0.0 if self.started is None else max(now - self.started, 0.0)
        postfix = ", ".join(f"r{s.rank}={s.done}/{s.total}" for s in self.shards.values())
        return tqdm.format_meter(self.n, self.total, elapsed, ncols=None, prefix=LABEL, unit="sample",
                                 postfix=postfix, initial=self.initial)


def devices_for(n: int, cuda: bool) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES for each of n local shards: one GPU each, round robin when there are fewer
    GPUs than shards (they share); None on CPU."""
    if not cuda:
        return [None] * n
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not visible:
        import torch

        visible = [str(i) for i in range(torch.cuda.device_count())]
    if not visible:
        raise StageError("--device cuda with several local shards: no GPU visible (CUDA_VISIBLE_DEVICES, "
                         "nvidia-smi); use --device cpu or one rank")
    if len(visible) < n:
        click.echo(f"extract: {n} shards on {len(visible)} GPU(s): shards share GPUs round robin")
    return [visible[i % len(visible)] for i in range(n)]


def run_local_shards(argv: list[str], shards: list[Shard], cuda: bool, echo=click.echo) -> None:
    """Start `python -m eaglelab.stages.extract <argv> --rank r --spawned` for every shard, relay
    their output prefixed, print the combined bar, wait for all; StageError if any failed."""
    combined = Combined(shards)
    devices = devices_for(len(shards), cuda)
    out = sys.stdout
    lock = threading.Lock()
    last_frame = [0.0]
    cores = os.cpu_count() or 1

    def draw(now: float, final: bool = False) -> None:
        if combined.started is None and not final:
            return
        if not final and now - last_frame[0] < FRAME_EVERY_S:
            return
        last_frame[0] = now
        out.write(combined.frame(now) + ("\n" if final else "\r"))  # a \r-terminated frame: the next line starts clean
        out.flush()

    procs: list[subprocess.Popen] = []
    for i, shard in enumerate(shards):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if devices[i] is not None:
            env["CUDA_VISIBLE_DEVICES"] = devices[i]
        elif "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = str(max(1, cores // len(shards)))  # CPU: the shards share the cores
        cmd = [sys.executable, "-m", "eaglelab.stages.extract", *argv, "--rank", str(shard.rank), "--spawned"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=env))
        where = f"CUDA_VISIBLE_DEVICES={devices[i]}" if devices[i] is not None else "cpu"
        echo(f"extract: rank {shard.rank} started (pid {procs[-1].pid}, {where}): {shard.total} samples, "
             f"{shard.base} already done")

    def relay(shard: Shard, proc: subprocess.Popen) -> None:
        prefix = f"[rank{shard.rank}]: "
        buf = b""
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):
            buf += chunk
            while True:
                cut = min((i for i in (buf.find(b"\n"), buf.find(b"\r")) if i >= 0), default=-1)
                if cut < 0:
                    break
                seg, term, buf = buf[:cut].decode(errors="replace"), buf[cut:cut + 1], buf[cut + 1:]
                now = time.monotonic()
                with lock:
                    if combined.segment(shard.rank, seg, now):
                        draw(now)
                    elif term == b"\n":  # a child's \r-frames (other bars being redrawn) are not copied
                        shard.tail.append(seg)
                        out.write(prefix + seg + "\n")
                        out.flush()
        if buf.strip():
            with lock:
                shard.tail.append(buf.decode(errors="replace"))
                out.write(prefix + buf.decode(errors="replace") + "\n")

    threads = [threading.Thread(target=relay, args=(s, p), daemon=True) for s, p in zip(shards, procs)]
    for t in threads:
        t.start()

    def forward(signum, _frame):  # lab stop: TERM reaches the whole group; pass it on anyway
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for shard, proc, t in zip(shards, procs, threads):
            shard.exit_code = proc.wait()
            t.join()
            with lock:
                shard.ended = True
                draw(time.monotonic())
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    with lock:
        draw(time.monotonic(), final=True)
    failed = [s for s in shards if s.exit_code != 0]
    if failed:
        parts = []
        for s in failed:
            tail = "\n".join(f"    [rank{s.rank}]: {line}" for line in s.tail)
            parts.append(f"rank {s.rank} failed (exit {s.exit_code}); its last lines:\n{tail}")
        ok = [s.rank for s in shards if s.exit_code == 0]
        raise StageError(f"{len(failed)} of {len(shards)} extraction shards failed "
                         f"(finished: {ok or 'none'}; their files are kept, a rerun redoes only what is "
                         "missing):\n" + "\n".join(parts))
