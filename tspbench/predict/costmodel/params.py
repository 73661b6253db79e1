"""Parameters and how each scheme divides them: the second layer of the cost model (imports workload.py only).

Notation (docs/method.md#notation): B micro-batch, S sequence, h hidden, L layers, n_h / n_kv heads,
g = n_h/n_kv, ffn = F·h the gated-MLP width, V vocabulary; T tensor degree, Σ sequence degree, D TSP degree.

Parameters (Llama block, SwiGLU, RMSNorm, untied LM head; docs/method.md#memory):
    per layer   W = (2 + 2/g)·h² [Q, K, V, O]  +  3·ffn·h [gate, up, down]      (+ 2h RMSNorm weights)
    edges       2·V·h [embedding + untied LM head]: split by vocabulary over T in tp, tp_msp and tp_sp
                (Megatron's vocabulary parallelism, tspbench/schemes/ops/vocab.py), replicated in sp and tsp
    replicated  (2L + 1)·h [norms]  -- on every rank, in every scheme
    tp_sp       Megatron-SP on T by default (par.msp): residual stream 1/(T·Σ) of the tokens (`mesh_megatron_sp`)
    sharded     W / T for tp, tp_msp, tp_sp;  W / D for tsp;  not at all for sp (weights replicated); with
                T > n_kv (GQA/MQA) each rank holds one whole KV head (K, V: 2·h·d), replicated over T/n_kv ranks;
                fsdp_sp: every parameter (norms, embedding, head included) ÷ N = dp_shard·Σ (FSDP2's shard group;
                replicated over the dp/dp_shard HSDP replicas)

Model state bytes per parameter k (AdamW): dtype weights + grad_dtype grads + fp32 m, v (+ fp32 master when
the weights are 16-bit and master_fp32): bf16 → 2 + 2 + 8 + 4 = 16; with fp32 grads 18 (Megatron). Without
master_fp32, m and v are in the parameter dtype, as torch's AdamW keeps them (bf16: 2 + 2 + 4 = 8).
"""

from __future__ import annotations

from dataclasses import replace

from tspbench.config import ModelConfig
from tspbench.parallel import Divisors, ParallelConfig
from tspbench.predict.costmodel.workload import BYTES

# ---------------------------------------------------------------------------------------------- layout
Layout = Divisors
"""How one scheme divides a replica's work over its `degree` ranks (tspbench.parallel.Divisors, written down with
the scheme in its registry entry)."""


def layout(par: ParallelConfig) -> Layout:
    """The scheme's divisors (its registry entry) with the vocabulary split of this layout."""
    return replace(par.spec.divisors(par), vocab_div=par.vocab_degree)


def megatron_tp_degree(par: ParallelConfig) -> int:
    """T of Megatron's tensor parallelism: the ranks a block's heads and channels are split over, whose activations
    pass through f/g all-reduces (or, with Megatron-SP, an all-gather in and a reduce-scatter out) around every
    attention and MLP: T in tp, tp_msp and tp_sp (the layout's head_div); 1 in sp and fsdp_sp (weights whole or
    FSDP's) and in tsp, whose D weight shards travel to the tokens while every rank runs every head."""
    return layout(par).head_div


def mesh_megatron_sp(par: ParallelConfig) -> bool:
    """Megatron-SP on the tensor axis of a T × Σ mesh (tp_sp with msp, T > 1; docs/method.md#choice-tp-sp-msp):
    rank (σ, t)'s residual stream is 1/T of token shard σ, 1/(T·Σ) of the tokens, so its norms (and a replicated
    embedding / LM head) see tokens of their own on all T·Σ ranks of the group. ParallelConfig.megatron_sp is the
    wider fact, Megatron-SP on any tensor axis (tp_msp too, whose norms see 1/T of every token and no token axis)."""
    return par.megatron_sp and par.spec.axes == "T×Σ"


def regathers_kv(par: ParallelConfig) -> bool:
    """What the code does with the exchanged K/V in backward: TSP's owner loop re-gathers each owner's K/V
    (schemes/ops/owner_attention.py) rather than keep it, unless the layout says `regather_kv=False` (then backward
    uses the K/V the forward, or the full-recompute replay, gathered); the token-sharded schemes keep theirs. The
    default of every `regather_kv` argument (docs/method.md#communication)."""
    return par.scheme == "tsp" and par.regather_kv


