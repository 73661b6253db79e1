"""Closed-form cost model: per-device memory, per-layer communication volume, FLOPs.

Nothing here is fitted to the paper. Every term is written out with its source; tsp-method.md §4–§5 and
anchors.md §4 are the references. Time (α–β + roofline) and hardware profiles live in `costmodel_time.py`
and are re-exported here (`step_time`, `cluster_throughput`, `HardwareProfile`, `load_hardware`).

Notation (tsp-method.md §2): B micro-batch, S sequence, h hidden, L layers, n_h / n_kv heads, g = n_h/n_kv,
ffn = F·h the gated-MLP width, V vocabulary; T tensor degree, Σ sequence degree, D TSP degree.

Parameters (Llama block, SwiGLU, RMSNorm, untied LM head, tsp-method.md §4):
    per layer   W = (2 + 2/g)·h² [Q, K, V, O]  +  3·ffn·h [gate, up, down]      (+ 2h RMSNorm weights)
    replicated  2·V·h [embedding + untied LM head] + (2L + 1)·h [norms]  -- on every rank, in every scheme
    sharded     W / T for tp, tp_msp, tp_sp;  W / D for tsp;  not at all for sp (weights replicated)

Model state bytes per parameter k (AdamW): dtype weights + grad_dtype grads + fp32 m, v (+ fp32 master when
the weights are 16-bit and master_fp32): bf16 → 2 + 2 + 8 + 4 = 16; with fp32 grads 18 (Megatron).

Activations (Korthikanti et al. 2022, Table 2, re-derived for a Llama block with flash/SDPA attention, so
no 5·a·s² softmax term and no dropout masks). Elements saved per token per layer:
    token-wise, replicated over the TP axis     4h   = attn-norm input, QKV input, MLP-norm input, MLP input
    head/channel-sharded over the TP axis       (1 + 2/g)·h [Q, K, V saved by SDPA] + h [attention output]
                                                + 4·ffn [gate, up, silu(gate), gate·up as saved by eager autograd]
    (+ n_h fp32 log-sum-exp values)
For h = 4096, g = 1, ffn = 4h this is 48·s·b·h bytes in bf16 (Korthikanti's 34 assumes a GeLU MLP with
dropout). Token-wise tensors are divided by Σ (sp, tp_sp) or D (tsp) and, for tp_msp (Megatron-SP), the
replicated part by T; sharded tensors are divided by T (tp, tp_msp, tp_sp). A TSP rank applies every weight
shard to its own tokens, so all of its terms are simply ÷D. Full recompute keeps only each layer's input
(h per local token), Korthikanti's 2·s·b·h, and rebuilds one layer at a time in backward.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tspbench.config import ModelConfig, ParallelConfig

BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
MEMORY_KEYS = ("params", "grads", "optimizer", "activations", "temporaries", "comm_buffers", "kv_cache")


# ---------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Layout:
    """How one scheme divides a replica's work over its `degree` ranks."""

    tp: int          # T: tensor axis (weight/head sharding); D for tsp
    sp: int          # Σ: sequence axis (token sharding); D for tsp
    weight_div: int  # per-layer weights held by a rank = W / weight_div
    seq_div: int     # token-wise tensors hold B·S / seq_div tokens
    head_div: int    # head/channel-sharded activations are further ÷ head_div (1 for tsp: a rank does all heads)
    rep_div: int     # TP-replicated token-wise activations ÷ rep_div (T for Megatron-SP)
    loss_div: int    # the (replicated) LM head runs on B·S / loss_div tokens per rank


def layout(par: ParallelConfig) -> Layout:
    d, s = par.degree, par.scheme
    if s == "single":
        return Layout(1, 1, 1, 1, 1, 1, 1)
    if s == "tp":
        return Layout(d, 1, d, 1, d, 1, 1)
    if s == "tp_msp":
        return Layout(d, 1, d, 1, d, d, d)
    if s == "sp":
        return Layout(1, d, 1, d, 1, 1, d)
    if s == "tp_sp":
        t, sig = par.tp_degree, par.sp_degree
        return Layout(t, sig, t, sig, t, 1, sig)
    if s == "tsp":
        return Layout(d, d, d, d, 1, 1, d)
    raise ValueError(f"scheme={s!r} is unknown")


# ---------------------------------------------------------------------------------------------- params
def layer_weight_params(model: ModelConfig) -> int:
    """W: matmul parameters of one block, (2 + 2/g)·h² + 3·ffn·h (norm weights excluded)."""
    h, d = model.dim, model.head_dim
    attn = h * model.n_heads * d * 2 + h * model.n_kv_heads * d * 2      # Q, O + K, V
    return attn + 3 * model.ffn_hidden * h                                # + gate, up, down


