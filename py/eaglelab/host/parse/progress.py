"""Recognize one tqdm progress-bar frame and read every figure it prints.

Handles the variants that real logs contain:
  `desc: 86%|███  | 55/64 [20:02<04:10, 27.81s/it, loss=0.1]`        tqdm default
  `Loading safetensors checkpoint shards:  86% Completed | 55/64 [20:02<04:10, 27.81s/it]`  vLLM
  `57% 4/7 [00:02<00:01, 1.50it/s]`                                   HF / notebook text
  `model.safetensors:  45%|####5 | 2.25G/4.98G [00:30<00:36, 75.3MB/s]`  unit_scale
  `desc: 123it [00:05, 24.5it/s]`                                      no total
with `H:MM:SS` and `d days, H:MM:SS` times, `?` rates and remaining, postfixes as `k=v` or `k: v`,
process prefixes (`(Worker_TP0 pid=12) `), and colour codes or their pasted remnants.

One frame per call: splitting a `\\r`-separated stream into frames is the caller's job.
Figures with an SI suffix (`2.25G`, `1.23kit/s`) are read with divisor 1000 (tqdm may have used
1024 for bytes; n, total and rate are scaled alike, so ratios and ETAs stay right).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .ansi import strip_ansi
from .prefixes import split_prefix

_SI = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "Z": 1e21, "Y": 1e24}
_TIME = r"(?:\d+ days?, )?\d+(?::\d\d){1,2}"
_NUM = r"\d+(?:\.\d+)?(?:e[+-]?\d+)?[kKMGTPEZY]?"
# Anchored at the end of the frame: `[pct% (|bar| | Completed |)] n[/total][unit] [elapsed<remaining, rest]`
_BAR_RE = re.compile(
    rf"(?:(?P<pct>\d{{1,3}}(?:\.\d+)?)%\s*(?:\|[^|]*\||Completed\s*\|)?\s*)?"
    rf"(?P<n>{_NUM})(?:/(?P<total>{_NUM}|\?))?(?P<unit> ?[A-Za-z][\w/]*)?\s*"
    rf"\[(?P<elapsed>{_TIME}|\?)(?:<(?P<remaining>{_TIME}|\?))?(?:,\s*(?P<rest>.*))?\]\s*$"
)
_RATE_RE = re.compile(r"\s*(?P<val>\?|\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s?(?P<si>[kKMGTPEZY]?)(?P<unit>s/ ?\S+|[^\s/]+/s)\s*$")
# The `[elapsed<remaining, rate, postfix]` block that closes a frame, wherever it is in a line.
_CLOSE_RE = re.compile(rf"\[(?:{_TIME}|\?)(?:<(?:{_TIME}|\?))?(?:,[^\]]*)?\]")
_BAR_GROUPS = ("pct", "n", "total", "unit", "elapsed", "remaining", "rest")
# A counter's head (no total): `123it [00:05`, `908 examples [16:08`
_COUNTER_HEAD_RE = re.compile(rf"\d ?[A-Za-z]\w* \[(?:{_TIME}|\?)")
_NUM_RE = re.compile(r"(\d+(?:\.\d+)?(?:e[+-]?\d+)?)([kKMGTPEZY]?)$")


@dataclass(slots=True)
class Progress:
    label: str                      # the bar's desc without its trailing ':'; '' if none
    n: int | float
    total: int | float | None
    unit: str                       # 'it' unless the frame shows another
    percent: float | None           # as printed, else n/total*100, else None
    elapsed_s: float | None
    remaining_s: float | None       # tqdm's own printed remaining time ('?' -> None)
    rate: float | None              # as printed (SI suffix applied), None for '?'
    rate_unit: str                  # 's/it' or 'it/s' style, as printed
    rate_s_per_it: float | None     # seconds per unit, whichever way it was printed
    postfix: dict[str, str] = field(default_factory=dict)
    prefix: str = ""                # the process prefix stripped, e.g. '(Worker_TP0 pid=12)'
    position: int = 0               # a nested bar's row below the first (nested_position)

    @property
    def key(self) -> tuple[str, str, int]:
        """What tells one bar from another interleaved with it: (process prefix, label, position)."""
        return (self.prefix, self.label, self.position)


# tqdm draws a nested bar (position k > 0: an evaluation loop inside training, a file inside a
# download) k rows down and then moves the cursor back up: `\n` * k, the frame, ESC[A * k. In a
# log file the rows never move, so the cursor-ups after the frame's `]` (a log record may follow
# them on the same line) are all that tells an unlabelled evaluation bar from the unlabelled
# training bar it interleaves with (HF Trainer's two bars).
_NESTED_RE = re.compile(r"\]\s*((?:\x1b\[A)+)")


def nested_position(raw: str) -> int:
    """How many rows below the first a raw frame (escape sequences not yet stripped) was drawn."""
    if "\x1b[A" not in raw:
        return 0
    m = _NESTED_RE.search(raw)
    return m.group(1).count("\x1b[A") if m else 0


def parse_time(text: str | None) -> float | None:
    """`MM:SS`, `H:MM:SS` or `d days, H:MM:SS` as seconds; `?` or None -> None."""
    if not text or text == "?":
        return None
    mins, colon, secs_ = text.partition(":")
    if ":" not in secs_ and mins.isdigit():  # M..M:SS, nearly every frame
        return float(int(mins) * 60 + int(secs_))
    days = 0
    if "day" in text:
        d, _, text = text.partition(",")
        days = int(d.split()[0])
        text = text.strip()
    secs = 0
    for part in text.split(":"):
        secs = secs * 60 + int(part)
    return float(days * 86400 + secs)


def _number(text: str) -> int | float:
    if text.isdigit():
        return int(text)
    m = _NUM_RE.match(text)
    if m is None:  # pragma: no cover - the bar regex only lets numbers through
        raise ValueError(text)
    digits, si = m.groups()
    if not si and digits.isdigit():
        return int(digits)
    value = float(digits) * _SI[si]
    return int(value) if value.is_integer() and si else value


def _postfix(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, item in enumerate(items):
        item = item.strip()
        if not item:
            continue
        if "=" in item:
            k, _, v = item.partition("=")
        elif ": " in item:
            k, _, v = item.partition(": ")
        else:  # a bare postfix string (set_postfix_str) keeps its place
            k, v = f"_{i}", item
        out[k.strip()] = v.strip()
    return out


def parse_progress(line: str) -> Progress | None:
    """The progress bar in one frame, or None when line is not a progress bar."""
    if "[" not in line or "]" not in line:
        return None  # fast path: almost every non-bar line
    split = split_prefix(strip_ansi(line))
    return parse_bar(split.message, split.prefix)


def parse_progress_glued(line: str) -> Progress | None:
    """parse_progress, and a frame with a log record glued after it (no newline between them)."""
    p = parse_progress(line)
    if p is not None or "]" not in line:
        return p
    split = split_prefix(strip_ansi(line))
    glued = split_glued(split.message)
    return parse_bar(glued[0], split.prefix) if glued is not None else None


def parse_bar(message: str, prefix: str = "") -> Progress | None:
    """parse_progress for a frame already cleaned of colour codes and process prefixes."""
    if "]" not in message:
        return None
    text = message.rstrip()
    if not text.endswith("]"):
        return None
    m = _BAR_RE.search(text)
    if m is None:
        return None
    pct, n_s, total_s, unit_s, elapsed, remaining, rest = m.group(*_BAR_GROUPS)  # one call, not seven
    desc = text[: m.start()].strip()
    if desc.endswith(":"):
        desc = desc[:-1].rstrip()
    if pct is None and desc and not unit_s and total_s is None:
        # `word 12 [00:01, ...]` without % or unit is not a bar frame tqdm prints.
        if rest is None:
            return None
    if unit_s:
        unit_s = unit_s.lstrip()  # HF datasets' unit=" examples": `47 examples [01:21, 2.04s/ examples]`
    n = int(n_s) if n_s.isdigit() else _number(n_s)
    total = None if total_s is None or total_s == "?" else int(total_s) if total_s.isdigit() else _number(total_s)
    unit = unit_s or "it"

    rate = rate_unit = None
    s_per_it = None
    postfix: dict[str, str] = {}
    if rest is not None:
        items = rest.split(",")
        rm = _RATE_RE.match(items[0])
        if rm is not None:
            val, si, rate_unit = rm.group("val", "si", "unit")
            if val != "?":
                rate = float(val) * _SI[si]
                if rate_unit.startswith("s/"):
                    s_per_it = rate
                elif rate > 0:
                    s_per_it = 1.0 / rate
            rate_unit = rate_unit.replace("s/ ", "s/")  # HF datasets' unit=" examples": `2.04s/ examples`
            if rate_unit.startswith("s/"):
                unit = rate_unit[2:] if not unit_s else unit
            elif not unit_s:
                unit = rate_unit[:-2]
            del items[0]
        if items:
            postfix = _postfix(_rejoin(items))

    percent = float(pct) if pct is not None else (100.0 * n / total if total else None)
    return Progress(desc, n, total, unit, percent, parse_time(elapsed), parse_time(remaining),
                    rate, rate_unit or "", s_per_it, postfix, prefix)


# A frame cut at the terminal's width (an 80- or 120-column window; the rest of the frame, its
# `]` and often its `\r`, never reached the log): `desc:  39%|█████▏   | 37/96 [15:59` - the count
# and total survive, the elapsed when it was not cut in the middle. Frames pasted one after another
# without their `\r` each give one.
_CUT_RE = re.compile(
    rf"(?P<pct>\d{{1,3}})%\|[^|\n]*\|\s*(?P<n>{_NUM})/(?P<total>{_NUM})(?P<unit>[A-Za-z][\w/]*)?"
    rf"(?:\s*\[(?:(?P<elapsed>{_TIME})(?=$|[^\d:]))?[^\]A-Za-z]*)?")


def parse_cut_frames(message: str, prefix: str = "") -> tuple[list[Progress], str]:
    """The frames of a line made of frames cut at the terminal width (no closing `]`), oldest first,
    and the text after the last one; ([], message) when the line is not one."""
    if "%|" not in message:
        return [], message
    out: list[Progress] = []
    start = 0
    for m in _CUT_RE.finditer(message):
        desc = message[start:m.start()].rsplit("]", 1)[-1].strip()  # not the tail of a whole frame before it
        start = m.end()
        if desc.endswith(":"):
            desc = desc[:-1].rstrip()
        if desc[:1].islower() and out and out[-1].label.lower() == desc.lower():
            desc = out[-1].label  # the window cut the first letter of one copy
        pct, n_s, total_s, unit_s, elapsed = m.group("pct", "n", "total", "unit", "elapsed")
        n, total = _number(n_s), _number(total_s)
        if total <= 0 or n > total:
            continue
        out.append(Progress(label=desc, n=n, total=total, unit=unit_s or "it", percent=float(pct),
                            elapsed_s=parse_time(elapsed), remaining_s=None, rate=None, rate_unit="",
                            rate_s_per_it=None, prefix=prefix))
    if out:  # the first copy's label may have lost letters the later ones kept
        label = out[-1].label
        for p in out:
            if label.lower().endswith(p.label.lower()) or p.label.lower().endswith(label.lower()[1:]):
                p.label = label
        return out, message[start:]
    return out, message


def split_glued(message: str) -> tuple[str, str] | None:
    """A bar frame with text glued after it (a log line written right after a \\r-frame, no newline):
    (frame, rest), or None. `Training:  22%|█ | 14/64 [00:07<00:17, 2.94step/s]2026-07-07 ... INFO ...`
    """
    if "%" not in message and _COUNTER_HEAD_RE.search(message) is None:
        return None
    m = _CLOSE_RE.search(message)
    if m is None or m.end() >= len(message):
        return None
    return message[: m.end()], message[m.end():]


def _rejoin(items: list[str]) -> list[str]:
    """Split on ', ' only: a comma inside a value (`shape=[1,2]`) stays in that value."""
    out: list[str] = []
    for item in items:
        if out and not item.startswith(" "):
            out[-1] += "," + item
        else:
            out.append(item)
    return out