def selective_reruns_kernel(par: ParallelConfig) -> bool:
    """recompute=selective re-runs the attention kernel in backward (Megatron's core-attention recompute), except
    in tsp, whose owner loop keeps nothing of the kernel's to drop: there selective executes as none
    (docs/method.md#tsp-backward)."""
    return par.recompute == "selective" and par.scheme != "tsp"


# ---------------------------------------------------------------------------------------------- params
def layer_weight_params(model: ModelConfig) -> int:
    """W: matmul parameters of one block, (2 + 2/g)·h² + 3·ffn·h (norm weights excluded)."""
    h, d = model.dim, model.head_dim
    attn = h * model.n_heads * d * 2 + h * model.n_kv_heads * d * 2  # Q, O + K, V
    return attn + 3 * model.ffn_hidden * h  # + gate, up, down


def kv_heads_per_rank(model: ModelConfig, t: int) -> float:
    """KV heads a rank of tensor degree t holds: n_kv/T, or 1 when T > n_kv (each KV head replicated over T/n_kv
    ranks, as Megatron; tspbench/schemes/ops/sharding.py)."""
    return max(model.n_kv_heads / t, 1.0)


def local_gqa_ratio(model: ModelConfig, t: int) -> float:
    """Query heads per KV head on one rank of tensor degree t: g, or n_h/T when T > n_kv (one replicated KV head)."""
    return model.n_heads / (t * kv_heads_per_rank(model, t))


def layer_weight_params_per_rank(model: ModelConfig, par: ParallelConfig) -> float:
    """One block's matmul parameters on one rank: W / weight_div, except that W_K, W_V hold
    `kv_heads_per_rank` heads (a replicated KV head is whole on each of the T/n_kv ranks that share it)."""
    div = layout(par).weight_div
    kv = 2 * model.dim * model.head_dim
    return (layer_weight_params(model) - kv * model.n_kv_heads) / div + kv * kv_heads_per_rank(model, div)


def non_embedding_params(model: ModelConfig) -> int:
    """L·W: 8,589,934,592 for llama7b (docs/method.md#memory)."""
    return model.n_layers * layer_weight_params(model)


def fsdp_shards(par: ParallelConfig | None) -> int:
    """N = dp_shard·Σ: the ranks FSDP shards every weight over in fsdp_sp, its shard group (docs/method.md#fsdp-sp); 1
    elsewhere."""
    return par.fsdp_shards if par is not None else 1


def replicated_params(model: ModelConfig, layers: int | None = None, par: ParallelConfig | None = None) -> float:
    """Norm weights (held in full by every rank) and, for the full model, embedding + LM head: whole, or this
    rank's 1/T vocabulary slice when `par` splits the vocabulary (par.vocab_degree); one V·h matrix when the two are
    tied (model.tie_embeddings: only with the vocabulary replicated, parallel/checks.py). fsdp_sp: 1/N of them."""
    n = fsdp_shards(par)
    if layers is not None:
        return 2 * model.dim * layers / n
    vocab_div = par.vocab_degree if par is not None else 1
    matrices = 1 if model.tie_embeddings else 2
    return ((2 * model.n_layers + 1) * model.dim + matrices * model.vocab_size * model.dim / vocab_div) / n


def params_per_device(model: ModelConfig, par: ParallelConfig, layers: int | None = None) -> float:
    n_layers = model.n_layers if layers is None else layers
    return n_layers * layer_weight_params_per_rank(model, par) + replicated_params(model, layers, par)


def state_bytes_per_param(
    dtype: str = "bfloat16",
    optimizer: str = "adamw",
    master_fp32: bool = True,
    grad_dtype: str | None = None,
    mode: str = "train",
) -> dict[str, int]:
    """k split into params / grads / optimizer bytes (16 = 2 + 2 + 12 for bf16 AdamW, 18 with fp32 grads)."""
    if mode == "forward":
        return {"params": BYTES[dtype], "grads": 0, "optimizer": 0}
    if optimizer == "adamw":
        if master_fp32 and BYTES[dtype] < 4:
            opt = 12  # fp32 master copy + fp32 m, v
        else:
            opt = 2 * BYTES[dtype]  # torch AdamW: m, v in the parameter dtype
    elif optimizer == "sgd":
        opt = 0  # plain SGD keeps no state
    else:
        raise ValueError(f"optimizer={optimizer!r} is unknown; allowed: adamw, sgd")
    return {"params": BYTES[dtype], "grads": BYTES[grad_dtype or dtype], "optimizer": opt}
