"""The output probe's judgement by hand (eaglelab.stages.output_probe): which tokens no correct sampler
draws, the verdict, the words, and a vLLM-shaped answer parsed. The probe against real vLLM servers (a
plain one: clean; the CPU build's EAGLE-3 path: its fault) is in test_pipeline_e2e and test_engine_check,
each held to the target's own judgement in transformers."""

from __future__ import annotations

import math

import pytest

from eaglelab.stages import eval as eval_stage
from eaglelab.stages import output_probe as op

LN = math.log


def test_near_greedy_a_token_a_fifth_of_a_nat_below_the_top_is_impossible():
    rivals = {1: -0.5, 2: -0.8, 3: -3.0}
    assert not op.impossible(-0.5, rivals, 0.01, 1.0)              # the top token
    assert not op.impossible(-0.6, {1: -0.5, 9: -0.6}, 0.01, 1.0)  # 0.1 nats: odds e^-10, not ruled out
    assert op.impossible(-0.8, rivals, 0.01, 1.0)                  # 0.3 nats at T=0.01: odds e^-30
    assert not op.impossible(-0.8, rivals, 1.0, 1.0)                # the same token at T=1 is an ordinary draw
    assert op.impossible(-25.0, rivals, 1.0, 1.0)                  # 24.5 nats below the top at T=1: e^-24.5


def test_top_p_rules_out_a_token_whose_betters_already_hold_top_p():
    # every token listed (no unlisted mass), T=1: mass above the 3rd token is 0.6 + 0.3 = 0.9
    rivals = {1: LN(0.6), 2: LN(0.3), 3: LN(0.05), 4: LN(0.05)}
    assert op.impossible(LN(0.05), rivals, 1.0, 0.8)       # 0.9 >= 0.8: vLLM's top-p dropped it
    assert not op.impossible(LN(0.3), rivals, 1.0, 0.8)    # above it only 0.6 < 0.8: kept
    assert not op.impossible(LN(0.05), rivals, 1.0, 0.95)  # 0.9 < 0.95: kept
    assert not op.impossible(LN(0.05), rivals, 1.0, 0.9)   # 0.9 is not past 0.9 + the slack: rounding's benefit


def test_the_unlisted_mass_is_bounded_at_a_lower_temperature():
    # listed 0.5, 0.2; unlisted raw mass 0.3, each unlisted token <= 0.2. At T=0.5 the weights are p^2:
    # 0.25, 0.04; the unlisted at most 0.3 * 0.2 = 0.06, so above a token outside the list >= 0.29 / 0.35
    rivals = {1: LN(0.5), 2: LN(0.2)}
    assert 0.29 / 0.35 == pytest.approx(0.8286, abs=1e-4)
    assert op.impossible(LN(0.01), rivals, 0.5, 0.8)       # 0.829 >= 0.801
    assert not op.impossible(LN(0.01), rivals, 0.5, 0.9)   # could be below 0.9: not ruled out
    # above T=1 the unlisted mass is not bounded without the vocabulary: only the odds rule speaks
    assert not op.impossible(LN(0.01), rivals, 1.5, 0.5)


def test_judge_counts_and_the_verdict_needs_enough_tokens():
    good = [(1, -0.1, {1: -0.1, 2: -3.0})] * 60
    bad = [(2, -30.0, {1: -0.1, 2: -30.0})] * 6
    j = op.judge(good + bad, 0.01, 1.0)
    assert (j["tokens"], j["impossible"]) == (66, 6) and j["share"] == pytest.approx(6 / 66)
    assert j["examples"][0] == {"token": 2, "logprob": -30.0, "top_logprob": -0.1}
    v = op.verdict([{"name": "near_greedy", **j}])
    assert v["fault"] and v["worst"]["name"] == "near_greedy"
    assert not op.verdict([{"name": "near_greedy", **op.judge(good, 0.01, 1.0)}])["fault"]
    few = op.judge(bad * 3, 0.01, 1.0)  # 18 tokens, all impossible: too few to judge
    assert not op.verdict([{"name": "near_greedy", **few}])["fault"]


def test_settings_near_greedy_always_and_the_serving_sampling_when_sampled():
    assert op.settings_for(0.0, 1.0) == [("near_greedy", 0.01, 1.0)]
    assert op.settings_for(1.0, 0.95) == [("near_greedy", 0.01, 1.0), ("serving", 1.0, 0.95)]


class _Answer:
    def __init__(self, doc):
        self.doc = doc

    def raise_for_status(self):
        pass

    def json(self):
        return self.doc


def test_probe_reads_vllms_answer_and_names_the_fault_beside_the_baseline():
    """vLLM's completion shape (logprobs with return_tokens_as_token_ids, return_token_ids), as served by
    vllm 0.32.0: a drafter server that emits a -37-nat token every other step."""
    sent = []

    def post(url, body):
        sent.append(body)
        toks, lps, tops = [], [], []
        for i in range(body["max_tokens"]):
            wrong = i % 2 == 1
            toks.append("token_id:7" if wrong else "token_id:3")
            lps.append(-37.2 if wrong else -1.1)
            tops.append({"token_id:3": -1.1, "token_id:5": -2.4, **({"token_id:7": -37.2} if wrong else {})})
        return _Answer({"choices": [{"prompt_token_ids": [0, 11, 12], "logprobs": {
            "tokens": toks, "token_logprobs": lps, "top_logprobs": tops}}]})

    doc = op.probe("http://127.0.0.1:1", "m", ["a", "b"], 40, 1.0, 0.95, seed=0, post=post)
    assert sent[0]["logprobs"] == 20 and sent[0]["return_tokens_as_token_ids"] and sent[0]["seed"] == 0
    assert [s["name"] for s in doc["settings"]] == ["near_greedy", "serving"]
    ng = doc["settings"][0]
    assert (ng["tokens"], ng["impossible"]) == (80, 40) and ng["requests"][0]["prompt_token_ids"] == [0, 11, 12]
    assert ng["requests"][0]["token_ids"][:2] == [3, 7]
    assert doc["verdict"]["fault"]
    text = op.words(doc, "vLLM with the drafter")
    assert text.startswith("vLLM with the drafter emits tokens its own target ranks impossible: impossible tokens "
                           "40/80 (50%) at T=0.01; 40/80 (50%) at T=1, top-p 0.95")
    clean = {"settings": [{**s, "impossible": 0, "share": 0.0} for s in doc["settings"]], "verdict": {"fault": False}}
    fault = eval_stage.probe_fault(doc, clean)
    assert fault.endswith("; without the drafter none: 0/80 (0%) at T=0.01; 0/80 (0%) at T=1, top-p 0.95")
    assert eval_stage.probe_fault(clean, None) is None
