"""First-run priors (docs/eta.md): a pipeline that never ran shows a finish time for every stage
from each stage's input size (measured on its host) x the throughput its `prior:` declares; a
finished run's measured rate replaces the prior; an input that cannot be measured falls back to
the declared size, or to no estimate, with the reason said."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from eaglelab import config
from eaglelab.control.lab import Lab
from eaglelab.control.registry import Registry
from eaglelab.control.status import collect
from eaglelab.errors import ConfigError
from eaglelab.eta import annotate
from eaglelab.eta.history import History
from eaglelab.eta.prior import Prior, learned_span, prior_span
from eaglelab.fsutil import parse_iso
from eaglelab.host import sizes

REPO = pathlib.Path(__file__).resolve().parents[1]

# `silent` prints nothing (no bar, no phase): only its prior or what it learned can time it.
PIPELINE = """\
vars:
  data: {root}/data
  rows: {root}/rows.jsonl
  steps: "5"
stages:
  tick:
    host: local
    command: ["${{python}}", "-m", "eaglelab.stages.tick", "--steps", "${{steps}}", "--delay", "0.01"]
    prior: {{unit: items, expected: "${{steps}}", per_s: 10, fixed_s: 1}}
  silent:
    host: local
    command: ["${{python}}", "-c", "import sys, time; time.sleep(0.2 * sum(1 for _ in open(sys.argv[1])))", "${{rows}}"]
    inputs: ["${{rows}}"]
    prior: {{unit: samples, measure: "${{rows}}", limit: 100, per_s: 10}}
  after:
    host: local
    command: ["${{python}}", "-c", "pass"]
    depends_on: [silent]
    prior: {{unit: samples, measure: "${{data}}/out", expected: 7, per_s: 2, fixed_s: 3}}
  tokens:
    host: local
    command: ["${{python}}", "-c", "pass"]
    depends_on: [tick]
    prior: {{unit: tokens, measure: "${{rows}}", expected: 1000, per_s: 100}}
