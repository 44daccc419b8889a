"""Side jobs through the real `bin/lab pipeline` and jobwrap (docs/foresight.md): a smoke test of the
next stage starts while the current one runs, once it has made enough units; its failure is reported
at once (stdout, `lab status`, the `failed` webhook as the next stage's failure) while the current stage
goes on, and the pipeline then does not start that stage under the same config; a passing smoke lets
it start; a pilot beside a stage starts during it, or when the pipeline passes it finished already.
The real stages' smoke (train on the first extracted files) is tested on the demo in test_foresight_demo.py."""

from __future__ import annotations

import json

from eaglelab import config, side_jobs
from eaglelab.control import notify
from eaglelab.control.pipeline.plan import beside_order

# A tqdm-like bar of N items, one every DELAY s, then its output: the "current stage".
UPSTREAM = ("import os, sys, time\n"
            "n = int(os.environ['N'])\n"
            "for i in range(n + 1):\n"
            "    print(f'Working: {100 * i // n}%|##| {i}/{n} [00:01<00:01,  4.00it/s]', flush=True)\n"
            "    time.sleep(float(os.environ['DELAY']))\n"
            "os.makedirs(sys.argv[1], exist_ok=True); open(sys.argv[1] + '/done', 'w').write('1')\n")
# The "next stage": fails with a library-style argument error when --mode is bad; --smoke marks a smoke run.
NEXT = ("import json, os, sys, time\n"
        "args = sys.argv[1:]\n"
        "mode = args[args.index('--mode') + 1]\n"
        "smoke = '--smoke' in args\n"
        "if mode not in ('ce', 'kl_div'):\n"
        "    sys.exit(f\"next.py: error: invalid configuration: loss_fn: Unknown loss function '{mode}'\")\n"
        "out = args[0] + ('.smoke' if smoke else '')\n"
        "os.makedirs(out, exist_ok=True); json.dump({'t': time.time()}, open(out + '/done', 'w'))\n")

PIPELINE = """\
vars:
  mode: ce
  n: "12"
  delay: "0.5"
  smoke_after: "3"
stages:
  upstream:
    host: local
    command: ["${python}", "-c", %s, "${work_dir}/up"]
    env: {N: "${n}", DELAY: "${delay}"}
    outputs: ["${work_dir}/up"]
    stop_grace_s: 2
  next:
    host: local
    command: ["${python}", "-c", %s, "${work_dir}/next", "--mode", "${mode}"]
    outputs: ["${work_dir}/next"]
    depends_on: [upstream]
    smoke: {during: upstream, after: "${smoke_after}", args: ["--smoke"]}
  pilot:
    host: local
    command: ["${python}", "-c", "import time; time.sleep(1); print('pilot done')"]
    during: {stage: upstream, after: "${pilot_after}"}
""" % (json.dumps(UPSTREAM), json.dumps(NEXT))

HOOK = "notify:\n  webhooks:\n    - {url: 'http://127.0.0.1:9/hook'}\n"


def setup(tmplab, **vars_) -> None:
    tmplab.write_lab(HOOK)
    tmplab.write_pipeline(PIPELINE.replace("vars:\n", "vars:\n  pilot_after: \"4\"\n"))
    tmplab.write_profile("test", "vars: " + json.dumps({k: str(v) for k, v in vars_.items()}) + "\n")


def test_a_failing_smoke_is_reported_while_the_stage_before_runs_and_stops_the_next(tmplab):
    setup(tmplab, mode="klx")
    p = tmplab.lab("pipeline", check=False, timeout=200)
    assert p.returncode != 0
    assert "next WILL FAIL: its smoke test" in p.stdout and "Unknown loss function 'klx'" in p.stdout, p.stdout
    assert "not starting next: its smoke test" in p.stdout
    assert "pipeline stopped at next (next not started" in p.stderr
    [up], [smoke] = tmplab.runs("upstream"), tmplab.runs("smoke-next")
    assert up["state"] == "completed" and smoke["state"] == "failed"
    assert smoke["ended_at"] < up["ended_at"]  # found while the stage before still ran
    assert (tmplab.work / "up" / "done").exists() and tmplab.runs("next") == []  # upstream's work is kept
    st = tmplab.status()
    [sj] = [s for s in st["pipeline"]["side_jobs"] if s["stage"] == "smoke-next"]
    assert sj["smoke_of"] == "next" and sj["current_config"] and "klx" in sj["reason"]
    assert "next WILL FAIL: its smoke test" in tmplab.lab("status").stdout
    sent = notify.deliveries(tmplab.logs / "registry.sqlite")
    [ev] = [d for d in sent if d["stage"] == "smoke-next" and d["event"] == "failed"]
    # the same pipeline again, nothing fixed: upstream is up to date, next still refused
    p = tmplab.lab("pipeline", check=False, timeout=200)
    assert p.returncode != 0 and "not starting next: its smoke test" in p.stdout and tmplab.runs("next") == []


def test_the_failed_smokes_notification_names_the_next_stage():
    run = {"id": "smoke-next-1", "stage": "smoke-next", "host": "local", "state": "failed", "duration_s": 3,
           "exit_code": 1, "log_state": {"failure": {"reason": "bad_argument", "message": "Unknown loss 'klx'"}}}
    body = notify.stage_payload("failed", run, "http://127.0.0.1:8765/", 0.0)
    assert body["smoke_of"] == "next" and body["text"].startswith("next will fail: its smoke test failed on local")


