"""The pipeline's blocks of the status document, typed (docs/interfaces.md, "lab status --json"):
the drafter's forecast (`Forecast`, its `Acceptance` figures, the past `ForecastCheck`s), the side
jobs (`SideJob`, the engine check's `EngineFigures`), the eval's outcome (`Outcome`, its `SweepCell`s
and `EvalRow`s) and the page's configuration notice (`ConfigNote`).

Each is made by its own producer as JSON (control/foresight/forecast.py, control/status.py's side_jobs_view
and engine_figures, status_web/outcome.py, status_web/config_watch.py) and read here once, by
`from_json`: a field of the wrong type or a garbled entry reads as absent, never raises, so the page
formats these fields without guards of its own. `to_json` gives back the document it was read from.
Standard library only, frozen, read when a front end first asks (eaglelab.lab_status.Status).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .logstate import _iso_time, _number


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _words(v: Any) -> str | None:
    """A value shown as words: a string, or any other scalar said as it is; None for none."""
    return None if v is None or isinstance(v, (dict, list)) else str(v)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list:
    return v if isinstance(v, list) else []


def _texts(v: Any) -> tuple[str, ...]:
    return tuple(str(x) for x in _list(v))


# -- the forecast (control/foresight/forecast.py) -----------------------------------------------------------

@dataclass(frozen=True)
class Acceptance:
    """Acceptance figures: a rate and a mean acceptance length, with the same figures under the other
    decodings beside them (`sampled`, `greedy`) and, for a served checkpoint, its `epoch` and `run`."""

    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    sampled: Acceptance | None = None
    greedy: Acceptance | None = None
    epoch: str | None = None
    run: str | None = None
    json: dict = field(default_factory=dict, compare=False, repr=False)
    on_policy: bool | None = None  # a sampled forecast: were its rows drawn as the eval samples?
    engine_fault: str | None = None  # a served sampled figure: the output probe found the server sampling wrongly

    @classmethod
    def from_json(cls, data: Any) -> Acceptance | None:
        """None when there are no figures at all (absent, not an object, an empty object)."""
        if not isinstance(data, dict) or not data:
            return None
        on_policy = data.get("on_policy")
        return cls(_number(data.get("acceptance_rate")), _number(data.get("mean_acceptance_length")),
                   cls.from_json(data.get("sampled")), cls.from_json(data.get("greedy")),
                   _words(data.get("epoch")), _words(data.get("run")), data,
                   on_policy if isinstance(on_policy, bool) else None, _words(data.get("engine_fault")))

    def to_json(self) -> dict:
        return self.json


@dataclass(frozen=True)
class Forecast(Acceptance):
    """pipeline.forecast: will the drafter pay off (docs/foresight.md), from the best evidence so
    far (`source`: pilot, checkpoint, eval), with its verdict and the offline and served figures."""

    verdict: str | None = None
    speedup: float | None = None
    source: str | None = None
    checkpoints: int | None = None
    made_at: float | None = None
    decoding: str | None = None
    reasons: tuple[str, ...] = ()
    offline: Acceptance | None = None
    served_checkpoint: Acceptance | None = None

    @classmethod
    def from_json(cls, data: Any) -> Forecast | None:
        base = Acceptance.from_json(data)
        if base is None:
            return None
        return cls(base.acceptance_rate, base.mean_acceptance_length, base.sampled, base.greedy, base.epoch,
                   base.run, data, base.on_policy, base.engine_fault, verdict=_str(data.get("verdict")),
                   speedup=_number(data.get("speedup")), source=_str(data.get("source")),
                   checkpoints=_int(data.get("checkpoints")), made_at=_iso_time(data.get("made_at")),
                   decoding=_str(data.get("decoding")), reasons=_texts(data.get("reasons")),
                   offline=Acceptance.from_json(data.get("offline")),
                   served_checkpoint=Acceptance.from_json(data.get("served_checkpoint")))


@dataclass(frozen=True)
class ForecastCheck:
    """One row of pipeline.forecast_history: a training run's forecast against what the eval then
    served, in the decoding the eval decided on and in the other one."""

    train_run: str | None = None
    source: str | None = None
    decoding: str | None = None
    forecast_rate: float | None = None
    eval_rate: float | None = None
    error: float | None = None
    by_decoding: dict[str, tuple[float | None, float | None, float | None]] = field(default_factory=dict)
    json: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> ForecastCheck | None:
        if not isinstance(data, dict):
            return None
        per = {d: (_number(data.get(f"forecast_{d}_rate")), _number(data.get(f"eval_{d}_rate")),
                   _number(data.get(f"{d}_error"))) for d in ("greedy", "sampled")}
        return cls(_words(data.get("train_run")), _str(data.get("source")), _str(data.get("decoding")),
                   _number(data.get("forecast_rate")), _number(data.get("eval_rate")), _number(data.get("error")),
                   per, data)

    @property
    def other(self) -> str:
        """The decoding beside the headline one."""
        return "greedy" if self.decoding == "sampled" else "sampled"

    def to_json(self) -> dict:
        return self.json


# -- side jobs (control/status.py) ----------------------------------------------------------------

_ENGINE_FIGURES = ("served_rate", "offline_rate", "ratio", "min_ratio")


@dataclass(frozen=True)
class EngineFigures:
    """The engine check's figures (docs/foresight.md, "The engine check"): served by vLLM vs offline on
    the same synth rows, their ratio and the floor it is held to; `alarm` when the run failed on them."""

    served_rate: float
    offline_rate: float
    ratio: float
    min_ratio: float
    drafts: int
    alarm: bool = False
    run: str | None = None
    json: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> EngineFigures | None:
        """None unless every figure is there (a number)."""
        if not isinstance(data, dict):
            return None
        figs = [_number(data.get(k)) for k in _ENGINE_FIGURES]
        drafts = _number(data.get("drafts"))
        if None in figs or drafts is None:
            return None
        return cls(*figs, int(drafts), bool(data.get("alarm")), _words(data.get("run")), data)

    def to_json(self) -> dict:
        return self.json


@dataclass(frozen=True)
class SideJob:
    """One of pipeline.side_jobs: a pilot or smoke test, the stage it runs beside, its latest run and
    why that failed; `current_config` when that run was made under the config as it is now."""

    stage: str | None = None
    beside: str | None = None
    smoke_of: str | None = None
    state: str | None = None
    run: str | None = None
    ended_at: str | None = None
    reason: str | None = None
    current_config: bool = False
    engine: EngineFigures | None = None
    json: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> SideJob | None:
        if not isinstance(data, dict):
            return None
        return cls(_words(data.get("stage")), _words(data.get("beside")), _words(data.get("smoke_of")),
                   _words(data.get("state")), _words(data.get("run")), _str(data.get("ended_at")),
                   _words(data.get("reason")), bool(data.get("current_config")),
                   EngineFigures.from_json(data.get("engine")), data)

    def to_json(self) -> dict:
        return self.json


# -- the eval's outcome (status_web/outcome.py) ---------------------------------------------------

@dataclass(frozen=True)
class SweepCell:
    """One cell of the eval's sweep table: a decoding at a concurrency, speedup and its spread."""

    sampling: str | None = None
    concurrency: int | None = None
    speedup: float | None = None
    speedup_min: float | None = None
    speedup_max: float | None = None
    spec_tokens_per_s: float | None = None
    baseline_tokens_per_s: float | None = None
    acceptance_rate: float | None = None
    same: str | None = None
    verdict: str | None = None

    @classmethod
    def from_json(cls, data: Any) -> SweepCell | None:
        if not isinstance(data, dict):
            return None
        return cls(_words(data.get("sampling")), _int(data.get("concurrency")),
                   *(_number(data.get(k)) for k in ("speedup", "speedup_min", "speedup_max", "spec_tokens_per_s",
                                                    "baseline_tokens_per_s", "acceptance_rate")),
                   _words(data.get("same")), _words(data.get("verdict")))


