"""FLOPs per token: the one set of formulas the worker (MFU/HFU), the estimate's records, the cost model's
roofline and the paper tables share (docs/method.md#flops).

Model FLOPs per token, forward (all ranks together; a matmul of m×k by k×n costs 2·m·k·n):
    2·L·W                       block matmuls, W = (2 + 2/g)·h² + 3·ffn·h weights per layer
  + 2·V·h                       LM head (embedding lookups are free); on by default for the full model, off
                                for a block benchmark (`layers` given)
  + L·4·S·n_h·d · c             attention scores QKᵀ and A·V, c = ½ for the causal mask (Megatron
                                `transformer_flops`, MaxText) or c = 1 (PaLM App. B, torchtitan, picotron)
Train = 3 × forward (backward = 2 × forward); this is PaLM's 6N + 12·L·H·Q·T when c = 1. Decode: one new
token's forward against seq_len cached tokens, whose attention covers all of them (c = 1).
Hardware FLOPs add what recompute re-executes: with recompute=full every block's forward runs again in
backward (the LM head is not checkpointed), counted with c = ½ since causal kernels skip masked tiles.
"""

from __future__ import annotations

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel.params import layer_weight_params, selective_reruns_kernel
from tspbench.predict.costmodel.workload import Workload

MODES = ("train", "forward", "decode")


def flops_per_token(
    model: ModelConfig,
    seq_len: int,
    *,
    mode: str = "train",
    causal_halved: bool = True,
    layers: int | None = None,
    include_lm_head: bool | None = None,
    recompute: bool = False,
) -> float:
    """Model FLOPs per token (module docstring). `layers`: a k-block benchmark (no LM head unless
    `include_lm_head`); `recompute`: one more forward in training (×4 instead of ×3, LM head included; the
    time model's convention for HFU of the blocks)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is unknown; allowed: {', '.join(MODES)}")
    n_layers = model.n_layers if layers is None else layers
    if include_lm_head is None:
        include_lm_head = layers is None
    halved = causal_halved and mode != "decode"
    attn = 4 * seq_len * model.n_heads * model.head_dim * (0.5 if halved else 1.0)
    fwd = n_layers * (2 * layer_weight_params(model) + attn)
    fwd += 2 * model.vocab_size * model.dim if include_lm_head else 0
    if mode != "train":
        return fwd
    return fwd * (4 if recompute else 3)


def hardware_flops_per_token(
    par: ParallelConfig,
    work: Workload,
    *,
    layers: int | None = None,
    include_lm_head: bool | None = None,
    causal_halved: bool = True,
) -> float:
    """FLOPs actually executed per token (HFU numerator; the time model's compute), over the replica:
    model FLOPs (causal halved) plus what the step re-executes (work.mode, par.recompute), as the estimate's FLOP
    counter sees it:
      flash backward   the kernel's backward recomputes the scores QKᵀ (five matmuls for the forward's two):
                       + ½ attention forward per layer in training
      recompute=full   every block forward again in backward, except (torch's non-reentrant checkpoint stops
                       once the last saved tensor is rebuilt) the block's last GEMM, W_down (2·ffn·h); TSP's MLP
                       is one autograd Function, so its replay runs whole
      selective        the attention kernel's forward again (4·S·n_h·d·½ per layer), except for tsp, whose
                       selective executes as none (docs/method.md#tsp-backward)
      op_sac           (published rows only: torchtitan's op-level SAC, activations.op_sac_saved_bytes) the forward
                       of the three projections it does not save, W_K, W_O and W_up (w3)
    tests/integration/test_estimate.py holds this equal to the counter for every scheme × recompute mode."""
    model, seq_len, mode = work.model, work.seq_len, work.mode
    n_layers = model.n_layers if layers is None else layers
    total = flops_per_token(
        model, seq_len, mode=mode, causal_halved=causal_halved, layers=layers, include_lm_head=include_lm_head
    )
    if mode != "train":
        return total
    attn = 4 * seq_len * model.n_heads * model.head_dim * (0.5 if causal_halved else 1.0)  # one layer's forward
    total += n_layers * attn / 2
    if par.recompute == "full":
        total += flops_per_token(model, seq_len, mode="forward", causal_halved=causal_halved, layers=n_layers)
        total -= n_layers * 2 * model.ffn_hidden * model.dim if par.scheme != "tsp" else 0.0
    if selective_reruns_kernel(par):
        total += n_layers * attn
    if par.recompute == "op_sac":  # torchtitan's op-level SAC replays the projections it did not save: wk, wo, w3
        total += n_layers * 2 * model.dim * (model.n_kv_heads * model.head_dim + model.n_heads * model.head_dim)
        total += n_layers * 2 * model.dim * model.ffn_hidden
    return total
