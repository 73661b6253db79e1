"""Shared by tests/hf: tiny Hugging Face configs (dicts, as in config.json: nothing is downloaded), Hugging Face
models built from them in float64, and the float64 context their forward needs.

Why `hf_float64`. transformers hard-codes float32 in three places of the Llama/Mistral forward: RMSNorm upcasts with
`.to(torch.float32)`, eager attention's softmax runs with `dtype=torch.float32`, and the rotary embedding computes
its inverse frequencies and angles with `dtype=torch.float`. For bf16 models that is an upcast; for a float64 model
it is a DOWNcast, which caps agreement with any float64 implementation at float32's ε ≈ 1e-7. Inside the context
`torch.float32` and `torch.float` name float64, so the same code runs at float64 precision and the comparison can
use the float64 tolerance (TOL_F64). test_hf_parity.py also compares without it, at float32's level.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

TOL_F64 = 1e-10
"""Normwise relative error max|a − b| / max|b| allowed between two float64 computations of the same model: they
differ only in operation order (GEMM blocking, the RoPE layout, the softmax's reduction, sums of sharded partials),
bounded by ≈ n·ε with n ≲ 10³ at these sizes, ≈ 2e-13; 1e-10 leaves margin and is ~10⁸ below what a wrong weight
layout produces (the broken variants below are off by O(1e-2 … 1)). The same value as tspbench.verify.case.TOL."""


@contextlib.contextmanager
def hf_float64() -> Iterator[None]:
    """Run transformers' code with its hard-coded float32 meaning float64 (module docstring)."""
    with mock.patch.object(torch, "float32", torch.float64), mock.patch.object(torch, "float", torch.float64):
        yield


def tiny(**over: Any) -> dict[str, Any]:
    """A tiny Llama config.json dict (GQA 4/2 heads, head_dim 8) with the given fields replaced."""
    d: dict[str, Any] = {
        "model_type": "llama",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 48,
        "vocab_size": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    }
    d.update(over)
    return d


LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,  # small, so the test's 24 positions span all three bands
}


def hf_model(config: dict[str, Any], seed: int = 0) -> torch.nn.Module:
    """The Hugging Face model of a config dict, random weights (seeded), float64, eager attention, built inside
    hf_float64 (the rotary inverse frequencies are computed at construction)."""
    import transformers

    cfg_cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig}[
        config.get("model_type", "llama")
    ]
    model_cls = {"llama": transformers.LlamaForCausalLM, "mistral": transformers.MistralForCausalLM}
    hf_cfg = cfg_cls(**{k: v for k, v in config.items() if k != "model_type"}, attn_implementation="eager")
    torch.manual_seed(seed)
    with hf_float64():
        model = model_cls[config.get("model_type", "llama")](hf_cfg).to(torch.float64)
    with torch.no_grad():  # transformers' std 0.02 makes attention near uniform (RoPE would hardly matter) and its
        for name, p in model.named_parameters():  # norms are 1 (a swapped norm would not show): re-draw them all
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 1.0 if "embed" in name else p.shape[-1] ** -0.5)
    return model


def batch(vocab: int, rows: int, seq: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Random input_ids and labels (= input_ids, Hugging Face's convention: shifted inside the loss)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, seq), generator=g)
    return ids, ids.clone()


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Normwise relative error max|got − want| / max|want| (tspbench.verify.case.check_tensor's measure)."""
    got, want = got.detach().double(), want.detach().double()
    if got.shape != want.shape:
        return float("inf")
    scale = want.abs().max().item()
    return (got - want).abs().max().item() / (scale if scale > 0 else 1.0)