@dataclass(frozen=True)
class EvalRow:
    """One earlier eval run of the outcome's history."""

    run_id: str | None = None
    state: str | None = None
    ended_at: str | None = None
    verdict: str | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    speedup: float | None = None

    @classmethod
    def from_json(cls, data: Any) -> EvalRow | None:
        if not isinstance(data, dict):
            return None
        return cls(_words(data.get("run_id")), _str(data.get("state")), _str(data.get("ended_at")),
                   _words(data.get("verdict")), *(_number(data.get(k)) for k in (
                       "acceptance_rate", "mean_acceptance_length", "speedup")))


@dataclass(frozen=True)
class Outcome:
    """status.outcome: how the pipeline went (the latest eval's verdict and figures, the latest
    vocab's coverage, the earlier evals), and when it finished."""

    verdict: str | None = None
    reasons: tuple[str, ...] = ()
    measured: bool = False
    eval_run: str | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    speedup: float | None = None
    per_position: tuple[float, ...] = ()
    spec_tokens_per_s: float | None = None
    baseline_tokens_per_s: float | None = None
    coverage: float | None = None
    decided_at: tuple[int | None, str | None] | None = None  # (concurrency, sampling) the verdict was decided at
    sweep: tuple[SweepCell, ...] = ()
    finished_at: float | None = None
    took_s: float | None = None
    history: tuple[EvalRow, ...] = ()
    json: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Outcome:
        """Any JSON value: what is not an object reads as an outcome with nothing measured."""
        data = _dict(data)
        nums = {k: _number(data.get(k)) for k in ("acceptance_rate", "mean_acceptance_length", "speedup",
                                                  "spec_tokens_per_s", "baseline_tokens_per_s", "coverage",
                                                  "finished_at", "took_s")}
        decided = _dict(data.get("decided_at"))
        return cls(_words(data.get("verdict")), _texts(data.get("reasons")), bool(data.get("measured")),
                   _words(data.get("eval_run")),
                   per_position=tuple(p for p in map(_number, _list(data.get("per_position"))) if p is not None),
                   decided_at=(_int(decided.get("concurrency")), _words(decided.get("sampling"))) if decided else None,
                   sweep=tuple(c for c in map(SweepCell.from_json, _list(data.get("sweep"))) if c is not None),
                   history=tuple(h for h in map(EvalRow.from_json, _list(data.get("history"))) if h is not None),
                   json=data, **nums)

    def to_json(self) -> dict:
        return self.json


# -- the configuration notice (status_web/config_watch.py) ----------------------------------------

@dataclass(frozen=True)
class ConfigEvent:
    """A reload of the lab's files, or the error that keeps the last good one: when, which files."""

    at: float | None = None
    files: tuple[str, ...] = ()
    message: str = ""

    @classmethod
    def from_json(cls, data: Any) -> ConfigEvent | None:
        if not isinstance(data, dict):
            return None
        return cls(_iso_time(data.get("at")), _texts(data.get("files")), str(data.get("message") or ""))


@dataclass(frozen=True)
class ConfigNote:
    """status.config (the page's): the folder the lab came from, its last reload, the error that stands."""

    conf_dir: str = ""
    reloaded: ConfigEvent | None = None
    error: ConfigEvent | None = None
    json: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> ConfigNote | None:
        """None when the status carries no notice (`lab status`, a replayed status)."""
        if not isinstance(data, dict):
            return None
        return cls(str(data.get("conf_dir") or ""), ConfigEvent.from_json(data.get("reloaded")),
                   ConfigEvent.from_json(data.get("error")), data)

    def to_json(self) -> dict:
        return self.json
