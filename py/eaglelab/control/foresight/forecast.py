"""The pipeline's forecast: will the drafter pay off? `lab status --json` -> pipeline.forecast.

Evidence, best last:
  pilot       offline acceptance of a pilot train stage's checkpoints (a stage named pilot*)
  checkpoint  offline acceptance of the current train run's latest checkpoint (its log's
              `acceptance/rate=..., acceptance/mean_length=...` lines, eaglelab.stages.acceptance)
  eval        the served measurement (the eval stage's manifest: acceptance, speedup, verdict)
An offline forecast's headline is vLLM's greedy restart chain (`acceptance/chain_rate`) where the
estimate made one (else the every-start average, kept as `all_starts`); `sampled` is the expected
acceptance of speculative sampling at the eval's temperature (`acceptance/sampled_rate`). The eval's
`sampled` is its served sampled cell, so each forecast stands beside the figure it forecasts.
The headline is the decoding the model is served with (`decoding`: eval_decide_sampling, auto = sampled
when eval_temperature > 0; the eval's own decision once it ran), the other decoding's figure beside it
(`greedy`, `sampled`): for kimi-k2.5 the sampled forecast against the served sampled cell.
An eval counts only when it ran after the current train run started (else it measured an older drafter).
Beside the ranking: `served_checkpoint`, the serving smoke's figures (smoke-serve_eval, a checkpoint
served by vLLM while training ran: its `served/acceptance_rate=...` line), from a completed smoke run
of the current train run.

Each train run's last offline forecast and the eval that followed it are kept in
<logs_dir>/forecast.json, so the page can say how far forecasts were from measurements before.
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path

from eaglelab.errors import EaglelabError
from eaglelab.fsutil import atomic_write_json, read_json, utcnow_iso
from eaglelab.model import RunState
from eaglelab.side_jobs import SMOKE_PREFIX

RATE, LENGTH = "acceptance/rate", "acceptance/mean_length"
CHAIN_RATE, CHAIN_LENGTH = "acceptance/chain_rate", "acceptance/chain_mean_length"
SAMPLED_RATE, SAMPLED_LENGTH = "acceptance/sampled_rate", "acceptance/sampled_mean_length"
SAMPLED_ON_POLICY = "acceptance/sampled_on_policy"  # 0: the rows were not drawn as the eval samples
def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


SERVED_RATE, SERVED_LENGTH, SERVED_EPOCH = "served/acceptance_rate", "served/mean_acceptance_length", "served/epoch"
STORE = "forecast.json"
HISTORY_KEEP = 20


def ts(v) -> float | None:
    """An ISO time (or epoch seconds) as epoch seconds; None for anything else."""
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return datetime.datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def verdict(rate: float, mean_len: float, speedup: float | None) -> tuple[str, list[str]]:
    """The eval stage's verdict rules; without a speedup a good forecast is PROMISING, not PAYS."""
    # the eval stage's module (~50 ms of imports) only when an eval manifest is read
    from eaglelab.stages.eval import verdict as eval_verdict

    v, reasons = eval_verdict(speedup, {"acceptance_rate": rate, "mean_acceptance_length": mean_len})
    if speedup is None and v == "PAYS":
        return "PROMISING", [f"offline acceptance {rate:.1%}, mean length {mean_len:.2f}; speedup not measured yet"]
    return v, reasons


def _last_pair(metrics: dict, rate_key: str, length_key: str) -> dict | None:
    """{acceptance_rate, mean_acceptance_length} from the last values of two metric series, None without."""
    try:
        return {"acceptance_rate": float(metrics[rate_key][-1][1]),
                "mean_acceptance_length": float(metrics[length_key][-1][1])}
    except (KeyError, TypeError, ValueError, IndexError):
        return None


DECODINGS = ("greedy", "sampled")


def served_decoding(lab) -> str:
    """How the model is served, so what the headline forecast is: the pipeline's eval_decide_sampling
    (auto: sampled when eval_temperature > 0, as the eval stage decides)."""
    pipeline = getattr(lab.cfg, "pipeline", None)
    v = dict(getattr(pipeline, "vars", None) or {})
    choice = str(v.get("eval_decide_sampling") or "auto").strip()
    if choice in DECODINGS:
        return choice
    if choice != "auto":
        raise ValueError(f"eval_decide_sampling {choice!r} (conf/pipeline.yaml or the profile's vars): "
                         "expected auto, greedy or sampled")
    try:
        return "sampled" if float(str(v.get("eval_temperature") or "0")) > 0 else "greedy"
    except ValueError:
        return "greedy"


