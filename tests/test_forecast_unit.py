"""The forecast (eaglelab.control.foresight.forecast) from a run's log metrics and the eval's manifest, on a stub lab:
the greedy chain leads an offline forecast and the sampled one stands beside it; the eval's manifest
is read through the executor of whichever host ran the eval (item 4 of issue 30), and each forecast
meets its served figure in the history and in `lab summary`'s comparison."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from eaglelab.control.commands.summary import _versus
from eaglelab.control.foresight import forecast

T0 = "2026-12-04T08:00:00+00:00"


class RemoteExecutor:
    """The eval host's side: manifests read there (an ssh round trip in the real executor)."""

    def __init__(self, docs: dict):
        self.docs, self.calls = docs, []

    def repo_dir(self) -> str:
        return "/remote/repo"

    def manifests(self, paths, cwd):
        self.calls.append((list(paths), cwd))
        return {p: self.docs.get(p) for p in paths}


def stub_lab(tmp_path, docs: dict, reach: str = "ssh"):
    stages = {"train": SimpleNamespace(host="local"), "eval": SimpleNamespace(host="gpu2")}
    ex = RemoteExecutor(docs)
    cfg = SimpleNamespace(stages=stages, stage=lambda n: stages[n], logs_dir=tmp_path,
                          host=lambda h: SimpleNamespace(reach="local" if h == "local" else reach))
    lab = SimpleNamespace(cfg=cfg, executor=lambda h: ex,
                          launch_spec=lambda st: {"cwd": str(tmp_path / "nowhere"), "outputs": ["data/eval"]})
    return lab, ex


def train_run(chain: bool = True, sampled: bool = True) -> dict:
    m = {"acceptance/rate": [[1.0, 0.2], [2.0, 0.30]], "acceptance/mean_length": [[1.0, 1.6], [2.0, 1.90]]}
    if chain:
        m |= {"acceptance/chain_rate": [[1.0, 0.15], [2.0, 0.25]], "acceptance/chain_mean_length": [[1.0, 1.45], [2.0, 1.75]]}
    if sampled:
        m |= {"acceptance/sampled_rate": [[1.0, 0.1], [2.0, 0.12]],
              "acceptance/sampled_mean_length": [[1.0, 1.3], [2.0, 1.36]]}
    return {"id": "train-1", "stage": "train", "state": "running", "started_at": T0, "log_state": {"metrics": m}}


EVAL_DOC = {"stage": "eval", "extra": {"acceptance_rate": 0.24, "mean_acceptance_length": 1.72, "speedup": 0.9,
                                       "verdict": "SLOWER", "decided_at": "concurrency 4, greedy",
                                       "sampled": {"acceptance_rate": 0.14, "mean_acceptance_length": 1.42,
                                                   "concurrency": 4, "temperature": 1.0, "top_p": 0.95}}}


def test_the_offline_forecast_leads_with_the_chain_and_carries_the_sampled_one(tmp_path):
    lab, _ = stub_lab(tmp_path, {})
    fc = forecast.make(lab, {"runs": [train_run()]}, 0.0)
    assert fc["source"] == "checkpoint" and fc["checkpoints"] == 2
    assert (fc["acceptance_rate"], fc["mean_acceptance_length"]) == (0.25, 1.75)  # the chain, not 0.30
    assert fc["all_starts"] == {"acceptance_rate": 0.30, "mean_acceptance_length": 1.90}
    assert fc["sampled"] == {"acceptance_rate": 0.12, "mean_acceptance_length": 1.36}
    assert fc["curve"] == [[1.0, 0.15], [2.0, 0.25]]
    assert "sampled: acceptance 12.0%, mean length 1.36" in forecast.describe(fc)
    # an estimate from before the chain: the every-start average, as before
    old = forecast.make(lab, {"runs": [train_run(chain=False, sampled=False)]}, 0.0)
    assert (old["acceptance_rate"], old["greedy"], old["sampled"]) == (0.30, None, None)


