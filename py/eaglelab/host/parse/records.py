"""The header a logging library puts in front of a message: level and time, stripped.

Formats seen in the stages' logs (after the process prefix is gone):
  vLLM          `INFO 05-06 20:59:57 [default_loader.py:384] msg`  (older: `INFO 08-17 23:29:12 model_runner.py:266] msg`)
  logging       `WARNING:torch.distributed.elastic.multiprocessing.api:msg`, uvicorn `INFO:     msg`
  asctime       `2024-12-20 00:49:31,004 - app.llm - INFO - msg`, `2026-07-07 22:20:44 | INFO | mod | msg`
  loguru        `2024-01-01 12:00:00.123 | INFO     | mod:fn:12 - msg`
  Rich          `[20:51:04] INFO     msg                 file.py:12` (speculators; the time is blank
                when it repeats, and the source file sits at the far right)
  glog (torch)  `[E429 13:55:49.384372190 ProcessGroupNCCL.cpp:1743] msg`, `E0325 20:57:27.620000 2606 api.py:869] msg`
The level decides what may count as a failure (a WARNING never does); the time gives durations.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_GLOG_LEVEL = {"D": "DEBUG", "I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
_LVL = r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)"

_VLLM_RE = re.compile(rf"{_LVL} (?P<md>\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)(?:\.\d+)? (?:\[[^\]]*\]|\S+\]) ?")
_STDLIB_RE = re.compile(rf"{_LVL}:(?:[\w.<>-]*:|\s+)")
_ASCTIME_RE = re.compile(
    rf"(?P<date>\d{{4}}-\d\d-\d\d)[ T](?P<hms>\d\d:\d\d:\d\d)(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
    rf"(?: - [\w.<>-]+ - {_LVL} - | \| {_LVL.replace('level', 'level2')}\s*\| (?:[\w.:<>-]+ (?:- |\| ))?| \[{_LVL.replace('level', 'level3')}\] )")
_RICH_RE = re.compile(rf"(?:\[(?P<hms>\d\d:\d\d:\d\d)\] |\s{{11}}){_LVL}\s+")
_RICH_SRC_RE = re.compile(r"\s{2,}[\w.-]+\.py:\d+\s*$")
_GLOG_RE = re.compile(r"\[?(?P<lv>[DIWEF])(?P<md>\d{3,4}) (?P<hms>\d\d:\d\d:\d\d)\.\d+ (?:\d+ )?[^\]\s]+\] ?")


@dataclass(slots=True)  # not frozen: built for every line, and frozen init is slow
class Record:
    level: str | None       # one of LEVELS, or None for a raw print / traceback line
    message: str            # the text without the header
    date: str | None        # 'YYYY-MM-DD', 'MM-DD' or None
    time: str | None        # 'HH:MM:SS' or None


def parse_record(text: str) -> Record:
    """Split a log header off text; a line without a known header comes back whole, level None."""
    c = text[:1]
    if c in ("I", "W", "E", "D", "C", "F"):
        m = _VLLM_RE.match(text)
        if m:
            return Record(_level(m.group("level")), text[m.end():], m.group("md"), m.group("hms"))
        m = _STDLIB_RE.match(text)
        if m:
            return Record(_level(m.group("level")), text[m.end():], None, None)
        m = _GLOG_RE.match(text)
        if m:
            return Record(_GLOG_LEVEL[m.group("lv")], text[m.end():], _glog_md(m.group("md")), m.group("hms"))
    elif c == "[":
        m = _RICH_RE.match(text)
        if m:
            return Record(_level(m.group("level")), _rich_message(text[m.end():]), None, m.group("hms"))
        m = _GLOG_RE.match(text)
        if m:
            return Record(_GLOG_LEVEL[m.group("lv")], text[m.end():], _glog_md(m.group("md")), m.group("hms"))
    elif c.isdigit():
        m = _ASCTIME_RE.match(text)
        if m:
            lv = m.group("level") or m.group("level2") or m.group("level3")
            return Record(_level(lv), text[m.end():], m.group("date"), m.group("hms"))
    elif c == " " and text.startswith(" " * 11):
        m = _RICH_RE.match(text)
        if m:
            return Record(_level(m.group("level")), _rich_message(text[m.end():]), None, None)
    return Record(None, text, None, None)


def _rich_message(msg: str) -> str:
    """msg without the `file.py:12` Rich puts at the far right; the search runs only where one can be."""
    return _RICH_SRC_RE.sub("", msg) if ".py:" in msg else msg


def _glog_md(md: str) -> str:
    md = md.zfill(4)  # glog writes April 29 as 429
    return f"{md[:2]}-{md[2:]}"


_LEVEL_ALIASES = {"WARN": "WARNING", "FATAL": "CRITICAL"}


def _level(name: str) -> str:
    return _LEVEL_ALIASES.get(name, name)


class LogClock:
    """Turns the partial times of log headers into seconds on one consistent scale.

    Headers carry a full date, a month-day (vLLM, glog) or only a time of day (Rich). Only
    differences matter (phase durations), so a missing year is taken from the last full date
    seen (else 2000, a leap year, so that 02-29 parses) and a time of day that goes backwards by
    more than 12 hours is taken as the next day.
    """

    def __init__(self) -> None:
        self.year = 2000
        self.day: float | None = None   # seconds at 00:00 of the current day
        self._days: dict[str, float] = {}
        self.last: float | None = None
        self._key: tuple[str | None, str | None] | None = None

    def seconds(self, rec: Record) -> float | None:
        if rec.time is None:
            return None
        key = (rec.date, rec.time)
        if key == self._key:
            return self.last  # the same second as the last good header: most lines of a busy log
        t = rec.time
        try:
            tod = int(t[0:2]) * 3600 + int(t[3:5]) * 60 + int(t[6:8])
            if rec.date is not None:
                day = self._day_epoch(rec.date)
            else:
                day = self.day if self.day is not None else self._day_epoch(f"{self.year}-01-01")
        except ValueError:
            return None  # a header with an impossible date: no time for this line
        total = day + tod
        if rec.date is None and self.last is not None and total < self.last - 12 * 3600:
            day += 86400  # a time of day that went backwards: the next day
            total += 86400
        self.day = day
        self.last = total
        self._key = key  # only a good header: then a repeat of it means the same total
        return total

    def _day_epoch(self, date: str) -> float:
        """Seconds at 00:00 UTC of 'YYYY-MM-DD' or 'MM-DD' (in self.year), cached."""
        if len(date) == 10:
            self.year = int(date[:4])
        else:
            date = f"{self.year}-{date}"
        got = self._days.get(date)
        if got is None:
            if len(self._days) > 4096:
                self._days.clear()
            d = _dt.date.fromisoformat(date)
            got = self._days[date] = _dt.datetime(d.year, d.month, d.day, tzinfo=_dt.UTC).timestamp()
        return got
