"""Train the EAGLE-3 drafter with speculators' trainer, after checking that its inputs agree.

Checks before the (long) start: the hidden states are complete and were extracted with the same
aux layer ids as --aux-layers, their count equals the prepared samples, the vocab mapping has
--draft-vocab-size entries, and the loss implementation can run here (the fused Triton loss needs
a GPU, and crashes on torch 2.11 inside torch.compile: use eager there).

Resumes by itself: speculators starts from the highest `<save-path>/<epoch>/` checkpoint. Its
metric lines (`train/loss=..., train/full_acc_0=..., ...`) go through a Rich handler that wraps at
80 columns unless COLUMNS is wide (jobwrap sets COLUMNS=1000).

On a machine without an accelerator speculators fails three ways; `cpu_patches()` fixes them in
this process only: the model and batches go to "cpu" instead of `local_rank` 0, the step timer's
`torch.accelerator.synchronize()` becomes a no-op, autocast and checkpoint loading use "cpu".

    python -m eaglelab.stages.train --model data/demo/model --data data/demo/prepared \
        --hidden-states data/demo/hidden_states --vocab data/demo/vocab --out data/demo/checkpoints \
        --aux-layers "1 2 3" --draft-vocab-size 1024 --epochs 4
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from .. import manifest
from ..errors import StageError
from ..fsutil import read_json
from . import acceptance, common, train_memory
from . import warm_start as warm
from .common import TRIMMED_DATA, completed_epochs, hs_path

DRAFTER_LINK = "drafter"  # <out>/drafter -> the last epoch's checkpoint


def cpu_patches() -> None:
    """Make speculators' trainer run on CPU (it assumes an accelerator)."""
    import speculators.train.checkpointer as checkpointer
    import speculators.train.trainer as trainer
    import torch

    trainer.get_local_rank = lambda: "cpu"  # Trainer does model.to(local_rank), batch.to(local_rank)
    checkpointer.get_current_device = lambda: "cpu"  # resume loads state dicts onto this device
    if not torch.accelerator.is_available():
        torch.accelerator.synchronize = lambda *a, **k: None  # the step timer syncs every logged step
    original_init = trainer.Trainer.__init__

    def init_on_cpu(self, *a, **k):
        original_init(self, *a, **k)
        self.device_type = "cpu"  # autocast("cuda") would be a no-op with a warning on CPU

    trainer.Trainer.__init__ = init_on_cpu
    cpu_process_group()


def cpu_process_group() -> None:
    """Under torchrun on CPU (train_gpus > 1 with --device cpu, as CI runs it): speculators'
    `maybe_setup_distributed` selects the accelerator (`set_device_index(local_rank)`, fails with
    none) and its backend; do the same bookkeeping with the gloo backend instead. DDP then wraps
    the CPU model (no device_ids) and all-reduces gradients over gloo."""
    import speculators.train.cli as cli
    import speculators.train.distributed as sd
    import torch.distributed as dist

    original = cli.maybe_setup_distributed

    def setup_gloo(sp_size: int = 1) -> None:
        if "LOCAL_RANK" not in os.environ:
            return original(sp_size)
        sd._local_rank = int(os.environ["LOCAL_RANK"])
        sd._is_distributed = True
        dist.init_process_group("gloo")
        sd._rank, sd._world_size = dist.get_rank(), dist.get_world_size()
        sd._init_sp_process_groups(sd._rank, sd._world_size, sp_size)

    cli.maybe_setup_distributed = setup_gloo


def announce_plan() -> None:
    """Print the training plan before step 0 (`train: plan: 6 epochs x 12 steps per epoch`): the
    parser's training progress (eaglelab.host.parse.training) needs the total steps from the first
    step on, and speculators logs the steps per epoch only when an epoch's bar closes."""
    import speculators.train.trainer as trainer

    original = trainer.Trainer.run_training

    def run_training(self, *a, **k):
        if getattr(self, "rank", 0) == 0:
            limit = f", at most {self.config.max_steps} steps" if self.config.max_steps else ""
            click.echo(f"train: plan: {self.config.num_epochs} epochs x {len(self.train_loader)} steps per epoch"
                       f"{limit}", nl=True)
            sys.stdout.flush()
        return original(self, *a, **k)

    trainer.Trainer.run_training = run_training


