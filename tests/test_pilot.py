"""The pilot slice (eaglelab.stages.pilot): synth's first rows, taken in prompt order from a file
still being written, through the real prepare -> extract (transformers) -> vocab -> train stages on
the tiny target, on CPU; its log carries train's acceptance lines, which the project's log parser
and the forecast read; a rerun skips what is finished; too few rows is a clear error."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import foresight_data
from eaglelab import manifest
from eaglelab.control.foresight.forecast import offline_evidence
from eaglelab.host.parse.state import LogState
from eaglelab.stages import acceptance, pilot

REPO = Path(__file__).resolve().parents[1]
FAILED = 2       # the prompt recorded in responses.errors.jsonl (synth passed it over)
TORN = 10        # the prompt whose row is the half-written last line
SLICE = [0, 1, 3, 4, 5, 6, 7, 8]  # --samples 8 in prompt order: 2 failed, 9 and 10 not needed


def synth_row(row: dict, idx: int) -> dict:
    """A row as speculators' regenerate-responses writes it."""
    return {"id": f"{row['id']}_gen0", "primary_id": row["id"], "input_ids": row["input_ids"],
            "loss_mask": row["loss_mask"], "text": "",
            "metadata": {"idx": idx, "finish_reason": "length", "is_tool_call": False, "usage": {}}}


def write_synth(synth: Path, rows: list[dict], shuffle_seed: int = 3) -> list[int]:
    """synth's output mid-run: rows in completion order (not prompt order), one prompt failed, the
    last line torn. Returns the prompt indices in file order."""
    synth.mkdir(parents=True, exist_ok=True)
    done = [synth_row(r, i) for i, r in enumerate(rows) if i not in (FAILED, TORN)]
    random.Random(shuffle_seed).shuffle(done)
    with open(synth / pilot.SYNTH_OUT, "w") as f:
        for r in done:
            f.write(json.dumps(r) + "\n")
        f.write(json.dumps(synth_row(rows[TORN], TORN))[:80])  # still being written
    (synth / pilot.SYNTH_ERR).write_text(json.dumps({"id": rows[FAILED]["id"], "metadata": {"idx": FAILED,
                                                     "error": "ReadTimeout()"}}) + "\n")
    return [r["metadata"]["idx"] for r in done]


def run_pilot(root: Path, out: Path, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "py"))
    argv = [sys.executable, "-m", "eaglelab.stages.pilot", "--synth", str(root / "synth"),
            "--model", str(root / "model"), "--out", str(out), "--samples", "8", "--wait-s", "30",
            "--aux-layers", foresight_data.AUX, "--seq-length", "256", "--draft-vocab-size",
            foresight_data.DRAFT_VOCAB, "--epochs", "2", "--lr", "3e-3", "--loss-fn", "ce", "--device", "cpu",
            "--acceptance-k", "3", *extra]
    p = subprocess.run(argv, capture_output=True, env=env, timeout=900)
    if check and p.returncode != 0:
        raise AssertionError(f"pilot -> {p.returncode}\n{p.stdout.decode()[-6000:]}\n{p.stderr.decode()[-3000:]}")
    return p


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    root = tmp_path_factory.mktemp("pilot")
    foresight_data.run_stage("tiny_model", "--out", str(root / "model"), "--prompts-out", str(root / "prompts.jsonl"),
                             "--eval-prompts-out", str(root / "eval.jsonl"), "--num-prompts", "11",
                             "--num-eval-prompts", "1")
    rows = foresight_data.greedy_rows(root / "model", root / "prompts.jsonl", max_new=40)
    file_order = write_synth(root / "synth", rows)
    out = root / "pilot"
    p = run_pilot(root, out)
    return {"root": root, "rows": rows, "out": out, "stdout": p.stdout, "file_order": file_order}


def test_the_slice_is_the_first_prompts_in_order_without_the_failed_or_the_torn(ran):
    assert ran["file_order"][:8] != SLICE  # the first 8 lines would be another slice
    doc = manifest.require(ran["out"] / "synth", "synth", "-")
    assert doc["extra"]["order"] == "prompt" and doc["extra"]["prompt_indices"] == SLICE
    got = [json.loads(line) for line in (ran["out"] / "synth" / pilot.SYNTH_OUT).read_text().splitlines()]
    assert [r["input_ids"] for r in got] == [ran["rows"][i]["input_ids"] for i in SLICE]
    assert doc["counts"]["rows"] == 8
    assert b"1 unreadable line(s) skipped" in ran["stdout"]
    assert manifest.read(ran["out"] / "prepared")["counts"]["samples"] == 8  # prepare took the slice


