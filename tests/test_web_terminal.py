"""`lab status` in a terminal (eaglelab.control.render): every value is literal text for rich (a failure
reason in brackets, log text with markup-like words), and run ids stay whole at 80 columns."""

from __future__ import annotations

import io
import re

from rich.console import Console

import web_samples
from eaglelab.control.render import print_status


def rendered(status: dict, width: int = 80, show_all: bool = False) -> str:
    out = io.StringIO()
    print_status(status, show_all=show_all, console=Console(file=out, width=width, color_system=None))
    return out.getvalue()


def test_failure_reasons_and_markup_like_values_are_shown_literally():
    st = web_samples.lab_status()
    run = next(r for r in st["runs"] if r["state"] == "running")
    run["log_state"]["failure"] = {"reason": "disk_full", "message": "x"}
    run["log_state"]["phase"] = "[bold red]weights[/]"
    st["hosts"][0]["name"] = "gpu1[/]"
    text = rendered(st, width=200)
    assert "[disk_full]" in text
    assert "[bold red]weights[/]" in text
    assert "gpu1[/]" in text


def test_run_ids_whole_at_80_columns():
    st = web_samples.lab_status()
    st["runs"][0]["id"] = "tick-20261201T113446-b07e"
    st["stages"][0]["latest_run"] = "tick-20261201T113446-b07e"
    text = rendered(st, width=80, show_all=True)
    assert all(len(line) <= 80 for line in text.splitlines())
    for r in st["runs"]:
        if any(s.get("latest_run") == r["id"] for s in st["stages"]):
            assert r["id"] in text, r["id"]
    assert "…" not in "".join(re.findall(r"\S*-2026\S*|\S*-2027\S*", text))
    assert "[cuda_oom]" in text and "ETA " in text  # what went wrong and when it ends, under the id
    for width in (100, 160):
        wide = rendered(st, width=width)
        assert all(len(line) <= width for line in wide.splitlines())
        assert "extract-20270115T063000-bbbb" in wide and "[cuda_oom]" in wide


def test_a_finished_pipeline_shows_no_finish_estimate():
    """Once nothing runs, "pipeline finishes about 06:40 (06:40–06:40)" is no news: `lab summary`
    says how it went. While a stage runs, the estimate is shown."""
    st = web_samples.lab_status()
    assert "pipeline finishes about" in rendered(st, width=120)
    for r in st["runs"]:
        r["state"] = "completed"
    assert "pipeline finishes about" not in rendered(st, width=120)
