"""Parse a whole log file (or bytes) once, in bounded memory: what `lab parse FILE` prints."""

from __future__ import annotations

from pathlib import Path

from ..parse.state import LogState
from .frames import SAMPLE_BYTES, FrameSplitter


def bar_eta(observations: list, total: float | None, label: str, remaining_s: float | None,
            prior_s_per_item: float | None = None, prior_run: tuple | None = None) -> tuple:
    """The estimator (eaglelab.eta.bar_eta), imported on first use: it pulls numpy, which a log with
    no progress bar never needs."""
    if total is not None and observations and observations[-1][0] >= total:
        return 0.0, 0.0, 0.0  # a finished bar (a server's weight loading, long done): no numpy either
    # numpy, through the estimator: a log with no progress bar never needs it
    from eaglelab.eta.estimator import bar_eta as estimate

    return estimate(observations, total, label, remaining_s, prior_s_per_item, prior_run=prior_run)


CHUNK = 1 << 20  # one buffer, reused for every read (measured: 1-4 MiB read fastest)


def parse_chunks(chunks, include_history: bool = False, state: LogState | None = None,
                 sample_bytes: int = SAMPLE_BYTES) -> dict:
    """The final state JSON of a log given as an iterable of byte chunks."""
    st = state or LogState(bar_eta=bar_eta)
    sp = FrameSplitter(st.feed_line, st.feed_frame, sample_bytes=sample_bytes, on_block=st.feed_block)
    for chunk in chunks:
        sp.feed(chunk)
    sp.flush()
    st.lines, st.garbled = sp.lines, sp.bad
    st.end_of_log()  # a whole file: nothing more will come
    return st.snapshot(include_history=include_history)


def parse_bytes(data: bytes, include_history: bool = False) -> dict:
    return parse_chunks([data], include_history)


def parse_file(path: str | Path, include_history: bool = False, chunk: int = CHUNK,
               sample_bytes: int = SAMPLE_BYTES) -> dict:
    from eaglelab.errors import EaglelabError  # here, not at the top: the host side needs no click
    path = Path(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise EaglelabError(f"log file {str(path)!r} does not exist: give the path of a stage's output.log") from None
    except IsADirectoryError:
        raise EaglelabError(f"{str(path)!r} is a directory: give a log file (e.g. {str(path / 'output.log')!r})") from None
    except PermissionError:
        raise EaglelabError(f"cannot read {str(path)!r}: permission denied") from None
    st = LogState(bar_eta=bar_eta)  # the parser reads; the estimator (eaglelab.eta) gives the ETA
    sp = FrameSplitter(st.feed_line, st.feed_frame, sample_bytes=sample_bytes, on_block=st.feed_block)
    with f:
        sp.feed_file(f, chunk)
    sp.flush()
    st.lines, st.garbled = sp.lines, sp.bad
    st.end_of_log()  # a whole file: nothing more will come
    return st.snapshot(include_history=include_history)
