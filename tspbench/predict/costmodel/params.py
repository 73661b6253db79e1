"""Parameters and how each scheme divides them: the first layer of the cost model (imports nothing of it).

Notation (docs/method.md#notation): B micro-batch, S sequence, h hidden, L layers, n_h / n_kv heads,
g = n_h/n_kv, ffn = F·h the gated-MLP width, V vocabulary; T tensor degree, Σ sequence degree, D TSP degree.

Parameters (Llama block, SwiGLU, RMSNorm, untied LM head; docs/method.md#memory):
    per layer   W = (2 + 2/g)·h² [Q, K, V, O]  +  3·ffn·h [gate, up, down]      (+ 2h RMSNorm weights)
    edges       2·V·h [embedding + untied LM head]: split by vocabulary over T in tp, tp_msp and tp_sp
                (Megatron's vocabulary parallelism, tspbench/schemes/ops/vocab.py), replicated in sp and tsp
    replicated  (2L + 1)·h [norms]  -- on every rank, in every scheme
    tp_sp       Megatron-SP on T by default (par.msp): residual stream 1/(T·Σ) of the tokens (`megatron_sp`)
    sharded     W / T for tp, tp_msp, tp_sp;  W / D for tsp;  not at all for sp (weights replicated); with
                T > n_kv (GQA/MQA) each rank holds one whole KV head (K, V: 2·h·d), replicated over T/n_kv ranks;
                fsdp_sp: every parameter (norms, embedding, head included) ÷ N = dp·Σ (FSDP2)

Model state bytes per parameter k (AdamW): dtype weights + grad_dtype grads + fp32 m, v (+ fp32 master when
the weights are 16-bit and master_fp32): bf16 → 2 + 2 + 8 + 4 = 16; with fp32 grads 18 (Megatron). Without
master_fp32, m and v are in the parameter dtype, as torch's AdamW keeps them (bf16: 2 + 2 + 4 = 8).
"""

from __future__ import annotations

from dataclasses import replace

from tspbench.config import ModelConfig
from tspbench.parallel import Divisors, ParallelConfig

BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


# ---------------------------------------------------------------------------------------------- layout
Layout = Divisors
"""How one scheme divides a replica's work over its `degree` ranks (tspbench.parallel.Divisors, written down with
the scheme in its registry entry)."""


def megatron_sp(par: ParallelConfig) -> bool:
    """tp_sp with Megatron-SP on its tensor axis (par.msp, T > 1): residual-stream tensors 1/(T·Σ) per rank,
    all-gather in / reduce-scatter out over T instead of TP's all-reduces (docs/method.md#choice-tp-sp-msp)."""
    return par.scheme == "tp_sp" and par.msp and par.tp_degree > 1


def layout(par: ParallelConfig) -> Layout:
    """The scheme's divisors (its registry entry) with the vocabulary split of this layout."""
    return replace(par.spec.divisors(par), vocab_div=par.vocab_degree)


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
    """N = dp·Σ: the ranks FSDP shards every weight over in fsdp_sp (docs/method.md#fsdp-sp); 1 elsewhere."""
    return par.fsdp_shards if par is not None else 1


def replicated_params(model: ModelConfig, layers: int | None = None, par: ParallelConfig | None = None) -> float:
    """Norm weights (held in full by every rank) and, for the full model, embedding + LM head: whole, or this
    rank's 1/T vocabulary slice when `par` splits the vocabulary (par.vocab_degree). fsdp_sp: 1/N of them."""
    n = fsdp_shards(par)
    if layers is not None:
        return 2 * model.dim * layers / n
    vocab_div = par.vocab_degree if par is not None else 1
    return ((2 * model.n_layers + 1) * model.dim + 2 * model.vocab_size * model.dim / vocab_div) / n


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
