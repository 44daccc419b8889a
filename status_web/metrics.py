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

from .model import finish_times, mapping, num, run_finish, ts

STAGE_STATES = ("pending", "running", "completed", "failed", "killed", "stalled", "unreachable")


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
        runs = [r for r in status.get("runs") or [] if isinstance(r, dict)]
        by_id = {r.get("id"): r for r in runs}
        last_ok: dict[str, float] = {}  # stage -> end of its last completed run (one pass, not per stage)
        for r in runs:
            end = ts(r.get("ended_at")) if r.get("state") == "completed" else None
            if end is not None and end > last_ok.get(str(r.get("stage")), float("-inf")):
                last_ok[str(r.get("stage"))] = end
        for s in status.get("stages") or []:
            if not isinstance(s, dict):
                continue
            host, name = str(s.get("host")), str(s.get("name"))
            cur = str(s.get("state"))
            for st in STAGE_STATES:
                state.add_metric([host, name, st], 1.0 if cur == st else 0.0)
            run = by_id.get(s.get("latest_run")) or {}
            prog = mapping(mapping(run.get("log_state")).get("progress"))
            n, total = num(prog.get("n")), num(prog.get("total"))
            if cur == "completed":
                progress.add_metric([host, name], 1.0)
            elif n is not None and total:
                progress.add_metric([host, name], max(0.0, min(1.0, n / total)))
            if cur in ("running", "stalled"):
                fin, _ = run_finish(run, s, now)
                if fin:
                    eta.add_metric([host, name], max(0.0, fin["at"] - now))
            if name in last_ok:
                success.add_metric([host, name], last_ok[name])
        for h in status.get("hosts") or []:
            if isinstance(h, dict) and h.get("reachable") is not None:  # never asked: unknown, not down
                up.add_metric([str(h.get("name"))], 1.0 if h.get("reachable") else 0.0)
        fin = finish_times(status.get("pipeline"), now)
        if fin:
            pipeline.add_metric([], max(0.0, fin["at"] - now))
        yield from (progress, eta, state, success, up, pipeline)


def render_status(status: dict, now: float) -> bytes:
    """The exposition text for one status object (cached per snapshot by the app)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StatusCollector(lambda: status, lambda: now))
    return generate_latest(reg)
