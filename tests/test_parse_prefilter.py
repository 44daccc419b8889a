"""The prefilter (eaglelab.host.parse.prefilter) changes how fast a log is read, never what it says.

Every fixture and corpus log, and logs made to catch a prefilter that drops a line it must not
(each trigger class in turn, a traceback among plain lines, the clock across skipped lines), is
parsed with every run of plain lines handed over as a block and, as the reference, line by line;
the states must be equal, in whole-file parses and in a live tail fed in small pieces.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from eaglelab.host.parse import prefilter
from eaglelab.host.parse.state import LogState
from eaglelab.host.tail import frames
from eaglelab.host.tail.frames import FrameSplitter

ROOT = Path(__file__).resolve().parents[1]
LOGS = sorted(p for d in (ROOT / "tests" / "fixtures" / "logs", ROOT / "bench" / "corpus")
              for p in d.rglob("*.log") if p.is_file())

PLAIN = [
    '(APIServer pid=17112) INFO:     127.0.0.1:{n} - "POST /v1/completions HTTP/1.1" 200 OK',
    "INFO 02-01 06:36:{s:02d} async_llm_engine.py:110] Finished request cmpl-{n}abc-0.",
    "(APIServer pid=1) WARNING 11-29 20:{s:02d}:00 [protocol.py:112] The following fields were present in the request but ignored: {{'strict'}}",
    "(APIServer pid=1) ",
    "   ",
]
# One line of each kind that must reach the recognizers, among plain lines.
MUST = [
    "(APIServer pid=1) INFO 11-29 20:00:{s:02d} [loggers.py:271] Engine 000: Avg prompt throughput: {n}.0 tokens/s, "
    "Avg generation throughput: 1.0 tokens/s, Running: 2 reqs, Waiting: 0 reqs, GPU KV cache usage: 5.0%",
    "INFO 11-29 20:01:{s:02d} [default_loader.py:1] Starting to load model x...",
    "INFO 11-29 20:01:{s:02d} [default_loader.py:1] Loading weights took {n}.5 seconds",
    "train/loss={n}.1, train/full_acc_0=0.5, epoch=0, lr=1.00e-04, global_step={n}",
    "Training epoch 1/2 started",
    "eaglelab: metric vocab/coverage=0.9{n} step={n}",
    "Loading checkpoint shards:  50%|#####     | 1/2 [00:0{s:1d}<00:01,  1.00s/it]",
    "[20:51:{s:02d}] INFO     saving                file.py:12",
    "2024-12-20 00:49:{s:02d},004 - app.llm - INFO - request done",
    "\x1b[0;36m(Worker pid=2)\x1b[0m INFO 11-29 20:02:{s:02d} [x.py:1] Capturing CUDA graphs",
    "[0;36mINFO 11-29 20:02:{s:02d} [x.py:1] plain text after a remnant",
    "ERROR 11-29 20:03:{s:02d} [worker.py:1] NCCL error: unhandled system error",
    "terminate called after throwing an instance of 'c10::CUDAError'",
    "Traceback (most recent call last):",
    '  File "/srv/x.py", line {n}, in f',
    "    plain_code_line({n})",
    "RuntimeError: boom {n}",
    "Application startup complete.",
]
# Plain lines whose header moves the clock in ways the prefilter must replay.
CLOCK = ["INFO 13-45 20:04:{s:02d} [x.py:1] an impossible date", "INFO 02-29 20:05:{s:02d} [x.py:1] a leap day"]


def _parse(data: bytes, blocks: bool, piece: int | None = None, now: float | None = None) -> dict:
    st = LogState()
    sp = FrameSplitter(lambda t, n: st.feed_line(t, n, now), lambda t, n: st.feed_frame(t, n, now),
                       on_block=(lambda b, f, m: st.feed_block(b, f, m, now)) if blocks else None)
    step = piece or len(data) or 1
    for i in range(0, len(data), step):
        sp.feed(data[i:i + step])
    sp.flush()
    st.lines, st.garbled = sp.lines, sp.bad
    st.end_of_log()
    return st.snapshot(include_history=True)


@pytest.fixture
def every_block(monkeypatch):
    monkeypatch.setattr(frames, "MIN_BLOCK", 1)  # every run of plain lines, however short, is a block


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_blocks_give_the_same_state_on_every_fixture_and_corpus_log(path, every_block):
    data = path.read_bytes()
    assert _parse(data, blocks=True) == _parse(data, blocks=False)


def _mixed(seed: int, lines: int = 3000) -> bytes:
    rnd = random.Random(seed)
    out = []
    for k in range(lines):
        pool = MUST if rnd.random() < 0.04 else CLOCK if rnd.random() < 0.02 else PLAIN
        out.append(rnd.choice(pool).format(n=rnd.randrange(100), s=k // 60 % 60))
    return ("\n".join(out) + "\n").encode()


@pytest.mark.parametrize("seed", range(8))
def test_blocks_give_the_same_state_on_plain_lines_mixed_with_every_kind_of_line(seed, every_block):
    data = _mixed(seed)
    want = _parse(data, blocks=False)
    assert _parse(data, blocks=True) == want
    assert _parse(data, blocks=True, piece=977) == want  # chunks that cut lines anywhere
    live = _parse(data, blocks=True, piece=4096, now=1000.0)
    assert live == _parse(data, blocks=False, piece=4096, now=1000.0)


def test_each_kind_of_line_that_matters_is_a_trigger():
    for line in MUST:
        if line.startswith("    "):
            continue  # a code line matters inside a traceback only, where every line takes the full path
        shape = prefilter.shapes_of((line.format(n=7, s=5) + "\n").encode())[0]
        assert prefilter.TRIGGER_RE.search(shape), line
    for line in PLAIN + CLOCK:
        shape = prefilter.shapes_of((line.format(n=7, s=5) + "\n").encode())[0]
        assert not prefilter.TRIGGER_RE.search(shape), line


def test_a_phase_timed_by_skipped_lines_keeps_its_duration(every_block):
    # The bar that starts the phase has no time: the phase starts at the skipped line before it.
    log = ("INFO 11-29 20:00:00 [x.py:1] Finished request a\n"
           "INFO 11-29 20:00:10 [x.py:1] Finished request b\n"
           "Loading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]\n"
           + "INFO 11-29 20:00:20 [x.py:1] Finished request c\n" * 50
           + "INFO 11-29 20:00:42 [default_loader.py:1] Model loading took 1.2 GiB memory and 3.0 seconds\n").encode()
    got = _parse(log, blocks=True)
    assert got == _parse(log, blocks=False)
    assert got["phases"][0]["name"] == "weights_loading" and got["phases"][0]["duration_s"] == 32.0


def test_a_traceback_among_plain_lines_is_read_whole(every_block):
    log = ("INFO:     127.0.0.1:1 - \"GET /health HTTP/1.1\" 200 OK\n" * 40
           + "Traceback (most recent call last):\n"
           + '  File "/srv/x.py", line 3, in f\n'
           + "    go()\n"
           + "OSError: [Errno 28] No space left on device\n"
           + "INFO:     127.0.0.1:1 - \"GET /health HTTP/1.1\" 200 OK\n" * 40).encode()
    got = _parse(log, blocks=True)
    assert got == _parse(log, blocks=False)
    assert got["failure"]["reason"] == "disk_full" and got["failure"]["line"] == 44
    assert got["last_line"].startswith("INFO:")


def test_over_long_lines_and_bad_utf8_in_a_block_are_mended_and_counted_as_line_by_line(every_block):
    plain = b'INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK\n'
    log = plain * 30 + b"x" * (frames.MAX_LINE + 10) + b"\n" + plain * 30 + b"caf\xe9 ok\n" + plain * 3
    got = _parse(log, blocks=True)
    assert got == _parse(log, blocks=False)
    assert got["bad_lines"] == 2 and got["lines"] == 65


def test_the_shape_cache_stays_bounded_on_a_log_of_unique_long_lines():
    st = LogState()
    rnd = random.Random(3)
    for block in range(40):  # 40 x 64 lines of 4 KiB, each a shape of its own (letters vary)
        lines = ["".join(rnd.choice("ghijkmnopqrsuvwxyz ") for _ in range(4096)) for _ in range(64)]
        blk = ("\n".join(lines) + "\n").encode()
        assert st.feed_block(blk, 1 + 64 * block, frames.MAX_LINE) == 64
    assert st.shapes.size <= prefilter._MAX_SHAPE_BYTES + 4096 + 100
    assert sum(map(len, st.shapes.known)) <= prefilter._MAX_SHAPE_BYTES + 4096
