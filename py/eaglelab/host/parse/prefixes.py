"""Process prefixes that launchers put in front of every line, stripped and kept as context.

vLLM's multiprocess workers print `(Worker_TP0 pid=12) `, `(VllmWorker rank=0 pid=34) `,
`(EngineCore_DP0 pid=5) `, `(APIServer pid=1) `; Ray adds `(RayWorkerWrapper pid=7, ip=10.77.0.2) `;
torchrun's `--tee`/log redirects write `[rank3]: ` or `[default0]:`; `srun --label` writes `0: `;
mpirun `--tag-output` writes `[1,0]<stdout>:`; `docker logs -t` puts an RFC 3339 timestamp first;
workflow engines (Metaflow) write `2023-04-29 06:01:12.977 [177/train/578 (pid 28936)] [uuid] `.
They can be stacked (`[rank0]: (Worker pid=1) ...`). Recognizers see the bare message; the
prefix tells which process said it (to keep interleaved progress bars apart), and a launcher rank
other than 0 (`follower`) never drives the stage's progress: its bars are kept, its steps ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DOCKER_TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)\s"
# `(Name k=v, k=v)`: a name, then at least one key=value; or `(pid=123)` as older Ray prints.
_PAREN = r"\((?:[A-Za-z_][\w.:-]*\s+)?[A-Za-z_]\w*=[^()\s,]*(?:,?\s*[A-Za-z_]\w*=[^()\s,]*)*\)\s?"
# torchrun's --tee header is `[default0]:` with nothing after it: what follows is the message's own
# (Rich's 11-space blank time column must keep all 11). `[rank0]: ` is followed by a separator.
_RANK = r"\[(?:rank|local_rank)\d+\]:\s?|\[default\d+\]:"
_MPI = r"\[\d+,\d+\]<std(?:out|err)>:\s?"
_SRUN = r"\d{1,4}: "
# A workflow engine's task header: time, `[run/step/task (pid N)]`, an optional `[uuid]`.
_WORKFLOW = (r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]\s]+ \(pid \d+\)\]"
             r"(?: \[[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\])? ")
# One regex per first character: most lines are rejected or matched by a single small pattern.
_BY_FIRST = {"(": re.compile(f"(?P<proc>{_PAREN})"), "[": re.compile(f"(?P<proc>{_RANK}|{_MPI})")}
_DIGIT_RE = re.compile(f"(?:(?P<ts>{_DOCKER_TS})|(?P<proc>{_SRUN}|{_WORKFLOW}))")
for _d in "0123456789":
    _BY_FIRST[_d] = _DIGIT_RE
_FIRST = frozenset(_BY_FIRST)


# The rank a launcher's tag names: torchrun's `[rank3]:` / `[default3]:` / `[local_rank3]:`, mpirun's
# `[1,3]<stdout>:`, srun --label's `3: `.
_RANK_OF = re.compile(r"\[(?:rank|default|local_rank)(?P<a>\d+)\]:|\[\d+,(?P<b>\d+)\]<std|(?P<c>\d{1,4}):(?:\s|$)")


def follower(prefix: str) -> bool:
    """Whether prefix (as split_prefix returns it) names a launcher rank other than 0: a replica's
    output (torchrun's rank 1 of a DDP training repeats rank 0's steps), which must not move the
    stage's progress, whose figures rank 0 gives. vLLM's worker tags (`(Worker_TP1 pid=3)`) are not
    launcher ranks and do not count."""
    if not prefix or prefix[0] not in "[0123456789":
        return False
    m = _RANK_OF.match(prefix)
    return m is not None and int(m.group("a") or m.group("b") or m.group("c")) != 0


@dataclass(slots=True)  # not frozen: built for every line, and frozen init is slow
class Split:
    prefix: str          # process prefixes joined by one space, '' if none
    message: str         # the line without them
    timestamp: str | None  # a docker RFC 3339 timestamp, if the line carried one


def split_prefix(line: str) -> Split:
    """Strip every leading process prefix (and docker timestamp) from line."""
    if not line or line[0] not in _FIRST:
        return Split("", line, None)
    procs: list[str] = []
    ts = None
    pos = 0
    for _ in range(6):  # bounded: prefixes stack a few deep at most
        m = _BY_FIRST[line[pos]].match(line, pos)
        if m is None:
            break
        if m.lastgroup == "ts":
            ts = ts or m.group("ts").strip()
        else:
            procs.append(m.group("proc").strip())
        pos = m.end()
        if pos >= len(line) or line[pos] not in _FIRST:
            break
    if pos == 0:
        return Split("", line, None)
    return Split(" ".join(procs), line[pos:], ts)
