"""Remove terminal control sequences from a log line.

Two kinds reach our logs: real escape sequences (ESC `[0;36m`, cursor moves `ESC[A` written by
nested tqdm bars, OSC titles) and their remnants in logs pasted into issues, where the ESC byte
was lost and `[0;36m` / `[1m` / `[0m` stay behind. Both are noise to every recognizer.
"""

from __future__ import annotations

import re

# CSI (colours, cursor moves, erase), OSC (terminated by BEL or ST), and two-byte escapes.
_ESC_RE = re.compile(r"\x1b(?:\[[0-9;?<=>]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
# Remnants of SGR colour codes whose ESC byte was lost: `[0;36m`, `[1m`, `[0m`, `[38;5;12m`.
# At least one digit is required so that ordinary bracketed text such as `[m]` survives.
_REMNANT_RE = re.compile(r"\[\d{1,3}(?:;\d{1,3})*m")
# Other C0 controls except TAB (\r and \n are split on before lines get here).
_CTRL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def strip_ansi(text: str) -> str:
    """text without escape sequences, their pasted remnants, or stray control characters."""
    if "\x1b" in text:
        text = _ESC_RE.sub("", text)
    if "m" in text and "[" in text:
        text = _REMNANT_RE.sub("", text)
    return _CTRL_RE.sub("", text) if _has_ctrl(text) else text


def _has_ctrl(text: str) -> bool:
    # Fast path: most lines are plain printable text.
    return not text.isprintable() and _CTRL_RE.search(text) is not None