def test_the_manifest_and_summary_carry_the_acceptance_of_the_last_checkpoint(ran):
    doc = manifest.require(ran["out"], "pilot", "-")
    records = acceptance.read(ran["out"] / "checkpoints")
    assert len(records) == 2  # one estimate per epoch
    assert doc["counts"]["samples"] == 8 and doc["counts"]["checkpoints"] == 2
    assert doc["extra"]["acceptance_rate"] == records[-1]["acceptance_rate"]
    assert doc["extra"]["mean_acceptance_length"] == records[-1]["mean_acceptance_length"]
    text = ran["stdout"].decode()
    steps = re.findall(r"^pilot: step (\d)/5 (\w+) \(8 samples\)$", text, re.M)
    assert steps == [("1", "prepare"), ("2", "extract"), ("3", "vocab"), ("4", "train"), ("5", "acceptance")]
    m = re.search(r"^pilot summary: samples=8 acceptance_rate=([\d.]+) mean_acceptance_length=([\d.]+) "
                  r"checkpoints=2 seconds=[\d.]+$", text, re.M)
    assert m and float(m.group(1)) == pytest.approx(records[-1]["acceptance_rate"], abs=5e-4)
    assert float(m.group(2)) == pytest.approx(records[-1]["mean_acceptance_length"], abs=5e-3)
    assert (ran["out"] / "checkpoints" / "drafter" / "config.json").is_file()


def test_the_acceptance_lines_reach_the_log_parser_and_the_forecast(ran):
    assert b"\r" in ran["stdout"]  # the children's bytes came through as they were (tqdm's \r frames)
    assert b"train: plan: 2 epochs x " in ran["stdout"]
    st = LogState()
    for i, line in enumerate(ran["stdout"].decode().splitlines()):
        st.feed_line(line, i + 1)
    snap = st.snapshot()
    assert len(snap["metrics"]["acceptance/rate"]) == 2 and len(snap["metrics"]["acceptance/mean_length"]) == 2
    ev = offline_evidence({"id": "r1", "stage": "pilot", "log_state": snap})
    last = acceptance.read(ran["out"] / "checkpoints")[-1]
    assert ev["checkpoints"] == 2
    # the forecast's headline is vLLM's greedy chain; the every-start figure rides along
    assert ev["acceptance_rate"] == pytest.approx(last["chain"]["acceptance_rate"], abs=1e-4)
    assert ev["mean_acceptance_length"] == pytest.approx(last["chain"]["mean_acceptance_length"], abs=1e-4)
    assert ev["all_starts"]["acceptance_rate"] == pytest.approx(last["acceptance_rate"], abs=1e-4)
    assert ev["all_starts"]["mean_acceptance_length"] == pytest.approx(last["mean_acceptance_length"], abs=1e-4)


def test_a_rerun_skips_the_finished_steps_and_still_reports_the_curve(ran):
    out, stages_ran = ran["out"], re.compile(rb"^(prepare|extract|vocab|train): ", re.M)
    before = manifest.read(out)
    again = run_pilot(ran["root"], out).stdout  # finished: nothing runs
    assert re.search(rb"^pilot: .* is complete \(.*\); skipping$", again, re.M) and not stages_ran.search(again)
    assert again.count(b"acceptance/rate=") == 2

    (out / manifest.NAME).unlink()  # killed after the last step, before the pilot's manifest
    again = run_pilot(ran["root"], out).stdout
    assert not stages_ran.search(again)  # no stage was started again
    assert len(re.findall(rb"^pilot: step \d/5 \w+ \(8 samples\): done earlier", again, re.M)) == 4
    st = LogState()
    for i, line in enumerate(again.decode().splitlines()):
        st.feed_line(line, i + 1)
    assert offline_evidence({"log_state": st.snapshot()})["checkpoints"] == 2
    after = manifest.read(out)
    assert after["counts"] == before["counts"]
    assert after["extra"]["acceptance_rate"] == before["extra"]["acceptance_rate"]

    ledger = json.loads((out / pilot.LEDGER).read_text())
    ledger["steps"]["train"]["output"] = None  # killed during training: started, not finished
    (out / pilot.LEDGER).write_text(json.dumps(ledger))
    (out / manifest.NAME).unlink()
    again = run_pilot(ran["root"], out).stdout
    assert b"2 acceptance estimate(s) made before the interruption" in again
    assert re.search(rb"^pilot: step 4/5 train \(8 samples\)$", again, re.M)  # the train stage resumes
    assert b"train: " in again and not re.search(rb"^(prepare|extract|vocab): ", again, re.M)
    assert manifest.read(out)["extra"]["checkpoints"] == 2


