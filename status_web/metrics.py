"""GET /metrics: the snapshot in Prometheus text format (prometheus-client).

A custom collector reads the current snapshot at scrape time, so the figures are exactly what the
page shows. Labels are host and stage (and state, from a fixed list): the cardinality is bounded by
the pipeline's size, never by the number of runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client.core import CollectorRegistry, GaugeMetricFamily
from prometheus_client.exposition import generate_latest

from eaglelab.model import RunState, StageState

from .model import read, run_finish, ts

STAGE_STATES = (StageState.PENDING, StageState.RUNNING, StageState.COMPLETED, StageState.FAILED, StageState.KILLED,
                StageState.STALLED, StageState.UNREACHABLE)


class StatusCollector:
    def __init__(self, get_status: Callable[[], dict | None], clock: Callable[[], float] = time.time):
        self.get_status, self.clock = get_status, clock

    def collect(self):
        status = self.get_status() or {}
        now = self.clock()
        progress = GaugeMetricFamily("eaglelab_stage_progress_ratio",
                                     "Share of the current progress bar done (n/total) of each stage's latest run",
                                     labels=["host", "stage"])
        eta = GaugeMetricFamily("eaglelab_stage_eta_seconds", "Seconds until the stage's running run finishes",
                                labels=["host", "stage"])
        state = GaugeMetricFamily("eaglelab_stage_state", "1 for the stage's current state, 0 for the others",
                                  labels=["host", "stage", "state"])
        success = GaugeMetricFamily("eaglelab_run_last_success_timestamp_seconds",
                                    "When the stage's last completed run ended (Unix time)", labels=["host", "stage"])
        up = GaugeMetricFamily("eaglelab_host_up", "1 if the host answered the last poll", labels=["host"])
        pipeline = GaugeMetricFamily("eaglelab_pipeline_eta_seconds", "Seconds until the whole pipeline finishes")
        st = read(status, now)
        last_ok: dict[str, float] = {}  # stage -> end of its last completed run (one pass, not per stage)
        for r in st.runs:
            end = ts(r.run.ended_at) if r.run.state == RunState.COMPLETED else None
            if end is not None and end > last_ok.get(r.run.stage, float("-inf")):
                last_ok[r.run.stage] = end
        for s in st.stages:
            host, name = s.host, s.name
            cur = str(s.state)
            for name_of_state in STAGE_STATES:
                state.add_metric([host, name, name_of_state], 1.0 if cur == name_of_state else 0.0)
            run = st.run(s.latest_run)
            prog = run.progress if run else None
            if s.state == StageState.COMPLETED:
                progress.add_metric([host, name], 1.0)
            elif prog is not None and prog.total:
                progress.add_metric([host, name], max(0.0, min(1.0, prog.n / prog.total)))
            if s.state in (StageState.RUNNING, StageState.STALLED):
                fin = run_finish(run, s)
                if fin:
                    eta.add_metric([host, name], max(0.0, fin.at - now))
            if name in last_ok:
                success.add_metric([host, name], last_ok[name])
        for h in st.hosts:
            if h.reachable is not None:  # never asked: unknown, not down
                up.add_metric([h.name], 1.0 if h.reachable else 0.0)
        fin = st.pipeline.finish if st.pipeline else None
        if fin:
            pipeline.add_metric([], max(0.0, fin.at - now))
        yield from (progress, eta, state, success, up, pipeline)


def render_status(status: dict, now: float) -> bytes:
    """The exposition text for one status object (cached per snapshot by the app)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StatusCollector(lambda: status, lambda: now))
    return generate_latest(reg)