def decoded(d: dict | None, decoding: str) -> dict | None:
    """{acceptance_rate, mean_acceptance_length} of one decoding from a forecast or eval figure: its
    headline when that is the decoding (no `decoding`: greedy, as before), else its `greedy`/`sampled`."""
    if not isinstance(d, dict):
        return None
    x = d.get(decoding)
    # a served sampled figure from a broken sampling path (the eval's output probe) keeps saying so
    fault = x.get("engine_fault") if isinstance(x, dict) and isinstance(x.get("engine_fault"), str) else None
    mark = {"engine_fault": fault} if fault else {}
    if (d.get("decoding") or "greedy") == decoding and _num(d.get("acceptance_rate")) is not None:
        return {"acceptance_rate": _num(d["acceptance_rate"]),
                "mean_acceptance_length": _num(d.get("mean_acceptance_length")), **mark}
    if isinstance(x, dict) and _num(x.get("acceptance_rate")) is not None:
        return {"acceptance_rate": _num(x["acceptance_rate"]),
                "mean_acceptance_length": _num(x.get("mean_acceptance_length")), **mark}
    return None


def as_served(ev: dict, decoding: str) -> dict:
    """An offline forecast with the served decoding's figure as its headline, the greedy one beside; as
    it was (greedy) when the estimate made no sampled figure."""
    ev = {**ev, "decoding": "greedy"}
    if decoding == "sampled":
        greedy, sd = decoded(ev, "greedy"), decoded(ev, "sampled")
        if sd is not None and sd["mean_acceptance_length"] is not None:
            ev.update(sd, decoding="sampled", greedy=greedy)  # greedy: the chain (or every start) beside
    return ev


def sampled_evidence(metrics: dict) -> dict | None:
    """The last sampled forecast, with `on_policy: false` when its line said its rows were not drawn as
    the eval samples (greedy rows under a sampled eval: the demo's synth; docs/foresight.md)."""
    sd = _last_pair(metrics, SAMPLED_RATE, SAMPLED_LENGTH)
    marks = metrics.get(SAMPLED_ON_POLICY) or []
    if sd is not None and len(marks) == len(metrics.get(SAMPLED_RATE) or []):  # from the same line
        try:
            sd["on_policy"] = bool(float(marks[-1][1]))
        except (TypeError, ValueError, IndexError):
            pass
    return sd


def offline_evidence(run: dict) -> dict | None:
    """The last offline estimate in a run's log state, and how many there were; None without any.
    Headline: the greedy chain (as vLLM drafts) when the estimate made one, else the every-start average."""
    metrics = (run.get("log_state") or {}).get("metrics") or {}
    every = _last_pair(metrics, RATE, LENGTH)
    if every is None:
        return None
    greedy = _last_pair(metrics, CHAIN_RATE, CHAIN_LENGTH)
    # a chain figure from the same line as the last every-start one (an older estimate made none)
    if greedy is not None and len(metrics.get(CHAIN_RATE) or []) != len(metrics[RATE]):
        greedy = None
    curve = metrics[CHAIN_RATE] if greedy is not None else metrics[RATE]
    return {**(greedy or every), "greedy": greedy, "all_starts": every,
            "sampled": sampled_evidence(metrics),
            "checkpoints": len(metrics[RATE]), "curve": [[p[0], p[1]] for p in curve], "run": run.get("id"),
            "stage": run.get("stage")}


def served_sampled(extra: dict) -> dict | None:
    """The eval manifest's served sampled figures: its `sampled` (eval at the decided concurrency), or an
    older manifest's sampled sweep cell at that concurrency (a rate only); None without a sampled sweep."""
    sd = extra.get("sampled")
    if isinstance(sd, dict) and _num(sd.get("acceptance_rate")) is not None:
        return {"acceptance_rate": _num(sd["acceptance_rate"]),
                "mean_acceptance_length": _num(sd.get("mean_acceptance_length")),
                # the output probe found the drafter's server sampling wrongly: the figure is the fault's
                **({"engine_fault": sd["engine_fault"]} if isinstance(sd.get("engine_fault"), str) else {})}
    at = str(extra.get("decided_at") or "").split(",")[0].replace("concurrency", "").strip()
    cells = [c for c in extra.get("sweep") or [] if isinstance(c, dict) and c.get("sampling") == "sampled"
             and _num(c.get("acceptance_rate")) is not None]
    cell = next((c for c in cells if str(c.get("concurrency")) == at), cells[-1] if cells else None)
    return {"acceptance_rate": _num(cell["acceptance_rate"]), "mean_acceptance_length": None} if cell else None


