"""A transfer stage's process: move a producer's outputs to the host that reads them, and prove it.

Run by `lab` like any stage (under jobwrap on the controller, so it survives a disconnect, its log
has a progress bar that the page turns into an ETA, and it shows in `lab status`):

    python -m eaglelab.control.transfers.transfer --conf DIR --profile NAME --stage move-extract-to-gpu2

The way depends on who reaches whom: host to host when the source lists the destination in
`direct_to` (rsync runs on the source), else through the controller (rsync to a staging copy under
logs/transfers/, then on to the destination: the controller reaches every host). rsync --partial
makes every leg resumable: a cut link is retried, a rerun continues where the last one stopped.
The copy is then checked on the destination against the source: the same manifest.json (and the
files it lists at their sizes), or the same names, sizes and small-file hashes.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

from eaglelab import config as config_mod
from eaglelab.errors import EaglelabError, HostError, StageError

from ..executors import Executor, HostUnreachable, for_host

PROGRESS = re.compile(rb"^\s*([\d,]+)\s+\d+%")  # rsync --info=progress2: "  1,234,567  45%  1.2MB/s ..."


@dataclass
class Leg:
    """One rsync: run here (or on `via`'s host), from src to dst."""
    src: str
    dst: str
    rsh: list[str] | None  # the ssh command rsync uses for the remote end (None: both ends local)
    via: Executor | None = None  # run on this host over ssh instead of here (host to host)


def plan_legs(t, src: Executor, dst: Executor, path: str, is_dir: bool, staging: Path) -> list[Leg]:
    """The rsync legs for one path: one (direct, or where the controller is an end), or two."""
    slash = "/" if is_dir else ""
    (src_rsh, src_spec), (dst_rsh, dst_spec) = src.rsync_target(path), dst.rsync_target(path)
    if src_rsh is None or dst_rsh is None:  # the controller is one end: one leg from here
        return [Leg(src_spec + slash, dst_spec + slash, src_rsh or dst_rsh)]
    if t.dst in src.host.direct_to:  # the source pushes to the destination itself, with its own ssh
        dest = f"{t.dst}:{dst.host_path(path)}"  # `ssh DST` as the source's own ssh config names it
        return [Leg(src.host_path(path) + slash, dest + slash, ["ssh", "-o", "BatchMode=yes"], via=src)]
    # one folder per path, named by its hash: a `..` in the path cannot climb out of the staging area
    stage_copy = str(staging / hashlib.sha256(path.encode()).hexdigest()[:12] / posixpath.basename(path.rstrip("/")))
    return [Leg(src_spec + slash, stage_copy + slash, src_rsh), Leg(stage_copy + slash, dst_spec + slash, dst_rsh)]


def rsync_argv(leg: Leg, is_dir: bool, bwlimit: str | None) -> list[str]:
    # -s: names travel as data, never through a remote shell; --partial: a cut resumes mid-file
    argv = ["rsync", "-a", "-s", "--partial", "--mkpath", "--info=progress2", "--no-inc-recursive"]
    if is_dir:
        argv.append("--delete")  # the copy mirrors the producer's output: no stale shards of an older run
    if bwlimit:
        argv.append(f"--bwlimit={bwlimit}")
    if leg.rsh:
        argv += ["-e", shlex.join(leg.rsh)]
    return argv + [leg.src, leg.dst]


def run_leg(leg: Leg, is_dir: bool, bwlimit: str | None, on_bytes) -> tuple[int, str]:
    """Run one rsync, calling on_bytes(n) as it reports progress; (exit code, last error lines)."""
    argv = rsync_argv(leg, is_dir, bwlimit)
    if leg.via is not None:  # run on the source host: one quoted remote command over its ssh
        argv = leg.via.ssh_argv() + ["--", leg.via.host.ssh.host, shlex.join(argv)]
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    buf = b""
    while chunk := p.stdout.read1(65536):
        buf += chunk
        *lines, buf = re.split(rb"[\r\n]", buf)
        for line in lines:
            m = PROGRESS.match(line)
            if m:
                on_bytes(int(m.group(1).replace(b",", b"")))
    err = p.stderr.read().decode(errors="replace").strip()
    return p.wait(), "\n".join(err.splitlines()[-3:])


def check_destinations(stage_name: str, t, dst: Executor) -> None:
    """Refuse, before anything is read or moved, a path that rsync --delete would mirror onto
    unless it lies strictly inside one of the destination's data roots, resolved on that host."""
    roots = list(dst.host.data_roots)
    fix = (f"write {t.producer!r}'s outputs inside a data root (e.g. {roots[0] if roots else 'data'}/NAME), "
           f"or declare the folder that holds them in hosts.{t.dst}.data_roots (lab.yaml)")
    for p in t.paths:
        why = config_mod.unsafe_root(p)
        if why:
            raise StageError(f"{stage_name}: refusing to mirror {p!r} (an output of stage {t.producer!r}) onto "
                             f"host {t.dst!r} with rsync --delete: {why}; {fix}")
    answer = dst.inside_roots(list(t.paths), roots, dst.repo_dir())
    for p in t.paths:
        where = answer["paths"][p]
        if where["root"] is None:
            raise StageError(f"{stage_name}: refusing to mirror {p!r} (an output of stage {t.producer!r}) onto "
                             f"host {t.dst!r} with rsync --delete: it resolves there to {where['resolved']!r}, "
                             f"not strictly inside a data root ({', '.join(answer['roots']) or 'none declared'}); "
                             f"{fix}")


def move(cfg, stage_name: str, out=sys.stdout) -> dict:
    """Do the transfer stage's work; the figures (bytes, seconds, legs). StageError if it cannot."""
    stage = cfg.stage(stage_name)
    t = stage.transfer
    if t is None:
        raise StageError(f"stage {stage_name!r} is not a transfer")
    src, dst = for_host(cfg.host(t.src)), for_host(cfg.host(t.dst))
    check_destinations(stage_name, t, dst)
    opts = cfg.lab.transfers
    have = src.paths_info(list(t.paths), src.repo_dir())
    for p, info in have.items():
        if not info["exists"]:
            raise StageError(f"{p} is not on {t.src}, where stage {t.producer!r} writes it; "
                             f"run `lab run {t.producer}` first")
        if info["problems"]:
            raise StageError(f"{p} on {t.src} does not match its manifest ({'; '.join(info['problems'][:3])}); "
                             f"run `lab run {t.producer}` again")
    there = dst.paths_info(list(t.paths), dst.repo_dir())
    todo = [p for p in t.paths if there[p]["key"] != have[p]["key"] or there[p]["problems"]]
    total = sum(have[p]["bytes"] for p in todo)
    need = total - sum(there[p]["bytes"] for p in todo)
    free = min((there[p]["free_bytes"] for p in todo), default=None)
    if free is not None and need > free:
        raise StageError(f"host {t.dst!r} has {free:,} bytes free where {', '.join(todo)} go, and the transfer "
                         f"needs {need:,} more; free disk there, or declare a shared path (hosts.NAME.shared)")
    print(f"lab transfer: {t.producer}'s outputs {t.src} -> {t.dst}: "
          + ", ".join(f"{p} ({have[p]['bytes']:,} B, {have[p]['files']} files"
                      + (", already there" if p not in todo else "") + ")" for p in t.paths), file=out, flush=True)
    staging = cfg.logs_dir / "transfers" / stage_name
    legs = {p: plan_legs(t, src, dst, p, have[p]["is_dir"], staging) for p in todo}
    how = "host to host" if any(leg.via for ls in legs.values() for leg in ls) else (
        "through the controller" if any(len(ls) > 1 for ls in legs.values()) else "from/to the controller")
    print(f"lab transfer: {how}", file=out, flush=True)
    from tqdm import tqdm
    started = time.monotonic()
    steps = sum(have[p]["bytes"] * len(legs[p]) for p in todo)
    bar = tqdm(total=steps, unit="B", unit_scale=True, unit_divisor=1024, desc="Moving", file=out,
               mininterval=0.5, ascii=False, dynamic_ncols=False, ncols=100)
    done = 0
    for p in todo:
        for leg in legs[p]:
            size = have[p]["bytes"]
            for attempt in range(1, opts.retries + 2):
                rc, err = run_leg(leg, have[p]["is_dir"], opts.bwlimit,
                                  lambda n, done=done, size=size: bar.update(max(0, min(done + min(n, size), steps) - bar.n)))
                if rc == 0:
                    break
                if attempt > opts.retries:
                    bar.close()
                    raise HostError(f"rsync {leg.src} -> {leg.dst} failed (rc {rc}) {attempt} times: {err}; "
                                    f"run the stage again to resume (rsync --partial keeps what arrived)")
                print(f"\nlab transfer: rsync rc {rc} ({err.splitlines()[-1] if err else 'no message'}); "
                      f"retry {attempt}/{opts.retries} in {opts.retry_wait_s:.0f} s", file=out, flush=True)
                time.sleep(opts.retry_wait_s)
            done += size
            bar.update(max(0, done - bar.n))
    bar.close()
    after = dst.paths_info(list(t.paths), dst.repo_dir())
    bad = [f"{p}: {after[p]['key']} on {t.dst} != {have[p]['key']} on {t.src}"
           + (f" ({'; '.join(after[p]['problems'][:2])})" if after[p]["problems"] else "")
           for p in t.paths if after[p]["key"] != have[p]["key"] or after[p]["problems"]]
    if bad:
        raise StageError("the copy differs from the source after the transfer: " + "; ".join(bad))
    seconds = time.monotonic() - started
    print(f"lab transfer: moved {total:,} bytes in {seconds:.1f} s; verified on {t.dst} "
          f"({', '.join(after[p]['key'] for p in t.paths)})", file=out, flush=True)
    return {"bytes": total, "seconds": seconds, "how": how}


@click.command()
@click.option("--conf", "conf_dir", required=True, type=click.Path(file_okay=False))
@click.option("--profile", required=True)
@click.option("--stage", "stage_name", required=True)
def main(conf_dir: str, profile: str, stage_name: str) -> None:
    try:
        move(config_mod.load(conf_dir, profile), stage_name)
    except HostUnreachable as e:
        raise SystemExit(f"lab transfer: host unreachable: {e}") from None
    except EaglelabError as e:
        raise SystemExit(f"lab transfer: {e}") from None


if __name__ == "__main__":
    main()
