"""A host name or a stage argument full of shell syntax reaches the remote side as an inert string."""

from __future__ import annotations

import json
from pathlib import Path

from test_ssh_lab import host_run_ids

ECHO_ARGV = ("import json, os, sys; "
             "open(os.path.join(os.environ['EAGLELAB_RUN_DIR'], 'argv.json'), 'w').write(json.dumps(sys.argv[1:]))")


def test_hostile_host_name_and_stage_argument_stay_inert(sshlab, tmp_path: Path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "file").write_text("still here")
    p1, p2, p3, p4 = (tmp_path / f"pwned{i}" for i in range(1, 5))
    # a var's value is substituted as it is (no second templating pass for `$(`)
    evil_arg = f"x; rm -rf {keep} $(touch {p1}) `touch {p2}` \"dq\" 'sq' \\ * ; echo"
    evil_host = f"h1; rm -rf {keep} $(touch {p3}) `touch {p4}` \"dq\" 'sq'"
    # A host name is a name: shell syntax there is refused at load, naming the file and the rule.
    sshlab.write({"echo": {"host": evil_host, "command": ["${python}", "-c", ECHO_ARGV, "${evil}", "${host}"]}},
                 hosts=["h1"], names={"h1": evil_host}, vars={"evil": evil_arg})
    refused = sshlab.lab("run", "echo", "--quiet", check=False)
    assert refused.returncode == 2 and "host name" in refused.stderr and "is not allowed" in refused.stderr
    # A stage argument may hold anything: it arrives as one inert argv item.
    sshlab.write({"echo": {"host": "h1", "command": ["${python}", "-c", ECHO_ARGV, "${evil}", "${host}"]}},
                 hosts=["h1"], vars={"evil": evil_arg})
    out = sshlab.lab("run", "echo", "--quiet")
    assert out.returncode == 0
    (run_id,) = host_run_ids(sshlab, "h1")
    run_dir = sshlab.run_dir("h1", run_id)
    assert json.loads((run_dir / "argv.json").read_text()) == [evil_arg, "h1"]
    st = sshlab.status()
    assert [(r["host"], r["state"]) for r in st["runs"]] == [("h1", "completed")]
    sshlab.lab("logs", "echo")
    sshlab.lab("mirror", "echo")
    assert not any(p.exists() for p in (p1, p2, p3, p4))
    assert (keep / "file").read_text() == "still here"