def non_embedding_params(model: ModelConfig) -> int:
    """L·W: 8,589,934,592 for llama7b (tsp-method.md §4)."""
    return model.n_layers * layer_weight_params(model)


def replicated_params(model: ModelConfig, layers: int | None = None) -> int:
    """Held in full by every rank of every scheme: RMSNorm weights, and (full model only) embedding + LM head."""
    if layers is not None:
        return 2 * model.dim * layers
    return (2 * model.n_layers + 1) * model.dim + 2 * model.vocab_size * model.dim


def params_per_device(model: ModelConfig, par: ParallelConfig, layers: int | None = None) -> float:
    n_layers = model.n_layers if layers is None else layers
    return n_layers * layer_weight_params(model) / layout(par).weight_div + replicated_params(model, layers)


def state_bytes_per_param(dtype: str = "bfloat16", optimizer: str = "adamw", master_fp32: bool = True,
                          grad_dtype: str | None = None, mode: str = "train") -> dict[str, int]:
    """k split into params / grads / optimizer bytes (16 = 2 + 2 + 12 for bf16 AdamW, 18 with fp32 grads)."""
    if mode == "forward":
        return {"params": BYTES[dtype], "grads": 0, "optimizer": 0}
    if optimizer == "adamw":
        opt = 8 + (4 if master_fp32 and BYTES[dtype] < 4 else 0)    # fp32 m, v (+ fp32 master copy)
    elif optimizer == "sgd":
        opt = 0                                                      # plain SGD keeps no state
    else:
        raise ValueError(f"optimizer={optimizer!r} is unknown; allowed: adamw, sgd")
    return {"params": BYTES[dtype], "grads": BYTES[grad_dtype or dtype], "optimizer": opt}


# ---------------------------------------------------------------------------------------------- memory
def activation_elems_per_token(model: ModelConfig) -> tuple[float, float]:
    """(replicated-over-TP, head/channel-sharded) elements saved per token per layer (module docstring)."""
    h, g = model.dim, model.gqa_ratio
    replicated = 4 * h                                       # 2 norm inputs + QKV input + MLP input
    sharded = (1 + 2 / g) * h + h + 4 * model.ffn_hidden     # Q,K,V + attn out + gate, up, silu, product
    return replicated, sharded


def layer_activation_bytes(model: ModelConfig, par: ParallelConfig, seq_len: int, batch: int,
                           dtype: str = "bfloat16") -> float:
    """Everything one block saves for backward on one rank, without recompute."""
    lay, b = layout(par), BYTES[dtype]
    tokens = batch * seq_len / lay.seq_div
    rep, shard = activation_elems_per_token(model)
    lse_bytes = tokens * model.n_heads / lay.head_div * 4    # fp32 log-sum-exp from flash/SDPA
    return tokens * (rep / lay.rep_div + shard / lay.head_div) * b + lse_bytes


def comm_buffer_bytes(model: ModelConfig, par: ParallelConfig, seq_len: int, batch: int,
                      dtype: str = "bfloat16") -> float:
    """Largest transient communication buffers of one layer (tsp-method.md §4 table, last column)."""
    lay, b, h, g = layout(par), BYTES[dtype], model.dim, model.gqa_ratio
    tokens = batch * seq_len
    s = par.scheme
    if s == "tp":
        return tokens * h * b                                       # all-reduce of the row-parallel output
    if s == "tp_msp":
        return tokens * h * b                                       # all-gathered full-sequence GEMM input
    if s == "sp":
        return 2 * tokens * (h / g) * b                             # all-gathered full K/V
    if s == "tp_sp":
        tp_ar = tokens / lay.sp * h if lay.tp > 1 else 0.0          # TP all-reduce on the local tokens
        kv = 2 * tokens * h / (g * lay.tp) if lay.sp > 1 else 0.0   # full-sequence K/V of the local heads
        return (tp_ar + kv) * b
    if s == "tsp":
        d, ffn = par.degree, model.ffn_hidden
        attn_shard = (2 + 2 / g) * h * h / d                        # packed W_Q, W_K, W_V, W_O of one owner
        ring = 2 * 3 * ffn * h / d                                  # two MLP ring buffers (double buffering)
        kv = 2 * tokens * (h / g) / d                               # gathered K/V of one owner's heads
        return (attn_shard + ring + kv) * b
    return 0.0


