"""The forecast calibrated to how vLLM drafts (eaglelab.stages.acceptance): the restart chain over the
per-start correctness, speculative sampling's expected acceptance, and the verifier's sampling
distribution, against small cases computed by hand (and the chain's expectation against an
exhaustive enumeration of the walks it averages)."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from eaglelab.host.parse.state import LogState
from eaglelab.stages import acceptance


def steps(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_greedy_chain_restarts_after_the_verifiers_token():
    # k=2; every start right at both steps except where 0. vLLM: t=0 keeps 2, verifier's token at 2,
    # next draft at 3 keeps 2, next at 6 = past the row: 2 drafts, 4 accepted.
    good = steps([1, 1, 0, 1, 1, 1], [1, 0, 1, 1, 0, 1])
    valid = torch.ones(6, dtype=torch.bool)
    assert acceptance.chain(good, valid) == ([2.0, 2.0], 2.0)
    # every start: step 0 right at 5 of 6, steps 0 and 1 at 3 (t=0,3,5): the average is lower
    assert acceptance.prefix_sums(good, valid) == ([5.0, 3.0], 6)
    s = acceptance.summarize([2.0, 2.0], 2.0, 2)
    assert (s["acceptance_rate"], s["mean_acceptance_length"]) == (1.0, 3.0)


def test_greedy_chain_after_rejections_and_past_an_unsupervised_start():
    # t=0 misses at step 0 (0 kept: the verifier's token at 0, next draft at 1); t=1 keeps 2 (next at
    # 4); t=4 misses at step 0 (next 5); t=5 is no valid start (moves on to 6); t=6 keeps 1 (step 1
    # missed). Drafts at 0, 1, 4, 6: 4 drafts; kept at position 0: t=1, 6; at position 1: t=1.
    st = steps([0, 1, 1, 1, 0, 1, 1], [1, 1, 0, 1, 1, 1, 0])
    valid = torch.tensor([1, 1, 1, 1, 1, 0, 1], dtype=torch.bool)
    sums, drafts = acceptance.chain(st, valid)
    assert (sums, drafts) == ([2.0, 1.0], 4.0)
    s = acceptance.summarize(sums, drafts, 2)
    assert s["per_position"] == [0.5, 0.25]
    assert math.isclose(s["acceptance_rate"], 3 / 8) and math.isclose(s["mean_acceptance_length"], 1.75)
    # every valid start (0..4 and 6): step 0 right at 1, 2, 3, 6; both at 1 and 3
    assert acceptance.prefix_sums(st, valid) == ([4.0, 2.0], 6)


def test_sampled_chain_by_hand():
    # k=2, two starts. From t=0: step 0 kept w.p. 0.5, then step 1 w.p. 0.4 -> E[kept at pos 0] 0.5, at
    # pos 1 0.2; rejected at step 0 (0.5) -> the next draft at t=1; rejected at step 1 (0.3) -> t=2
    # (past the row); both kept (0.2) -> t=3. From t=1 (reached w.p. 0.5): step 0 always kept, step 1
    # never. Drafts 1 + 0.5; kept at pos 0: 0.5 + 0.5 * 1, at pos 1: 0.2 + 0.5 * 0.
    sums, drafts = acceptance.chain(steps([0.5, 1.0], [0.4, 0.0]), torch.ones(2, dtype=torch.bool))
    assert drafts == pytest.approx(1.5) and sums == pytest.approx([1.0, 0.2])
    s = acceptance.summarize(sums, drafts, 2)
    assert s["acceptance_rate"] == pytest.approx(1.2 / 3) and s["mean_acceptance_length"] == pytest.approx(1.8)
    # every start: E[kept at pos 0] = 0.5 + 1.0, at pos 1 = 0.2 + 0
    sums, starts = acceptance.prefix_sums(steps([0.5, 1.0], [0.4, 0.0]), torch.ones(2, dtype=torch.bool))
    assert sums == pytest.approx([1.5, 0.2]) and starts == 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampled_chain_is_the_expectation_of_the_greedy_walks(seed):
    # Each (start, step) kept independently with its probability: enumerate every outcome, walk each one
    # greedily, weight by its probability. The expected chain must give the same sums and drafts.
    rnd = random.Random(seed)
    k, n = 2, 5
    probs = [[rnd.choice([0.0, 1.0, rnd.random()]) for _ in range(n)] for _ in range(k)]
    valid = [True, True, rnd.random() < 0.5, True, True]
    want_sums, want_drafts = [0.0] * k, 0.0
    for outcome in itertools.product([0, 1], repeat=k * n):
        kept = [list(outcome[s * n:(s + 1) * n]) for s in range(k)]
        weight = math.prod(probs[s][t] if kept[s][t] else 1 - probs[s][t] for s in range(k) for t in range(n))
        if weight == 0:
            continue
        sums, drafts = acceptance.chain(steps(*kept), torch.tensor(valid))
        want_sums = [a + weight * b for a, b in zip(want_sums, sums)]
        want_drafts += weight * drafts
    sums, drafts = acceptance.chain(steps(*probs), torch.tensor(valid))
    assert drafts == pytest.approx(want_drafts) and sums == pytest.approx(want_sums)


def test_the_verifiers_sampling_distribution_temperature_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    assert acceptance.target_probs(logits, 1.0)[0].tolist() == pytest.approx([0.5, 0.3, 0.2])
    # vLLM's top-p: ascending cumulative 0.2, 0.5, 1.0; drop those <= 1 - 0.7 = 0.3 (the 0.2 token)
    assert acceptance.target_probs(logits, 1.0, 0.7)[0].tolist() == pytest.approx([0.625, 0.375, 0.0])
    assert acceptance.target_probs(logits, 1.0, 0.05)[0].tolist() == pytest.approx([1.0, 0.0, 0.0])
    r = [math.sqrt(x) for x in (0.5, 0.3, 0.2)]  # T = 2: p^(1/2), normalised
    assert acceptance.target_probs(logits, 2.0)[0].tolist() == pytest.approx([x / sum(r) for x in r])


def test_step_probs_are_the_verifiers_probability_of_each_drafted_token():
    # Identity norm and lm_head: position u's logits are log P[u]. Step s from start t is kept with
    # probability P[t+s][draft_s(t)] (vLLM's proposal is a point mass: sum min(p, q) = p(draft)).
    P = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]])
    drafts = [torch.tensor([0, 1, 2]), torch.tensor([2, 0, 0])]
    got = acceptance.step_probs(torch.log(P), torch.nn.Identity(), torch.eye(3), drafts, 1.0, 1.0, chunk=2)
    assert got.flatten().tolist() == pytest.approx([0.5, 0.6, 0.3, 0.2])  # [P0[0], P1[1]], [P1[2], P2[0]]
    # and a draft that is the verifier's argmax everywhere scores its probability, not 1
    top = acceptance.step_probs(torch.log(P), torch.nn.Identity(), torch.eye(3), [P.argmax(-1)], 1.0, 1.0)
    assert top.flatten().tolist() == pytest.approx([0.5, 0.6, 0.6])


def test_the_log_line_carries_both_forecasts_to_the_train_page():
    doc = {"acceptance_rate": 0.3, "mean_acceptance_length": 1.6, "per_position": [0.4, 0.2],
           "chain": acceptance.summarize([2.0, 1.0], 4.0, 2),
           "sampled": {"temperature": 1.0, "top_p": 0.95, **acceptance.summarize([1.0, 0.2], 1.5, 2)},
           "epoch": 1, "global_step": 8}
    st = LogState()
    st.feed_line(acceptance.log_line(doc), 1)
    m = st.snapshot()["metrics"]
    assert m["acceptance/chain_rate"][-1][1] == pytest.approx(0.375, abs=1e-4)
    assert m["acceptance/chain_mean_length"][-1][1] == pytest.approx(1.75, abs=1e-4)
    assert m["acceptance/sampled_rate"][-1][1] == pytest.approx(0.4, abs=1e-4)
    assert m["acceptance/sampled_mean_length"][-1][1] == pytest.approx(1.8, abs=1e-4)
    assert "T=1, top-p 0.95: 40.00% / 1.80" in acceptance.describe(doc)


def test_a_sampled_forecast_on_greedy_rows_says_it_is_off_policy(tmp_path, monkeypatch):
    """The rows' sampling is read from the synth run prepare read; greedy rows under a sampled forecast
    are named off-policy in the forecast and its words (the demo: 16.0% there, 7.2% on sampled rows)."""
    from eaglelab import manifest

    monkeypatch.chdir(tmp_path)  # prepare names its inputs relative to the lab, as the train stage runs there
    (tmp_path / "synth").mkdir()
    (tmp_path / "synth" / "responses.jsonl").write_text("{}\n")
    manifest.write(tmp_path / "synth", "synth", [tmp_path / "synth" / "responses.jsonl"],
                   params={"sampling": {"temperature": 0.0, "top_p": 1.0}})
    (tmp_path / "prepared").mkdir()
    manifest.write(tmp_path / "prepared", "prepare", [], params={"inputs": {"synth/responses.jsonl": "x"}})
    rows = acceptance.rows_sampling(tmp_path / "prepared")
    assert rows == {"temperature": 0.0, "top_p": 1.0}
    doc = {"sampled": {"temperature": 1.0, "top_p": 0.95, "acceptance_rate": 0.16, "mean_acceptance_length": 1.48}}
    acceptance.mark_policy(doc, rows)
    assert doc["sampled"]["on_policy"] is False
    assert "off-policy: the rows were drawn at T=0, top-p 1" in acceptance.describe(doc)
    on = acceptance.mark_policy({"sampled": {**doc["sampled"], "on_policy": None}},
                                {"temperature": 1.0, "top_p": 0.95})
    assert on["sampled"]["on_policy"] is True and "off-policy" not in acceptance.describe(on)
    assert acceptance.rows_sampling(tmp_path / "nowhere") is None


def test_the_off_policy_mark_travels_from_the_log_line_to_the_page():
    """acceptance/sampled_on_policy=0 on the train's metric line -> the forecast's `sampled` says
    on_policy false -> the page's words name it (beside the figure, and beside a served one)."""
    from eaglelab.control.foresight import forecast
    from eaglelab.pipeline_status import Acceptance
    from status_web.model import sampled_words

    doc = {"acceptance_rate": 0.3, "mean_acceptance_length": 1.6, "per_position": [0.4, 0.2],
           "sampled": {"temperature": 1.0, "top_p": 0.95, "on_policy": False,
                       **acceptance.summarize([1.0, 0.2], 1.5, 2)}, "epoch": 0, "global_step": 8}
    st = LogState()
    st.feed_line(acceptance.log_line(doc), 1)
    run = {"id": "train-1", "stage": "train", "log_state": {"metrics": st.snapshot()["metrics"]}}
    sd = forecast.offline_evidence(run)["sampled"]
    assert sd["on_policy"] is False and sd["acceptance_rate"] == pytest.approx(0.4, abs=1e-4)
    offline = Acceptance.from_json(sd)
    assert offline.on_policy is False
    assert sampled_words(offline, None) == "40.0%, mean length 1.80, on rows not drawn as the eval samples"
    served = Acceptance.from_json({"acceptance_rate": 0.02, "mean_acceptance_length": 1.05})
    assert sampled_words(served, offline).endswith("(offline forecast 40.0%, on rows not drawn as the eval samples)")
    # rows drawn as the eval samples, or an older line without the mark: nothing said
    doc["sampled"]["on_policy"] = True
    st = LogState()
    st.feed_line(acceptance.log_line(doc), 1)
    again = forecast.offline_evidence({"log_state": {"metrics": st.snapshot()["metrics"]}})["sampled"]
    assert again["on_policy"] is True and "not drawn" not in sampled_words(Acceptance.from_json(again), None)