def served_evidence(run: dict) -> dict | None:
    """The serving smoke's figures in a run's log state (eaglelab.stages.serve_smoke), None without."""
    metrics = (run.get("log_state") or {}).get("metrics") or {}
    try:
        rate, length = float(metrics[SERVED_RATE][-1][1]), float(metrics[SERVED_LENGTH][-1][1])
        epoch = metrics.get(SERVED_EPOCH)
        epoch = int(epoch[-1][1]) if epoch else None
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return {"acceptance_rate": rate, "mean_acceptance_length": length, "run": run.get("id"), "epoch": epoch}


def eval_evidence(lab, stage_name: str, run_id: str | None = None) -> dict | None:
    """The eval stage's figures from its output manifest, read on the eval's host (a local file, or one
    `manifests` round trip over ssh). A finished eval run's figures do not change: kept by run id in
    <logs_dir>/forecast.json, so `lab status` and the page ask the host once per eval, not per refresh."""
    memo_path = lab.cfg.logs_dir / STORE
    if run_id:
        memo = ((read_json(memo_path) or {}).get("evals") or {}).get(run_id)
        if isinstance(memo, dict) and "decoding" in memo:  # (a memo from before decodings: read again)
            return memo
    stage = lab.cfg.stage(stage_name)
    spec = lab.launch_spec(stage)
    if lab.cfg.host(stage.host).reach == "local":
        docs = {out: read_json(Path(spec["cwd"], out) / "manifest.json") for out in spec["outputs"]}
    else:
        ex = lab.executor(stage.host)
        try:
            docs = ex.manifests(spec["outputs"], ex.repo_dir())
        except EaglelabError:
            return None  # the host is away: the offline forecast stands until it answers
    found = None
    for out in spec["outputs"]:
        doc = docs.get(out) or {}
        extra = doc.get("extra") or {}
        if doc.get("stage") == "eval" and isinstance(extra.get("acceptance_rate"), (int, float)):
            found = {"acceptance_rate": float(extra["acceptance_rate"]),
                     "mean_acceptance_length": float(extra.get("mean_acceptance_length") or 1.0),
                     "speedup": extra.get("speedup"), "verdict": extra.get("verdict"),
                     # the decoding the eval decided on (an eval from before: greedy), the other beside
                     "decoding": extra.get("decoding") if extra.get("decoding") in DECODINGS else "greedy",
                     "greedy": decoded(extra.get("greedy"), "greedy"), "window": extra.get("window"),
                     "sampled": served_sampled(extra)}
            if found["decoding"] == "greedy":
                found["greedy"] = decoded(found, "greedy")
            break
    if found is not None and run_id:
        store = read_json(memo_path) or {}
        if isinstance(store, dict):
            evals = store.setdefault("evals", {})
            evals[run_id] = found
            store["evals"] = dict(list(evals.items())[-HISTORY_KEEP:])
            try:
                memo_path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_json(memo_path, store)
            except OSError:
                pass
    return found


def _latest(runs: list[dict], pred) -> dict | None:
    found = [r for r in runs if pred(r)]
    return max(found, key=lambda r: ts(r.get("started_at")) or 0.0) if found else None


def _stage_of(runs, name: str) -> list[dict]:
    return [r for r in runs if r.get("stage") == name]


