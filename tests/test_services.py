"""Services: started for the jobs that need them, waited for until ready, and stopped when another
stage needs their GPUs (the seeds stopped the inference server by hand to free the GPUs)."""

from __future__ import annotations

import json

SERVICE = '["${python}", "-c", "import time; time.sleep(0.5); print(\'Application startup complete\', flush=True); time.sleep(600)"]'

PIPELINE = f"""\
stages:
  serve_a:
    kind: service
    host: local
    gpus: 1
    command: {SERVICE}
    ready: {{log_regex: "Application startup complete", timeout_s: 60}}
    stop_grace_s: 2
  serve_b:
    kind: service
    host: local
    gpus: 1
    command: {SERVICE}
    ready: {{log_regex: "Application startup complete", timeout_s: 60}}
    stop_grace_s: 2
  job_a:
    host: local
    command: ["true"]
    needs: [serve_a]
  job_b:
    host: local
    command: ["true"]
    needs: [serve_b]
    depends_on: [job_a]
  broken_service:
    kind: service
    host: local
    command: ["${{python}}", "-c", "import sys; print('no luck'); sys.exit(4)"]
    ready: {{log_regex: "Application startup complete", timeout_s: 60}}
  job_c:
    host: local
    command: ["true"]
    needs: [broken_service]
"""


def _state(tmplab, stage):
    runs = tmplab.runs(stage)
    return runs[-1]["state"] if runs else None


def test_service_started_for_job_then_handed_over_for_the_gpu(tmplab, monkeypatch):
    # GPUs are counted, not touched, by the hand-over: preflight (which asks nvidia-smi, and is
    # tested in test_ssh_preflight.py) would refuse them on this GPU-less machine.
    monkeypatch.setenv("EAGLELAB_NO_PREFLIGHT", "1")
    tmplab.write_lab("    gpus: 1\n")
    tmplab.write_pipeline(PIPELINE)
    p = tmplab.lab("run", "job_a")
    assert "waiting for service serve_a" in p.stdout and "service serve_a is ready" in p.stdout
    assert _state(tmplab, "job_a") == "completed" and _state(tmplab, "serve_a") == "running"
    # job_b needs serve_b, which needs the only GPU serve_a holds: serve_a is stopped first.
    p = tmplab.lab("run", "job_b")
    assert "stopping service serve_a to free 1 GPU(s) on local for serve_b" in p.stdout
    assert _state(tmplab, "serve_a") == "killed" and _state(tmplab, "serve_b") == "running"
    assert _state(tmplab, "job_b") == "completed"
    # a job whose service is up reuses it
    p = tmplab.lab("run", "job_b", "--force")
    assert "starting serve_b" not in p.stdout and len(tmplab.runs("serve_b")) == 1
    # the pipeline's end stops what is left
    p = tmplab.lab("pipeline", "--quiet", check=False)
    assert [(r["stage"], r["state"]) for r in tmplab.runs() if r["state"] == "running"] == [], p.stdout + p.stderr


def test_service_that_dies_before_ready_fails_the_job_with_its_log(tmplab):
    tmplab.write_pipeline(PIPELINE)
    p = tmplab.lab("run", "job_c", check=False)
    assert p.returncode != 0
    assert "service 'broken_service' ended (failed (exit code 4)) before it was ready" in p.stderr
    assert "lab logs" in p.stderr and tmplab.runs("job_c") == []


FLAGGED = """\
vars:
  flag: "--max-num-seqs 8"
stages:
  serve:
    kind: service
    host: local
    command: ["${python}", "-c", "import sys, time; print('Application startup complete', sys.argv[1:], flush=True); time.sleep(600)", "${flag}"]
    ready: {log_regex: "Application startup complete", timeout_s: 60}
    stop_grace_s: 2
  synth:
    host: local
    command: ["true"]
    needs: [serve]
  prepare:
    host: local
    command: ["true"]
"""


def _plan(tmplab):
    import json
    return {s["stage"]: (s["action"], s["reason"]) for s in json.loads(tmplab.lab("plan", "--json").stdout)["steps"]}


