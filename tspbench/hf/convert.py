"""Hugging Face ↔ tspbench: configs and state dicts of Llama-family models (LlamaForCausalLM, MistralForCausalLM).

`model_config_from_hf` reads a transformers config (a PretrainedConfig or the dict of its config.json, transformers
4.x `rope_theta` + `rope_scaling` or 5.x `rope_parameters`) into a ModelConfig, refusing with one line whatever
tspbench/model.py cannot represent. `state_dict_from_hf` / `state_dict_to_hf` rename the parameters and permute the
q/k projection rows: our `apply_rope` rotates interleaved pairs (2i, 2i+1) (Meta's convention) while Hugging Face's
`rotate_half` pairs (i, i + d/2), so each head's rows are permuted exactly as transformers'
convert_llama_weights_to_hf.py `permute` does (and inverted on the way back).

Imports nothing of tspbench's but config, and no transformers: a PretrainedConfig is read through `to_dict()`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from tspbench.config import ConfigError, ModelConfig, RopeScaling

FAMILIES = ("llama", "mistral")
"""model_type values whose architecture tspbench/model.py computes exactly."""
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
DEFAULT_EPS = {"llama": 1e-6, "mistral": 1e-6}
"""transformers' rms_norm_eps default when config.json omits it."""


def _as_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    raise ConfigError(f"model config of type {type(config).__name__}: expected a transformers PretrainedConfig or dict")


def _rope(d: dict[str, Any]) -> tuple[float, RopeScaling]:
    """(rope_theta, scaling) from 4.x `rope_theta` + `rope_scaling` or 5.x `rope_parameters`."""
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in (None, "default"):
        scaling = RopeScaling()  # factor 1: none
    elif kind == "llama3":
        scaling = RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
    else:
        raise ConfigError(f"rope_scaling.rope_type={kind!r} is not supported; allowed: default, llama3")
    if float(params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))) != 1.0:
        raise ConfigError("partial_rotary_factor must be 1.0 (RoPE on the whole head); allowed: 1.0")
    return theta, scaling


def _refuse(d: dict[str, Any], key: str, ok: Any, allowed: str, why: str) -> None:
    if key in d and d[key] is not None and d[key] != ok:
        raise ConfigError(f"{key}={d[key]!r} is not supported ({why}); allowed: {allowed}")