def make(lab, status: dict, now: float) -> dict | None:
    """The forecast from the status's runs and the eval manifest, or None before any evidence."""
    runs = [r for r in status.get("runs") or [] if isinstance(r, dict)]
    stages = lab.cfg.stages
    train_names = [n for n in stages if n == "train" or (n.startswith("train") and not n.startswith("pilot"))]
    train = _latest(runs, lambda r: r.get("stage") in train_names)
    decoding = served_decoding(lab)
    best = None
    pilot = _latest(runs, lambda r: str(r.get("stage", "")).startswith("pilot") and offline_evidence(r))
    pilot_ev = offline_evidence(pilot) if pilot is not None else None
    pilot_ev = as_served(pilot_ev, decoding) if pilot_ev is not None else None
    if pilot_ev is not None:
        best = {"source": "pilot", **pilot_ev}
    if train is not None and offline_evidence(train):
        best = {"source": "checkpoint", **as_served(offline_evidence(train), decoding)}
    for name in [n for n in stages if n == "eval"]:
        ev_run = _latest(_stage_of(runs, name), lambda r: r.get("state") == RunState.COMPLETED)
        started = ts((train or {}).get("started_at")) or 0.0
        if ev_run is None or (train is not None and (ts(ev_run.get("started_at")) or 0.0) < started):
            continue
        ev = eval_evidence(lab, name, ev_run.get("id"))
        if ev is not None:
            offline = best if best and best["source"] != "eval" else None
            best = {"source": "eval", **ev, "run": ev_run.get("id"), "stage": name,
                    "offline": {k: offline.get(k) for k in ("acceptance_rate", "mean_acceptance_length", "source",
                                                             "sampled", "all_starts", "greedy", "decoding")}
                    if offline else None,
                    # the pilot's own forecast too, when the checkpoints' replaced it: both are compared
                    "pilot": {k: pilot_ev[k] for k in ("acceptance_rate", "mean_acceptance_length", "sampled",
                                                       "greedy", "decoding")
                              if k in ("acceptance_rate", "mean_acceptance_length")
                              or (k == "sampled" and pilot_ev.get(k))
                              or pilot_ev.get("decoding") == "sampled"}
                    if pilot_ev is not None and (offline or {}).get("source") != "pilot" else None}
    if best is None:
        return None
    started = ts((train or {}).get("started_at")) or 0.0
    smoke = _latest(runs, lambda r: str(r.get("stage", "")).startswith(SMOKE_PREFIX) and r.get("state") == RunState.COMPLETED
                    and (ts(r.get("started_at")) or 0.0) >= started and served_evidence(r))
    best["served_checkpoint"] = served_evidence(smoke) if smoke else None
    if best["source"] != "eval":
        best["speedup"] = None
        best["verdict"], best["reasons"] = verdict(best["acceptance_rate"], best["mean_acceptance_length"], None)
    else:
        best["reasons"] = []
    best["train_run"] = (train or {}).get("id")
    return best


def _key(f: dict) -> str:
    return f"{f['source']}:{f.get('run')}:{f['acceptance_rate']:.6f}:{f['mean_acceptance_length']:.6f}"


def remember(path: Path, forecast: dict | None, now: float) -> dict:
    """Keep made_at stable for the same evidence and pair each train run's forecast with its eval."""
    store = read_json(path) or {}
    if not isinstance(store.get("pipelines"), dict):
        store = {"schema": 1, "current": None, "pipelines": {}, "evals": store.get("evals") or {}}
    changed = False
    if forecast is not None:
        cur = store.get("current") or {}
        if cur.get("key") != _key(forecast):
            store["current"] = {"key": _key(forecast), "made_at": utcnow_iso(now)}
            changed = True
        forecast["made_at"] = store["current"]["made_at"]
        forecast["age_s"] = max(0.0, now - (ts(forecast["made_at"]) or now))
        tr = forecast.get("train_run")
        if tr:
            entry = store["pipelines"].setdefault(tr, {"train_run": tr})
            if forecast["source"] in ("pilot", "checkpoint"):
                fc = {k: forecast.get(k) for k in ("acceptance_rate", "mean_acceptance_length", "source", "made_at",
                                                   "sampled", "greedy", "decoding")}
                if entry.get("forecast") != fc:
                    entry["forecast"], changed = fc, True
            elif forecast["source"] == "eval" and entry.get("eval") is None:
                off = forecast.get("offline")
                seen = entry.get("forecast")
                # The eval is paired with the last evidence before it (the train run's last checkpoint),
                # whether or not anybody looked at that one: a look after the first checkpoint and none
                # after the last (a busy machine, a short demo run) must not pair a stale forecast.
                if off and (seen is None or (seen.get("acceptance_rate"), seen.get("source"))
                            != (off.get("acceptance_rate"), off.get("source"))):
                    entry["forecast"] = {**off, "made_at": None}  # made_at: None = not seen while it trained
                entry["eval"] = {k: forecast.get(k) for k in ("acceptance_rate", "mean_acceptance_length", "speedup",
                                                              "verdict", "sampled", "greedy", "decoding")}
                entry["eval"]["at"] = forecast["made_at"]
                changed = True
            entry.setdefault("first_seen", utcnow_iso(now))
    if changed:
        pipelines = sorted(store["pipelines"].values(), key=lambda e: e.get("first_seen") or "")[-HISTORY_KEEP:]
        store["pipelines"] = {e["train_run"]: e for e in pipelines}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, store)
        except OSError:
            pass  # a read-only logs dir: the forecast still shows, only its history is not kept
    return store


