"""The core that the CLI, cron and the web page share: config + registry + executors.

`lab run STAGE` is idempotent (DESIGN.md, principle 3): a running stage is attached to, a completed
stage whose fingerprint is unchanged is skipped, a failed or changed one is started again. Services a
stage `needs` are started and waited for; services holding GPUs that a stage wants are stopped first.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from eaglelab import __version__
from eaglelab import config as config_mod
from eaglelab.config import Config, StageConfig
from eaglelab.control.registry import Registry
from eaglelab.errors import EaglelabError, HostError, StageError
from eaglelab.fsutil import UntrustedFolder, parse_iso, trusted_folder
from eaglelab.host.settle import at_launch
from eaglelab.model import ACTIVE, BadRecord, HostReport, Meta, RunRecord, RunState, StageState, check, exit_text

from . import stage_code
from .executors import Executor, HostUnreachable, for_host
from .foresight import gates
from .pipeline import preflight, services
from .pipeline.side_runs import SideRuns

# The longest a wait asks a host to watch a run before the controller looks again (gates, side jobs,
# the other hosts): an end is still seen within hostside.AWAIT_STEP_S of it.
AWAIT_S = 5.0
MISSING_CONFIRM_S = 0.5  # between the report that lacks a live run and the one that confirms it


class Lab:
    def __init__(self, cfg: Config, registry: Registry | None = None):
        self.cfg = cfg
        if registry is None:
            try:  # the registry, mirrored logs, locks: in a folder nobody else can rename things in
                trusted_folder(cfg.logs_dir, "logs_dir")
            except UntrustedFolder as e:
                raise EaglelabError(f"{e} (logs_dir is set in {cfg.conf_dir / 'lab.yaml'})") from None
        self.registry = registry or Registry(cfg.logs_dir / "registry.sqlite")
        self._executors: dict[str, Executor] = {}
        from . import notify  # stage completed/failed/stalled -> webhooks, seen as the registry learns it
        self.notifier = notify.watch(self)
        self.ignore_gates = False  # --ignore-gates (eaglelab.control.foresight.gates)
        self.gate_failures: dict[str, list[str]] = {}  # run id -> why its gate stopped it
        self.side_runs = None  # the pilot and smoke jobs of the pipeline being run (control/pipeline/side_runs.py)
        self.code_root = stage_code.SOURCE_ROOT  # where the code that fingerprints hash lives (py/)

    @classmethod
    def load(cls, conf_dir: str | None = None, profile: str | None = None) -> Lab:
        return cls(config_mod.load(conf_dir, profile))

    def executor(self, host: str) -> Executor:
        if host not in self._executors:
            self._executors[host] = for_host(self.cfg.host(host))
        return self._executors[host]

    # -- what a stage would run --------------------------------------------------------------

    def launch_spec(self, stage: StageConfig) -> dict:
        ex = self.executor(stage.host)
        variables = self.cfg.vars_for(stage, repo=ex.repo_dir(), python=ex.python, work_dir=ex.work_dir)
        render = lambda v: self.cfg.render(stage, v, variables)
        return {
            "stage": stage.name, "host": stage.host, "profile": self.cfg.profile, "kind": stage.kind,
            "command": [render(a) for a in stage.command],
            "env": {k: render(v) for k, v in stage.env.items()},
            "inputs": [render(p) for p in stage.inputs], "outputs": [render(p) for p in stage.outputs],
            "cwd": ex.repo_dir(), "python": ex.python,
            **({"slurm": config_mod.slurm_options(self.cfg.host(stage.host), stage)}
               if self.cfg.host(stage.host).reach == "slurm" else {}),
        }

    def fingerprint(self, stage: StageConfig, spec: dict | None = None) -> str:
        """Config + inputs' manifests + code + the configuration of the services the stage `needs` (a
        vLLM flag or num_speculative_tokens changes what eval measures and what synth generates): a
        change in any of them means rerun. The code is every module of the package that the modules
        a command names (`-m eaglelab.stages.train`) may run: their import closure (stage_code)."""
        def code_of(spec: dict) -> dict:
            code = {"eaglelab": __version__}
            for arg in spec["command"]:
                if stage_code.module_path(arg, self.code_root) is not None:
                    code.update(stage_code.code_digest(arg, self.code_root, cache=self.cfg.logs_dir / "stage_code.json"))
            return code

        spec = spec or self.launch_spec(stage)
        digest = self.executor(stage.host).inputs_digest(spec["inputs"], spec["cwd"]) if spec["inputs"] else {}
        payload = {k: spec[k] for k in ("stage", "host", "kind", "command", "env", "inputs", "outputs")}
        needed = {}
        for name in stage.needs:  # their command, env and code; their inputs are the stage's business
            svc = self.launch_spec(self.cfg.stage(name))
            needed[name] = {"spec": {k: svc[k] for k in ("host", "command", "env")}, "code": code_of(svc)}
        blob = json.dumps({"spec": payload, "inputs": digest, "code": code_of(spec),
                           **({"services": needed} if needed else {})}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # -- the hosts' truth into the registry ---------------------------------------------------

    def refresh(self, hosts: list[str] | None = None, stage: str | None = None) -> dict[str, str | None]:
        """Poll hosts in parallel (one round trip each); returns {host: error or None}."""
        names = hosts or list(self.cfg.hosts)

        def poll(name: str):
            asked_at = time.time()  # what the report says is as of no earlier than this
            try:
                return name, self.executor(name).report(stage), None, asked_at
            except HostUnreachable as e:
                return name, None, str(e), asked_at

        errors = {}
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(names)))) as pool:
            for name, report, err, asked_at in pool.map(poll, names):
                if report is not None:
                    report = checked_report(name, report)
                self.registry.sync_host(name, report, err, as_of=asked_at)
                errors[name] = err
                if report is not None and self.registry.missing_from(name, report, stage, asked_at):
                    self._confirm_missing(name, stage)
        return errors

    def _confirm_missing(self, host: str, stage: str | None) -> None:
        """Live runs of the registry that the host's report lacks (their directory vanished or became
        unreadable: a wiped host, a replaced disk) are ended `lost`, with the reason, once a second
        report, asked for after the first, confirms it; until then nothing changes. Otherwise they
        would stay `running` forever: attached to, waited on, never run again."""
        time.sleep(MISSING_CONFIRM_S)
        asked_at = time.time()
        try:
            report = checked_report(host, self.executor(host).report(stage))
        except HostUnreachable:
            return  # not confirmed: they keep their state until a host answers
        self.registry.sync_host(host, report, None, as_of=asked_at)
        self.registry.end_missing(host, self.registry.missing_from(host, report, stage, asked_at))

    def latest(self, stage: str) -> dict | None:
        return self.registry.latest(stage)

    # -- run ---------------------------------------------------------------------------------

    def decide(self, name: str, force: bool = False) -> tuple[str, str, dict | None]:
        """(action, reason, latest run): action is attach | skip | run. Needs a fresh registry."""
        stage = self.cfg.stage(name)
        latest = self.latest(name)
        if latest and latest["state"] in ACTIVE:
            return "attach", f"{name} is already {latest['state']} as {latest['id']} on {latest['host']}", latest
        if force:
            return "run", "forced", latest
        if stage.transfer is not None:  # up to date exactly when the destination holds the source's data
            return (*self._transfer_verdict(stage.transfer), latest)
        if latest is None:
            return "run", "never ran", None
        if latest.get("end_unknown"):  # unreadable is not absent: a person decides, not a rerun
            return "hold", (f"the end of {latest['id']} is unknown ({latest['end_unknown']}); look at it "
                            f"(`lab logs {latest['id']}`), then `lab run {name} --force` to run it again"), latest
        if latest["state"] != RunState.COMPLETED:
            return "run", f"last run {latest['id']} {latest['state']}" + _end_detail(latest), latest
        if stage.kind == "service":
            return "run", "service is not running", latest
        fp = self.fingerprint(stage)
        if latest.get("fingerprint") != fp:
            return "run", f"inputs, config or code changed since {latest['id']}", latest
        newer = self._upstream_newer(stage, latest)
        if newer is not None:
            return "run", f"upstream {newer['stage']} ran again ({newer['id']}) after {latest['id']} started", latest
        return "skip", f"{name} is up to date ({latest['id']} completed, nothing changed)", latest

    def transfer_sizes(self, t) -> tuple[dict, dict]:
        """paths_info of a transfer's paths on its source and on its destination."""
        src, dst = self.executor(t.src), self.executor(t.dst)
        return src.paths_info(list(t.paths), src.repo_dir()), dst.paths_info(list(t.paths), dst.repo_dir())

    def _transfer_verdict(self, t) -> tuple[str, str]:
        legs = ("host to host" if t.dst in self.cfg.host(t.src).direct_to else
                "through the controller" if "local" not in (self.cfg.host(t.src).reach, self.cfg.host(t.dst).reach)
                else "over ssh from/to the controller")
        try:
            have, there = self.transfer_sizes(t)
        except HostError as e:
            return "run", f"moves {', '.join(t.paths)} {t.src} -> {t.dst} (sizes unknown: {e})"
        if not all(i["exists"] for i in have.values()):
            return "run", f"moves {', '.join(t.paths)} {t.src} -> {t.dst} {legs}, once {t.producer} has made it"
        todo = [p for p in t.paths if there[p]["key"] != have[p]["key"] or there[p]["problems"]]
        if not todo:
            return "skip", f"{', '.join(t.paths)} already on {t.dst}, the same as on {t.src} ({have[t.paths[0]]['key']})"
        size = sum(have[p]["bytes"] for p in todo)
        return "run", (f"moves {', '.join(todo)} ({_size(size)}, {sum(have[p]['files'] for p in todo)} files) "
                       f"{t.src} -> {t.dst} {legs}")

    def _upstream_newer(self, stage: StageConfig, latest: dict) -> dict | None:
        """A depends_on stage whose latest run started after this stage's latest run did (make's rule:
        the upstream ran again, so this stage's result is stale even if its inputs' digest matches).
        Start times come from the hosts' clocks; a skew shorter than the upstream's own run cannot
        flip the order, since a stage starts only after its upstream has ended."""
        mine = parse_iso(latest.get("started_at"))
        for dep in stage.depends_on:
            if self.cfg.stage(dep).kind != "job":
                continue
            up = self.latest(dep)
            theirs = parse_iso(up.get("started_at")) if up else None
            if mine is not None and theirs is not None and theirs > mine:
                return up
        return None

    def run(self, name: str, *, force: bool = False, deps: bool = False, wait: bool = True,
            out: TextIO | None = None, follow: bool = True, reap: bool = True) -> dict:
        """Run (or attach to, or skip) one stage; with wait, until it ends. The run record."""
        out = out or sys.stdout
        stage = self.cfg.stage(name)
        if deps:
            for dep in self.cfg.stage_order([name])[:-1]:
                if self.cfg.stage(dep).kind == "job":
                    rec = self.run(dep, wait=True, out=out, follow=follow)
                    if rec["state"] != RunState.COMPLETED:
                        return rec
        for dep in stage.depends_on:  # the data it reads from other hosts comes first (cheap when there)
            transfer = self.cfg.stage(dep).transfer
            if transfer is not None and (self.latest(transfer.producer) or {}).get("state") == RunState.COMPLETED:
                rec = self.run(dep, wait=True, out=out, follow=False)
                if rec["state"] != RunState.COMPLETED:
                    return rec
        self._check_dependencies(stage)
        from filelock import FileLock  # ~20 ms to import (it brings asyncio); only a launch takes a lock
        lock = FileLock(str(self.cfg.logs_dir / "locks" / f"stage-{name}.lock"))
        (self.cfg.logs_dir / "locks").mkdir(parents=True, exist_ok=True)
        with lock:
            self.refresh([stage.host], stage=name)
            action, reason, latest = self.decide(name, force)
            if action == "skip":
                print(f"lab: {reason}", file=out)
                # a transfer may be up to date without a run (the data was there already)
                if latest and latest["state"] == RunState.COMPLETED:
                    return latest
                return {"id": None, "stage": name, "host": stage.host, "state": RunState.COMPLETED}
            if action == "hold":
                raise StageError(f"{name}: not run: {reason}")
            if action == "attach":
                print(f"lab: {reason}; attaching", file=out)
                rec = latest
            else:
                for svc in stage.needs:
                    self.ensure_service(svc, out=out)
                self._free_gpus_for(stage, out=out)
                spec = self.launch_spec(stage)
                spec["fingerprint"] = self.fingerprint(stage, spec)
                if stage.transfer is None:  # a transfer checks its own source and the room where it goes
                    preflight.before_launch(self, stage, spec)  # a failed check raises StageError naming it
                print(f"lab: starting {name} on {stage.host} ({reason})", file=out)
                meta = self.executor(stage.host).launch(spec)
                rec = self._record_launch(meta, spec)
        if not wait or stage.kind == "service":
            if stage.kind == "service" and wait:
                self.wait_ready(stage, rec, out=out)
            print(f"lab: {rec['id']} {rec['state']}; follow with `lab logs -f {rec['id']}`", file=out)
            return rec
        final = self.wait(rec, out=out if follow else None)
        if reap and stage.needs:  # its services may be idle now: stopped after their keep-alive
            services.schedule_reap(self)
        return final

    def _record_launch(self, meta: dict, spec: dict) -> dict:
        try:
            check(Meta, meta, f"host {spec['host']}: the launch of {spec['stage']} answered")
        except BadRecord as e:  # a malformed answer is an error, not a KeyError far away
            raise HostError(f"{e}; the run may exist on the host: `lab status` shows it once it reports") from None
        rec = {**meta, "id": meta["run_id"], "state": at_launch(meta),
               "run_dir": str(Path(self.executor(spec["host"]).work_dir) / "runs" / meta["run_id"])}
        self.registry.upsert(rec)
        return self.registry.get(rec["id"]) or rec

    def _check_dependencies(self, stage: StageConfig) -> None:
        for dep in stage.depends_on:
            latest = self.latest(dep)
            if latest is None or latest["state"] != RunState.COMPLETED:
                # the registry may lag the host (a run that ended a moment ago): ask before refusing
                hosts = [h for h in dict.fromkeys([self.cfg.stage(dep).host, *([latest["host"]] if latest else [])])
                         if h in self.cfg.hosts]
                errors = self.refresh(hosts, stage=dep)
                latest = self.latest(dep)
            if latest is None or latest["state"] != RunState.COMPLETED:
                state = f"whose latest run {latest['id']} is {latest['state']}" if latest else "which never ran"
                silent = "; ".join(f"{h} did not answer: {e}" for h, e in errors.items() if e)
                raise StageError(f"stage {stage.name!r} depends on {dep!r}, {state}"
                                 f"{f' ({silent})' if silent else ''}; "
                                 f"run `lab run {dep}` first (or `lab run {stage.name} --deps`)")

    # -- services ----------------------------------------------------------------------------

    def ensure_service(self, name: str, out: TextIO) -> dict:
        svc = self.cfg.stage(name)
        self.refresh([svc.host], stage=name)
        latest = self.latest(name)
        if latest and latest["state"] in ACTIVE:
            self.wait_ready(svc, latest, out=out)
            return latest
        return self.run(name, wait=True, out=out)

    def is_ready(self, svc: StageConfig, rec: dict, wait_s: float = 0.0) -> bool:
        """Asked on the service's host, one round trip (never from here: a port of the same number on
        the controller says nothing about the service, and its log stays where it is); the host asks
        again itself for up to wait_s."""
        ready = svc.ready
        if ready is None:
            return True
        url = self.cfg.render(svc, ready.url, self.cfg.vars_for(svc)) if ready.url else None
        return self.executor(svc.host).ready(rec["id"], url, ready.log_regex, wait_s)

    def wait_ready(self, svc: StageConfig, rec: dict, out: TextIO) -> None:
        deadline = time.time() + (svc.ready.timeout_s if svc.ready else 0)
        print(f"lab: waiting for service {svc.name} ({rec['id']}) to be ready", file=out)
        while True:
            if self.is_ready(svc, rec, wait_s=min(AWAIT_S, max(0.0, deadline - time.time()))):
                print(f"lab: service {svc.name} is ready", file=out)
                return
            self.refresh([svc.host], stage=svc.name)
            cur = self.registry.get(rec["id"]) or rec
            if cur["state"] not in ACTIVE:
                raise StageError(f"service {svc.name!r} ended ({cur['state']}{_end_detail(cur)}) before it was "
                                 f"ready; see `lab logs {cur['id']}`")
            if time.time() > deadline:
                raise StageError(f"service {svc.name!r} not ready after {svc.ready.timeout_s:.0f} s; "
                                 f"see `lab logs {cur['id']}` (ready.timeout_s raises the limit)")

    def _free_gpus_for(self, stage: StageConfig, out: TextIO) -> None:
        """Stop running services on the stage's host whose GPUs it needs (the seeds stopped the
        inference server by hand to free the GPUs for extraction)."""
        if stage.gpus <= 0:
            return
        host = self.cfg.host(stage.host)
        keep = set(stage.needs)
        used = {}
        for name, s in self.cfg.stages.items():
            if s.kind == "service" and s.host == stage.host and s.gpus > 0 and name != stage.name:
                latest = self.latest(name)
                if latest and latest["state"] in ACTIVE:
                    used[name] = s.gpus
        needed_by_kept = sum(g for n, g in used.items() if n in keep)
        free = host.gpus - sum(used.values())
        for name in [n for n in used if n not in keep]:
            if free >= stage.gpus or host.gpus - needed_by_kept - stage.gpus < 0:
                break
            print(f"lab: stopping service {name} to free {used[name]} GPU(s) on {host.name} for {stage.name}",
                  file=out)
            self.stop(name)
            free += used[name]

    # -- follow, stop, logs --------------------------------------------------------------------

    def wait(self, rec: dict, out: TextIO | None, poll_s: float = 0.5) -> dict:
        """Follow the run's log (to out, if given) until the run ends; the final record."""
        offset = rec.get("log_size", 0) if out is None else 0
        ex = self.executor(rec["host"])
        gate_watch = gates.Watch(self)  # a failing gate on this stage stops the run
        while True:
            if out is not None:
                offset = self._pump_log(ex, rec["id"], offset, out)
            self.refresh([rec["host"]], stage=rec["stage"])
            cur = self.registry.get(rec["id"]) or rec
            if cur["state"] not in ACTIVE:
                if out is not None:
                    self._pump_log(ex, rec["id"], offset, out)
                    print(f"lab: {cur['id']} {cur['state']}{_end_detail(cur)}", file=out)
                return cur
            gate_watch(cur, out)
            if self.side_runs is not None:  # the pilot / the next stage's smoke, started beside this run
                self.side_runs.poll(cur)
            # Then wait on the host for the run to end (or, when following, for new log lines), up to
            # AWAIT_S: over ssh every question starts a Python there, and a day-long stage needs no
            # question twice a second. A side job still to start beside it is triggered by a count of
            # units, seen only by asking: then ask every poll_s. Gates are looked at after each wait.
            time.sleep(poll_s)
            if self.side_runs is not None and self.side_runs.awaited_beside(rec["stage"]):
                continue
            try:
                ex.await_change(rec["id"], AWAIT_S - poll_s, offset if out is not None else None)
            except HostUnreachable:
                pass  # the next refresh says what is known of the host

    @staticmethod
    def _pump_log(ex: Executor, run_id: str, offset: int, out: TextIO) -> int:
        while True:
            try:
                data = ex.read_log(run_id, offset, 1 << 20)
            except HostUnreachable:
                return offset
            if not data:
                return offset
            out.write(data.decode("utf-8", "replace"))
            out.flush()
            offset += len(data)

    def resolve_run(self, stage_or_run: str) -> dict:
        """A run id, or a stage name meaning its latest run."""
        rec = self.registry.get(stage_or_run)
        if rec is None and stage_or_run in self.cfg.stages:
            self.refresh([self.cfg.stage(stage_or_run).host], stage=stage_or_run)
            rec = self.latest(stage_or_run)
            if rec is None:
                raise StageError(f"stage {stage_or_run!r} has no runs yet; start one with `lab run {stage_or_run}`")
        if rec is None:
            raise EaglelabError(f"{stage_or_run!r} is neither a stage nor a run id"
                                f"{config_mod.did_you_mean(stage_or_run, self.cfg.stages)}; "
                                f"stages: {', '.join(self.cfg.stages)}")
        return rec

    def stop(self, stage_or_run: str, grace_s: float | None = None) -> dict:
        rec = self.resolve_run(stage_or_run)
        if grace_s is None:
            st = self.cfg.stages.get(rec["stage"])
            grace_s = st.stop_grace_s if st else 30.0
        try:
            final = self.executor(rec["host"]).stop(rec["id"], grace_s)
        except HostUnreachable:
            raise
        except HostError as e:  # its directory vanished or is damaged: a ghost, ended once confirmed
            self.refresh([rec["host"]], stage=rec["stage"])
            now = self.registry.get(rec["id"]) or rec
            if now["state"] not in ACTIVE:
                raise HostError(f"{e}; recorded {now['state']}{_end_detail(now)}: {now.get('end_unknown')}") from None
            raise
        self.registry.upsert(final)
        return self.registry.get(rec["id"]) or final

    def pipeline(self, force: bool = False, keep_services: bool = False, follow: bool = True,
                 out: TextIO = sys.stdout) -> PipelineResult:
        """Every job in dependency order, each only if needed, stopping at the first that does not
        complete; services are stopped however it ends (Ctrl-C included) unless keep_services, each
        only when no live run needs it (a job a Ctrl-C left running keeps its service: stop_services).
        `lab pipeline` and a cron firing both call this."""
        result = PipelineResult()
        # side jobs (a pilot, a smoke test) start beside the stage they name, not in this order
        jobs = [n for n in self.cfg.stage_order() if self.cfg.stage(n).kind == "job" and self.cfg.stage(n).during is None]
        self.side_runs = side = SideRuns(self, out)
        try:
            for i, name in enumerate(jobs):
                gated = gates.blocked(self, name, out)  # its gate fails already: it does not start
                if gated:
                    result.ran.append({"stage": name, "run": None, "state": StageState.GATED})
                    result.failed = gated
                    break
                side.poll(force=True)  # a pilot beside a stage that had finished already starts now
                smoked = side.before(name)  # its smoke test failed: hours of it would fail the same way
                if smoked:
                    print(f"lab: not starting {name}: " + "; ".join(smoked), file=out)
                    result.ran.append({"stage": name, "run": None, "state": StageState.SMOKE_FAILED})
                    result.failed = {"stage": name, "state": StageState.SMOKE_FAILED, "id": None, "smoke": smoked}
                    break
                try:
                    rec = self.run(name, force=force, wait=True, follow=follow, reap=False)
                except EaglelabError as e:  # could not start (a service died, preflight): a failure too
                    result.error, rec = e, {"stage": name, "state": RunState.FAILED, "id": None}
                if rec.get("id") in self.gate_failures:
                    rec = {**rec, "gate": self.gate_failures[rec["id"]]}
                result.ran.append({"stage": name, "run": rec.get("id"), "state": rec.get("state")})
                if rec["state"] != RunState.COMPLETED:
                    result.failed = rec
                    break
                if not keep_services:  # a service no job left in the pipeline needs holds its GPUs for nothing
                    later = {svc for n in jobs[i + 1:] for svc in self.cfg.stage(n).needs}
                    self.stop_services(out=out, keep=lambda n, later=later: n in later, why="no stage left needs it")
            if result.failed is None:
                side.poll(force=True)  # one due on the last job, which ended between two polls (late: true)
                side.finish()  # a pilot still running: its forecast belongs to this pipeline
        finally:
            self.side_runs = None
            if not keep_services:  # however it ends (Ctrl-C included), but never under a live job
                kept = self.stop_services(out=out)
                if kept:  # stopped once idle past their keep-alive, with nobody watching
                    services.reap_later(self, 1)
        return result

    def stop_services(self, out: TextIO, keep: Callable[[str], bool] = lambda n: False, why: str = "") -> list[str]:
        """Stop the running services not kept, except those in use: a service is stopped only when
        no live run needs it, whichever controller started that run (this pipeline's own job left
        running by a Ctrl-C, another pipeline's, a cron firing's), as the hosts report it now.
        Returns the services left running because they are in use."""
        names = [n for n, s in self.cfg.stages.items() if s.kind == "service" and not keep(n)
                 and (self.latest(n) or {}).get("state") in ACTIVE]
        if not names:
            return []
        services.refresh_for(self, names)
        kept = []
        for name in names:
            latest = self.latest(name)
            if not latest or latest["state"] not in ACTIVE:
                continue
            users = services.in_use(self, name)
            if users:
                busy = ", ".join(f"{u['stage']} ({u['id']}, {u['state']})" for u in users)
                print(f"lab: keeping service {name} ({latest['id']}): in use by {busy}; it stops once idle for "
                      f"its keep_alive_s", file=out)
                kept.append(name)
                continue
            print(f"lab: stopping service {name} ({latest['id']}){': ' + why if why else ''}", file=out)
            self.stop(latest["id"])
        return kept