def test_a_needed_services_flag_is_part_of_the_jobs_fingerprint(tmplab):
    tmplab.write_pipeline(FLAGGED)
    tmplab.lab("run", "synth")
    tmplab.lab("run", "prepare")
    tmplab.lab("stop", "serve")
    assert _plan(tmplab)["synth"][0] == "skip"  # nothing changed: a stopped service is no reason to rerun
    tmplab.write_profile("test", "vars:\n  flag: '--max-num-seqs 64'\n")
    plan = _plan(tmplab)
    assert plan["synth"] == ("run", plan["synth"][1]) and "config" in plan["synth"][1], plan
    assert plan["prepare"][0] == "skip", plan  # needs no service: untouched
    tmplab.write_profile("test", "vars: {}\n")  # back as it was: up to date again
    assert _plan(tmplab)["synth"][0] == "skip"


# The pilot's own window (eaglelab.pilot_window; the kimi-k2.5 profile): where the target holds every GPU,
# the pilot goes first: synth's first rows, serve_extract for its data, its train on a GPU of its own, then
# synth's server again for the rest. Each job records its argv, so the rewritten commands are seen as run.
RECORD = '"${python}", "-c", "import sys, json; open(sys.argv[1], \'a\').write(json.dumps(sys.argv[2:]) + chr(10))", "${data}/argv.jsonl"'
TWO_GPU_SERVICE = (f'{{kind: service, host: local, gpus: 2, command: {SERVICE}, stop_grace_s: 2, '
                   'ready: {log_regex: "Application startup complete", timeout_s: 60}}')
WINDOW = f"""\
vars: {{data: DATA, pilot_samples: "8"}}
pilot_window: own
stages:
  serve_t: {TWO_GPU_SERVICE}
  serve_x: {TWO_GPU_SERVICE}
  synth:
    host: local
    command: [{RECORD}, "synth", "--out", "${{data}}/synth", "--limit", "100"]
    needs: [serve_t]
  pilot:
    host: local
    command: [{RECORD}, "pilot", "--synth", "${{data}}/synth", "--out", "${{data}}/pilot"]
    needs: [serve_x]
  extract:
    host: local
    command: [{RECORD}, "extract"]
    needs: [serve_x]
    depends_on: [synth]
"""


def test_the_pilots_own_window_hands_the_gpus_over_in_its_order(tmplab, monkeypatch):
    monkeypatch.setenv("EAGLELAB_NO_PREFLIGHT", "1")  # GPUs counted, not asked for (as above)
    tmplab.write_lab("    gpus: 2\n")
    data = tmplab.root / "data"
    data.mkdir()
    tmplab.write_pipeline(WINDOW.replace("DATA", str(data)))
    p = tmplab.lab("pipeline", "--quiet", "--no-notify", timeout=300)
    argv = [json.loads(line) for line in (data / "argv.jsonl").read_text().splitlines()]
    assert [a[0] for a in argv] == ["synth", "pilot", "pilot", "synth", "extract"], p.stdout
    head, pilot_data, pilot, synth, _ = argv
    assert head[-4:] == ["--limit", "8", "--out", f"{data}/synth_head"] and "100" not in head
    assert pilot_data[-4:] == ["--synth", f"{data}/synth_head", "--through", "vocab"]
    assert "--through" not in pilot and pilot[-2:] == ["--synth", f"{data}/synth_head"]
    assert synth[-2:] == ["--reuse", f"{data}/synth_head"] and "--limit" in synth
    # the services: serve_t for the head, serve_x for the pilot's data (serve_t stopped), none for its train
    # (serve_x stopped for its GPU), serve_t again for the rest of synth, serve_x again for extract
    starts = [r["stage"] for r in sorted(tmplab.runs(), key=lambda r: r["started_at"]) if r["stage"].startswith("serve")]
    assert starts == ["serve_t", "serve_x", "serve_t", "serve_x"], p.stdout
    assert "stopping service serve_x to free 2 GPU(s) on local for pilot" in p.stdout
    assert [(r["stage"], r["state"]) for r in tmplab.runs() if r["state"] == "running"] == []
