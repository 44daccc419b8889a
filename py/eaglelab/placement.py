"""Where the data is: which stage outputs must move to which host before the stages that read them.

A stage reads its `inputs` on its own host. When the job that writes one of them runs on another
host, and the two hosts do not share the path (`hosts.NAME.shared`: the same filesystem name on a
prefix of it), eaglelab adds a transfer stage to the pipeline, `move-<producer>-to-<host>`, run on
the controller between the producer and its readers. So `lab plan` lists it with its size, `lab
pipeline` and `lab run` run it, the page shows its progress and ETA like any run, and when the
producer runs again its outputs move again. eaglelab.control.transfers.transfer does the moving.

Pure: config in, transfer stages out (no host is asked anything here).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from .errors import ConfigError

CONTROLLER = "controller"  # the host the transfers run on when the lab names no `reach: local` host


@dataclass(frozen=True)
class Transfer:
    producer: str             # the job that writes the paths
    src: str                  # its host
    dst: str                  # the host of the stages that read them
    paths: tuple[str, ...]    # the producer's outputs, as rendered (relative to repo_dir, or absolute)
    readers: tuple[str, ...]  # the stages on dst that read them

    @property
    def name(self) -> str:
        return f"move-{self.producer}-to-{self.dst}"


def _norm(p: str) -> str:
    return posixpath.normpath(p) if p not in ("", ".") else "."


def under(path: str, prefix: str) -> bool:
    """path is prefix or lies inside it (whole path components: data/ab is not under data/a)."""
    path, prefix = _norm(path), _norm(prefix)
    return prefix == "." and not path.startswith(("/", "~")) or path == prefix or path.startswith(prefix.rstrip("/") + "/")


def filesystems(host, path: str) -> set[str]:
    """The names of the shared filesystems the host has under path (hosts.NAME.shared)."""
    return {fs for prefix, fs in host.shared.items() if under(path, prefix)}


def shared(a, b, path: str) -> bool:
    """Hosts a and b see the same files at path."""
    return a.name == b.name or bool(filesystems(a, path) & filesystems(b, path))


def _rendered(cfg, stage, values: list[str]) -> list[str]:
    variables = cfg.vars_for(stage)
    return [_norm(cfg.render(stage, v, variables)) for v in values]


def needed(cfg) -> list[Transfer]:
    """Every (producer, receiving host) pair whose outputs must move, in pipeline order."""
    outputs = {n: _rendered(cfg, s, s.outputs) for n, s in cfg.stages.items() if s.kind == "job" and s.outputs}
    moves: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    for reader_name, reader in cfg.stages.items():
        # declared inputs, and any argument naming the output of a stage upstream of it (an input
        # left undeclared is still read: the train stage once failed on h3 for want of config.json)
        upstream = set(upstream_of(cfg, reader_name))
        own = outputs.get(reader_name, [])
        args = [a for a in _rendered(cfg, reader, reader.command)
                if not a.startswith("-") and not any(under(a, o) for o in own)]
        declared = _rendered(cfg, reader, reader.inputs)
        for path in dict.fromkeys(declared + args):
            for producer, outs in outputs.items():
                if producer == reader_name or (path not in declared and producer not in upstream):
                    continue
                out = next((o for o in outs if under(path, o)), None)
                if out is None:
                    continue
                src, dst = cfg.host(cfg.stages[producer].host), cfg.host(reader.host)
                if shared(src, dst, out):
                    continue
                paths, readers = moves.setdefault((producer, dst.name), ([], []))
                if out not in paths:
                    paths.append(out)
                if reader_name not in readers:
                    readers.append(reader_name)
    return [Transfer(p, cfg.stages[p].host, dst, tuple(paths), tuple(readers))
            for (p, dst), (paths, readers) in moves.items()]


def upstream_of(cfg, name: str) -> list[str]:
    """Every stage name reaches through depends_on and needs (not itself)."""
    seen: list[str] = []
    todo = list(cfg.stages[name].depends_on + cfg.stages[name].needs)
    while todo:
        n = todo.pop()
        if n not in seen and n in cfg.stages:
            seen.append(n)
            todo.extend(cfg.stages[n].depends_on + cfg.stages[n].needs)
    return seen


def controller_host(cfg) -> str:
    """The lab's `reach: local` host (this machine), else a `controller` host made for transfers."""
    local = next((n for n, h in cfg.hosts.items() if h.reach == "local"), None)
    if local:
        return local
    if CONTROLLER not in cfg.hosts:
        h = cfg.make_host(reach="local", work_dir=str(cfg.logs_dir / "controller"))
        h.name = CONTROLLER
        h._logs_dir = str(cfg.logs_dir)
        cfg.hosts[CONTROLLER] = h
    return CONTROLLER


def add_transfer_stages(cfg) -> list[Transfer]:
    """Put a transfer stage between each producer and its readers on other hosts (in place)."""
    transfers = needed(cfg)
    if not transfers:
        return []
    host = controller_host(cfg)
    for t in transfers:
        if t.name in cfg.stages:
            raise ConfigError(f"{cfg.conf_dir / 'pipeline.yaml'}: stage name {t.name!r} is taken by eaglelab's "
                              f"transfer of {t.producer}'s outputs to {t.dst}; rename that stage")
        stage = cfg.make_stage(
            host=host, depends_on=[t.producer],
            command=["${python}", "-m", "eaglelab.control.transfers.transfer", "--conf", str(cfg.conf_dir),
                     "--profile", cfg.profile, "--stage", t.name],
            description=f"moves {t.producer}'s outputs ({', '.join(t.paths)}) from {t.src} to {t.dst} "
                        f"for {', '.join(t.readers)}")
        stage.name = t.name
        stage._transfer = t
        cfg.stages[t.name] = stage
        for r in t.readers:
            if t.name not in cfg.stages[r].depends_on:
                cfg.stages[r].depends_on.append(t.name)
    return transfers
