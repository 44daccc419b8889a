"""Make the demo's target model here, from text already on the machine (no hub access needed).

A byte-level BPE tokenizer trained with `tokenizers` on local text (licenses, stdlib sources),
a Llama-3-style chat template with {% generation %} tags (so assistant masks work), and a tiny
random LlamaForCausalLM in bf16 saved in several safetensors shards, so that vLLM prints a real
`Loading safetensors checkpoint shards` bar. Also writes the demo's prompts (JSONL, one user turn
per row, stable ids) cut from the same text. Idempotent: skipped when its manifest says done.

    python -m eaglelab.stages.tiny_model --out data/demo/model --prompts-out data/demo/prompts.jsonl
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import click

from .. import manifest
from ..errors import StageError
from ..fsutil import atomic_write_bytes

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|eot_id|>", "<|pad|>"]

# Llama-3 layout; {% generation %} marks what the assistant says (HF assistant masks).
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- generation %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

DEFAULT_TEXT_GLOBS = ["/usr/share/common-licenses/*", f"{sys.base_prefix}/lib/python3*/[a-m]*.py"]


def corpus_files(globs: list[str], max_bytes: int) -> list[Path]:
    """Local text files, sorted (deterministic), up to max_bytes in total."""
    files: list[Path] = []
    total = 0
    for g in globs:
        base = Path(g).anchor or "."
        for p in sorted(Path(base).glob(str(Path(g).relative_to(base)))):
            if not p.is_file() or p.is_symlink():
                continue
            size = p.stat().st_size
            if total + size > max_bytes:
                continue
            files.append(p)
            total += size
    return files


def train_tokenizer(files: list[Path], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(f) for f in files], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
        pad_token="<|pad|>", chat_template=CHAT_TEMPLATE, model_max_length=4096)


def make_prompts(files: list[Path], n: int, seed: int, prefix: str = "demo") -> list[dict]:
    """n user turns cut from the corpus: 'Continue: <a sentence or two>'; ids are stable."""
    sentences: list[str] = []
    for f in files:
        text = f.read_text(errors="replace")
        for s in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", text)):
            if 40 <= len(s) <= 200 and s.isascii():
                sentences.append(s)
    if len(sentences) < n:
        raise StageError(f"only {len(sentences)} usable sentences in the corpus, {n} prompts wanted; "
                         "pass more --text-glob or fewer --num-prompts")
    rng = random.Random(seed)
    picked = rng.sample(sentences, n)
    verbs = ["Continue this text", "Explain in plain words", "Summarize", "Rewrite formally"]
    return [{"id": f"{prefix}-{i:04d}", "messages": [{"role": "user", "content": f"{verbs[i % len(verbs)]}: {s}"}]}
            for i, s in enumerate(picked)]


def deepseek_v3_config(tokenizer, hidden: int, layers: int, heads: int, intermediate: int, experts: int):
    """Kimi-K2.5's architecture class, scaled down: DeepSeek-V3 MoE with MLA (latent KV, split rope/nope
    heads), the first layer dense, the rest routed experts + a shared expert, sigmoid top-k routing."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate,
        moe_intermediate_size=max(intermediate // 4, 32), num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads, n_routed_experts=experts, n_shared_experts=1, num_experts_per_tok=min(4, experts),
        n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=hidden // 2, kv_lora_rank=hidden // 4,
        qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64, max_position_embeddings=16384,
        rope_theta=50000.0, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, torch_dtype="bfloat16")


def build_model(tokenizer, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, seed: int,
                arch: str = "llama", experts: int = 8):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if arch == "deepseek_v3":
        return AutoModelForCausalLM.from_config(
            deepseek_v3_config(tokenizer, hidden, layers, heads, intermediate, experts)).to(torch.bfloat16)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=4096, rope_theta=500000.0, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, torch_dtype="bfloat16")
    # HF's own init (std 0.02). Greedy decoding of such a model settles into short loops, a
    # pattern a drafter can learn in minutes: the demo then shows a real, non-zero acceptance.
    return LlamaForCausalLM(cfg).to(torch.bfloat16)


def sharpen(model, logit_scale: float) -> None:
    """Multiply every logit by `logit_scale`, through the final norm's weight (logits = lm_head(norm(h))):
    the argmax (greedy decoding) is the same and the softmax at temperature 1 is peaked. HF's init leaves a
    random model nearly uniform at T=1 (top-1 ~0.1% of 4,096 tokens), where speculative sampling keeps
    nothing; a power of two is exact in bf16, so greedy outputs stay identical token for token. The norm,
    not lm_head: an EAGLE-3 drafter copies the verifier's lm_head and keeps it frozen, and a x32 copy held
    the demo's pilot at 2% (from 13%); the verifier's norm it reads only to compute the verifier's targets."""
    import torch

    with torch.no_grad():
        model.model.norm.weight.mul_(logit_scale)


@click.command()
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="model directory")
@click.option("--prompts-out", type=click.Path(path_type=Path), default=None, help="write demo prompts JSONL here")
@click.option("--num-prompts", default=64, show_default=True)
@click.option("--eval-prompts-out", type=click.Path(path_type=Path), default=None,
              help="write held-out prompts for the eval stage here")
