"""SSH: `lab status` over the test hosts with and without multiplexing, and the time to launch a
stage on every host. Real hosts (network namespaces + sshd, tests/testlab.py); needs root.

    .venv/bin/python bench/bench_ssh.py [--hosts 3] [--repeat 5]

Prints each figure with its baseline from the same run (no multiplexing) and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "py"), str(REPO / "tests")]

import yaml

from testlab import SshLab, TestLab


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def fmt(xs: list[float]) -> str:
    return f"median {statistics.median(xs) * 1000:7.1f} ms (min {min(xs) * 1000:.1f}, max {max(xs) * 1000:.1f}, n={len(xs)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-ssh-"))
    net = TestLab(root / "net", hosts=a.hosts).start()
    labs = []
    try:
        hosts = list(net.hosts)
        stages = {f"t_{h}": {"host": h, "command": ["${python}", "-m", "eaglelab.stages.tick", "--steps", "3",
                                                    "--delay", "0.1"]} for h in hosts}
        results = {}
        for mux in (False, True):
            lab = SshLab(net, root / f"mux-{mux}")
            lab.write(stages)
            conf = yaml.safe_load((lab.conf / "lab.yaml").read_text())
            for h in conf["hosts"].values():
                h["ssh"]["multiplex"] = mux
            (lab.conf / "lab.yaml").write_text(yaml.safe_dump(conf))
            labs.append(lab)
            lab.lab("status", "--json")  # warm: the master connection (when multiplexing), caches
            core = lab.core()
            core.refresh()
            results[mux] = {
                "ssh_true": timed(lambda core=core: core.executor(hosts[0]).run_ssh("true"), a.repeat * 2),
                "refresh": timed(lambda core=core: core.refresh(), a.repeat * 2),
                "cli_status": timed(lambda lab=lab: lab.lab("status", "--json"), a.repeat),
            }

            def launch_all(core=core):
                with ThreadPoolExecutor(len(hosts)) as pool:
                    list(pool.map(lambda s: core.run(s, force=True, wait=False, out=open("/dev/null", "w")), stages))
            results[mux]["launch_all"] = timed(launch_all, max(2, a.repeat // 2))
            for name in stages:  # let the last launches finish before the next round
                core.wait(core.latest(name), out=None)

        print(f"== SSH over {len(hosts)} namespace hosts (ConnectTimeout 2, ServerAlive 1x2); "
              f"baseline = no multiplexing")
        names = {"ssh_true": "one remote `true` (ssh round trip)",
                 "refresh": f"status refresh, {len(hosts)} hosts in parallel (in-process)",
                 "cli_status": "`lab status --json` (CLI process, incl. Python start)",
                 "launch_all": f"launch a stage on all {len(hosts)} hosts in parallel (preflight + launch)"}
        for key, label in names.items():
            off, on = results[False][key], results[True][key]
            print(f"{label}\n   no mux: {fmt(off)}\n   mux:    {fmt(on)}\n   ratio no-mux/mux: "
                  f"{statistics.median(off) / statistics.median(on):.1f}x")
    finally:
        for lab in labs:
            lab.cleanup()
        net.stop()


if __name__ == "__main__":
    main()