def memory_breakdown(model: ModelConfig, par: ParallelConfig, seq_len: int, batch: int, *,
                     mode: str = "train", dtype: str = "bfloat16", optimizer: str = "adamw",
                     master_fp32: bool = True, grad_dtype: str | None = None,
                     kv_cache: bool = True) -> dict[str, float]:
    """Predicted peak bytes per device, by category, and their sum as `total`.

    The peak is modelled as the sum of the categories: model state + stored activations + the largest
    transient (the fp32 logits for the loss, or one layer's working set, whichever is larger) + one layer's
    communication buffers. `mode="forward"` keeps no grads, optimizer state or stored activations (only one
    layer's working set and bf16 logits) and, with `kv_cache=True`, a KV cache as in prefill.
    """
    if mode not in ("train", "forward"):
        raise ValueError(f"mode={mode!r} is unknown; allowed: train, forward")
    lay, b = layout(par), BYTES[dtype]
    n_dev = params_per_device(model, par)
    k = state_bytes_per_param(dtype, optimizer, master_fp32, grad_dtype, mode)
    out = {key: n_dev * k[key] for key in ("params", "grads", "optimizer")}

    layer_bytes = layer_activation_bytes(model, par, seq_len, batch, dtype)
    loss_tokens = batch * seq_len / lay.loss_div
    head_input_bytes = 2 * loss_tokens * model.dim * b              # final-norm input + LM-head input
    if mode == "train":
        if par.recompute == "full":
            ckpt_tokens = batch * seq_len / lay.seq_div / lay.rep_div   # each layer's (sharded) input only
            out["activations"] = model.n_layers * ckpt_tokens * model.dim * b + head_input_bytes
        else:
            out["activations"] = model.n_layers * layer_bytes + head_input_bytes
        logits_bytes = loss_tokens * model.vocab_size * 4           # fp32 logits for the cross-entropy
        # one layer's transients: its recomputed activations (full) or the gradients flowing back (none)
        out["temporaries"] = max(logits_bytes, layer_bytes)
        out["kv_cache"] = 0.0
    else:
        out["activations"] = 0.0
        out["temporaries"] = max(loss_tokens * model.vocab_size * b, layer_bytes)
        kv_tokens = batch * seq_len / lay.seq_div
        out["kv_cache"] = (2 * model.n_layers * kv_tokens * (model.dim / model.gqa_ratio) / lay.head_div * b
                           if kv_cache else 0.0)
    out["comm_buffers"] = comm_buffer_bytes(model, par, seq_len, batch, dtype)
    out = {key: float(out[key]) for key in MEMORY_KEYS}
    out["total"] = sum(out.values())
    return out


# ---------------------------------------------------------------------------------------------- comm
def comm_per_layer(model: ModelConfig, par: ParallelConfig, seq_len: int, batch: int, *,
                   mode: str = "forward", regather_kv: bool = False) -> dict:
    """Elements received per device per layer, by kind (tsp-method.md §5), plus per-step `grad_sync`.

    Forward (bandwidth-optimal collectives, N = B·S):
        tp, tp_msp  activations 4·N·h·(T−1)/T          (2 all-reduces, or 2 all-gather + reduce-scatter pairs)
        sp          kv          2·N·(h/g)·(Σ−1)/Σ      (all-gather of K and V)
        tp_sp       activations 4·(N/Σ)·h·(T−1)/T  +  kv 2·N·(h/(g·T))·(Σ−1)/Σ
        tsp         weights     W·(D−1)/D              (attention broadcasts + MLP ring)
                    kv          2·N·(h/g)·(D−1)/D
    Backward, no recompute: TP repeats its all-reduces; SP/TP×SP reduce-scatter dK/dV (= kv); TSP re-sends
    the weights (W) and reduces the weight gradients to their owners (W) and reduce-scatters dK/dV (K), so
    TSP is 3W + 2K forward + backward. `regather_kv=True` adds one K/V all-gather to the backward of
    sp/tp_sp/tsp (tsp-method.md A7 default; §5's 3W + 2K omits it). Full recompute adds one more forward.
    `grad_sync` is per step, not per layer: the all-reduce over the group of gradients that ranks holding
    different tokens compute for the same weights (ring all-reduce: 2·n·(p−1)/p received).
    """
    lay, h, g, n = layout(par), model.dim, model.gqa_ratio, batch * seq_len
    zero = {"weights": 0.0, "kv": 0.0, "activations": 0.0}
    fwd = dict(zero)
    s = par.scheme
    if s in ("tp", "tp_msp", "tp_sp"):
        fwd["activations"] = 4 * (n / lay.sp) * h * (lay.tp - 1) / lay.tp
    if s in ("sp", "tp_sp"):
        fwd["kv"] = 2 * n * h / (g * lay.tp) * (lay.sp - 1) / lay.sp
    if s == "tsp":
        d = par.degree
        fwd["weights"] = layer_weight_params(model) * (d - 1) / d
        fwd["kv"] = 2 * n * (h / g) * (d - 1) / d

    bwd = dict(zero)
    if mode == "train":
        bwd["activations"] = fwd["activations"]                 # TP: all-reduces (or AG/RS) mirrored
        bwd["kv"] = fwd["kv"] * (2 if regather_kv else 1)       # dK/dV reduce-scatter (+ re-gather)
        bwd["weights"] = 2 * fwd["weights"]                     # TSP: weight re-send + weight-grad reduce
        if par.recompute == "full":
            bwd = {key: bwd[key] + fwd[key] for key in bwd}     # one more forward's worth
    elif mode != "forward":
        raise ValueError(f"mode={mode!r} is unknown; allowed: train, forward")

    return {"fwd": fwd, "bwd": bwd, "fwd_total": sum(fwd.values()), "bwd_total": sum(bwd.values()),
            "grad_sync": grad_sync_elems(model, par) if mode == "train" else 0.0}


