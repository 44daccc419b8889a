"""The figures a plan starts from, each with its source: the verifier's shape, the hosts' capacities,
the workload's priors.

The shape comes from the model's own config.json when it can be read (`from_config_json`); when the
host is out of reach (or the model not downloaded yet) from a small facts file kept with the profile,
`conf/facts/<profile>.yaml` (`load_facts`):

    model:     {name, architecture, layers, hidden_size, vocab_size, heads, kv_heads, head_dim,
                intermediate_size, experts, experts_per_token, kv_lora_rank, qk_rope_head_dim,
                quantization, weight_bytes}
    hosts:     {HOST: {gpu_memory_gib, disk_bytes, ram_gib}}      # capacities (absent: not checked)
    workload:  {sample_tokens: {value, source}, ...}              # priors about the data
    rates:     {train_tokens_per_s: {value, source}, ...}         # measured or prior throughputs

Every key is checked: an unknown one is an error naming the file and the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from eaglelab.errors import ConfigError

BF16 = 2


@dataclass(frozen=True)
class Figure:
    """A number with where it came from: arithmetic | prior | measured | config."""
    value: float
    source: str
    note: str = ""


@dataclass(frozen=True)
class ModelFacts:
    """The verifier's shape, as the drafter and a vLLM server see it."""
    name: str
    layers: int
    hidden_size: int
    vocab_size: int
    heads: int
    intermediate_size: int
    kv_heads: int = 0            # 0: = heads
    head_dim: int = 0            # the attention head size the DRAFTER gets (0: hidden_size // heads)
    experts: int = 0             # routed experts per MoE layer; 0: dense
    experts_per_token: int = 0
    kv_lora_rank: int = 0        # MLA: the latent a server caches per token and layer; 0: no MLA
    qk_rope_head_dim: int = 0    # MLA: the rope part cached beside the latent
    weight_bytes: int = 0        # the checkpoint on disk (what a server loads); 0: unknown
    quantization: str = "bf16"
    architecture: str = ""
    source: str = ""             # the file these figures came from

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.heads

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    def kv_bytes_per_token(self, tp: int = 1) -> float:
        """KV cache of one token on ONE GPU of a tensor-parallel server (bf16). MLA caches the latent
        + the rope key per layer, the same on every rank; dense attention splits its KV heads."""
        if self.mla:
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim) * BF16
        return 2 * self.layers * max(1, self.kv // tp) * self.attn_head_dim * BF16


@dataclass(frozen=True)
class HostFacts:
    gpu_memory_gib: float | None = None
    disk_bytes: float | None = None      # free disk where the outputs go
    ram_gib: float | None = None


@dataclass(frozen=True)
class Facts:
    model: ModelFacts
    hosts: dict[str, HostFacts] = field(default_factory=dict)
    workload: dict[str, Figure] = field(default_factory=dict)
    rates: dict[str, Figure] = field(default_factory=dict)
    source: str = ""

    def host(self, name: str) -> HostFacts:
        return self.hosts.get(name, HostFacts())


MLA_TYPES = ("deepseek_v3", "deepseek_v2", "kimi_k2")


def from_config_json(cfg: dict, weight_bytes: int = 0, source: str = "config.json", name: str = "") -> ModelFacts:
    """A Hugging Face config.json (a multimodal one: its text_config) -> ModelFacts.

    head_dim: the config's own when it has one; for DeepSeek-V3-type models transformers' built-in
    config class sets it to qk_rope_head_dim (64), which is what speculators then gives the drafter
    (measured: issue 29); DeepSeek's own config class (--trust-remote-code) sets none, and the
    drafter's head size becomes hidden_size // heads (112 for Kimi-K2.5: a wider attention)."""
    text = cfg.get("text_config") or cfg
    model_type = str(text.get("model_type") or cfg.get("model_type") or "")

    def need(key: str) -> int:
        if key not in text:
            raise ConfigError(f"{source}: no {key!r}; the planner needs the model's {key} (or a facts file "
                              f"conf/facts/<profile>.yaml with model.{key})")
        return int(text[key])

    head_dim = text.get("head_dim") or (text.get("qk_rope_head_dim") if model_type in MLA_TYPES else 0) or 0
    quant = (cfg.get("quantization_config") or text.get("quantization_config") or {}).get("quant_method")
    return ModelFacts(
        name=name or str(cfg.get("_name_or_path") or model_type), layers=need("num_hidden_layers"),
        hidden_size=need("hidden_size"), vocab_size=need("vocab_size"), heads=need("num_attention_heads"),
        intermediate_size=need("intermediate_size"), kv_heads=int(text.get("num_key_value_heads") or 0),
        head_dim=int(head_dim), experts=int(text.get("n_routed_experts") or text.get("num_local_experts")
                                            or text.get("num_experts") or 0),
        experts_per_token=int(text.get("num_experts_per_tok") or 0),
        kv_lora_rank=int(text.get("kv_lora_rank") or 0), qk_rope_head_dim=int(text.get("qk_rope_head_dim") or 0),
        weight_bytes=int(weight_bytes), quantization=str(quant or text.get("torch_dtype") or cfg.get("torch_dtype")
                                                         or "bf16"),
        architecture=",".join(cfg.get("architectures") or []), source=source)


def read_config_json(model_dir: Path) -> ModelFacts:
    """The model's own config.json, and its weights' bytes on disk (*.safetensors)."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read the model's config ({e}); give a facts file "
                          f"conf/facts/<profile>.yaml") from e
    size = sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))
    return from_config_json(cfg, size, str(path), name=Path(model_dir).name)


def _figure(raw, where: str) -> Figure:
    if isinstance(raw, dict):
        unknown = set(raw) - {"value", "source", "note"}
        if unknown or "value" not in raw:
            raise ConfigError(f"{where}: expected {{value, source, note}}, got keys {sorted(raw)}")
        raw_value, source, note = raw["value"], str(raw.get("source", "prior")), str(raw.get("note", ""))
    else:
        raw_value, source, note = raw, "prior", ""
    try:
        return Figure(float(raw_value), source, note)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {raw_value!r} is not a number") from e


def _strict(section: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")


def facts_from_dict(data: dict, source: str) -> Facts:
    _strict(data, {"model", "hosts", "workload", "rates"}, source)
    model_raw = dict(data.get("model") or {})
    names = {f.name for f in fields(ModelFacts)} - {"source"}
    _strict(model_raw, names, f"{source}: model")
    try:
        model = ModelFacts(**{"name": Path(source).name.split(".")[0], **model_raw, "source": source})
    except TypeError as e:
        raise ConfigError(f"{source}: model: {e} (needs layers, hidden_size, vocab_size, heads, "
                          f"intermediate_size)") from e
    hosts = {}
    for h, raw in (data.get("hosts") or {}).items():
        _strict(raw or {}, {"gpu_memory_gib", "disk_bytes", "ram_gib"}, f"{source}: hosts.{h}")
        hosts[h] = HostFacts(**{k: float(v) for k, v in (raw or {}).items()})
    workload = {k: _figure(v, f"{source}: workload.{k}") for k, v in (data.get("workload") or {}).items()}
    rates = {k: _figure(v, f"{source}: rates.{k}") for k, v in (data.get("rates") or {}).items()}
    return Facts(model, hosts, workload, rates, source)


def load_facts(path: Path) -> Facts:
    import yaml
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read the facts file ({e})") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with model/hosts/workload/rates")
    return facts_from_dict(data, str(path))
