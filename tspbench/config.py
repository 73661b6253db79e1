"""Typed configuration shared by every part of tspbench: the model (`ModelConfig`), the dtypes and modes, and
`ConfigError`. The parallel layout is tspbench.parallel (`ParallelConfig`, the scheme registry).

Every field has an attribute docstring. `validate_model` raises `ConfigError` (a `ValueError`) with one
actionable line naming the field and the allowed values; callers (verify, the runner) catch it and
print that line before any rank is spawned. This module is a leaf: it imports nothing of tspbench's but paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
GRAD_BUCKET_ELEMS = 2**25
"""Gradient all-reduce bucket (schemes/base.py ParallelModel.finish_grad_sync): at most 32M elements are
concatenated at once (Megatron's DDP default is 40M), so the sync never holds a second copy of all the gradients.
Here, not in schemes/, so that the cost model reads it without importing torch.distributed."""
GIB = 2**30
"""Bytes per GiB: records store memory in GiB (keys ending `_gib`; docs/records.md)."""
GB = 10**9
"""Bytes per GB: every printed table, the report and the paper state memory in decimal GB."""
GIB_TO_GB = GIB / GB
"""1 GiB = 1.073741824 GB."""
MODES = ("train", "forward", "decode")
"""train: forward + backward + AdamW; forward: one forward (prefill without a cache); decode: serving, a
KV-cache prefill of seq_len tokens, then one new token per step (schemes/ops/decode.py)."""


class ConfigError(ValueError):
    """A user mistake in the configuration; its message is one actionable line."""


@dataclass
class RopeScaling:
    """Llama 3.1's RoPE frequency scaling (Hugging Face `rope_type: llama3`): wavelengths longer than
    original_max_position_embeddings / low_freq_factor are divided by `factor`, those shorter than
    original_max_position_embeddings / high_freq_factor are kept, and the band between is interpolated smoothly.
    factor = 1 (the default) is plain RoPE: the formula is then the identity whatever the other three fields."""

    factor: float = 1.0
    """Divisor of the low frequencies (Llama 3.1: 8; 1: no scaling)."""
    low_freq_factor: float = 1.0
    """Wavelengths above original_max_position_embeddings / low_freq_factor are scaled fully (Llama 3.1: 1)."""
    high_freq_factor: float = 4.0
    """Wavelengths below original_max_position_embeddings / high_freq_factor are not scaled (Llama 3.1: 4)."""
    original_max_position_embeddings: int = 8192
    """The context length the model was pre-trained at (Llama 3.1: 8192)."""


@dataclass(frozen=True)
class Rope:
    """What RoPE needs besides the positions: the base and the optional frequency scaling (ModelConfig.rope)."""

    theta: float
    scaling: RopeScaling | None = None


@dataclass
class ModelConfig:
    """Llama-style decoder (docs/method.md#published; SwiGLU + RMSNorm + RoPE per docs/method.md#choice-activation)."""

    name: str = "tiny"
    """Label used in results and reports."""
    vocab_size: int = 256
    """Vocabulary size V (the paper does not state one; llama7b uses Llama-2's 32000)."""
    dim: int = 64
    """Hidden size h."""
    n_layers: int = 2
    """Number of decoder blocks L."""
    n_heads: int = 4
    """Query heads n_h; head dim d = dim / n_heads."""
    n_kv_heads: int = 4
    """Key/value heads n_kv (GQA ratio g = n_heads / n_kv_heads; equal to n_heads for MHA)."""
    ffn_hidden: int = 256
    """Intermediate size of the gated MLP (F·h; the paper's F = 4 gives 4·h)."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    rope_theta: float = 10000.0
    """RoPE base."""
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    """RoPE frequency scaling (Llama 3.1's `llama3` type: `model.rope_scaling.factor=8`; factor 1: plain RoPE)."""
    tie_embeddings: bool = False
    """The LM head shares the embedding's weight (Hugging Face `tie_word_embeddings`; Llama 3.2 1B/3B)."""
    sliding_window: int | None = None
    """Mistral's attention window (Hugging Face `sliding_window`). The model attends causally over the whole
    sequence, which equals a sliding window only when seq_len ≤ sliding_window: a longer sequence is refused
    (Transformer.forward). None: full causal attention (Llama, Mistral v0.3)."""

    def __post_init__(self) -> None:
        if isinstance(self.rope_scaling, dict):  # from YAML, JSON or a record's asdict()
            self.rope_scaling = RopeScaling(**self.rope_scaling)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def rope(self) -> Rope:
        """RoPE's base and scaling, as every attention module takes them (tspbench/model.py rope_cos_sin)."""
        return Rope(self.rope_theta, self.rope_scaling if self.rope_scaling.factor != 1.0 else None)

    @property
    def gqa_ratio(self) -> int:
        return self.n_heads // self.n_kv_heads


def model_preset(name: str) -> ModelConfig:
    """A model preset, conf/model/<name>.yaml, as a ModelConfig (the same file Hydra's `model=<name>` reads)."""
    import yaml

    from tspbench.paths import conf_dir

    path = conf_dir() / "model" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ConfigError(f"model={name!r} is unknown; allowed: {', '.join(known)}")
    data = {k: v for k, v in yaml.safe_load(path.read_text()).items() if k != "defaults"}
    return ModelConfig(**data)


def require_untied(m: ModelConfig, where: str) -> None:
    """Refuse tied embeddings where a scheme holds the embedding and the LM head as two different shardings."""
    _need(
        not m.tie_embeddings,
        f"model.tie_embeddings=true cannot be sharded by {where} (embedding and LM head sharded apart); allowed: "
        "vocab=replicated with scheme=single|tp|tp_msp|sp|tp_sp|tsp, or model.tie_embeddings=false",
    )


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def validate_model(m: ModelConfig) -> None:
    for f in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden"):
        _need(getattr(m, f) >= 1, f"model.{f}={getattr(m, f)} must be a positive integer")
    _need(m.dim % m.n_heads == 0, f"model.dim={m.dim} must be divisible by model.n_heads={m.n_heads}")
    _need(m.n_heads % m.n_kv_heads == 0, f"model.n_kv_heads={m.n_kv_heads} must divide model.n_heads={m.n_heads} (GQA)")
    _need(m.head_dim % 2 == 0, f"model.dim/n_heads={m.head_dim} must be even for RoPE")
    r = m.rope_scaling
    if r.factor != 1.0:
        _need(r.factor > 0, f"model.rope_scaling.factor={r.factor} must be > 0 (1: no scaling)")
        _need(
            0 < r.low_freq_factor < r.high_freq_factor,
            f"model.rope_scaling.low_freq_factor={r.low_freq_factor} and high_freq_factor={r.high_freq_factor} "
            "must satisfy 0 < low_freq_factor < high_freq_factor",
        )
        _need(
            r.original_max_position_embeddings >= 1,
            f"model.rope_scaling.original_max_position_embeddings={r.original_max_position_embeddings} must be ≥ 1",
        )
    _need(
        m.sliding_window is None or m.sliding_window >= 1,
        f"model.sliding_window={m.sliding_window} must be a positive integer or null (full causal attention)",
    )
