"""tick: a small real stage for demos and tests of the machinery (no model, no GPU).

Counts to --steps with a tqdm bar, sleeping --delay between steps, then writes --output with a
manifest. `--fail-at N` exits 3 at step N (a failing stage); it resumes from --output's partial
count, like the real stages do.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
from tqdm import tqdm


@click.command()
@click.option("--steps", default=20, show_default=True)
@click.option("--delay", default=0.2, show_default=True, help="Seconds per step.")
@click.option("--output", type=click.Path(path_type=Path), default=None, help="File to write the count to.")
@click.option("--fail-at", type=int, default=None, help="Exit 3 at this step (for tests).")
def main(steps: int, delay: float, output: Path | None, fail_at: int | None) -> None:
    print(f"tick: counting to {steps}", flush=True)
    for i in tqdm(range(steps), desc="Ticking", unit="step", mininterval=0, file=sys.stderr):
        if fail_at is not None and i == fail_at:
            print(f"tick: failing at step {i} as asked", flush=True)
            sys.exit(3)
        time.sleep(delay)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps({"steps": steps}) + "\n")
    print("tick: done", flush=True)


if __name__ == "__main__":
    main()
