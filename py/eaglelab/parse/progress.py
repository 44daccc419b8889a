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
    rf"(?P<n>{_NUM})(?:/(?P<total>{_NUM}|\?))?(?P<unit>[A-Za-z][\w/]*)?\s*"
    rf"\[(?P<elapsed>{_TIME}|\?)(?:<(?P<remaining>{_TIME}|\?))?(?:,\s*(?P<rest>.*))?\]\s*$"
)
_RATE_RE = re.compile(r"\s*(?P<val>\?|\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s?(?P<si>[kKMGTPEZY]?)(?P<unit>s/\S+|[^\s/]+/s)\s*$")
# The `[elapsed<remaining, rate, postfix]` block that closes a frame, wherever it is in a line.
_CLOSE_RE = re.compile(rf"\[(?:{_TIME}|\?)(?:<(?:{_TIME}|\?))?(?:,[^\]]*)?\]")
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

    @property
    def key(self) -> tuple[str, str]:
        """What tells one bar from another interleaved with it: (process prefix, label)."""
        return (self.prefix, self.label)


def parse_time(text: str | None) -> float | None:
    """`MM:SS`, `H:MM:SS` or `d days, H:MM:SS` as seconds; `?` or None -> None."""
    if not text or text == "?":
        return None
    if len(text) == 5 and text[2] == ":":  # MM:SS, nearly every frame
        return float(int(text[:2]) * 60 + int(text[3:]))
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
    desc = text[: m.start()].strip()
    if desc.endswith(":"):
        desc = desc[:-1].rstrip()
    pct = m.group("pct")
    if pct is None and desc and not m.group("unit") and m.group("total") is None:
        # `word 12 [00:01, ...]` without % or unit is not a bar frame tqdm prints.
        if m.group("rest") is None:
            return None
    n = _number(m.group("n"))
    total_s = m.group("total")
    total = None if total_s in (None, "?") else _number(total_s)
    unit = m.group("unit") or "it"

    rate = rate_unit = None
    s_per_it = None
    post_items: list[str] = []
    rest = m.group("rest")
    if rest is not None:
        items = rest.split(",")
        rm = _RATE_RE.match(items[0])
        if rm is not None:
            rate_unit = rm.group("unit")
            if rm.group("val") != "?":
                rate = float(rm.group("val")) * _SI[rm.group("si")]
                if rate_unit.startswith("s/"):
                    s_per_it = rate
                elif rate > 0:
                    s_per_it = 1.0 / rate
            if rate_unit.startswith("s/"):
                unit = rate_unit[2:] if not m.group("unit") else unit
            elif not m.group("unit"):
                unit = rate_unit[:-2]
            items = items[1:]
        post_items = _rejoin(items)

    percent = float(pct) if pct is not None else (100.0 * n / total if total else None)
    return Progress(
        label=desc, n=n, total=total, unit=unit, percent=percent,
        elapsed_s=parse_time(m.group("elapsed")), remaining_s=parse_time(m.group("remaining")),
        rate=rate, rate_unit=rate_unit or "", rate_s_per_it=s_per_it,
        postfix=_postfix(post_items), prefix=prefix,
    )


def split_glued(message: str) -> tuple[str, str] | None:
    """A bar frame with text glued after it (a log line written right after a \\r-frame, no newline):
    (frame, rest), or None. `Training:  22%|█ | 14/64 [00:07<00:17, 2.94step/s]2026-07-07 ... INFO ...`
    """
    if "%" not in message and "it [" not in message:
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