def test_through_vocab_stops_before_the_train(ran):
    """pilot_data's `--through vocab` (the pilot's own window): its steps whole, then it stops; no pilot
    manifest, so the stage `pilot` after it finds those steps done and trains (as the rerun test shows)."""
    out = ran["out"]  # in place (the ledger holds its paths), put back as it was after
    kept = {f: (out / f).read_bytes() for f in (manifest.NAME, pilot.LEDGER)}
    try:
        (out / manifest.NAME).unlink()
        ledger = json.loads(kept[pilot.LEDGER])
        del ledger["steps"]["train"]  # as after pilot_data: the train never started
        (out / pilot.LEDGER).write_text(json.dumps(ledger))
        p = run_pilot(ran["root"], out, "--through", "vocab").stdout
        assert len(re.findall(rb"^pilot: step \d/5 \w+ \(8 samples\): done earlier", p, re.M)) == 3
        assert re.search(rb"^pilot: stopping after step 3/5 vocab \(--through vocab\)", p, re.M)
        assert b"step 4/5 train" not in p and manifest.read(out) is None
        assert "train" not in json.loads((out / pilot.LEDGER).read_text())["steps"]
    finally:
        for f, data in kept.items():
            (out / f).write_bytes(data)


def test_a_failing_stage_fails_the_pilot_naming_the_step_and_its_last_lines(ran, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(ran["root"] / "model", model)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "vocab_size": 50}))  # the data's ids are larger
    root = tmp_path
    shutil.copytree(ran["root"] / "synth", root / "synth")
    p = run_pilot(root, tmp_path / "pilot", check=False)
    assert p.returncode == 1
    err = p.stderr.decode()
    assert "pilot: step 1/5 prepare failed (exit 1)" in err
    assert ">= the target's vocab_size 50" in err  # the child's own last line, quoted
    assert not (tmp_path / "pilot" / manifest.NAME).exists()


def test_too_few_rows_within_the_wait_is_an_error_naming_the_file(ran, tmp_path):
    synth = tmp_path / "synth"
    synth.mkdir()
    lines = [json.dumps(synth_row(r, i)) for i, r in enumerate(ran["rows"][:3])]
    (synth / pilot.SYNTH_OUT).write_text("\n".join(lines) + "\n" + lines[0][:30])
    args = ["--synth", str(synth), "--model", str(ran["root"] / "model"), "--out", str(tmp_path / "p"),
            "--samples", "8", "--wait-s", "0.3", "--draft-vocab-size", "128"]
    r = CliRunner().invoke(pilot.main, args)
    assert r.exit_code == 1
    assert f"{synth / pilot.SYNTH_OUT}: 3 complete row(s), the pilot needs 8; waited 0.3 s" in r.output
    assert "pilot_samples" in r.output and "--wait-s" in r.output
    assert not (tmp_path / "p" / "synth" / manifest.NAME).exists()

    r = CliRunner().invoke(pilot.main, [*args[:1], str(tmp_path / "nothing"), *args[2:]])
    assert r.exit_code == 1 and f"{tmp_path / 'nothing' / pilot.SYNTH_OUT}: not there" in r.output


def row(idx, conv=None, tool=False):
    return {"primary_id": conv or f"c{idx}", "id": f"{conv or f'c{idx}'}_gen", "input_ids": [1], "loss_mask": [1],
            "metadata": {"idx": idx, "is_tool_call": tool}}


@pytest.mark.parametrize("rows, errors, n, final, want_idx, order", [
    # prompt order, whatever the file order
    ([row(3), row(0), row(1), row(2)], [], 3, False, [0, 1, 2], "prompt"),
    # prompt 1 still running: wait, even though 3 rows exist ...
    ([row(0), row(2), row(3)], [], 3, False, None, "prompt"),
    # ... unless it failed (synth passes it over) ...
    ([row(0), row(2), row(3)], [{"metadata": {"idx": 1}}], 3, False, [0, 2, 3], "prompt"),
    # ... or the wait is over: the lowest indices
    ([row(0), row(2), row(3)], [], 3, True, [0, 2, 3], "lowest"),
    # a conversation's rows stay together; the last one counts only once its answer is there
    ([row(0), row(1, "c1", tool=True), row(1, "c1")], [], 3, False, [0, 1, 1], "prompt"),
    ([row(0), row(1), row(2, "c2", tool=True)], [], 3, True, None, "prompt"),
    # rows without metadata.idx: file order
    ([{"id": "b", "input_ids": [1]}, {"id": "a", "input_ids": [2]}], [], 2, False, "ba", "file"),
])
def test_choose(rows, errors, n, final, want_idx, order):
    got = pilot.choose(rows, errors, n, final=final)
    assert got["order"] == order
    if want_idx is None:
        assert got["rows"] is None
    elif order == "file":
        assert "".join(r["id"] for r in got["rows"]) == want_idx
    else:
        assert [r["metadata"]["idx"] for r in got["rows"]] == want_idx
    if order == "lowest":
        assert got["missing"] == [1]


