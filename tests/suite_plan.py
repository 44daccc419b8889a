"""How `make test` spreads the suite over pytest-xdist workers, and where its time went.

Workers (`-n 3`, Makefile): every test belongs to a group, and a group runs whole on one worker
(the scheduler below), so its module and session fixtures are paid for once:

- by default a test's group is its file (what `--dist loadfile` would do);
- files that share a session fixture share a group (SHARED below): the namespaced ssh hosts, the
  Slurm cluster, the tiny trained drafter;
- the groups are handed out longest first (WEIGHT_S, seconds measured on the 2-core machine), so the
  long whole-pipeline runs start at once, side by side, and the short files fill the gaps.

Most of the suite waits (vLLM servers starting, ssh round trips, a controller's polls, cron's
minute): measured with vmstat during a serial run, the two cores were idle 49% of the time. Three
workers fill that; the CPU-heavy groups are few enough to be run side by side.

At the end, the time by file (setup + call + teardown, summed over the file's tests): where the
suite's minutes go, in every CI log.
"""

from __future__ import annotations

import fnmatch
import time
from collections import defaultdict
from pathlib import Path

import pytest

# Files whose tests share one session fixture (tests/conftest.py): one group, one worker, one start.
SHARED = {
    "netlab": ("test_ssh_inject", "test_ssh_lab", "test_ssh_preflight", "test_ssh_sync", "test_ssh_testlab",
               "test_transfers"),
    "slurm": ("test_slurm_lab",),
    "tiny_drafter": ("test_acceptance", "test_serve_smoke", "test_multigpu", "test_engine_check"),
}
GROUP_OF = {stem: group for group, stems in SHARED.items() for stem in stems}

# Seconds each long group took in ci8 (a fresh clone on the idle 2-core machine, 3 workers,
# 2026-12-04: 985 tests, 2,476 s of test time): the order the groups start in.
# A group not named here counts as short and keeps its collection order after these.
# tiny_drafter: 328 + ~150 for test_engine_check (its drafter and two vLLM starts; 553 s measured under a load of ~11).
WEIGHT_S: dict[str, float] = {
    "test_demo_spread": 411, "test_pipeline_e2e": 333, "tiny_drafter": 480, "netlab": 240,
    "test_foresight_demo": 182, "slurm": 176, "test_train_repeat": 123, "test_extract": 114,
    "test_runs_lifecycle": 86, "test_cron": 73, "test_pilot": 59, "test_train_progress": 49,
    "test_idle_services": 40, "test_side_jobs": 32, "test_gates": 30, "test_web_crawl": 28,
}


# `make test-NAME` runs one part; between them the parts hold every test file exactly once
# (tests/test_docs.py checks it, so a new file must be given a part).
PARTS: dict[str, tuple[str, ...]] = {
    "parse": ("test_parse_*", "test_tail_*"),
    "stages": ("test_stages_unit", "test_output_probe", "test_extract", "test_acceptance", "test_acceptance_chain", "test_served_acceptance", "test_serve_smoke", "test_multigpu",
               "test_engine_check", "test_pilot", "test_train_*", "test_model", "test_drafter_support"),
    "pipeline": ("test_pipeline_e2e", "test_foresight_demo", "test_gates", "test_forecast_unit", "test_side_jobs"),
    "ssh": ("test_ssh_*", "test_transfers", "test_demo_spread"),
    "web": ("test_web", "test_web_*", "test_render_status", "test_status_object"),
    "ops": ("test_cron", "test_notify", "test_slurm_*", "test_settle", "test_run_object"),
    "core": ("test_config", "test_docs", "test_eta*", "test_registry", "test_runs_lifecycle", "test_services",
             "test_idle_services", "test_placement", "test_plan_settings", "test_host_imports", "test_host_await",
             "test_stage_code", "test_import_graph", "test_cli_imports", "test_sizing", "test_fit_refusal",
             "test_state_names"),
}


def parts_of(stem: str) -> list[str]:
    return [name for name, pats in PARTS.items() if any(fnmatch.fnmatch(stem, p) for p in pats)]


def pytest_addoption(parser):
    parser.addoption("--part", choices=sorted(PARTS), help="run one part of the suite (tests/suite_plan.py PARTS)")


def group_of_stem(stem: str) -> str:
    return GROUP_OF.get(stem, stem)


def group_of(item: pytest.Item) -> str:
    return group_of_stem(item.path.stem)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: `-p no:xdist` still runs the suite
def pytest_xdist_make_scheduler(config, log):
    """xdist's own `--dist loadgroup` cannot be used: it marks a group by rewriting the node id,
    which pytest 9 no longer allows (the test ids stay as they were and every test is scheduled on
    its own). This is loadscope with our groups as the scopes."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of_stem(Path(nodeid.split("::", 1)[0]).stem)

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    part = config.getoption("--part")
    if part:
        inside = [part in parts_of(it.path.stem) for it in items]
        config.hook.pytest_deselected(items=[it for it, keep in zip(items, inside) if not keep])
        items[:] = [it for it, keep in zip(items, inside) if keep]
    # longest groups first (a stable sort keeps each group's own order)
    items.sort(key=lambda it: -WEIGHT_S.get(group_of(it), 0.0))


_t0 = time.monotonic()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput"):  # a worker: the controller prints the summary
        return
    by_file: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for reports in terminalreporter.stats.values():
        for r in reports:
            if not hasattr(r, "duration") or not hasattr(r, "nodeid") or not r.nodeid:
                continue
            f = r.nodeid.split("::")[0]
            by_file[f] += r.duration
            if r.when == "call":
                count[f] += 1
    if not by_file:
        return
    total = sum(by_file.values())
    wall = time.monotonic() - _t0
    tr = terminalreporter
    tr.write_sep("=", "time by file (setup + call + teardown)")
    for f, s in sorted(by_file.items(), key=lambda kv: -kv[1])[:25]:
        tr.write_line(f"{s:8.1f} s  {100 * s / total:5.1f}%  {count[f]:4d} tests  {f}")
    tr.write_line(f"{total:8.1f} s of test time in {wall:.0f} s of wall time "
                  f"({wall / 60:.1f} min; x{total / wall:.2f} by the workers)")