def comparisons(store: dict) -> list[dict]:
    """Earlier pipelines with both a forecast and an eval: the forecast's error, newest first. The headline
    (`forecast_rate`, `eval_rate`, `error`) is in the decoding the eval decided on (`decoding`); both
    decodings' triples beside it (`forecast_greedy_rate`, ..., `sampled_error`; None where either side
    lacks one)."""
    out = []
    for e in store.get("pipelines", {}).values():
        f, ev = e.get("forecast"), e.get("eval")
        if not f or not ev:
            continue
        decoding = ev.get("decoding") if ev.get("decoding") in DECODINGS else "greedy"
        row = {"train_run": e["train_run"], "decoding": decoding, "forecast_at": f.get("made_at"),
               "eval_at": ev.get("at"), "source": f.get("source")}
        for name in DECODINGS:
            fd, ed = decoded(f, name), decoded(ev, name)
            both = fd is not None and ed is not None
            row.update({f"forecast_{name}_rate": fd["acceptance_rate"] if both else None,
                        f"eval_{name}_rate": ed["acceptance_rate"] if both else None,
                        f"{name}_error": fd["acceptance_rate"] - ed["acceptance_rate"] if both else None,
                        f"forecast_{name}_length": fd["mean_acceptance_length"] if both else None,
                        f"eval_{name}_length": ed["mean_acceptance_length"] if both else None})
        row.update({"forecast_rate": row[f"forecast_{decoding}_rate"], "eval_rate": row[f"eval_{decoding}_rate"],
                    "error": row[f"{decoding}_error"], "forecast_length": row[f"forecast_{decoding}_length"],
                    "eval_length": row[f"eval_{decoding}_length"]})
        out.append(row)
    return sorted(out, key=lambda c: c.get("eval_at") or "", reverse=True)


def annotate(lab, status: dict, now: float | None = None) -> dict:
    """status['pipeline']['forecast'] (None before evidence) and ['forecast_history']."""
    now = now or time.time()
    try:
        fc = make(lab, status, now)
        store = remember(lab.cfg.logs_dir / STORE, fc, now)
    except Exception as e:  # noqa: BLE001 - a forecast that cannot be made never breaks `lab status`
        fc, store = {"error": f"{type(e).__name__}: {e}"[:300]}, {}
    pipe = status.get("pipeline")
    if not isinstance(pipe, dict):
        pipe = status["pipeline"] = {} if pipe is None else {"eta": pipe}
    pipe["forecast"] = fc
    pipe["forecast_history"] = comparisons(store)
    return status


def describe(fc: dict | None) -> str:
    """One line for terminals and notifications."""
    if not fc or "acceptance_rate" not in fc:
        return "no forecast yet"
    sp = f", speedup {fc['speedup']:.2f}x" if isinstance(fc.get("speedup"), (int, float)) else ""
    age = f", {fc['age_s']:.0f} s ago" if isinstance(fc.get("age_s"), (int, float)) else ""
    sv = fc.get("served_checkpoint") or {}
    served = (f"; served checkpoint {sv.get('epoch')}: acceptance {sv['acceptance_rate']:.1%}, mean length "
              f"{sv['mean_acceptance_length']:.2f}") if isinstance(sv.get("acceptance_rate"), (int, float)) else ""
    decoding = fc.get("decoding") if fc.get("decoding") in DECODINGS else "greedy"
    other = "greedy" if decoding == "sampled" else "sampled"
    sd = decoded(fc, other) or {}
    beside = (f"; {other}: acceptance {sd['acceptance_rate']:.1%}"
              + (f", mean length {sd['mean_acceptance_length']:.2f}" if _num(sd.get("mean_acceptance_length")) else "")
              ) if _num(sd.get("acceptance_rate")) is not None else ""
    return (f"{fc['verdict']}: acceptance {fc['acceptance_rate']:.1%}, mean length {fc['mean_acceptance_length']:.2f}"
            f"{sp} ({decoding}; from {fc['source']}{age}){beside}{served}")