"""


def write_rows(path: pathlib.Path, n: int) -> None:
    path.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(n)))


def setup(tmplab, rows: int = 5):
    tmplab.write_pipeline(PIPELINE.format(root=tmplab.root))
    write_rows(tmplab.root / "rows.jsonl", rows)


def test_a_fresh_pipeline_shows_a_finish_for_every_stage_before_any_ran(tmplab):
    setup(tmplab)
    st = tmplab.status()
    eta = {s["name"]: s["eta"] for s in st["stages"]}
    for name, e in eta.items():
        assert e["finish_at"] is not None and e["source"] == "prior", (name, e)
        assert e["eta_low_s"] < e["eta_s"] < e["eta_high_s"]  # a wide range: a prior is a guess
        assert e["basis"].startswith("prior: ")
    assert st["pipeline"]["finish_at"] is not None and st["pipeline"]["unknown"] == []
    # tick: 5 steps (its declared size) at 10/s + 1 s
    assert eta["tick"]["eta_s"] == pytest.approx(1.5)
    assert (eta["tick"]["eta_low_s"], eta["tick"]["eta_high_s"]) == pytest.approx((0.5, 4.5))
    # silent: the 5 lines of rows.jsonl, measured on the host
    assert eta["silent"]["eta_s"] == pytest.approx(0.5) and "lines of" in eta["silent"]["basis"]
    # after: its input is not there yet (silent never ran): the declared size, and why
    assert eta["after"]["eta_s"] == pytest.approx(eta["silent"]["eta_s"] + 3 + 7 / 2, abs=0.1)
    assert "prior.expected 7" in eta["after"]["basis"] and "is not there yet" in eta["after"]["basis"]
    # tokens of a plain file cannot be counted cheaply: the declared size, the reason said
    assert "plain file" in eta["tokens"]["basis"] and "prior.expected 1,000" in eta["tokens"]["basis"]
    assert eta["after"]["start_at"] == eta["silent"]["finish_at"]
    # the terminal says it too: each stage's predicted finish and its source, the pipeline's
    text = tmplab.lab("status").stdout
    assert "started now, the pipeline would finish about" in text
    assert all(any(line.startswith(f"│ {n} ") and line.rstrip(" │").endswith("prior") for line in text.splitlines())
               for n in eta), text


def test_after_a_run_the_learned_rate_replaces_the_prior(tmplab):
    setup(tmplab, rows=5)
    tmplab.lab("run", "silent", "-q")
    first = tmplab.runs("silent")[0]  # this status records the size it ran on (5 rows)
    assert first["state"] == "completed"
    d1 = first["duration_s"]
    write_rows(tmplab.root / "rows.jsonl", 60)  # a bigger input: the stage runs again, 12x as long
    tmplab.lab("run", "silent", "--detach", "-q")

    def running_status():
        s = tmplab.status()
        return s if any(r["stage"] == "silent" and r["state"] == "running" for r in s["runs"]) else None

    st = tmplab.wait_for(running_status, timeout=30)
    run = next(r for r in st["runs"] if r["stage"] == "silent" and r["state"] == "running")
    e = next(s["eta"] for s in st["stages"] if s["name"] == "silent")
    assert e["source"] == "learned", e
    assert e["basis"].startswith("learned from 1 run: 60 samples")
    # finish = its start + 60 rows x the first run's seconds per row (the prior said 10 rows/s)
    expected = parse_iso(run["started_at"]) + 60 * d1 / 5
    assert parse_iso(e["finish_at"]) == pytest.approx(expected, abs=0.3)
    assert e["eta_low_s"] < e["eta_s"] < e["eta_high_s"]
    assert run["eta"]["source"] == "learned" and run["eta"]["finish_at"] == e["finish_at"]
    # the stage after it still has only its prior
    assert next(s["eta"] for s in st["stages"] if s["name"] == "after")["source"] == "prior"
    tmplab.wait_for(lambda: tmplab.runs("silent")[-1]["state"] == "completed", timeout=60)


def test_an_unmeasurable_input_without_a_fallback_has_no_estimate_and_says_why(tmplab):
    setup(tmplab)
    tmplab.write_profile("blind", """\
        stages:
          tokens:
            prior: {expected: null}
        """)
    cfg = config.load(tmplab.conf, "blind")
    lab = Lab(cfg, Registry(tmplab.logs / "registry.sqlite"))
    st = collect(lab).to_json()
    e = next(s["eta"] for s in st["stages"] if s["name"] == "tokens")
    assert e["eta_s"] is None and e["source"] == "unknown"
    assert "plain file" in e["reason"] and "tokens" in e["reason"]
    assert st["pipeline"]["unknown"] == ["tokens"]
    assert "plain file" in st["pipeline"]["unknown_reasons"]["tokens"]


@pytest.mark.parametrize("prior,needles", [
    ("{unit: samples, per_s: 2, limit: lots}", ["pipeline.yaml", "stages.a.prior.limit", "'lots'", "positive number"]),
    ("{unit: samples, per_s: 2, limit: '${nope}'}", ["unknown variable ${nope}"]),
    ("{unit: samples, per_s: 2}", ["stages.a.prior", "a prior needs a size"]),
    ("{unit: furlongs, per_s: 2, limit: 3}", ["stages.a.prior.unit", "'furlongs'"]),
    ("{unit: samples, per_s: 0, limit: 3}", ["stages.a.prior.per_s", "greater than 0"]),
    ("{unit: samples, rate: 2, limit: 3}", ["stages.a.prior.rate", "unknown key", "per_s"]),
])
def test_a_bad_prior_names_file_and_key(tmplab, prior, needles):
    tmplab.write_pipeline(f"stages:\n  a:\n    host: local\n    command: [x]\n    prior: {prior}\n")
    with pytest.raises(ConfigError) as e:
        config.load(tmplab.conf)
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


@pytest.mark.parametrize("profile", ["demo", "kimi-k2.5"])
def test_the_shipped_profiles_estimate_every_stage_before_any_ran(tmp_path, profile):
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    lab_yaml = conf / "lab.yaml"
    lab_yaml.write_text(lab_yaml.read_text().replace("logs_dir: logs", f"logs_dir: {tmp_path / 'logs'}"))
    lab = Lab(config.load(conf, profile), Registry(tmp_path / "registry.sqlite"))
    st = collect(lab, refresh=False).to_json()  # kimi's host is not reachable from here: the declared sizes
    assert st["pipeline"]["unknown"] == [] and st["pipeline"]["finish_at"]
    eta = {s["name"]: s["eta"] for s in st["stages"]}
    assert all(e["source"] == "prior" for e in eta.values())
    if profile == "kimi-k2.5":  # the seeds' figures for the seeds' sizes, each after what it waits for
        # (synth after the pilot in its own window, `after`; extract after prepare; train after extract)
        alone = {n: (eta[n]["eta_s"] - eta[before]["eta_s"]) / 3600
                 for n, before in (("synth", "pilot"), ("extract", "prepare"), ("train", "extract"))}
        assert alone == pytest.approx({"synth": 5.3, "extract": 3.8, "train": 2.6}, abs=0.05)


def test_learned_range_narrows_with_every_run():
    p = Prior(unit="samples", per_s=1.0, units=100.0, spread=3.0, size_how="test")
    widths = []
    for n in (1, 2, 4, 8):
        hist = History.from_dict({"runs": [{"stage": "s", "host": "h", "profile": "p", "duration_s": 50.0,
                                            "run_id": f"r{i}"} for i in range(n)],
                                  "units": [{"run_id": f"r{i}", "units": 100.0} for i in range(n)]})
        span = learned_span(hist, "s", "h", "p", p)
        assert span.eta_s == pytest.approx(50.0) and span.source == "learned"
        widths.append(span.high_s / span.low_s)
    declared = prior_span(p)
    assert declared.high_s / declared.low_s == pytest.approx(9.0)
    assert 9.0 > widths[0] > widths[1] > widths[2] > widths[3] > 1.0


def test_a_running_stage_with_no_bar_uses_its_prior_from_its_start():
    now = parse_iso("2026-11-29T21:00:00Z")
    st = {"schema": 1, "profile": "p", "hosts": [],
          "runs": [{"id": "s-1", "stage": "s", "host": "h", "state": "running", "started_at": "2026-11-29T20:59:00Z",
                    "log_state": {"phase": None, "phases": [], "progress": None}}],
          "stages": [{"name": "s", "host": "h", "depends_on": [], "latest_run": "s-1", "state": "running"}]}
    prior = {"unit": "samples", "per_s": 1.0, "units": 100.0, "fixed_s": 20.0, "size_how": "x"}
    out = annotate(st, None, now, {"s": prior})
    assert out["stages"][0]["eta"]["eta_s"] == pytest.approx(120.0 - 60.0)  # 120 s from its start, 60 s ago
    assert out["runs"][0]["eta"]["source"] == "prior"
    assert annotate(st, None, now)["runs"][0]["eta"]["eta_s"] is None  # without the prior: unknown, as before


def test_sizes_are_measured_cheaply_on_the_host(tmp_path):
    d = tmp_path / "prepared"
    d.mkdir()
    (d / "data.bin").write_bytes(b"x" * 10)
    (d / "manifest.json").write_text(json.dumps({"schema": 1, "counts": {"samples": 64, "rows": 60},
                                                 "total_bytes": 10}))
    write_rows(tmp_path / "p.jsonl", 3)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a").write_bytes(b"y" * 7)
    m = lambda *a: sizes.measure(*a, cwd=str(tmp_path))
    assert m("prepared", "samples")["size"] == 64
    assert m("prepared", "samples", "rows")["size"] == 60
    assert m("prepared", "bytes")["size"] == 10
    assert "no counts.tokens" in m("prepared", "tokens")["reason"]
    assert m("p.jsonl", "samples") == {"size": 3.0, "how": "lines of p.jsonl"}
    assert m("p.jsonl", "bytes")["size"] == (tmp_path / "p.jsonl").stat().st_size
    assert m("raw", "bytes")["size"] == 7 and "without a manifest" in m("raw", "samples")["reason"]
    assert m("nope", "samples") == {"size": None, "reason": "nope is not there yet"}
    # a big file's lines: the first LINE_SAMPLE_BYTES counted, the rest extrapolated
    sizes.LINE_SAMPLE_BYTES, old = 1 << 20, sizes.LINE_SAMPLE_BYTES
    try:
        big = tmp_path / "big.jsonl"
        big.write_bytes((b"z" * 99 + b"\n") * 50_000)  # 5 MB, 50,000 lines
        got = sizes.measure("big.jsonl", "lines", cwd=str(tmp_path))
        assert got["size"] == pytest.approx(50_000, rel=0.01) and "estimated" in got["how"]
    finally:
        sizes.LINE_SAMPLE_BYTES = old


def test_the_page_shows_a_fresh_pipelines_finish_and_what_each_estimate_rests_on(tmplab, monkeypatch):
    from status_web import create_app
    monkeypatch.delenv("EAGLELAB_TOKEN", raising=False)
    setup(tmplab)
    lab = Lab(config.load(tmplab.conf), Registry(tmplab.logs / "registry.sqlite"))
    app = create_app(lab, start=False)
    app.extensions["eaglelab"].snapshot.refresh_now()
    page = app.test_client().get("/").get_data(as_text=True)
    assert "Started now, the pipeline would be done at about" in page
    assert 'id="eta-sources">(estimates: prior 4)' in page
    # each predicted bar's tooltip says what it rests on
    assert "silent: predicted" in page and "(prior: 5 samples at 10 samples/s (lines of" in page
    assert "after: predicted" in page and "prior.expected 7, since" in page


def test_sizes_are_measured_again_only_when_due(tmplab, monkeypatch):
    """The page refreshes every 2 s; a size is measured again after MEASURE_EVERY_S, or when a run
    ended since the last measurement, not at every refresh."""
    from eaglelab.control import priors
    setup(tmplab, rows=5)
    lab = Lab(config.load(tmplab.conf), Registry(tmplab.logs / "registry.sqlite"))
    silent = lambda: next(s["eta"] for s in collect(lab).to_json()["stages"] if s["name"] == "silent")
    assert "5 samples" in silent()["basis"]
    write_rows(tmplab.root / "rows.jsonl", 9)
    assert "5 samples" in silent()["basis"]  # the last measurement, still fresh
    monkeypatch.setattr(priors, "MEASURE_EVERY_S", 0.0)
    assert "9 samples" in silent()["basis"]


def test_a_services_earlier_lifetime_is_not_its_time_to_ready():
    """A service's finished run lasted as long as stages needed it (the demo's serve_extract: 197 s,
    ready after ~60); for the pipeline it is done once ready: its prior stands."""
    now = parse_iso("2026-11-29T21:00:00Z")
    hist = {"runs": [{"stage": "svc", "host": "h", "profile": "p", "duration_s": 5000.0, "run_id": "svc-0"}]}
    st = {"schema": 1, "profile": "p", "hosts": [], "runs": [],
          "stages": [{"name": "svc", "host": "h", "kind": "service", "depends_on": [], "latest_run": None,
                      "state": "pending"},
                     {"name": "job", "host": "h", "kind": "job", "depends_on": [], "needs": ["svc"],
                      "latest_run": None, "state": "pending"}]}
    prior = {"unit": "bytes", "per_s": 1e6, "units": 30e6, "fixed_s": 10.0, "size_how": "x"}
    out = annotate(st, hist, now, {"svc": prior})
    svc = out["stages"][0]["eta"]
    assert (svc["eta_s"], svc["source"]) == (40.0, "prior")
    assert annotate(st, hist, now)["stages"][0]["eta"]["eta_s"] == 5000.0  # no prior: history, as before