def test_the_eval_manifest_is_read_on_the_eval_host_and_each_forecast_meets_its_served_figure(tmp_path):
    lab, ex = stub_lab(tmp_path, {"data/eval": EVAL_DOC})
    ev = {"id": "eval-1", "stage": "eval", "state": "completed", "started_at": "2026-12-04T09:00:00+00:00"}
    fc = forecast.make(lab, {"runs": [train_run(), ev]}, 0.0)
    assert ex.calls == [(["data/eval"], "/remote/repo")]  # asked on its host, nothing read locally
    assert fc["source"] == "eval" and fc["acceptance_rate"] == 0.24
    assert fc["sampled"] == {"acceptance_rate": 0.14, "mean_acceptance_length": 1.42}
    assert fc["offline"]["acceptance_rate"] == 0.25 and fc["offline"]["sampled"]["acceptance_rate"] == 0.12
    vs = _versus(fc)
    assert vs["error"] == pytest.approx(0.01) and vs["sampled_error"] == pytest.approx(-0.02)
    # kept by run id: a second look does not ask the host again
    forecast.make(lab, {"runs": [train_run(), ev]}, 0.0)
    assert len(ex.calls) == 1
    # the history pairs both forecasts with both served figures
    store = forecast.remember(tmp_path / forecast.STORE, forecast.make(lab, {"runs": [train_run()]}, 0.0), 1.0)
    store = forecast.remember(tmp_path / forecast.STORE, fc, 2.0)
    [h] = forecast.comparisons(store)
    assert (h["forecast_rate"], h["eval_rate"]) == (0.25, 0.24)
    assert (h["forecast_sampled_rate"], h["eval_sampled_rate"]) == (0.12, 0.14)
    assert h["sampled_error"] == pytest.approx(-0.02)


def test_an_older_eval_manifest_gives_its_sampled_cell_at_the_decided_concurrency():
    extra = {"decided_at": "concurrency 4, greedy",
             "sweep": [{"sampling": "greedy", "concurrency": 4, "acceptance_rate": 0.3},
                       {"sampling": "sampled", "concurrency": 1, "acceptance_rate": 0.11},
                       {"sampling": "sampled", "concurrency": 4, "acceptance_rate": 0.13}]}
    assert forecast.served_sampled(extra) == {"acceptance_rate": 0.13, "mean_acceptance_length": None}
    assert forecast.served_sampled({"sweep": [{"sampling": "greedy", "acceptance_rate": 0.3}]}) is None


def test_a_host_that_does_not_answer_leaves_the_offline_forecast_standing(tmp_path):
    from eaglelab.errors import EaglelabError

    lab, ex = stub_lab(tmp_path, {})

    def away(paths, cwd):
        raise EaglelabError("gpu2: ssh: connect to host gpu2 port 22: Connection refused")
    ex.manifests = away
    ev = {"id": "eval-1", "stage": "eval", "state": "completed", "started_at": "2026-12-04T09:00:00+00:00"}
    fc = forecast.make(lab, {"runs": [train_run(), ev]}, 0.0)
    assert fc["source"] == "checkpoint" and fc["acceptance_rate"] == 0.25


SAMPLED_EVAL_DOC = {"stage": "eval", "extra": {
    "acceptance_rate": 0.14, "mean_acceptance_length": 1.42, "speedup": 0.8, "verdict": "SLOWER",
    "decided_at": "concurrency 4, sampled", "decoding": "sampled", "window": "tokens 1024-1536 of each response",
    "greedy": {"acceptance_rate": 0.24, "mean_acceptance_length": 1.72, "speedup": 1.1, "verdict": "LOW_ACCEPTANCE"},
    "sampled": {"acceptance_rate": 0.14, "mean_acceptance_length": 1.42, "concurrency": 4, "temperature": 1.0,
                "top_p": 0.95}}}