@dataclass
class PipelineResult:
    ran: list[dict] = field(default_factory=list)  # {stage, run, state} per job, in order
    failed: dict | None = None                      # the run that stopped the pipeline
    error: EaglelabError | None = None              # a job that could not start

    @property
    def detail(self) -> str:
        if self.failed and self.failed.get("gate"):
            return f"{self.failed['stage']} stopped by its gate: " + "; ".join(self.failed["gate"])
        if self.failed and self.failed.get("smoke"):
            return f"{self.failed['stage']} not started: " + "; ".join(self.failed["smoke"])
        return f"{self.failed['stage']} {self.failed['state']}" if self.failed else f"{len(self.ran)} stages completed"


def exit_code_of(rec: dict) -> int:
    """The exit code a command reports for a run that did not complete (128+signal, as a shell)."""
    if rec.get("exit_code"):
        return int(rec["exit_code"])
    return 128 + int(rec["signal"]) if rec.get("signal") else 1


def checked_report(host: str, report: dict) -> dict:
    """A host's report checked where it enters the controller: every run record checked against
    eaglelab.model.RunRecord; one of the wrong shape is listed in `bad_runs` (named, with what is
    wrong) and left out, so one bad run directory never takes `lab status` or the page down."""
    try:
        rep = dict(check(HostReport, report, f"host {host}: report"))
    except BadRecord as e:
        return {"schema": 1, "runs": [], "bad_runs": [{"run_dir": None, "error": str(e)}]}
    runs, bad = [], list(rep.get("bad_runs") or [])
    for r in rep.get("runs") or []:
        if isinstance(r, dict):
            r.setdefault("host", host)
        where = f"host {host}: run {r.get('run_dir') or r.get('id') if isinstance(r, dict) else '?'}"
        try:
            runs.append(check(RunRecord, r, where))
        except BadRecord as e:
            bad.append({"run_dir": r.get("run_dir") if isinstance(r, dict) else None, "error": str(e)})
    rep.update(runs=runs, bad_runs=bad)
    return rep


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _end_detail(rec: dict) -> str:
    text = exit_text(rec)
    return f" ({text})" if text else ""