@click.option("--num-eval-prompts", default=8, show_default=True)
@click.option("--vocab-size", default=4096, show_default=True)
@click.option("--hidden", default=128, show_default=True)
@click.option("--layers", default=4, show_default=True)
@click.option("--heads", default=4, show_default=True)
@click.option("--kv-heads", default=2, show_default=True)
@click.option("--intermediate", default=256, show_default=True)
@click.option("--max-shard-size", default="1MB", show_default=True)
@click.option("--text-glob", "text_globs", multiple=True, help="text to train the tokenizer on (repeatable)")
@click.option("--max-text-bytes", default=3_000_000, show_default=True)
@click.option("--arch", type=click.Choice(["llama", "deepseek_v3"]), default="llama", show_default=True,
              help="deepseek_v3: a scaled-down MoE with MLA, Kimi-K2.5's architecture class")
@click.option("--experts", default=8, show_default=True, help="deepseek_v3: routed experts per MoE layer")
@click.option("--logit-scale", default=1.0, show_default=True,
              help="multiply the logits by this (the final norm's weight): argmax unchanged, a peaked distribution at T=1 (the demo: 32)")
@click.option("--seed", default=0, show_default=True)
@click.option("--force", is_flag=True, help="rebuild even if the manifest says done")
def main(out_dir: Path, prompts_out: Path | None, num_prompts: int, eval_prompts_out: Path | None,
         num_eval_prompts: int, vocab_size: int, hidden: int, layers: int,
         heads: int, kv_heads: int, intermediate: int, max_shard_size: str, text_globs: tuple[str, ...],
         max_text_bytes: int, arch: str, experts: int, logit_scale: float, seed: int, force: bool) -> None:
    """Make the tiny demo target model (and its prompts)."""
    if hidden % heads or heads % kv_heads:
        raise StageError(f"--hidden {hidden} must divide by --heads {heads}, and heads by --kv-heads {kv_heads}")
    if not logit_scale > 0:
        raise StageError(f"--logit-scale {logit_scale}: must be > 0 (a negative scale turns the argmax into the argmin)")
    params = dict(vocab_size=vocab_size, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
                  intermediate=intermediate, max_shard_size=max_shard_size, seed=seed,
                  **({"arch": arch, "experts": experts} if arch != "llama" else {}),
                  **({"logit_scale": logit_scale} if logit_scale != 1.0 else {}),
                  num_prompts=num_prompts if prompts_out else 0,
                  num_eval_prompts=num_eval_prompts if eval_prompts_out else 0)
    prompts_ok = all(p is None or p.is_file() for p in (prompts_out, eval_prompts_out))
    if not force and prompts_ok and manifest.is_complete(out_dir, params):
        click.echo(f"tiny_model: {out_dir} is complete (manifest {manifest.read(out_dir)['fingerprint']}); skipping")
        return

    files = corpus_files(list(text_globs) or DEFAULT_TEXT_GLOBS, max_text_bytes)
    if not files:
        raise StageError(f"no text found under {list(text_globs) or DEFAULT_TEXT_GLOBS}; pass --text-glob")
    click.echo(f"tiny_model: training a {vocab_size}-token byte-level BPE on {len(files)} local files")
    tokenizer = train_tokenizer(files, vocab_size)
    model = build_model(tokenizer, hidden, layers, heads, kv_heads, intermediate, seed, arch, experts)
    if logit_scale != 1.0:
        sharpen(model, logit_scale)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|end_of_text|>")]
    n_params = sum(p.numel() for p in model.parameters())

    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.safetensors"):
        old.unlink()  # a rebuild with other shard counts must not leave stale shards
    model.save_pretrained(out_dir, max_shard_size=max_shard_size)
    tokenizer.save_pretrained(out_dir)
    shards = sorted(out_dir.glob("*.safetensors"))
    click.echo(f"tiny_model: {n_params / 1e6:.2f} M parameters, {len(shards)} safetensors shards in {out_dir}")

    # One draw, then split: the eval prompts are never among the training prompts.
    drawn = make_prompts(files, num_prompts + num_eval_prompts, seed)
    for path, rows, prefix in ((prompts_out, drawn[:num_prompts], "demo"),
                               (eval_prompts_out, drawn[num_prompts:], "eval")):
        if path is None:
            continue
        for i, r in enumerate(rows):
            r["id"] = f"{prefix}-{i:04d}"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, "".join(json.dumps(p) + "\n" for p in rows).encode())
        click.echo(f"tiny_model: {len(rows)} prompts in {path}")

    written = [p for p in out_dir.iterdir() if p.is_file() and p.name != manifest.NAME]
    doc = manifest.write(out_dir, "tiny_model", written, params=params,
                         counts={"parameters": n_params, "shards": len(shards), "vocab": len(tokenizer),
                                 "prompts": num_prompts if prompts_out else 0},
                         extra={"prompts": str(prompts_out) if prompts_out else None})
    click.echo(f"tiny_model: done, manifest fingerprint {doc['fingerprint']}")


if __name__ == "__main__":
    main()