def test_a_smokes_reason_uses_the_same_words_as_its_notification():
    from eaglelab.control.pipeline.side_runs import failure_of
    from eaglelab.model import how_it_ended
    run = {"id": "smoke-next-1", "stage": "smoke-next", "state": "failed", "exit_code": 1,
           "log_state": {"failure": {"reason": "bad_argument", "message": "Unknown loss 'klx'"}}}
    assert failure_of(run) == how_it_ended(run) == "bad_argument: Unknown loss 'klx'"
    assert failure_of({**run, "log_state": None}) == how_it_ended({**run, "log_state": None})  # the exit in words
    assert failure_of({**run, "error": "host h9 unreachable"}) == "host h9 unreachable"  # it never started


def test_a_passing_smoke_lets_the_next_stage_run_and_the_pilot_runs_beside(tmplab):
    setup(tmplab, mode="ce")
    p = tmplab.lab("pipeline", check=False, timeout=200)
    assert p.returncode == 0, p.stdout + p.stderr
    [up], [smoke], [nxt], [pilot] = (tmplab.runs(s) for s in ("upstream", "smoke-next", "next", "pilot"))
    assert smoke["state"] == nxt["state"] == pilot["state"] == "completed"
    assert smoke["started_at"] < up["ended_at"] and pilot["started_at"] < up["ended_at"]  # beside, not after
    assert (tmplab.work / "next.smoke" / "done").exists() and (tmplab.work / "next" / "done").exists()
    assert "side job smoke-next completed" in p.stdout


def test_a_pilot_beside_a_stage_that_had_finished_starts_when_the_pipeline_passes_it(tmplab):
    setup(tmplab, mode="ce", pilot_after="1000", smoke_after="1000")  # never reached while upstream runs
    p = tmplab.lab("pipeline", check=False, timeout=200)
    assert p.returncode == 0, p.stdout + p.stderr
    [pilot] = tmplab.runs("pilot")
    [up] = tmplab.runs("upstream")
    assert pilot["started_at"] >= up["ended_at"] and pilot["state"] == "completed"  # late: after, still run
    assert tmplab.runs("smoke-next") == []  # a smoke is not started once its stage before has finished
    assert "side job smoke-next not run: upstream ended before it was seen to have made 1000 unit(s)" in p.stdout


def test_plan_shows_side_jobs_beside_their_stage(tmplab):
    setup(tmplab, mode="ce")
    out = tmplab.lab("plan").stdout
    lines = [ln.split()[0] for ln in out.splitlines() if ln and not ln.startswith((" ", "-"))]
    assert lines[:4] == ["upstream", "pilot", "smoke-next", "next"], out
    assert "beside upstream, once it has made 3 unit(s) (not once upstream has finished): smoke test of next" in out


def test_side_job_config_errors_name_the_key(tmplab):
    tmplab.write_lab("")
    tmplab.write_pipeline(PIPELINE.replace("during: upstream,", "during: upstreem,")
                          .replace("vars:\n", "vars:\n  pilot_after: \"4\"\n"))
    tmplab.write_profile("test", "vars: {}\n")
    p = tmplab.lab("status", check=False)
    assert p.returncode != 0 and "stages.next.smoke: 'upstreem' is no other job" in p.stderr, p.stderr
    tmplab.write_pipeline(PIPELINE.replace("vars:\n", "vars:\n  pilot_after: \"many\"\n"))
    p = tmplab.lab("status", check=False)
    assert p.returncode != 0 and "stages.pilot: during.after" in p.stderr and "'many'" in p.stderr, p.stderr


def test_beside_order_is_pure():
    assert beside_order(["a", "b", "s", "c", "p"], {"s": "a", "p": "a"}) == ["a", "s", "p", "b", "c"]
    assert beside_order(["a", "s"], {"s": "zz"}) == ["a", "s"]
    assert side_jobs.progress_units({"log_state": {"progress": {"n": 7, "total": 9}}}) == 7.0
    assert side_jobs.progress_units(None) == 0.0 and side_jobs.progress_units({"log_state": {"progress": None}}) == 0.0
    assert config is not None


def test_a_side_job_due_on_the_awaited_run_starts_at_once_not_at_the_next_poll(tmplab):
    # the record `lab` waits on is checked at every wait step: a window shorter than POLL_S is not missed
    from eaglelab.control.lab import Lab
    from eaglelab.control.pipeline.side_runs import SideRuns
    setup(tmplab, pilot_after=1000)
    side = SideRuns(Lab.load(str(tmplab.conf), "test"), None, clock=lambda: 100.0)  # the clock stands still
    started = []
    side.start = lambda name, trigger: (started.append(name), side.started.update({name: {"id": None}}))
    side.follow = lambda: None
    run = {"id": "upstream-1", "stage": "upstream", "state": "running", "log_state": {"progress": {"n": 1}}}
    side.poll(run)            # the first poll: not due yet (1 of 3 units)
    assert started == []
    side.poll({**run, "log_state": {"progress": {"n": 3}}})  # inside POLL_S, but due on this very record
    assert started == ["smoke-next"]
    side.next_at = 200.0
    side.poll({**run, "stage": "other"})  # nothing due on another stage's record: the throttle holds
    assert started == ["smoke-next"]
