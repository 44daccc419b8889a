"""Data placement across real hosts (the namespaced ssh lab, tests/testlab.py): each host has its own
checkout and its own data/; a stage's outputs move to the hosts of the stages that read them, are
verified there, resume after a cut link; hosts that declare a shared path move nothing."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from conftest import wait_for

REPO = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO / "tests" / "fixtures" / "stages" / "make_data.py")


def checkouts(sshlab, shared_data: Path | None = None) -> str:
    """A checkout per host (its code linked to this repo's, its own data/ unless shared_data)."""
    name = f"eaglelab-{sshlab.root.name}"
    for h in sshlab.net.hosts:
        d = sshlab.net.home(h) / name
        d.mkdir(parents=True, exist_ok=True)
        for part in ("py", "status_web"):
            if not (d / part).exists():
                (d / part).symlink_to(REPO / part)
        if shared_data is not None and not (d / "data").exists():
            (d / "data").symlink_to(shared_data)
    return f"~/{name}"


def data_on(sshlab, host: str, repo: str, path: str) -> Path:
    return sshlab.net.home(host) / repo[2:] / path


def stages(mb: int = 1) -> dict:
    make = ["${python}", SCRIPT, "make", "data/made", "--mb", str(mb), "--seed", "${seed}"]
    use = lambda h: {"host": h, "depends_on": ["make"], "inputs": ["data/made"],
                     "outputs": [f"data/used-{h}.txt"],
                     "command": ["${python}", SCRIPT, "check", "data/made", f"data/used-{h}.txt"]}
    return {"make": {"host": "h1", "command": make, "outputs": ["data/made"]}, "use2": use("h2"), "use3": use("h3")}


def write(sshlab, repo: str, mb: int = 1, seed: int = 1, host_extra: dict | None = None,
          lab_extra: dict | None = None) -> None:
    sshlab.write(stages(mb), vars={"seed": str(seed)}, extra_host={"repo_dir": repo, **(host_extra or {})})
    if lab_extra:
        lab_file = sshlab.conf / "lab.yaml"
        lab_file.write_text(yaml.safe_dump({**yaml.safe_load(lab_file.read_text()), **lab_extra}))


def plan(sshlab) -> dict[str, dict]:
    return {s["stage"]: s for s in json.loads(sshlab.lab("plan", "--json").stdout)["steps"]}


def test_outputs_move_to_the_readers_hosts_verified_and_once(sshlab):
    repo = checkouts(sshlab)
    write(sshlab, repo)
    steps = plan(sshlab)
    assert list(steps) == ["make", "move-make-to-h2", "use2", "move-make-to-h3", "use3"], steps
    assert "once make has made it" in steps["move-make-to-h2"]["reason"], steps
    assert "through the controller" in steps["move-make-to-h2"]["reason"]

    p = sshlab.lab("pipeline", "--no-notify", timeout=300)
    assert "lab transfer: moved" in p.stdout and "verified on h2" in p.stdout, p.stdout
    src = data_on(sshlab, "h1", repo, "data/made")
    for h in ("h2", "h3"):
        copy = data_on(sshlab, h, repo, "data/made")
        assert sorted(f.name for f in copy.iterdir()) == sorted(f.name for f in src.iterdir())
        assert all((copy / f.name).read_bytes() == f.read_bytes() for f in src.iterdir())
        assert "read data/made" in data_on(sshlab, h, repo, f"data/used-{h}.txt").read_text()
    status = sshlab.status()
    moved = [r for r in status["runs"] if r["stage"].startswith("move-")]
    assert {r["stage"] for r in moved} == {"move-make-to-h2", "move-make-to-h3"}
    assert all(r["state"] == "completed" and r["host"] == "controller" for r in moved), moved

    summary = {s["stage"]: s for s in json.loads(sshlab.lab("summary", "--json").stdout)["stages"]}
    made = json.loads((src / "manifest.json").read_text())
    assert summary["make"]["outputs"][0]["bytes"] == made["total_bytes"] > 0, summary["make"]  # read on h1

    again = plan(sshlab)  # nothing changed: the copies are the source's, nothing runs
    assert all(s["action"] == "skip" for s in again.values()), again
    assert "already on h2" in again["move-make-to-h2"]["reason"]

    (data_on(sshlab, "h2", repo, "data/made") / "shard-0.bin").write_bytes(b"damaged")  # a copy gone bad
    steps = plan(sshlab)
    assert steps["move-make-to-h2"]["action"] == "run" and steps["move-make-to-h3"]["action"] == "skip", steps
    assert "(1.0 MiB, 6 files)" in steps["move-make-to-h2"]["reason"], steps  # the size, before anything moves

    write(sshlab, repo, seed=2)  # the producer reruns: its outputs move again, the readers rerun
    sshlab.lab("pipeline", "--no-notify", timeout=300)
    assert (data_on(sshlab, "h3", repo, "data/made") / "notes.txt").read_text() == "seed 2\n"


def test_a_declared_shared_path_moves_nothing(sshlab, tmp_path):
    common = tmp_path / "labfs"
    common.mkdir()
    repo = checkouts(sshlab, shared_data=common)
    write(sshlab, repo, host_extra={"shared": {"data": "labfs"}})
    steps = plan(sshlab)
    assert list(steps) == ["make", "use2", "use3"], steps
    p = sshlab.lab("pipeline", "--no-notify", timeout=300)
    assert "lab transfer" not in p.stdout
    assert (common / "used-h2.txt").is_file() and (common / "used-h3.txt").is_file()


def test_preflight_names_where_a_missing_input_is(sshlab, tmp_path):
    """Declared shared but not mounted on h2: the advice names the producer, its host and the mount."""
    repo = checkouts(sshlab)
    write(sshlab, repo, host_extra={"shared": {"data": "labfs"}})
    sshlab.lab("run", "make")
    p = sshlab.lab("run", "use2", check=False)
    assert p.returncode != 0
    err = p.stdout + p.stderr
    assert "made by stage 'make' on 'h1'" in err and "check the mount on h2" in err, err


def test_a_cut_link_mid_transfer_is_retried_and_resumes(sshlab):
    repo = checkouts(sshlab)
    write(sshlab, repo, mb=12, lab_extra={"transfers": {"bwlimit": "1500", "retries": 8, "retry_wait_s": 2}})
    sshlab.lab("run", "make")
    proc = sshlab.popen("run", "use2", "-q", stdout=open(sshlab.root / "run.out", "w"), stderr=open(sshlab.root / "run.err", "w"))
    try:
        run = wait_for(lambda: next((r for r in sshlab.status()["runs"] if r["stage"] == "move-make-to-h2"), None), 60)
        log = Path(run["run_dir"]) / "output.log"
        wait_for(lambda: log.is_file() and b"Moving" in log.read_bytes(), 60)
        # the page and `lab status` see the transfer as any run: a byte count with an ETA
        live = wait_for(lambda: next((r for r in sshlab.status()["runs"] if r["id"] == run["id"]
                                      and (r.get("log_state") or {}).get("progress")
                                      and (r.get("eta") or {}).get("eta_s") is not None), None), 30)
        assert live["log_state"]["progress"]["total"] > 12e6, live["log_state"]["progress"]
        sshlab.net.cut("h1")  # the first leg comes from h1
        time.sleep(6)
        sshlab.net.restore("h1")
        assert proc.wait(timeout=240) == 0, (sshlab.root / "run.err").read_text()
    finally:
        sshlab.net.restore("h1")
        if proc.poll() is None:
            proc.kill()
    text = log.read_text(errors="replace")
    assert "retry 1/8" in text and "verified on h2" in text, text[-3000:]
    assert "read data/made" in data_on(sshlab, "h2", repo, "data/used-h2.txt").read_text()


def test_direct_to_moves_host_to_host(sshlab):
    """h1 reaches h2 with its own key: rsync runs on h1, nothing is staged on the controller."""
    repo = checkouts(sshlab)
    ssh_dir = sshlab.net.home("h1") / ".ssh"
    ssh_dir.mkdir(exist_ok=True)
    key = ssh_dir / "id_lab"
    key.write_bytes(sshlab.net.key.read_bytes())
    key.chmod(0o600)
    (ssh_dir / "config").write_text(f"Host h2\n  HostName {sshlab.net.hosts['h2']}\n  User root\n"
                                    f"  IdentityFile {key}\n  StrictHostKeyChecking no\n"
                                    f"  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
    sshlab.write({k: v for k, v in stages().items() if k != "use3"}, vars={"seed": "1"},
                 extra_host={"repo_dir": repo})
    lab_file = sshlab.conf / "lab.yaml"
    doc = yaml.safe_load(lab_file.read_text())
    doc["hosts"]["h1"]["direct_to"] = ["h2"]
    lab_file.write_text(yaml.safe_dump(doc))
    assert "host to host" in plan(sshlab)["move-make-to-h2"]["reason"]
    sshlab.lab("run", "make")
    sshlab.lab("run", "use2")
    assert "lab transfer: host to host" in _transfer_log(sshlab)
    assert not (sshlab.logs / "transfers").exists()
    assert "read data/made" in data_on(sshlab, "h2", repo, "data/used-h2.txt").read_text()


def _transfer_log(sshlab) -> str:
    run = next(r for r in sshlab.status()["runs"] if r["stage"].startswith("move-"))
    return (Path(run["run_dir"]) / "output.log").read_text(errors="replace")


@pytest.mark.parametrize("bad, message", [
    ({"placement": {"nosuch": "h1"}}, "placement.nosuch: no stage"),
    ({"placement": {"use2": "h9"}}, "placement.use2 = 'h9': no such host"),
])
def test_placement_errors_name_lab_yaml(sshlab, bad, message):
    repo = checkouts(sshlab)
    write(sshlab, repo, lab_extra=bad)
    p = sshlab.lab("plan", check=False)
    write(sshlab, repo)  # a valid config again, for the fixture's cleanup
    assert p.returncode != 0 and message in p.stderr and "lab.yaml" in p.stderr, p.stderr


def test_placement_in_lab_yaml_moves_a_stage_and_its_transfers(sshlab):
    repo = checkouts(sshlab)
    write(sshlab, repo, lab_extra={"placement": {"use3": "h1"}})  # beside its producer: nothing moves
    steps = plan(sshlab)
    assert "move-make-to-h3" not in steps and steps["use3"]["host"] == "h1", steps


def test_a_transfer_that_would_fill_the_receiving_disk_stops_before_moving(sshlab, tiny_disk, tmp_path):
    """The controller as the receiving host, its data/ on a 512 KiB disk: refused with the figures."""
    repo = checkouts(sshlab)
    local_repo = tmp_path / "controller-checkout"
    local_repo.mkdir()
    (local_repo / "data").symlink_to(tiny_disk)
    sshlab.write({"make": stages()["make"],
                  "use": {"host": "here", "depends_on": ["make"], "inputs": ["data/made"],
                          "command": ["${python}", SCRIPT, "check", "data/made", "data/used.txt"]}},
                 vars={"seed": "1"}, hosts=["h1"], extra_host={"repo_dir": repo})
    lab_file = sshlab.conf / "lab.yaml"
    doc = yaml.safe_load(lab_file.read_text())
    doc["hosts"]["here"] = {"reach": "local", "repo_dir": str(local_repo), "work_dir": str(tmp_path / "work"),
                            "python": __import__("sys").executable}
    lab_file.write_text(yaml.safe_dump(doc))
    sshlab.lab("run", "make")
    p = sshlab.lab("run", "use", check=False)
    assert p.returncode != 0
    log = _transfer_log(sshlab)
    assert "host 'here' has" in log and "bytes free where data/made go" in log and "needs 1,04" in log, log
    assert "one leg" not in log and not any(tiny_disk.iterdir())  # nothing was written


def test_a_transfer_is_estimated_from_the_bytes_it_will_move(sshlab):
    """First-run priors (docs/eta.md): a transfer stage's ETA is the bytes of its paths, measured
    on the producer's host, at ~1 Gb/s; before the producer ran, it says that it counts none."""
    repo = checkouts(sshlab)
    write(sshlab, repo, mb=2)
    pipe = sshlab.conf / "pipeline.yaml"
    conf = yaml.safe_load(pipe.read_text())
    for name in ("make", "use2", "use3"):
        conf["stages"][name]["prior"] = {"unit": "items", "expected": 1, "per_s": 1}
    pipe.write_text(yaml.safe_dump(conf))
    eta = {s["name"]: s["eta"] for s in sshlab.status()["stages"]}
    assert eta["move-make-to-h2"]["source"] == "prior", eta
    assert "0 bytes counted until make has written them" in eta["move-make-to-h2"]["basis"]
    sshlab.lab("run", "make")
    e = next(s["eta"] for s in sshlab.status()["stages"] if s["name"] == "move-make-to-h2")
    size = sum(f.stat().st_size for f in data_on(sshlab, "h1", repo, "data/made").rglob("*") if f.is_file())
    manifest = json.loads((data_on(sshlab, "h1", repo, "data/made") / "manifest.json").read_text())
    assert size > 2 << 20 and f"prior: {manifest['total_bytes']:,} bytes at" in e["basis"], (size, e)
    assert "data/made/manifest.json total_bytes" in e["basis"]
    assert e["eta_s"] == pytest.approx(5.0 + size / 1e8, abs=0.1)


def _transfer(sshlab, stage: str):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "eaglelab.control.transfers.transfer", "--conf", str(sshlab.conf),
                           "--profile", "none", "--stage", stage], capture_output=True, text=True,
                          env=sshlab.env(), timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("out, why", [
    (".", "the repository"), ("", "the repository"), ("..", "climbs out"), ("data/../..", "climbs out"),
    ("/", "root of the filesystem"), ("~root", "~user"), ("data/made", "resolves there to"),
])
def test_a_transfer_never_mirrors_onto_anything_but_a_data_root(sshlab, out, why):
    """rsync --delete onto '.', '..', '/' or a ~user path (O-5) wiped a host's checkout: every
    destination must lie strictly inside hosts.NAME.data_roots as resolved ON the receiving host
    (there, data/made is a symlink to the checkout itself), and is refused before any rsync."""
    repo = checkouts(sshlab)
    for h in ("h1", "h2"):  # the producer's copy exists, so only the destination check can stop it
        (data_on(sshlab, h, repo, "data")).mkdir(exist_ok=True)
    (data_on(sshlab, "h1", repo, "data/made")).mkdir(exist_ok=True)
    (data_on(sshlab, "h1", repo, "data/made") / "shard-0.bin").write_bytes(b"x" * 100)
    link = data_on(sshlab, "h2", repo, "data/made")
    if out == "data/made" and not link.is_symlink():
        link.symlink_to("..")  # on h2 only: the controller cannot see it
    keep = [data_on(sshlab, "h2", repo, "keep.txt"), data_on(sshlab, "h2", repo, "data/keep.txt")]
    for f in keep:
        f.write_text("a live run's data\n")
    sshlab.write({"make": {"host": "h1", "command": ["true"], "outputs": [out]},
                  "use": {"host": "h2", "depends_on": ["make"], "inputs": [out], "command": ["true"]}},
                 hosts=["h1", "h2"], extra_host={"repo_dir": repo})
    p = _transfer(sshlab, "move-make-to-h2")
    assert all(f.read_text() == "a live run's data\n" for f in keep)  # nothing was deleted
    assert p.returncode != 0, p.stdout
    err = p.stderr
    assert "move-make-to-h2: refusing to mirror" in err and "host 'h2'" in err and why in err, err
    assert "hosts.h2.data_roots (lab.yaml)" in err and "Traceback" not in err, err
    assert "Moving" not in p.stdout and not (sshlab.logs / "transfers").exists()  # no rsync ran


def test_a_data_root_that_is_the_repository_or_root_is_a_config_error(sshlab):
    repo = checkouts(sshlab)
    write(sshlab, repo, host_extra={"data_roots": ["/"]})
    p = sshlab.lab("plan", check=False)
    write(sshlab, repo)
    assert p.returncode != 0 and "data_roots" in p.stderr and "root of the filesystem" in p.stderr, p.stderr
