"""The train stage's GPU memory and compile settings (eaglelab.stages.train_memory, the estimate in
acceptance.py), checked on CPU with a tiny EAGLE-3 drafter where the mechanism can be seen.

On a GPU speculators wraps the drafter's forward in torch.compile; here the forward is compiled the
same way with a backend that counts the graphs dynamo makes. The crash of issue 29 was a count: the
acceptance estimate added its own variants of the draft decoder layer's frame, so validation's last
TTT step passed dynamo's recompile limit and ran flex attention uncompiled (243 GiB at 18,432
tokens). The real-size run is bench/gpu_train_real.py (bench/RESULTS.md)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from eaglelab.stages import acceptance, train_memory

HIDDEN, VOCAB, DRAFT_VOCAB, SEQ, K = 32, 96, 48, 16, 1


def tiny_drafter(seed: int = 0):
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    torch.manual_seed(seed)
    layer = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=4, head_dim=16, max_position_embeddings=256)
    layer._attn_implementation = "sdpa"  # CPU has no compiled flex attention; the frame count is the same
    verifier = VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"])
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=DRAFT_VOCAB, norm_before_residual=True,
        eagle_aux_hidden_state_layer_ids=[0, 1, 2],
        speculators_config=SpeculatorsConfig(algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(
            speculative_tokens=K)], default_proposal_method="greedy", verifier=verifier))
    model = Eagle3DraftModel(cfg)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[:DRAFT_VOCAB] = True
    model.load_vocab_mappings(t2d, torch.zeros(DRAFT_VOCAB, dtype=torch.long))
    with torch.no_grad():  # no verifier to load them from: random frozen weights
        for p in (model.embed_tokens.weight, model.lm_head.weight, model.verifier_lm_head.weight):
            p.normal_()
    return model


def batch(seed: int = 1) -> dict:
    from speculators.losses import resolve_loss_config

    g = torch.Generator().manual_seed(seed)
    return {"loss_config": resolve_loss_config("kl_div", "eager"),  # the fused loss is a GPU kernel
            "hidden_states": torch.randn(1, SEQ, 3 * HIDDEN, generator=g),
            "input_ids": torch.randint(0, VOCAB, (1, SEQ), generator=g),
            "document_ids": torch.zeros(1, SEQ, dtype=torch.long),
            "loss_mask": torch.ones(1, SEQ, dtype=torch.bool),
            "position_ids": torch.arange(1, SEQ + 1).unsqueeze(0),
            "verifier_last_hidden_states": torch.randn(1, SEQ, HIDDEN, generator=g)}


def held_out(n: int = 1):
    for i in range(n):
        b = batch(10 + i)
        yield i, {k: b[k][0] for k in ("hidden_states", "input_ids", "position_ids", "loss_mask",
                                       "verifier_last_hidden_states")}


@pytest.fixture
def compiled_forward(monkeypatch):
    """Eagle3DraftModel.forward under torch.compile, as speculators sets it on a GPU; the graphs counted."""
    from speculators.models.eagle3 import Eagle3DraftModel

    graphs: list[int] = []

    def counting(gm, example_inputs):
        graphs.append(1)
        return gm.forward  # run the captured graph as it is: the count is the point, not speed

    torch._dynamo.reset()
    monkeypatch.setattr(Eagle3DraftModel, "forward", torch.compile(Eagle3DraftModel.forward, backend=counting))
    yield graphs
    torch._dynamo.reset()


def run_estimate(monkeypatch, drafter, lm_head) -> dict:
    """acceptance.estimate_checkpoint, the train hook's own call, on in-memory stand-ins for the files."""
    monkeypatch.setattr(acceptance, "verifier_lm_head", lambda *a, **k: lm_head)
    monkeypatch.setattr(acceptance, "load_checkpoint", lambda *a, **k: drafter)
    monkeypatch.setattr(acceptance, "held_out_samples", lambda *a, **k: held_out())
    return acceptance.estimate_checkpoint(None, None, None, None, 0.9, None, K, torch.device("cpu"))


