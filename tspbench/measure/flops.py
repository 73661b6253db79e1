"""FLOPs per token, peak FLOPs by device name, MFU and HFU (anchors.md §1.3, §1.6, §4.1).

Model FLOPs per token, forward (all ranks together; a matmul of m×k by k×n costs 2·m·k·n):
    2·L·W                       block matmuls, W = (2 + 2/g)·h² + 3·ffn·h weights per layer
  + 2·V·h                       LM head (embedding lookups are free)
  + L·4·S·n_h·d · c             attention scores QKᵀ and A·V, c = ½ for the causal mask (Megatron
                                `transformer_flops`, MaxText) or c = 1 (PaLM App. B, torchtitan, picotron)
Train = 3 × forward (backward = 2 × forward); this is PaLM's 6N + 12·L·H·Q·T when c = 1.
Hardware FLOPs add what recompute re-executes: with recompute=full every block's forward runs again in
backward (the LM head is not checkpointed), counted with c = ½ since causal kernels skip masked tiles.

MFU = FLOPs/token × tokens/s ÷ (peak × world size). The peak comes from a table keyed by device name
(torchtitan `get_peak_flops`, bf16 dense) and every record stores the value and its source (style rule
17); a device not in the table gets `None` with a reason, never a guess.
"""
from __future__ import annotations

from typing import Optional

from tspbench.config import ModelConfig


def layer_weight_params(m: ModelConfig) -> int:
    """W: matmul weights of one block (Q, K, V, O + gate, up, down)."""
    h, d = m.dim, m.head_dim
    return 2 * h * m.n_heads * d + 2 * h * m.n_kv_heads * d + 3 * m.ffn_hidden * h


def forward_flops_per_token(m: ModelConfig, seq_len: int, causal_halved: bool) -> float:
    attn = 4 * seq_len * m.n_heads * m.head_dim * (0.5 if causal_halved else 1.0)
    return m.n_layers * (2 * layer_weight_params(m) + attn) + 2 * m.vocab_size * m.dim


def flops_per_token(m: ModelConfig, seq_len: int, mode: str, causal_halved: bool) -> float:
    """Model FLOPs per token (MFU numerator): forward, or 3 × forward for train. Decode: one new token's
    forward against a context of seq_len cached tokens, whose attention covers all of them (no causal
    halving for a single query)."""
    if mode == "decode":
        return forward_flops_per_token(m, seq_len, causal_halved=False)
    fwd = forward_flops_per_token(m, seq_len, causal_halved)
    return fwd if mode == "forward" else 3 * fwd


def hardware_flops_per_token(m: ModelConfig, seq_len: int, mode: str, recompute: str) -> float:
    """FLOPs actually executed (HFU numerator): model FLOPs (causal halved) + recomputed block forwards."""
    total = flops_per_token(m, seq_len, mode, causal_halved=True)
    if mode == "train" and recompute == "full":
        total += forward_flops_per_token(m, seq_len, True) - 2 * m.vocab_size * m.dim
    return total


# (substring of the device name, bf16 dense peak FLOP/s, source). Order matters: first match wins.
PEAK_FLOPS: list[tuple[str, float, str]] = [
    ("GB300", 2.5e15, "torchtitan get_peak_flops (GB300, bf16 dense)"),
    ("GB200", 2.5e15, "torchtitan get_peak_flops (GB200, bf16 dense)"),
    ("B300", 2.25e15, "torchtitan get_peak_flops (B300, bf16 dense)"),
    ("B200", 2.25e15, "torchtitan get_peak_flops (B200, bf16 dense)"),
    ("H200", 989e12, "torchtitan get_peak_flops (H200, bf16 dense)"),
    ("H100 NVL", 835e12, "torchtitan get_peak_flops (H100 NVL, bf16 dense)"),
    ("H100 PCIe", 756e12, "torchtitan get_peak_flops (H100 PCIe, bf16 dense)"),
    ("H100", 989e12, "torchtitan get_peak_flops (H100 SXM, bf16 dense)"),
    ("A100", 312e12, "torchtitan get_peak_flops (A100, bf16 dense)"),
    ("L40S", 362e12, "torchtitan get_peak_flops (L40S, bf16 dense)"),
    ("MI355X", 2500e12, "torchtitan get_peak_flops (MI355X, bf16 dense)"),
    ("MI325X", 1300e12, "torchtitan get_peak_flops (MI325X, bf16 dense)"),
    ("MI300X", 1300e12, "torchtitan get_peak_flops (MI300X, bf16 dense)"),
    ("MI250X", 191.5e12, "torchtitan get_peak_flops (MI250X per GCD, bf16 dense)"),
]


def peak_flops(device_name: Optional[str], device_type: str) -> tuple[Optional[float], str]:
    """(peak FLOP/s per device, source) or (None, reason)."""
    if device_type == "cpu":
        return None, "no peak-FLOPs entry for CPU: MFU is not meaningful for gloo/CPU runs"
    for key, value, source in PEAK_FLOPS:
        if device_name and key.lower() in device_name.lower():
            return value, source
    return None, f"device {device_name!r} is not in the peak-FLOPs table (tspbench.measure.flops.PEAK_FLOPS)"


def mfu_pct(flops_token: float, tokens_per_s: Optional[float], peak: Optional[float],
            world_size: int) -> Optional[float]:
    if tokens_per_s is None or peak is None:
        return None
    return 100.0 * flops_token * tokens_per_s / (peak * world_size)