TORCHRUN_LOGS = "logs/torchrun"  # under --out: each rank's whole stdout/stderr, as torchrun's --tee keeps it


def torchrun_argv(nproc: int, out_dir: Path, stage_args: list[str]) -> list[str]:
    """This stage again under torchrun, one process per GPU of this host. `--tee 3` copies every
    rank's stdout and stderr to the console, each line prefixed `[default<rank>]:` (the parser strips
    it and takes the training progress from rank 0's lines alone), and to a file per rank under
    <out>/logs/torchrun."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "--tee", "3", "--log-dir", str(out_dir / TORCHRUN_LOGS), "-m", "eaglelab.stages.train", *stage_args]


def _rows(path: Path) -> int:
    from datasets import load_from_disk
    return len(load_from_disk(str(path)))


def smoke_inputs(data: Path, hidden_states: Path, out_dir: Path, prepared: str, need: int = 1, wait_s: float = 0.0,
                 poll_s: float = 0.5) -> tuple[Path, Path, Path]:
    """(rows, hidden states, out) for a smoke run while extraction writes: the longest prefix of the
    samples whose hs files exist (extraction goes in index order, and speculators maps row i to
    hs_i, so a prefix keeps the pairing), saved as a dataset of its own in <out>.smoke.

    Started with extraction (smoke.after 0), it waits up to `wait_s` for the first `need` samples
    itself: a demo's extraction lasts seconds, shorter than a controller's polls take to see it
    make samples, and on a real lab the wait costs nothing. Only files of an extraction of these very
    rows count (its claim or manifest names `prepared`, their fingerprint): a directory left by an
    earlier extraction is set aside by the new one, not read."""
    import shutil
    import time

    from datasets import load_from_disk


    def of_these_rows() -> bool:
        doc = manifest.read(hidden_states) or read_json(hidden_states / manifest.CLAIM) or {}
        return isinstance(doc, dict) and (doc.get("params") or {}).get("data") == prepared

    smoke = out_dir.parent / f"{out_dir.name}.smoke"
    shutil.rmtree(smoke, ignore_errors=True)
    deadline, n, rows = time.monotonic() + wait_s, 0, None
    while True:
        if rows is None and of_these_rows():  # the claim is written before the trimmed rows and any hs file
            src = hidden_states / TRIMMED_DATA if (hidden_states / TRIMMED_DATA).is_dir() else data
            rows = load_from_disk(str(src))
            need = max(1, min(need, len(rows)))
        while rows is not None and n < len(rows) and hs_path(hidden_states, n).is_file():
            n += 1
        if n >= need or time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    if n == 0:
        raise StageError(f"{hidden_states}: no hidden states of these prepared rows after {wait_s:.0f} s "
                         "(no extraction of them has written hs_0.safetensors there): the smoke of train needs "
                         "the first extracted samples; is extract writing there? Raise --smoke-wait-s or start "
                         "the smoke later (smoke.after)")
    if n < need:
        click.echo(f"train: smoke: {n} of the {need} samples it waited for after {wait_s:.0f} s; going on with {n}")
    smoke.mkdir(parents=True)
    rows.select(range(n)).save_to_disk(str(smoke / "rows"))
    click.echo(f"train: smoke on the first {n} of {len(rows)} samples (their hidden states exist) in {smoke}")
    return smoke / "rows", hidden_states, smoke / "checkpoints"


def check_loss(loss: str, device: str, torch_version: str) -> None:
    if loss != "fused":
        return
    if device == "cpu":
        raise StageError("--loss-implementation fused is a Triton kernel and needs a GPU; use eager on CPU")
    if torch_version.startswith("2.11"):
        raise StageError(f"--loss-implementation fused crashes with torch {torch_version} (speculators 0.9.0: "
                         "torch.compile 'ListVariable ... already tracked for mutation' in step 0); use eager")


def speculators_argv(*, model: Path, data: Path, hidden_states: Path, vocab: Path, out: Path, aux: list[int],
                     draft_vocab_size: int, epochs: int, lr: float, seq_len: int, loss: str, attn: str,
                     workers: int, max_steps: int | None, ttt_steps: int, extra: list[str]) -> list[str]:
    argv = ["--verifier-name-or-path", str(model), "--data-path", str(data),
            "--hidden-states-path", str(hidden_states), "--save-path", str(out),
            "--speculator-type", "eagle3", "--target-layer-ids", *map(str, aux),
            "--draft-vocab-size", str(draft_vocab_size), "--d2t-path", str(vocab / "d2t.npy"),
            "--t2d-path", str(vocab / "t2d.npy"), "--epochs", str(epochs), "--lr", str(lr),
            "--total-seq-len", str(seq_len), "--loss-implementation", loss, "--draft-attn-impl", attn,
            "--on-missing", "raise", "--num-workers", str(workers), "--ttt-steps", str(ttt_steps),
            "--log-dir", str(out / "logs")]
    if workers == 0:
        argv += ["--prefetch-factor", "2"]
    if max_steps:
        argv += ["--max-steps", str(max_steps)]
    return argv + extra


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--model", required=True, type=click.Path(path_type=Path), help="the verifier (target) model")
@click.option("--data", required=True, type=click.Path(path_type=Path), help="prepare's output")
@click.option("--hidden-states", required=True, type=click.Path(path_type=Path), help="extract's output")
@click.option("--vocab", required=True, type=click.Path(path_type=Path), help="vocab's output (d2t.npy, t2d.npy)")
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="checkpoints go here")
@click.option("--aux-layers", default="", help="aux layer ids WITHOUT the last layer (as extraction used)")
@click.option("--draft-vocab-size", required=True, type=int)
@click.option("--epochs", default=4, show_default=True)
@click.option("--lr", default=1e-3, show_default=True)
@click.option("--total-seq-len", default=8192, show_default=True)
@click.option("--loss-implementation", type=click.Choice(["eager", "fused"]), default="eager", show_default=True)
@click.option("--draft-attn-impl", type=click.Choice(["auto", "simple_flex_attention", "sdpa", "eager"]),
              default="auto", show_default=True, help="auto: sdpa on CPU, flex attention on GPU")
@click.option("--ttt-steps", default=3, show_default=True)
@click.option("--loss-fn", default="kl_div", show_default=True,
              help="kl_div (speculators' default for eagle3) | ce (hard labels: the target's argmax) | ...")
@click.option("--num-workers", default=None, type=int, help="dataloader workers (default 0 on CPU, 4 on GPU)")
@click.option("--max-steps", default=None, type=int, help="stop after this many optimizer steps (smoke runs)")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--gpus", default=1, show_default=True, help=">1: relaunch under torchrun with this many processes")
@click.option("--torchrun/--no-torchrun", "use_torchrun", default=None,
              help="relaunch under torchrun even for --gpus 1 (default: only when --gpus > 1)")
@click.option("--trust-remote-code/--no-trust-remote-code", default=False, help="the verifier needs custom code")
@click.option("--acceptance-k", default=3, show_default=True,
              help="estimate each checkpoint's acceptance offline for this many speculative tokens (0: off)")
@click.option("--acceptance-samples", default=32, show_default=True, help="held-out rows per estimate")
@click.option("--acceptance-temperature", default=0.0, show_default=True,
              help="> 0: the estimate also forecasts sampled serving at this temperature (eval_temperature)")
@click.option("--acceptance-top-p", default=1.0, show_default=True, help="the sampled forecast's top-p (eval_top_p)")
@click.option("--warm-start", default="", help="start from this EAGLE-3 drafter (a directory or a hub id); '': from scratch")
@click.option("--warm-start-vocab", type=click.Choice(["check", "rebuild", "adopt"]), default="check", show_default=True,
              help="check: the drafter's d2t must equal the vocab stage's; rebuild: remap its lm_head to it; "
                   "adopt: train with the drafter's own d2t/t2d")
@click.option("--seed", default=42, show_default=True, help="torch/numpy/random seed (speculators' --seed)")
@click.option("--smoke-steps", default=0, show_default=True,
              help=">0: a smoke test of this very command while extraction still runs: this many steps on the "
                   "samples whose hidden states exist so far, in <out>.smoke (removed after); no manifest")
@click.option("--smoke-wait-s", default=600.0, show_default=True,
              help="smoke: wait this long at most for the first --smoke-steps samples' hidden states")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def main(model: Path, data: Path, hidden_states: Path, vocab: Path, out_dir: Path, aux_layers: str,
         draft_vocab_size: int, epochs: int, lr: float, total_seq_len: int, loss_implementation: str,
         draft_attn_impl: str, ttt_steps: int, loss_fn: str, num_workers: int | None, max_steps: int | None, device: str,
         gpus: int, use_torchrun: bool | None, trust_remote_code: bool, acceptance_k: int, acceptance_samples: int,
         acceptance_temperature: float, acceptance_top_p: float, warm_start: str, warm_start_vocab: str, seed: int, smoke_steps: int, smoke_wait_s: float,
         extra: tuple[str, ...]) -> None:
    """Train the drafter (EXTRA args go to `speculators train` unchanged)."""
    import torch

    device = common.resolve_device(device)
    cfg = common.model_config(model)
    aux = common.parse_layers(aux_layers, "--aux-layers") if aux_layers else common.default_aux_layers(cfg["num_hidden_layers"])
    common.check_aux_layers(aux, cfg["num_hidden_layers"], "--aux-layers")
    check_loss(loss_implementation, device, torch.__version__)

    prep = manifest.require(data, "prepare", f"run the prepare stage (lab run prepare) to fill {data}")
    if smoke_steps > 0:  # extraction is still writing: no manifest yet, a prefix of the samples is there
        hs = None
        data, hidden_states, out_dir = smoke_inputs(data, hidden_states, out_dir, prep["fingerprint"], smoke_steps,
                                                    smoke_wait_s)
        max_steps, acceptance_k, gpus, use_torchrun = smoke_steps, 0, 1, False  # one process: ranks would share <out>.smoke
    else:
        hs = manifest.require(hidden_states, "extract", f"run the extract stage (lab run extract) to fill {hidden_states}")
    voc = manifest.require(vocab, "vocab", f"run the vocab stage (lab run vocab) to fill {vocab}")
    if hs is not None and hs["params"].get("aux_layers") != aux:
        raise StageError(f"{hidden_states / manifest.NAME}: extracted with aux layers {hs['params'].get('aux_layers')}, "
                         f"training asked for {aux}: they must agree (a mismatch collapses acceptance to ~1%). "
                         "Fix: use the same aux_layers var for extract and train")
    if hs is not None and (hs["params"].get("data") != prep["fingerprint"]
                           or hs["counts"]["samples"] != prep["counts"]["samples"]):
        raise StageError(f"{hidden_states / manifest.NAME}: hidden states are for other prepared data "
                         f"({hs['counts']['samples']} samples, data {hs['params'].get('data')}; prepared: "
                         f"{prep['counts']['samples']}, {prep['fingerprint']}). Fix: rerun extract")
    if voc["params"]["draft_vocab_size"] != draft_vocab_size and not (warm_start and warm_start_vocab == "adopt"):
        raise StageError(f"{vocab / manifest.NAME}: draft vocab {voc['params']['draft_vocab_size']} != "
                         f"--draft-vocab-size {draft_vocab_size}; rerun vocab with the same size")
    if voc["params"].get("data") != prep["fingerprint"]:
        raise StageError(f"{vocab / manifest.NAME}: built from other prepared data; rerun vocab")

    drafter, vocab_differs = None, None
    if warm_start:  # before the (long) start: the drafter fits this target, these layers, this vocabulary
        drafter = warm.converted(warm.resolve(warm_start), model, aux,
                                 out_dir.with_name(out_dir.name + ".warm_start_converted"), click.echo)
        if warm_start_vocab == "adopt":  # the drafter's vocabulary is this training's: the vocab stage's is not used
            d2t, _ = warm.drafter_vocab(drafter)
            if len(d2t) != draft_vocab_size:
                raise StageError(f"--warm-start {warm_start} --warm-start-vocab adopt: the drafter drafts {len(d2t):,} "
                                 f"tokens, --draft-vocab-size is {draft_vocab_size:,}. Fix: set the var "
                                 f"draft_vocab_size to {len(d2t)}")
            vocab = warm.adopt_vocab(drafter, out_dir.with_name(out_dir.name + ".warm_start_vocab"))
            click.echo(f"train: the draft vocabulary is the drafter's own ({len(d2t):,} tokens, in {vocab})")
        vocab_differs = warm.check(drafter, vocab, aux, cfg["hidden_size"])
        if vocab_differs and warm_start_vocab == "check":
            raise StageError(f"--warm-start {warm_start}: {vocab_differs}. speculators would put this vocabulary's "
                             "d2t under the drafter's lm_head, so each row would predict another token. Fix: set "
                             "the var warm_start_vocab to rebuild (keeps the drafter's rows for the tokens in both "
                             "vocabularies, the verifier's lm_head rows for the new ones), or to adopt (train with the "
                             "drafter's own d2t/t2d), or train from scratch (warm_start: '')")

    params = {"data": prep["fingerprint"], "hidden_states": hs["fingerprint"] if hs else None, "vocab": voc["fingerprint"],
              "aux_layers": aux, "epochs": epochs, "lr": lr, "total_seq_len": total_seq_len,
              "loss": loss_implementation, "loss_fn": loss_fn, "max_steps": max_steps, "ttt_steps": ttt_steps,
              "extra": list(extra), "seed": seed,
              **({"warm_start": {"drafter": warm.fingerprint(drafter), "vocab": "adopted" if warm_start_vocab == "adopt" else "rebuilt" if vocab_differs else "same"}}
                 if drafter else {})}
    if not smoke_steps and manifest.is_complete(out_dir, params):
        click.echo(f"train: {out_dir} is complete ({manifest.read(out_dir)['counts']}); skipping")
        return
    under_torchrun = "LOCAL_RANK" in os.environ
    lead = int(os.environ.get("RANK", "0")) == 0  # rank 0, or the one process: it alone says and writes
    if not under_torchrun and not smoke_steps:  # once, before torchrun's ranks start: they must not race on the directory
        moved = manifest.claim(out_dir, "train", params)
        if moved:
            click.echo(f"train: {out_dir} was trained with other inputs or settings; moved to {moved}; "
                       "training afresh")
    if drafter is not None:
        if not under_torchrun:  # once, before torchrun's ranks start (they read it)
            warm.stage(drafter, vocab, model, out_dir / warm.STAGED, rebuild=bool(vocab_differs))
            if vocab_differs:
                click.echo(f"train: warm start drafter rebuilt for this vocabulary ({vocab_differs})")
        if lead:
            click.echo(f"train: warm start from {drafter} (staged in {out_dir / warm.STAGED})")
        drafter = out_dir / warm.STAGED
    before = completed_epochs(out_dir)
    if before and lead:
        click.echo(f"train: resuming after epoch {before[-1]} (checkpoints {before} in {out_dir})")

    attn = draft_attn_impl if draft_attn_impl != "auto" else ("sdpa" if device == "cpu" else "simple_flex_attention")
    workers = num_workers if num_workers is not None else (0 if device == "cpu" else 4)
    # Extraction trimmed rows at the serving length cap: its copy of the rows matches its hs files.
    rows = hidden_states / hs["extra"]["dataset"] if hs and hs.get("extra", {}).get("dataset") else data
    argv = speculators_argv(model=model, data=rows, hidden_states=hidden_states, vocab=vocab, out=out_dir, aux=aux,
                            draft_vocab_size=draft_vocab_size, epochs=epochs, lr=lr, seq_len=total_seq_len,
                            loss=loss_implementation, attn=attn, workers=workers, max_steps=max_steps,
                            ttt_steps=ttt_steps,
                            extra=["--loss-fn", loss_fn, "--seed", str(seed)]
                            + (["--trust-remote-code"] if trust_remote_code else [])
                            + (["--from-pretrained", str(drafter)] if drafter is not None else []) + list(extra))
    if (gpus > 1 if use_torchrun is None else use_torchrun) and not under_torchrun:
        cmd = torchrun_argv(gpus, out_dir, sys.argv[1:])
        click.echo(f"train: relaunching under torchrun on {gpus} {'processes (gloo)' if device == 'cpu' else 'GPU(s)'}: "
                   f"{' '.join(cmd[1:7])} ...")
        sys.stdout.flush()
        os.execvp(cmd[0], cmd)

    if device == "cpu":
        cpu_patches()
        torch.use_deterministic_algorithms(True, warn_only=True)  # cheap here; the demo's numbers repeat
    else:  # GPU memory spent on purpose, and no uncompiled flex attention (train_memory.py says why)
        train_memory.install_frozen_cast(echo=click.echo if lead else None)
        train_memory.set_compile_limits(ttt_steps)
    announce_plan()
    from speculators.train.cli import main as train_main
    from speculators.train.config import TrainConfig

    if lead:
        click.echo(f"train: speculators train {' '.join(argv)}")
    train_cfg = TrainConfig.resolve(argv)
    if acceptance_k > 0:
        acceptance.install_trainer_hook(out_dir=out_dir, verifier=model, data=data, hidden_states=hidden_states,
                                        k=acceptance_k, train_data_ratio=train_cfg.data.train_data_ratio,
                                        max_samples=acceptance_samples, echo=lambda m: click.echo(m, err=False),
                                        temperature=acceptance_temperature, top_p=acceptance_top_p)
    train_main(train_cfg)
    if int(os.environ.get("RANK", "0")) != 0:
        return
    if smoke_steps:
        n = _rows(data)
        click.echo(f"train: smoke passed: {smoke_steps} step(s) of this command on the first {n} samples' hidden "
                   f"states; the full training will start from the same arguments")
        import shutil
        shutil.rmtree(out_dir.parent, ignore_errors=True)  # <out>.smoke: a real target's drafter is GBs
        return
    done = completed_epochs(out_dir)
    if not done:
        raise StageError(f"{out_dir}: training ended without a checkpoint; see the errors above")
    # speculators exits 0 on SIGTERM after saving `interrupted/`: that is not a finished training.
    if max_steps is None and done[-1] < epochs - 1:
        raise StageError(f"{out_dir}: training stopped after epoch {done[-1] + 1} of {epochs} (interrupted); "
                         "run the stage again to resume from that checkpoint")
    last = out_dir / str(done[-1])
    common.check_drafter(last, cfg, aux)
    # A stable name for the serving stage; speculators' resume ignores symlinks.
    link = out_dir / DRAFTER_LINK
    tmp = out_dir / f".{DRAFTER_LINK}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(last.name)
    os.replace(tmp, link)
    files = [p for p in last.rglob("*") if p.is_file()]
    doc = manifest.write(out_dir, "train", files, params=params,
                         counts={"epochs_done": len(done), "last_epoch": done[-1]},
                         extra={"last_checkpoint": str(last), "drafter": str(last.relative_to(out_dir))})
    click.echo(f"train: done, drafter checkpoint {last} (manifest {doc['fingerprint']})")


if __name__ == "__main__":
    main()