def test_the_tail_reads_each_line_once_and_waits_for_a_torn_one(tmp_path):
    path = tmp_path / "responses.jsonl"
    path.write_bytes(b'{"id": "a", "metadata": {"idx": 1}}\nnot json\n[1, 2]\n\n'
                     b'{"id": "b", "input_ids": [7, 8]}\n{"id": "c", "inp')
    tail = pilot.Tail(path)
    tail.poll()
    assert [s["id"] for s in tail.stubs] == ["a", "b"] and tail.bad == 2 and tail.torn == 1
    assert tail.stubs[0]["metadata"] == {"idx": 1, "is_tool_call": None}
    with open(path, "ab") as f:
        f.write(b'ut_ids": [9]}\n{"id": "d"}\n')  # the torn line is finished, and one more
    tail.poll()
    assert [s["id"] for s in tail.stubs] == ["a", "b", "c", "d"] and tail.bad == 2 and tail.torn == 0
    assert tail.lines(tail.stubs[1:3]) == [b'{"id": "b", "input_ids": [7, 8]}', b'{"id": "c", "input_ids": [9]}']
    path.write_bytes(b'{"id": "z"}\n')  # replaced by a shorter file: read afresh
    tail.poll()
    assert [s["id"] for s in tail.stubs] == ["z"]


def test_on_one_kimi_workstation_the_pilot_has_a_window_of_its_own_before_synth():
    """Kimi-K2.5 does not fit one GPU and every server holds all 8 (~14 GiB left on each): the pilot goes
    first (pilot_window: own): synth's first rows, serve_extract for its data, its train on a GPU of its own,
    then synth's server again for the rest (eaglelab.pilot_window; the hand-over itself: test_services)."""
    from eaglelab import config
    cfg = config.load(REPO / "conf", "kimi-k2.5")
    p, data, head = cfg.stage("pilot"), cfg.stage("pilot_data"), cfg.stage("synth_head")
    assert p.during is None and p.needs == [] and p.gpus == 1 and p.depends_on == ["pilot_data"]
    assert data.needs == ["serve_extract"] and data.command[-2:] == ["--through", "vocab"]
    assert head.needs == ["serve_synth"] and "--reuse" in cfg.stage("synth").command
    jobs = [n for n in cfg.stage_order() if cfg.stage(n).kind == "job" and cfg.stage(n).during is None]
    assert jobs.index("synth_head") < jobs.index("pilot_data") < jobs.index("pilot") < jobs.index("synth") \
        < jobs.index("eval_baseline") < jobs.index("extract")
    servers = [cfg.stage(n).needs[0] if cfg.stage(n).needs else None for n in jobs]
    assert servers[jobs.index("synth_head"):jobs.index("eval_baseline") + 1] == \
        ["serve_synth", "serve_extract", None, "serve_synth", "serve_target", "serve_target"]  # + eval_openings
    ec = cfg.stage("engine_check")  # vLLM's counters in synth's first minutes: beside the head
    assert ec.during.stage == "synth_head" and ec.command[ec.command.index("--synth") + 1] == "${data}/synth_head"
    # the demo keeps it beside synth, on the CPU
    demo = config.load(REPO / "conf", "demo")
    assert demo.stage("pilot").during.stage == "synth" and not demo.stage("pilot").needs
    assert "synth_head" not in demo.stages and "--reuse" not in demo.stage("synth").command


def test_an_engine_check_wanting_more_rows_than_the_head_makes_is_refused_at_load(tmp_path):
    """In its own window the engine check runs beside synth_head: rows it would wait for forever are a
    config error naming both keys, not a stage that hangs."""
    from eaglelab import config
    from eaglelab.errors import ConfigError
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    prof = conf / "profiles" / "kimi-k2.5.yaml"
    prof.write_text(prof.read_text().replace("  rows: 256", "  rows: 300"))
    with pytest.raises(ConfigError, match=r"pilot_window: own: .*engine_check.rows is 300.*vars.pilot_samples"):
        config.load(conf, "kimi-k2.5")