def test_an_engine_fault_travels_from_the_eval_manifest_to_the_page_and_the_forecast():
    """The eval marks its sampled cell `engine_fault` when the output probe caught the drafter's server sampling
    wrongly -> the forecast's served `sampled` keeps it -> the typed block and the page say the figure is the
    engine's; a cell without the mark says nothing of it."""
    from eaglelab.control.foresight import forecast
    from eaglelab.pipeline_status import Forecast
    from status_web.model import BROKEN_SAMPLING, sampled_words

    fault = "vLLM with the drafter emits tokens its own target ranks impossible: impossible tokens 93/128 (73%)"
    extra = {"acceptance_rate": 0.19, "sampled": {"acceptance_rate": 0.014, "mean_acceptance_length": 1.04,
                                                  "engine_fault": fault}}
    served = forecast.served_sampled(extra)
    assert served == {"acceptance_rate": 0.014, "mean_acceptance_length": 1.04, "engine_fault": fault}
    fc = Forecast.from_json({"acceptance_rate": 0.19, "source": "eval", "sampled": served,
                             "offline": {"acceptance_rate": 0.187, "sampled": {"acceptance_rate": 0.16}}})
    assert fc.sampled.engine_fault == fault and fc.source == "eval" and fc.offline.sampled.acceptance_rate == 0.16
    assert sampled_words(fc.sampled, fc.offline.sampled) == (
        f"1.4%, mean length 1.04{BROKEN_SAMPLING} (offline forecast 16.0%)")
    del extra["sampled"]["engine_fault"]
    clean = Forecast.from_json({"acceptance_rate": 0.19, "sampled": forecast.served_sampled(extra)})
    assert clean.sampled.engine_fault is None and "broken" not in sampled_words(clean.sampled, None)