def test_the_estimate_adds_no_compiled_variant_so_validation_stays_compiled(compiled_forward, monkeypatch):
    graphs = compiled_forward
    model = tiny_drafter()
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):     # a training step as the trainer runs it
        _, loss, _ = model(**batch(), ttt_steps=K)
    loss.backward()
    trained = len(graphs)
    assert trained > 0

    # the hook's estimate: the checkpoint in training's dtype (bf16), as on a GPU
    estimated, lm_head = tiny_drafter(seed=3).to(torch.bfloat16), torch.randn(VOCAB, HIDDEN, dtype=torch.bfloat16)
    doc = run_estimate(monkeypatch, estimated, lm_head)
    assert doc["samples"] == 1 and doc["k"] == K
    assert len(graphs) == trained, "the estimate compiled variants of its own: it must run eagerly"

    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # validation: its own variants
        model(**batch(2), ttt_steps=K)
    with_validation = len(graphs)
    assert with_validation > trained

    # the counter sees the mechanism: compiled, the same estimate adds variants (issue 29's crash)
    acceptance.estimate(estimated, lm_head, held_out(), K)
    assert len(graphs) > with_validation


def test_the_estimate_keeps_nothing_resident(monkeypatch):
    drafter, lm_head = tiny_drafter(seed=4), torch.randn(VOCAB, HIDDEN)
    refs = [weakref.ref(drafter), weakref.ref(lm_head)]
    run_estimate(monkeypatch, drafter, lm_head)
    del drafter, lm_head
    monkeypatch.undo()  # the stand-ins held them too
    gc.collect()
    assert [r() for r in refs] == [None, None], "the estimate's drafter or lm_head outlived it"


def test_frozen_matrices_go_to_the_training_dtype_and_training_still_runs():
    model = tiny_drafter()
    frozen = {"embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight"}  # speculators freezes both heads
    sizes = {n: p.numel() for n, p in model.named_parameters() if n in frozen}
    saved = train_memory.frozen_to_dtype(model, torch.bfloat16)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert {n for n, d in dtypes.items() if d == torch.bfloat16} == frozen
    assert saved == 2 * sum(sizes.values())              # float32 -> bf16: 2 bytes an element
    assert dtypes["verifier_norm.weight"] == torch.float32 and dtypes["fc.weight"] == torch.float32
    assert train_memory.frozen_to_dtype(model, torch.bfloat16) == 0
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as the trainer runs it
        _, loss, _ = model(**batch(), ttt_steps=K)
    loss.backward()
    assert torch.isfinite(loss) and model.fc.weight.grad is not None and model.embed_tokens.weight.grad is None


def test_the_recompile_limit_holds_training_and_validation_and_fails_loudly():
    assert train_memory.recompile_limit(3) == 8            # 3 TTT steps x 2 modes + 2: dynamo's default
    assert train_memory.recompile_limit(5) == 12
    assert train_memory.recompile_limit(1, current=16) == 16
    with torch._dynamo.config.patch(recompile_limit=8, fail_on_recompile_limit_hit=False):
        assert train_memory.set_compile_limits(4) == 10
        assert torch._dynamo.config.recompile_limit == 10 and torch._dynamo.config.fail_on_recompile_limit_hit


def test_the_verifiers_next_tokens_a_chunk_at_a_time_are_the_whole_argmax():
    g = torch.Generator().manual_seed(5)
    norm, w = torch.nn.Identity(), torch.randn(VOCAB, HIDDEN, generator=g)
    for h in (torch.randn(17, HIDDEN, generator=g), torch.randn(1, 17, HIDDEN, generator=g)):
        whole = (h @ w.T).argmax(dim=-1)
        assert torch.equal(acceptance.verifier_next_tokens(h, norm, w, chunk=5), whole)