def grad_sync_group(model: ModelConfig, par: ParallelConfig, layers: int | None = None) -> tuple[float, int]:
    """(elements all-reduced, group size) of the per-step in-group gradient all-reduce (not DP).

    Ranks that see different tokens produce different partial gradients of a weight they share:
    sp all-reduces every gradient over Σ; tp_sp the T-sharded weights and replicated ones over Σ; tsp the
    replicated norm/embedding/LM-head weights over D; tp_msp the norm weights over T (tokens differ in the
    norms). tp and single need none (all TP ranks see the same tokens).
    """
    lay, s = layout(par), par.scheme
    n_layers = model.n_layers if layers is None else layers
    if s in ("sp", "tp_sp"):
        return n_layers * layer_weight_params(model) / lay.tp + replicated_params(model, layers), lay.sp
    if s == "tsp":
        return replicated_params(model, layers), par.degree
    if s == "tp_msp":
        return 2 * model.dim * n_layers, par.degree
    return 0.0, 1


def grad_sync_elems(model: ModelConfig, par: ParallelConfig, layers: int | None = None) -> float:
    """Per-step elements received per device by the in-group gradient ring all-reduce: 2·n·(p−1)/p."""
    n, p = grad_sync_group(model, par, layers)
    return 2 * n * (p - 1) / p


def crossover_tokens(model: ModelConfig, degree: int, mode: str = "forward") -> int:
    """Smallest B·S at which TSP's per-layer volume ≤ TP's, for D = T = degree.

    Forward: W·(D−1)/D + 2N(h/g)(D−1)/D ≤ 4Nh(D−1)/D  ⇔  N ≥ W / (h·(4 − 2/g));
        W = (2 + 2/g)h² + 3·ffn·h, so g = 1, ffn = 4h gives N ≥ 16h²/2h = 8h.
    Train (no recompute, §5): 3W + 2K ≤ 8Nh  ⇔  N ≥ 3W / (h·(8 − 4/g)), i.e. 12h for g = 1, ffn = 4h.
    (D−1)/D cancels, so `degree` only matters through degree ≥ 2.
    """
    if degree < 2:
        raise ValueError("degree must be ≥ 2: with one rank neither scheme communicates")
    w, h, g = layer_weight_params(model), model.dim, model.gqa_ratio
    denom = h * (4 - 2 / g) if mode == "forward" else h * (8 - 4 / g)
    num = w if mode == "forward" else 3 * w
    return math.ceil(num / denom - 1e-9)


# ---------------------------------------------------------------------------------------------- FLOPs
def flops_per_token(model: ModelConfig, seq_len: int, causal_halved: bool, include_recompute: bool = False,
                    mode: str = "train", layers: int | None = None,
                    include_lm_head: bool | None = None) -> float:
    """Model FLOPs per token (all ranks together).

    Forward per layer: 2·W (matmuls) + 4·S·h attention (QKᵀ and A·V), halved for the causal mask when
    `causal_halved` (Megatron, MaxText) and not halved otherwise (PaLM, torchtitan, picotron). The LM head
    adds 2·V·h (on by default for the full model, off when `layers` is given, i.e. a block benchmark).
    Multiplier: forward 1×, train 3× (6N convention), +1× forward when `include_recompute` (HFU with full
    recompute).
    """
    n_layers = model.n_layers if layers is None else layers
    if include_lm_head is None:
        include_lm_head = layers is None
    attn = 4 * seq_len * model.n_heads * model.head_dim * (0.5 if causal_halved else 1.0)
    fwd = n_layers * (2 * layer_weight_params(model) + attn)
    fwd += 2 * model.vocab_size * model.dim if include_lm_head else 0
    if mode == "forward":
        return fwd
    if mode != "train":
        raise ValueError(f"mode={mode!r} is unknown; allowed: train, forward")
    return fwd * (4 if include_recompute else 3)


def __getattr__(name: str):
    """Re-export the time model lazily (costmodel_time imports this module, so no top-level import)."""
    if name in ("HardwareProfile", "load_hardware", "step_time", "cluster_throughput", "collective_time_s",
                "layer_collectives"):
        from tspbench import costmodel_time
        return getattr(costmodel_time, name)
    raise AttributeError(f"module 'tspbench.costmodel' has no attribute {name!r}")
