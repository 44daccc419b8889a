"""vLLM's own spec-decode counters read while synth runs (eaglelab.stages.synth.ServedAcceptance), on
/metrics texts recorded from a real vLLM 0.32 CPU server (the demo's tiny target with its trained
EAGLE-3 drafter, `serve --mode eval`): before any request, and after 4 greedy chat completions of 32
tokens each (ignore_eos). The figures since synth started print as the serving smoke's `served/...`
line, which the log parser turns into the synth run's curves; a server without a drafter prints nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglelab.host.parse.state import LogState
from eaglelab.stages import spec_metrics, synth

FIX = Path(__file__).parent / "fixtures" / "metrics"
BEFORE, AFTER = (FIX / "vllm_eagle3_before.prom").read_text(), (FIX / "vllm_eagle3_after.prom").read_text()


class Reply:
    def __init__(self, text: str | None):
        self.text = text

    def raise_for_status(self):
        if self.text is None:
            raise OSError("connection refused")


def server(*texts):
    """A /metrics that answers these texts in turn (None: the server does not answer), then the last."""
    seq = list(texts)

    def get(url):
        assert url == "http://127.0.0.1:8931/metrics"
        return Reply(seq.pop(0) if len(seq) > 1 else seq[0])
    return get


def test_the_recorded_counters_give_vllms_figures():
    # the recorded server: 101 drafts of 3 tokens, 23 accepted (9, 8, 6 at positions 0, 1, 2); 4 x 32
    # tokens = 101 drafts + 23 accepted + 4 first tokens from the prefill
    before, after = spec_metrics.parse_spec_metrics(BEFORE), spec_metrics.parse_spec_metrics(AFTER)
    assert before["drafts"] == 0 and after["drafts"] == 101 and after["draft_tokens"] == 303
    assert after["per_pos"] == {0: 9.0, 1: 8.0, 2: 6.0}
    s = spec_metrics.spec_stats(before, after)
    assert (s["drafts"], s["accepted_tokens"]) == (101, 23)
    assert s["acceptance_rate"] == pytest.approx(23 / 303) and s["mean_acceptance_length"] == pytest.approx(1 + 23 / 101)
    assert s["per_position_acceptance"] == pytest.approx([9 / 101, 8 / 101, 6 / 101])


def test_synth_prints_the_served_acceptance_since_it_started():
    lines = []
    watch = synth.ServedAcceptance("http://127.0.0.1:8931", 0, lines.append, get=server(BEFORE, None, AFTER, AFTER))
    watch.start()                       # the base: the counters before synth's first request
    assert watch.poll() is None         # the server did not answer: skipped, synth goes on
    stats = watch.poll()
    assert stats["drafts"] == 101 and stats["acceptance_rate"] == pytest.approx(23 / 303)
    assert watch.stop() == stats and len(lines) == 1   # nothing new drafted: no second line
    st = LogState()
    st.feed_line(lines[0], 1)
    m = st.snapshot()["metrics"]
    assert m["served/acceptance_rate"][-1][1] == pytest.approx(0.0759, abs=1e-4)
    assert m["served/mean_acceptance_length"][-1][1] == pytest.approx(1.2277, abs=1e-4)
    assert m["served/drafts"][-1][1] == 101 and m["served/pos_2"][-1][1] == pytest.approx(0.0594, abs=1e-4)


def test_a_server_without_a_drafter_prints_nothing():
    # the same exposition without vLLM's spec_decode families (what a server without a drafter shows)
    plain = "\n".join(ln for ln in AFTER.splitlines() if "spec_decode" not in ln) + "\n"
    lines = []
    watch = synth.ServedAcceptance("http://127.0.0.1:8931", 0, lines.append, get=server(plain, plain))
    watch.start()
    assert watch.stop() is None and lines == []
