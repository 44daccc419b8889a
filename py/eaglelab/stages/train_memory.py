"""GPU memory and torch.compile settings of the train stage, chosen on purpose (issue 29).

At Kimi-K2.5's size on one H200 (bench/gpu_train_real.sh, bench/RESULTS.md "The drafter at its real
size"; the stage prints the bytes the first saves, 3.04 GiB there):

- Frozen weights in training's dtype. speculators builds the drafter in float32, so the verifier's
  embeddings (163,840 x 7168) and the two draft-vocabulary heads (lm_head and verifier_lm_head,
  32,000 x 7168 each; speculators 0.9 trains neither) held 6.5 GB in float32 on the GPU; in bf16
  (the dtype of the verifier's own checkpoint, so nothing is lost) 3.3 GB. Under autocast the heads
  were cast to bf16 at every use anyway.
- Dynamo's recompile limit. speculators compiles the drafter's forward on a GPU; its first decoder
  layer has a graph break inside, so that frame gets one variant per TTT step and mode (training,
  validation). Past the limit dynamo runs the frame uncompiled, and uncompiled flex attention
  materialises the whole score matrix (243 GiB at 18,432 tokens): the limit is raised to hold both
  modes' variants, and hitting it is an error naming it, never that silent fallback.
"""

from __future__ import annotations


def frozen_to_dtype(model, dtype) -> int:
    """Cast the model's frozen floating-point matrices (requires_grad False, 2-D or more) to `dtype`;
    the bytes this frees. Norm vectors stay as they are (tiny, and their float32 is what the norms
    compute in)."""
    import torch

    saved = 0
    for p in model.parameters():
        if p.requires_grad or not p.is_floating_point() or p.dim() < 2 or p.dtype == dtype:
            continue
        before = p.numel() * p.element_size()
        with torch.no_grad():
            p.data = p.data.to(dtype)
        saved += before - p.numel() * p.element_size()
    return saved


def install_frozen_cast(echo=None) -> None:
    """Before speculators' Trainer moves the drafter to the GPU, cast its frozen matrices to the
    training dtype (TrainerConfig.hidden_states_dtype, bf16)."""
    import speculators.train.trainer as trainer

    original = trainer.Trainer.setup_model

    def setup_model(self, *a, **k):
        saved = frozen_to_dtype(self.model, self.config.hidden_states_dtype)
        if echo and saved and getattr(self, "rank", 0) == 0:
            echo(f"train: frozen weights (verifier embeddings, lm_head) in {self.config.hidden_states_dtype}: "
                 f"{saved / 2**30:.2f} GiB less on the GPU")
        return original(self, *a, **k)

    trainer.Trainer.setup_model = setup_model


def recompile_limit(ttt_steps: int, current: int = 8) -> int:
    """Variants the draft decoder layer's frame needs: one per TTT step in training and in validation,
    plus 2 to spare; never below dynamo's own default."""
    return max(current, 2 * ttt_steps + 2)


def set_compile_limits(ttt_steps: int) -> int:
    """Raise dynamo's per-frame recompile limit to what training + validation need, and make hitting it
    an error (`FailOnRecompileLimitHit`) instead of an uncompiled fallback. Returns the limit."""
    import torch._dynamo.config as dynamo

    dynamo.recompile_limit = recompile_limit(ttt_steps, dynamo.recompile_limit)
    if hasattr(dynamo, "fail_on_recompile_limit_hit"):  # torch 2.11 and 2.13 have it
        dynamo.fail_on_recompile_limit_hit = True
    return dynamo.recompile_limit
