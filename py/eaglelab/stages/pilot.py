"""The pilot slice: synth's first N rows through prepare -> extract -> vocab -> a short train with
offline acceptance, while the full synth goes on, so the pipeline has a forecast hours early.

It reads synth's `responses.jsonl` while synth still writes it. speculators' regenerate-responses
writes each conversation when it finishes, so the file's first lines are the conversations that
finished first: with 64 in flight, the short answers. A slice of those would forecast on a length
bias (long, truncated answers are what the drafter finds hard). So the slice is taken in PROMPT
order instead: every row carries `metadata.idx`, the prompt's index; the pilot takes the rows of
prompts 0, 1, 2, ... (a prompt recorded as failed in `responses.errors.jsonl` is passed over, as
synth passes it over) until it has N. Since speculators queues the prompts in order, that prefix
is complete soon after N rows exist: the wait is for the few stragglers among the first N. Rows
without `metadata.idx` (files not written by synth) are taken in file order. A line that does not
parse (the last one may be half-written) is skipped, and the last conversation counts only when its
final row is there (not a tool call). If the first N prompts are not all there by --wait-s but N
rows are, the N of the lowest prompt index are taken, with a warning naming the missing prompts;
fewer than N rows by then is an error naming the file.

The slice is written as a synth output (`<out>/synth/responses.jsonl` + a synth manifest), so the
stages take it as they take synth's: each runs as a subprocess (`python -m eaglelab.stages.NAME`)
into `<out>/{prepared,hidden_states,vocab,checkpoints}`, its output streamed through unchanged
(train's `acceptance/rate=..., acceptance/mean_length=...` lines are what eaglelab.control.foresight.forecast
reads from the log of a stage named pilot*). Extraction uses the transformers backend by default: an
in-process forward pass on this host's device, because the only vLLM server up while synth runs is
synth's own target server, a plain one; the vllm backend would need serve_extract (a second server
holding the target, with --extract-endpoint/--extract-staging), which is what the pilot is meant
not to wait for.

Resumable: each step is recorded in `<out>/pilot.steps.json` (its argv, the fingerprints of its
inputs' manifests, its output's) when it finishes, and a rerun skips a step whose record, inputs and
output manifest still agree; a step not recorded runs again, and the stage itself resumes from its
own manifest (extraction's finished files, train's last epoch). The estimates of checkpoints made
before an interruption are printed again before the resumed training, so the log holds the whole
curve. `<out>/manifest.json` (stage "pilot", the acceptance figures in `extra`) is written last.

--through STEP stops after that step (its outputs whole, no pilot manifest): where the target holds
every GPU (kimi-k2.5), the stage `pilot_data` extracts through serve_extract with `--through vocab`
and `pilot` then finds those steps done and trains on a GPU of its own (eaglelab.pilot_window).

    python -m eaglelab.stages.pilot --synth data/demo/synth --model data/demo/model --out data/demo/pilot \
        --samples 16 --aux-layers "1 2 3" --seq-length 1024 --draft-vocab-size 128 --epochs 2 --lr 3e-3

ends with

    pilot summary: samples=16 acceptance_rate=0.123 mean_acceptance_length=1.37 checkpoints=2 seconds=95.2
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from .. import manifest
from ..errors import StageError
from ..fsutil import atomic_write_bytes, atomic_write_json, read_json
from . import acceptance

SYNTH_OUT, SYNTH_ERR = "responses.jsonl", "responses.errors.jsonl"  # synth.OUT_NAME, synth.ERR_NAME
LEDGER = "pilot.steps.json"
DIRS = {"synth": "synth", "prepare": "prepared", "extract": "hidden_states", "vocab": "vocab", "train": "checkpoints"}
STEPS = ("prepare", "extract", "vocab", "train", "acceptance")
# The stages run as children, spelled out: the fingerprint follows these names (control/stage_code.py).
CHILDREN = {"prepare": "eaglelab.stages.prepare", "extract": "eaglelab.stages.extract",
            "vocab": "eaglelab.stages.vocab", "train": "eaglelab.stages.train"}
POLL_S = 2.0
TAIL_LINES = 20


# ---- reading synth's output while it is written (the choice itself is pure: choose) -----------------

class Tail:
    """synth's responses.jsonl, read as it grows: each complete line parsed once and kept as a stub
    (its ids, prompt index, tool-call flag and where it lies in the file), never as the whole row:
    10,000 reasoning traces are GBs of token ids. A last line without its newline is still being
    written: read again at the next poll."""

    CHUNK = 1 << 26

    def __init__(self, path: Path):
        self.path, self.offset, self.stubs, self.bad, self.torn = path, 0, [], 0, 0

    def poll(self) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            self.__init__(self.path)
            return
        if size < self.offset:  # replaced (synth set an old output aside): start over
            self.__init__(self.path)
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            buf = b""
            while chunk := f.read(self.CHUNK):
                buf += chunk
                end = buf.rfind(b"\n") + 1
                for line in buf[:end].split(b"\n")[:-1]:
                    self._add(line, self.offset)
                    self.offset += len(line) + 1
                buf = buf[end:]
        self.torn = int(bool(buf.strip()))

    def _add(self, line: bytes, at: int) -> None:
        if not line.strip():
            return
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            self.bad += 1
            return
        md = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        self.stubs.append({"id": obj.get("id"), "primary_id": obj.get("primary_id"),
                           "metadata": {"idx": md.get("idx"), "is_tool_call": md.get("is_tool_call")},
                           "at": [at, at + len(line)]})

    def lines(self, stubs: list[dict]) -> list[bytes]:
        """The chosen rows' lines, as synth wrote them."""
        out = []
        with open(self.path, "rb") as f:
            for st in stubs:
                f.seek(st["at"][0])
                out.append(f.read(st["at"][1] - st["at"][0]))
        return out