def test_a_model_served_sampled_is_forecast_and_judged_sampled_with_greedy_beside(tmp_path):
    """#28 item 5: eval_decide_sampling auto with eval_temperature > 0 (kimi-k2.5): the headline forecast is
    the sampled one, compared with the served sampled cell, in the forecast, the history, `lab summary` and
    `lab status`'s line; greedy beside each. greedy (the demo) keeps the greedy headline."""
    lab, _ = stub_lab(tmp_path, {"data/eval": SAMPLED_EVAL_DOC})
    lab.cfg.pipeline = SimpleNamespace(vars={"eval_decide_sampling": "auto", "eval_temperature": "1.0"})
    fc = forecast.make(lab, {"runs": [train_run()]}, 0.0)
    assert (fc["decoding"], fc["acceptance_rate"], fc["mean_acceptance_length"]) == ("sampled", 0.12, 1.36)
    assert fc["greedy"] == {"acceptance_rate": 0.25, "mean_acceptance_length": 1.75}  # the chain, beside
    assert fc["verdict"] == "LOW_ACCEPTANCE"  # judged on 12%, not on greedy's 25%
    line = forecast.describe(fc)
    assert "acceptance 12.0%, mean length 1.36 (sampled; from checkpoint" in line
    assert "greedy: acceptance 25.0%, mean length 1.75" in line
    ev = {"id": "eval-1", "stage": "eval", "state": "completed", "started_at": "2026-12-04T09:00:00+00:00"}
    fe = forecast.make(lab, {"runs": [train_run(), ev]}, 0.0)
    assert (fe["decoding"], fe["acceptance_rate"], fe["greedy"]["acceptance_rate"]) == ("sampled", 0.14, 0.24)
    assert fe["window"] == "tokens 1024-1536 of each response"
    vs = _versus(fe)
    assert vs["decoding"] == "sampled" and (vs["forecast_rate"], vs["measured_rate"]) == (0.12, 0.14)
    assert vs["greedy_error"] == pytest.approx(0.01) and vs["error"] == pytest.approx(-0.02)
    store = forecast.remember(tmp_path / forecast.STORE, fc, 1.0)
    store = forecast.remember(tmp_path / forecast.STORE, fe, 2.0)
    [h] = forecast.comparisons(store)
    assert h["decoding"] == "sampled" and (h["forecast_rate"], h["eval_rate"]) == (0.12, 0.14)
    assert h["error"] == pytest.approx(-0.02) and h["greedy_error"] == pytest.approx(0.01)
    assert (h["forecast_greedy_rate"], h["eval_greedy_rate"]) == (0.25, 0.24)
    # the demo's setting: decided greedy although its eval samples too
    lab.cfg.pipeline.vars["eval_decide_sampling"] = "greedy"
    g = forecast.make(lab, {"runs": [train_run()]}, 0.0)
    assert (g["decoding"], g["acceptance_rate"]) == ("greedy", 0.25)
    lab.cfg.pipeline.vars["eval_decide_sampling"] = "sometimes"
    with pytest.raises(ValueError, match="eval_decide_sampling 'sometimes'.*auto, greedy or sampled"):
        forecast.make(lab, {"runs": [train_run()]}, 0.0)


def test_a_served_sampled_figure_from_a_broken_sampling_path_is_named_beside_its_error():
    """The eval marks its sampled cell `engine_fault` (the output probe); `lab summary`'s comparison keeps the
    error figure and says whose it is."""
    fault = "vLLM with the drafter emits tokens its own target ranks impossible: impossible tokens 93/128 (73%)"
    fc = {"source": "eval", "acceptance_rate": 0.192, "mean_acceptance_length": 1.57, "decoding": "greedy",
          "sampled": {"acceptance_rate": 0.014, "mean_acceptance_length": 1.04, "engine_fault": fault},
          "offline": {"source": "checkpoint", "acceptance_rate": 0.187, "mean_acceptance_length": 1.56,
                      "sampled": {"acceptance_rate": 0.16, "mean_acceptance_length": 1.48}}}
    vs = _versus(fc)
    assert vs["sampled_error"] == pytest.approx(0.146) and vs["sampled_engine_fault"] == fault
    assert "greedy_engine_fault" not in vs
    del fc["sampled"]["engine_fault"]
    assert "sampled_engine_fault" not in _versus(fc)
