"""Fault replays on the demo (docs/foresight.md), through `lab pipeline` with the real vLLM server,
the real speculators and the real gate from conf/pipeline.yaml; the demo pipeline without its serving
measurement (eval_baseline, serve_eval, eval: test_pipeline_e2e.py covers those), on 48 samples:

  (a) a train argument the library rejects (loss_fn: klx) -> train's smoke test fails while extract
      still runs; reported at once (stdout, `lab status`, the failed webhook as train's); extract
      finishes; train is not started;
  (b) a drafter that cannot learn (lr 1e-9: a typo of 1e-3) -> the train gate (min_acceptance_rate
      5% after 2 checkpoint estimates) stops training before its last epoch; nothing upstream reruns;
      a late gate (a loaded machine's polls) still comes first: train pauses itself after its
      10th checkpoint (acceptance.PAUSE_ENV) where the gate stops it after its 2nd or 3rd;
  (c) the demo's own settings -> no gate fires, training completes, and the forecast existed while
      it ran.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
import yaml

from demo_lab import Lab
from eaglelab.control import notify
from eaglelab.fsutil import parse_iso
from eaglelab.stages.acceptance import PAUSE_ENV

pytestmark = pytest.mark.timeout(2400)
B_EPOCHS = 12
# (b)'s train stops itself after this checkpoint (0-based): a gate polled late still finds it alive. Without
# it, CI of stop 49 once trained all 12 epochs before the gate fired
B_PAUSE_AFTER = 9
NO_SERVING = ("eval_baseline", "serve_eval", "eval", "pilot")  # the pilot: tested in test_pilot.py


def set_vars(lab: Lab, train_env: dict | None = None, **vars_) -> None:
    """The profile's vars, and train's own env (its fingerprint only: nothing upstream reruns)."""
    path = lab.conf / "profiles" / "e2e.yaml"
    prof = yaml.safe_load(path.read_text())
    prof["vars"].update(vars_)
    stages = prof.setdefault("stages", {})
    if train_env:
        stages.setdefault("train", {})["env"] = train_env
    elif "train" in stages:
        stages["train"].pop("env", None)
    path.write_text(yaml.safe_dump(prof))


@pytest.fixture(scope="module")
def replays(tmp_path_factory):
    lab = Lab(tmp_path_factory.mktemp("foresight"), ports=(8220, 8221, 8222), drop_stages=NO_SERVING, samples=48,
              vars_={"loss_fn": "klx", "epochs": "4"},
              lab_extra={"notify": {"webhooks": [{"url": "http://127.0.0.1:9/hook"}]}})  # queued, never delivered
    facts: dict = {}
    try:
        facts["a"] = lab.lab("pipeline", check=False, timeout=1800)
        facts["a_status"] = lab.lab("status").stdout
        facts["a_json"] = lab.status_json()
        # the gate lands after its 2nd estimate (~4 s an epoch here, alone), well before the pause
        set_vars(lab, loss_fn="ce", lr="1e-9", epochs=str(B_EPOCHS), train_env={PAUSE_ENV: str(B_PAUSE_AFTER)})
        try:
            facts["b"] = lab.lab("pipeline", check=False, timeout=900)
        except subprocess.TimeoutExpired as e:  # paused, and no gate stopped it: say so, free it for (c)
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            facts["b"] = subprocess.CompletedProcess(e.cmd, None, out, "")
            lab.lab("stop", "train", check=False, timeout=120)
        facts["b_json"] = lab.status_json()
        ck = lab.data / "checkpoints"  # before (c) trains again in the same place
        facts["b_epochs"] = sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit()) if ck.is_dir() else []
        set_vars(lab, lr="3e-3", epochs="4")  # and train's env as it was
        (proc, log), seen = lab.popen("pipeline"), None
        while seen is None and proc.poll() is None:  # what `lab status --json` says while the good drafter trains
            st = lab.status_json()  # ~1 s of CPU each: asked only until the forecast is seen
            fc = st["pipeline"]["forecast"] or {}
            train = (runs_of(st, "train") or [{}])[-1]
            if seen is None and train.get("state") == "running" and fc.get("source") == "checkpoint" \
                    and fc.get("train_run") == train.get("id"):
                seen = fc
            time.sleep(2)
        proc.wait(timeout=1800)
        facts["c"], facts["c_seen"] = (proc.returncode, log.read_text(errors="replace")), seen
        facts["c_json"] = lab.status_json()
        yield lab, facts
    finally:
        lab.teardown()
        print("\n\n".join(lab.transcript[-4:]))


def runs_of(st: dict, stage: str) -> list[dict]:
    return [r for r in st["runs"] if r["stage"] == stage]


def test_a_rejected_train_argument_is_caught_by_the_smoke_while_extract_runs(replays):
    lab, f = replays
    a, st = f["a"], f["a_json"]
    assert a.returncode != 0, a.stdout[-3000:]
    assert "train WILL FAIL: its smoke test" in a.stdout and "klx" in a.stdout, a.stdout[-4000:]
    assert "not starting train: its smoke test" in a.stdout
    [ext], [smoke] = runs_of(st, "extract"), runs_of(st, "smoke-train")
    assert ext["state"] == "completed" and smoke["state"] == "failed"
    # started beside extract, by extract's own progress; on the demo's 48 samples extraction lasts about
    # as long as the smoke (15 s of it is importing speculators), on a real lab hours longer
    assert parse_iso(ext["started_at"]) < parse_iso(smoke["started_at"]) < parse_iso(ext["ended_at"]), (smoke, ext)
    print(f"smoke-train ended {parse_iso(ext['ended_at']) - parse_iso(smoke['ended_at']):+.1f} s before extract")
    assert runs_of(st, "train") == []
    assert "train WILL FAIL: its smoke test" in f["a_status"]
    [sj] = [s for s in st["pipeline"]["side_jobs"] if s["stage"] == "smoke-train"]
    assert sj["current_config"] and "klx" in sj["reason"], sj
    [ev] = [d for d in notify.deliveries(lab.root / "logs" / "registry.sqlite")
            if d["stage"] == "smoke-train" and d["event"] == "failed"]


def test_a_drafter_that_cannot_learn_is_stopped_by_the_gate_before_training_ends(replays):
    lab, f = replays
    b, st = f["b"], f["b_json"]
    [train] = runs_of(st, "train")
    seen = {k: v for k, v in ((train.get("log_state") or {}).get("metrics") or {}).items() if k.startswith("acceptance/")}
    why = (b.stdout[-6000:], st["pipeline"]["forecast"], seen)  # if the gate missed it: what the status held
    assert b.returncode is not None, (f"train paused after checkpoint {B_PAUSE_AFTER} and no gate stopped it", *why)
    assert b.returncode != 0, why
    assert re.search(r"gate on train failed: checkpoint forecast after \d+ checkpoint\(s\): acceptance rate "
                     r"\d\.\d% < min_acceptance_rate 5\.0%", b.stdout), b.stdout[-4000:]
    assert train["state"] == "killed"
    assert len(f["b_epochs"]) < B_EPOCHS, f["b_epochs"]  # stopped before its last epoch
    print(f"the gate stopped train after {len(f['b_epochs'])} of {B_EPOCHS} checkpoints (its pause: after {B_PAUSE_AFTER + 1})")
    assert len(runs_of(st, "extract")) == 1 and len(runs_of(st, "synth")) == 1  # nothing upstream redone
    fc = st["pipeline"]["forecast"]
    assert fc["source"] == "checkpoint" and fc["verdict"] == "LOW_ACCEPTANCE", fc


def test_a_good_drafter_passes_the_gate_and_the_forecast_came_while_it_trained(replays):
    lab, f = replays
    (rc, out), st = f["c"], f["c_json"]
    assert rc == 0, out[-4000:]
    assert "gate on" not in out
    train = runs_of(st, "train")[-1]
    assert train["state"] == "completed"
    fc = st["pipeline"]["forecast"]
    assert fc["source"] == "checkpoint" and fc["acceptance_rate"] > 0.05 and fc["checkpoints"] == 4, fc
    seen = f["c_seen"]  # the page and `lab status --json` had a forecast while it still trained
    assert seen is not None and seen["verdict"] and seen["acceptance_rate"] >= 0, seen
    assert parse_iso(seen["made_at"]) < parse_iso(train["ended_at"])