def conversation_of(row: dict) -> str:
    return str(row.get("primary_id") or row.get("id"))


def prompt_index(row: dict) -> int | None:
    idx = (row.get("metadata") or {}).get("idx")
    return idx if isinstance(idx, int) and not isinstance(idx, bool) else None


def whole_conversations(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """Rows grouped by conversation in file order. speculators writes a conversation's rows in one go
    (one per generation: tool calls, then the answer); the last conversation in the file may still be
    arriving, so it counts only when its final row is not a tool call."""
    groups: dict[str, list[dict]] = collections.OrderedDict()
    for r in rows:
        groups.setdefault(conversation_of(r), []).append(r)
    convs = list(groups.items())
    if convs and (convs[-1][1][-1].get("metadata") or {}).get("is_tool_call"):
        convs.pop()
    return convs


def choose(rows: list[dict], errors: list[dict], n: int, final: bool = False) -> dict:
    """The slice from what synth wrote so far: {"rows": the first n rows or None, "order": "prompt" |
    "file" | "lowest", "have": rows available for it, "waiting_on": the first prompt index not there,
    "missing": prompt indices passed over (final only)}. final: the wait is over; take the n rows of
    the lowest prompt index if the prefix is not complete."""
    convs = whole_conversations(rows)
    idx = {c: prompt_index(rs[0]) for c, rs in convs}
    total = sum(len(rs) for _, rs in convs)
    if not convs or any(i is None for i in idx.values()):
        flat = [r for _, rs in convs for r in rs]
        return {"rows": flat[:n] if len(flat) >= n else None, "order": "file", "have": len(flat),
                "waiting_on": None, "missing": []}
    by_idx = {idx[c]: rs for c, rs in convs}
    failed = {prompt_index(e) for e in errors} - {None} - set(by_idx)
    taken: list[dict] = []
    i, top = 0, max(by_idx)
    while len(taken) < n and i <= top:
        if i in by_idx:
            taken += by_idx[i]
        elif i not in failed:
            break
        i += 1
    if len(taken) >= n:
        return {"rows": taken[:n], "order": "prompt", "have": len(taken), "waiting_on": None, "missing": []}
    waiting = i if i <= top else top + 1
    if final and total >= n:
        lowest = [r for k in sorted(by_idx) for r in by_idx[k]][:n]
        last = prompt_index(lowest[-1])
        missing = [k for k in range(last) if k not in by_idx and k not in failed]
        return {"rows": lowest, "order": "lowest", "have": total, "waiting_on": waiting, "missing": missing}
    return {"rows": None, "order": "prompt", "have": len(taken), "waiting_on": waiting, "missing": []}


def read_errors(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_bytes().splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            rows.append(obj)
    return rows


def wait_for_slice(synth: Path, n: int, wait_s: float, echo, clock=time.monotonic, sleep=time.sleep) -> dict:
    """Poll synth's output until the slice is there, or --wait-s is over (StageError if n rows never came).
    The pick's "lines" are the chosen rows as synth wrote them."""
    out, err = synth / SYNTH_OUT, synth / SYNTH_ERR
    deadline, said, tail = clock() + wait_s, None, Tail(out)
    while True:
        final = clock() >= deadline
        tail.poll()
        pick = choose(tail.stubs, read_errors(err), n, final=final)
        if pick["rows"] is not None:
            pick["skipped_lines"] = tail.bad + tail.torn
            pick["lines"] = tail.lines(pick["rows"])
            return pick
        if final:
            what = f"{out}: not there" if not out.exists() else f"{out}: {pick['have']} complete row(s)"
            raise StageError(f"{what}, the pilot needs {n}; waited {wait_s:g} s (--wait-s). Is synth running "
                             f"and writing there (lab status)? Lower the pilot's --samples (var pilot_samples) "
                             f"or wait longer (--wait-s, var pilot_wait_s)")
        state = (pick["have"], pick["waiting_on"])
        if state != said:
            on = f", waiting on prompt {pick['waiting_on']}" if pick["waiting_on"] is not None and pick["have"] else ""
            echo(f"pilot: waiting for {n} rows in {out}: {pick['have']} so far{on}")
            said = state
        sleep(min(POLL_S, max(0.0, deadline - clock())))


def write_slice(slice_dir: Path, pick: dict, params: dict) -> dict:
    rows = [json.loads(line) for line in pick["lines"]]
    slice_dir.mkdir(parents=True, exist_ok=True)
    path = slice_dir / SYNTH_OUT
    atomic_write_bytes(path, b"".join(line + b"\n" for line in pick["lines"]))
    finish = collections.Counter(str((r.get("metadata") or {}).get("finish_reason")) for r in rows)
    return manifest.write(slice_dir, "synth", [path], params=params,
                          counts={"prompts": len({conversation_of(r) for r in rows}), "done": len(rows),
                                  "rows": len(rows), "errors": 0, "truncated": finish.get("length", 0),
                                  "tokens": sum(len(r.get("input_ids") or []) for r in rows),
                                  "completion_tokens": sum(sum(r.get("loss_mask") or []) for r in rows)},
                          extra={"pilot_slice": True, "order": pick["order"], "missing_prompts": pick["missing"],
                                 "prompt_indices": [prompt_index(r) for r in rows],
                                 "finish_reasons": dict(finish)})


# ---- running the stages -----------------------------------------------------------------------------

class Child:
    """The stage subprocess now running (a TERM to the pilot is passed on to it)."""
    proc: subprocess.Popen | None = None


def on_term(signum, frame):
    if Child.proc is not None and Child.proc.poll() is None:
        Child.proc.send_signal(signal.SIGTERM)
        try:
            Child.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            Child.proc.kill()
    raise SystemExit(128 + signum)


def run_child(step: str, n: int, stage: str, argv: list[str]) -> bytes:
    """Run `python -m eaglelab.stages.<stage> argv`, its stdout and stderr copied byte for byte to ours
    (\\r frames included); its output returned; StageError with its last lines if it fails."""
    pkg_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("COLUMNS", "1000")  # Rich wraps speculators' metric lines at 80 columns otherwise
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", CHILDREN[stage], *argv]
    sys.stdout.flush()
    out = sys.stdout.buffer
    Child.proc = proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    got = bytearray()
    try:
        while chunk := os.read(proc.stdout.fileno(), 1 << 16):
            out.write(chunk)
            out.flush()
            got += chunk
        rc = proc.wait()
    finally:
        Child.proc = None
        proc.stdout.close()
    if rc != 0:
        lines = [ln for ln in got.decode("utf-8", "replace").replace("\r", "\n").splitlines() if ln.strip()]
        tail = "\n".join("    " + ln for ln in lines[-TAIL_LINES:])
        raise StageError(f"pilot: step {STEPS.index(step) + 1}/{len(STEPS)} {step} failed (exit {rc}) after "
                         f"{n} samples' worth of work; `{' '.join(cmd)}` ended with:\n{tail}")
    return bytes(got)


def fingerprint_of(path: Path) -> str | None:
    doc = manifest.read(path)
    return doc.get("fingerprint") if doc and not manifest.problems(path, doc) else None


class Ledger:
    """<out>/pilot.steps.json: what each step ran with, and the fingerprint of what it made."""

    def __init__(self, path: Path):
        self.path = path
        doc = read_json(path)
        self.steps: dict = doc.get("steps", {}) if isinstance(doc, dict) else {}

    def entry(self, argv: list[str], inputs: list[Path]) -> dict:
        return {"argv": argv, "inputs": {str(p): fingerprint_of(p) for p in inputs}}

    def done(self, step: str, argv: list[str], inputs: list[Path], output: Path) -> bool:
        rec = self.steps.get(step) or {}
        want = self.entry(argv, inputs)
        return (rec.get("argv") == want["argv"] and rec.get("inputs") == want["inputs"]
                and rec.get("output") is not None and rec.get("output") == fingerprint_of(output))

    def started(self, step: str, argv: list[str], inputs: list[Path]) -> bool:
        """True when an earlier run began this step with the same argv and inputs (an interrupted one)."""
        rec = self.steps.get(step) or {}
        want = self.entry(argv, inputs)
        return rec.get("argv") == want["argv"] and rec.get("inputs") == want["inputs"]

    def record(self, step: str, argv: list[str], inputs: list[Path], output: Path | None, seconds: float) -> None:
        self.steps[step] = {**self.entry(argv, inputs),
                            "output": fingerprint_of(output) if output is not None else None,
                            "seconds": round(seconds, 1)}
        atomic_write_json(self.path, {"schema": 1, "steps": self.steps})


def replay(records: list[dict], why: str, echo) -> None:
    if records:
        echo(f"pilot: {len(records)} acceptance estimate(s) {why}:")
        for doc in records:
            echo(acceptance.log_line(doc))


@click.command()
@click.option("--synth", "synth_dir", required=True, type=click.Path(path_type=Path),
              help="synth's --out (its responses.jsonl may still be growing)")
@click.option("--model", required=True, type=click.Path(path_type=Path), help="the target model directory")
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="the pilot's own directory: synth/ prepared/ hidden_states/ vocab/ checkpoints/")
@click.option("--samples", default=256, show_default=True, type=click.IntRange(min=2),
              help="rows of synth's output to take (in prompt order)")
@click.option("--wait-s", default=3600.0, show_default=True, help="wait this long for the rows to appear")
@click.option("--aux-layers", default="", help="aux layer ids WITHOUT the last layer (as the full pipeline's)")
@click.option("--seq-length", default=8192, show_default=True)
@click.option("--draft-vocab-size", required=True, type=int)
@click.option("--epochs", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--lr", default=1e-3, show_default=True)
@click.option("--loss-fn", default="kl_div", show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--acceptance-k", default=3, show_default=True, type=click.IntRange(min=1),
              help="speculative tokens of the offline estimate (num_speculative_tokens)")
@click.option("--acceptance-temperature", default=0.0, show_default=True,
              help="> 0: also the sampled forecast at this temperature (eval_temperature)")
@click.option("--acceptance-top-p", default=1.0, show_default=True, help="the sampled forecast's top-p (eval_top_p)")
@click.option("--seed", default=42, show_default=True)
@click.option("--warm-start", default="", help="train from this drafter, as the full train does (its --warm-start)")
@click.option("--warm-start-vocab", type=click.Choice(["check", "rebuild", "adopt"]), default="check", show_default=True,
              help="as train's --warm-start-vocab")
@click.option("--trust-remote-code/--no-trust-remote-code", default=False, help="the target needs custom code")
@click.option("--extract-backend", type=click.Choice(["transformers", "vllm"]), default="transformers",
              show_default=True, help="transformers: a local forward pass (no second server beside synth's)")
@click.option("--extract-endpoint", default="http://127.0.0.1:8000", show_default=True,
              help="vllm backend: the extraction server (serve_extract)")
@click.option("--through", type=click.Choice(["prepare", "extract", "vocab", "train"]), default="train",
              show_default=True, help="stop after this step (the data part in one stage, the train in the next)")
@click.option("--extract-staging", type=click.Path(path_type=Path), default=None,
              help="vllm backend: that server's --hidden-states-path")
def main(synth_dir: Path, model: Path, out_dir: Path, samples: int, wait_s: float, aux_layers: str, seq_length: int,
         draft_vocab_size: int, epochs: int, lr: float, loss_fn: str, device: str, acceptance_k: int,
         acceptance_temperature: float, acceptance_top_p: float, seed: int, warm_start: str, warm_start_vocab: str,
         trust_remote_code: bool, extract_backend: str, extract_endpoint: str, extract_staging: Path | None,
         through: str) -> None:
    """Run the pilot slice: synth's first rows through prepare, extract, vocab and a short train."""
    t0 = time.monotonic()
    echo = lambda m: click.echo(m)
    signal.signal(signal.SIGTERM, on_term)
    if not (model / "config.json").is_file():
        raise StageError(f"{model / 'config.json'}: not found; --model must be the target model directory "
                         "(the pipeline's `model` var)")
    if extract_backend == "vllm" and extract_staging is None:
        raise StageError("--extract-backend vllm needs --extract-staging (serve_extract's --hidden-states-path)")
    source = (synth_dir / SYNTH_OUT).resolve()
    tr = ["--trust-remote-code" if trust_remote_code else "--no-trust-remote-code"]
    params = {"synth": str(source), "samples": samples, "model": str(model), "aux_layers": aux_layers,
              "seq_length": seq_length, "draft_vocab_size": draft_vocab_size, "epochs": epochs, "lr": lr,
              "loss_fn": loss_fn, "acceptance_k": acceptance_k, "seed": seed, "extract_backend": extract_backend,
              **({"warm_start": warm_start, "warm_start_vocab": warm_start_vocab} if warm_start else {}),
              **({"acceptance_temperature": acceptance_temperature, "acceptance_top_p": acceptance_top_p}
                 if acceptance_temperature > 0 else {})}
    d = {k: out_dir / v for k, v in DIRS.items()}
    if manifest.is_complete(out_dir, params):
        doc = manifest.read(out_dir)
        echo(f"pilot: {out_dir} is complete ({doc['counts']}); skipping")
        replay(acceptance.read(d["train"]), "of the finished pilot", echo)
        summary(doc["counts"]["samples"], doc["extra"], doc["extra"].get("seconds", 0.0), echo)
        return

    # the slice
    slice_params = {"source": str(source), "samples": samples}
    if manifest.is_complete(d["synth"], slice_params):
        sdoc = manifest.read(d["synth"])
        echo(f"pilot: slice of {sdoc['counts']['rows']} rows in {d['synth']} is there ({sdoc['extra'].get('order')} "
             "order); keeping it")
    else:
        if d["synth"].exists():
            moved = manifest.set_aside(d["synth"])
            echo(f"pilot: {d['synth']} was a slice of other rows or half-written; moved to {moved}")
        pick = wait_for_slice(synth_dir, samples, wait_s, echo)
        sdoc = write_slice(d["synth"], pick, slice_params)
        how = {"prompt": "the first prompts in order", "file": "file order (rows without metadata.idx)",
               "lowest": "the lowest prompt indices"}[pick["order"]]
        echo(f"pilot: slice: {samples} rows of {source} ({how}; {pick['skipped_lines']} unreadable line(s) "
             f"skipped) -> {d['synth']}")
        if pick["missing"]:
            echo(f"pilot: WARNING prompts {pick['missing'][:10]} had no row after {wait_s:g} s (--wait-s); "
                 "the slice took later ones instead")

    common_args = ["--model", str(model)]
    aux = ["--aux-layers", aux_layers] if aux_layers else []
    extract_args = ["--backend", extract_backend, *common_args, "--data", str(d["prepare"]), "--out", str(d["extract"]),
                    *aux, "--device", device]
    if extract_backend == "vllm":
        extract_args += ["--endpoint", extract_endpoint, "--server-hidden-states-path", str(extract_staging)]
    plan = [
        ("prepare", [*common_args, "--data", str(d["synth"]), "--out", str(d["prepare"]), "--seq-length",
                     str(seq_length), *tr], [d["synth"]]),
        ("extract", extract_args, [d["prepare"]]),
        ("vocab", ["--data", str(d["prepare"]), *common_args, "--draft-vocab-size", str(draft_vocab_size),
                   "--out", str(d["vocab"])], [d["prepare"]]),
        ("train", [*common_args, "--data", str(d["prepare"]), "--hidden-states", str(d["extract"]),
                   "--vocab", str(d["vocab"]), "--out", str(d["train"]), *aux,
                   "--draft-vocab-size", str(draft_vocab_size), "--epochs", str(epochs), "--lr", str(lr),
                   "--loss-fn", loss_fn, "--total-seq-len", str(seq_length), "--device", device,
                   "--acceptance-k", str(acceptance_k), "--acceptance-temperature", str(acceptance_temperature),
                   "--acceptance-top-p", str(acceptance_top_p), "--seed", str(seed), *tr,
                   # the forecast is of the drafter the full train will make: from the same start
                   *(["--warm-start", warm_start, "--warm-start-vocab", warm_start_vocab] if warm_start else [])],
         [d["prepare"], d["extract"], d["vocab"]]),
    ]
    ledger = Ledger(out_dir / LEDGER)
    n = sdoc["counts"]["rows"]
    for step, argv, inputs in plan:
        k = STEPS.index(step) + 1
        output = d[step]
        if ledger.done(step, argv, inputs, output):
            echo(f"pilot: step {k}/{len(STEPS)} {step} ({n} samples): done earlier "
                 f"(manifest {fingerprint_of(output)}); skipping")
            if step == "train":
                replay(acceptance.read(d["train"]), "of the finished training", echo)
        else:
            if step == "train" and ledger.started(step, argv, inputs):
                replay(acceptance.read(d["train"]), "made before the interruption", echo)
            echo(f"pilot: step {k}/{len(STEPS)} {step} ({n} samples)")
            s0 = time.monotonic()
            ledger.record(step, argv, inputs, None, 0.0)  # started: a rerun knows an interrupted step's records
            run_child(step, n, step, argv)
            if fingerprint_of(output) is None:
                raise StageError(f"pilot: step {k}/{len(STEPS)} {step} exited 0 but {output / manifest.NAME} is "
                                 "missing or does not match its files")
            ledger.record(step, argv, inputs, output, time.monotonic() - s0)
        if step == "prepare":
            n = manifest.read(output)["counts"]["samples"]
        if step == through != "train":
            echo(f"pilot: stopping after step {k}/{len(STEPS)} {step} (--through {through}): its outputs are whole; "
                 "the pilot's train runs next, finding these steps done")
            return

    k = len(STEPS)
    echo(f"pilot: step {k}/{k} acceptance ({n} samples)")
    records = acceptance.read(d["train"])
    if not records:
        raise StageError(f"pilot: step {k}/{k} acceptance: {d['train'] / acceptance.FILE_NAME} holds no estimate: "
                         "every checkpoint's estimate failed (the train output above says why)")
    last = records[-1]
    tdoc = manifest.read(d["train"]) or {}
    prep = manifest.read(d["prepare"]) or {}
    seconds = round(time.monotonic() - t0, 1)
    extra = {"acceptance_rate": last["acceptance_rate"], "mean_acceptance_length": last["mean_acceptance_length"],
             "per_position": last.get("per_position"), "k": last.get("k"), "held_out_samples": last.get("samples"),
             "checkpoints": len(records), "chain": last.get("chain"), "sampled": last.get("sampled"),
             "curve": [[r.get("epoch"), r["acceptance_rate"], r["mean_acceptance_length"]] for r in records],
             "drafter": str(d["train"] / tdoc.get("extra", {}).get("drafter", "drafter")),
             "slice_order": sdoc["extra"].get("order"), "seconds": seconds,  # this run's (a rerun skips work)
             "step_seconds": {s: (ledger.steps.get(s) or {}).get("seconds") for s in DIRS if s != "synth"}}
    extra["work_seconds"] = round(sum(v or 0 for v in extra["step_seconds"].values()), 1)
    files = [d["synth"] / SYNTH_OUT, d["train"] / acceptance.FILE_NAME]
    counts = {"samples": n, "tokens": prep.get("counts", {}).get("tokens"), "checkpoints": len(records),
              "epochs": epochs}
    manifest.write(out_dir, "pilot", files, params=params, counts=counts, extra=extra)
    summary(n, extra, seconds, echo)


def summary(n: int, extra: dict, seconds: float, echo) -> None:
    echo(f"pilot summary: samples={n} acceptance_rate={extra['acceptance_rate']:.3f} "
         f"mean_acceptance_length={extra['mean_acceptance_length']:.2f} checkpoints={extra['checkpoints']} "
         f"seconds={seconds:.1f}")


if __name__ == "__main__":
    main()