def model_config_from_hf(config: Any, name: str | None = None) -> ModelConfig:
    """A transformers Llama or Mistral config (PretrainedConfig or config.json dict) → ModelConfig. Keys starting
    with '_' (e.g. a `_source` URL) are ignored. Raises ConfigError (one line) for what model.py cannot compute."""
    d = {k: v for k, v in _as_dict(config).items() if not k.startswith("_") or k == "_name_or_path"}
    family = d.get("model_type", "llama")
    if family not in FAMILIES:
        raise ConfigError(f"model_type={family!r} is not supported; allowed: {', '.join(FAMILIES)}")
    _refuse(d, "hidden_act", "silu", "silu", "the MLP is SwiGLU")
    _refuse(d, "attention_bias", False, "false", "projections have no bias")
    _refuse(d, "mlp_bias", False, "false", "projections have no bias")
    _refuse(d, "attention_dropout", 0.0, "0.0", "no dropout in the benchmarked step")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        if not isinstance(d.get(key), int):
            raise ConfigError(f"{key}={d.get(key)!r} must be a positive integer (the config.json field)")
    heads, dim = d["num_attention_heads"], d["hidden_size"]
    if d.get("head_dim") not in (None, dim // heads) or dim % heads:
        raise ConfigError(
            f"head_dim={d.get('head_dim')} must equal hidden_size / num_attention_heads = {dim}/{heads}; "
            "allowed: an integer hidden_size / num_attention_heads"
        )
    window = d.get("sliding_window") if family == "mistral" else None
    theta, scaling = _rope(d)
    return ModelConfig(
        name=name or str(d.get("_name_or_path") or family).rstrip("/").rpartition("/")[2] or family,
        vocab_size=d["vocab_size"],
        dim=dim,
        n_layers=d["num_hidden_layers"],
        n_heads=heads,
        n_kv_heads=d.get("num_key_value_heads") or heads,
        ffn_hidden=d["intermediate_size"],
        norm_eps=float(d.get("rms_norm_eps", DEFAULT_EPS[family])),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_embeddings=bool(d.get("tie_word_embeddings", False)),
        sliding_window=int(window) if window is not None else None,
    )


def hf_config_from_model(cfg: ModelConfig, family: str = "llama", max_position_embeddings: int = 0) -> dict:
    """The config.json dict of the Hugging Face model equal to `cfg` (transformers 4.x keys, which 5.x reads too):
    `LlamaConfig(**d)` / `MistralConfig(**d)`. max_position_embeddings: 0 takes 8·original context with llama3
    scaling, else 4096 (RoPE here has no table, so it only feeds transformers' own checks)."""
    if family not in FAMILIES:
        raise ConfigError(f"family={family!r} is not supported; allowed: {', '.join(FAMILIES)}")
    if cfg.sliding_window is not None and family != "mistral":
        raise ConfigError(f"model.sliding_window={cfg.sliding_window} needs family=mistral; allowed: mistral")
    r = cfg.rope_scaling
    scaled = r.factor != 1.0
    max_pos = max_position_embeddings or (r.original_max_position_embeddings * int(r.factor) if scaled else 4096)
    out: dict[str, Any] = {
        "architectures": [ARCHITECTURES[family]],
        "model_type": family,
        "hidden_act": "silu",
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn_hidden,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": max_pos,
        "attention_dropout": 0.0,
    }
    if scaled:
        out["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": r.factor,
            "low_freq_factor": r.low_freq_factor,
            "high_freq_factor": r.high_freq_factor,
            "original_max_position_embeddings": r.original_max_position_embeddings,
        }
    if family == "llama":
        out.update(attention_bias=False, mlp_bias=False)
    else:
        out["sliding_window"] = cfg.sliding_window
    return out


# ---- state dicts -------------------------------------------------------------------------------------------
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attention.wq": "self_attn.q_proj.weight",
    "attention.wk": "self_attn.k_proj.weight",
    "attention.wv": "self_attn.v_proj.weight",
    "attention.wo": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.w_gate": "mlp.gate_proj.weight",
    "mlp.w_up": "mlp.up_proj.weight",
    "mlp.w_down": "mlp.down_proj.weight",
}
_TOP = {
    "embed.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}


def hf_name(name: str) -> str:
    """Our parameter name → Hugging Face's (`layers.3.attention.wq` → `model.layers.3.self_attn.q_proj.weight`)."""
    if name in _TOP:
        return _TOP[name]
    _, i, rest = name.split(".", 2)
    return f"model.layers.{i}.{_LAYER[rest]}"


def rope_to_hf(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of a q/k projection, interleaved-pair order → rotate_half order, per head (transformers'
    convert_llama_weights_to_hf.py `permute`): head row 2i → i, 2i+1 → d/2 + i."""
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def rope_from_hf(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of `rope_to_hf`."""
    rows, cols = w.shape
    return w.view(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def _heads(name: str, cfg: ModelConfig) -> int | None:
    """Heads of a q/k projection (its rows are permuted), None for every other parameter."""
    return cfg.n_heads if name.endswith("attention.wq") else cfg.n_kv_heads if name.endswith("attention.wk") else None


def our_names(cfg: ModelConfig) -> list[str]:
    """Our Transformer's parameter names (lm_head.weight included also when tied: state_dict() lists both)."""
    layer = [f"layers.{i}.{k}" for i in range(cfg.n_layers) for k in _LAYER]
    return ["embed.weight", *layer, "norm.weight", "lm_head.weight"]


def state_dict_from_hf(hf_sd: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A LlamaForCausalLM / MistralForCausalLM state dict → our Transformer's (q/k rows back to interleaved pairs).
    With tied embeddings a missing lm_head.weight is the embedding (both keys then name one tensor)."""
    out: dict[str, torch.Tensor] = {}
    for name in our_names(cfg):
        key = hf_name(name)
        if name == "lm_head.weight" and cfg.tie_embeddings:
            out[name] = out["embed.weight"]
            continue
        if key not in hf_sd:
            raise KeyError(f"{key} is missing from the Hugging Face state dict (needed for {name})")
        heads = _heads(name, cfg)
        out[name] = rope_from_hf(hf_sd[key], heads) if heads else hf_sd[key]
    return out


def state_dict_to_hf(sd: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our Transformer's state dict → LlamaForCausalLM's / MistralForCausalLM's (q/k rows in rotate_half order)."""
    out: dict[str, torch.Tensor] = {}
    for name in our_names(cfg):
        if name == "lm_head.weight" and cfg.tie_embeddings:
            out[hf_name(name)] = out[hf_name("embed.weight")]
            continue
        heads = _heads(name, cfg)
        out[hf_name(name)] = rope_to_hf(sd[name], heads) if heads else sd[name]
    return out
