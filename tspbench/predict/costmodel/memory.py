"""Per-device memory: the peak of one step of tspbench's own code (docs/method.md#memory).

Nothing here is fitted to the paper. Every term is written out with its source.

Memory (`memory_phases`, `memory_breakdown`): the peak of one step of tspbench's own code, as a maximum over
the moments where it can fall (loss backward, the first and last layer's backward, embedding backward,
gradient sync, optimizer step), each with its live categories. The terms are read off the code and checked
against the fake-tensor estimate (tspbench/predict/estimate.py, which runs the scheme code itself on the target
shapes): it agrees within 1.1% for llama7b, 16K and 128K, D = 8, every scheme (< 0.1% for tp, sp, tp_sp), and
to a few % on small GQA models, B > 1, fp32 and dp > 1 (tests/test_estimate.py). Per layer without recompute a
rank saves (per token of its residual stream / GEMM input, b = dtype bytes): two RMSNorms at 4h + b·h bytes (fp32 input
copy + normalised tensor), the attention input h·b, Q h/T·b, K and V 2h/(gT)·b (full-sequence copies after
a K/V all-gather; Ulysses' head shards are the local size, docs/method.md#ulysses), the output h/T·b (twice on
the zigzag path), fp32 log-sum-exp and RoPE tables, the MLP
input h·b and gate, up, product 3·ffn/T·b (model.silu_mul keeps gate and up only, as Megatron's fused SwiGLU); TSP
checkpoints its owner steps and its MLP ring, so it keeps only the two norms, the attention and MLP inputs and the
packed attention shard. Full recompute keeps each block's input (h·b per residual token) and rebuilds one block in
backward. Korthikanti et al.'s 34·s·b·h (GeLU MLP, dropout, no fp32 norm copies) does not describe this code.
"""

from __future__ import annotations

from dataclasses import dataclass

from tspbench.config import GRAD_BUCKET_ELEMS, ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel.comm import grad_sync_groups, kv_grad_sync_group
from tspbench.predict.costmodel.params import (
    BYTES,
    kv_heads_per_rank,
    layer_weight_params,
    layer_weight_params_per_rank,
    layout,
    megatron_sp,
    params_per_device,
    state_bytes_per_param,
)

MEMORY_KEYS = ("params", "grads", "optimizer", "activations", "temporaries", "comm_buffers", "kv_cache")


# ---------------------------------------------------------------------------------------------- memory
# Every term below is what tspbench's code allocates (checked op by op against the fake-tensor estimate,
# tspbench/predict/estimate.py, which runs the scheme code itself): `b` = bytes of the run dtype, `bg` of the
# gradients, per-token sizes are per rank. SDPA is the GPU flash kernel (memory-efficient for fp32): it saves
# Q, K, V, the output and an fp32 log-sum-exp, nothing S×S.
@dataclass(frozen=True)
class Geometry:
    """What one rank of a scheme runs on (tokens and head/channel split), as in tspbench.schemes."""

    n_res: float  # tokens of the residual stream: norms, residual adds, block inputs
    n_gemm: float  # tokens entering the attention / MLP GEMMs (tp_msp all-gathers them to B·S)
    n_loss: float  # tokens through the LM head and loss (the final norm runs on n_res)
    t: int  # head / channel split of the block weights (tsp: handled whole-layer, see below)
    kv_tokens: float  # tokens of the K/V a rank attends with after the exchange (0: its own or, Ulysses, the same
    # bytes as head shards of the whole sequence)
    chunked: bool  # W_O saves a flattened copy of the kernel output (attend_shard's cat; Ulysses' all-to-all back)
    gathered_inputs: bool  # the GEMM inputs are all-gather outputs (tp_msp): communication buffers
    batch: int = 1  # micro-batch B
    # tp_msp at B > 1: the all-gather hands back a [B, S, h] view of a contiguous [S, B, h] buffer and the
    # projections multiply it in that order (model.linear), so no GEMM copies or saves a copy of its input.


def geometry(par: ParallelConfig, seq_len: int, batch: int) -> Geometry:
    n, d, s = batch * seq_len, par.degree, par.scheme
    if s == "single":
        return Geometry(n, n, n, 1, 0, False, False, batch)
    if s == "tp":
        return Geometry(n, n, n, d, 0, False, False, batch)
    if s == "tp_msp":  # the vocabulary-parallel head gathers the sequence; a replicated one runs on S/T tokens
        return Geometry(n / d, n, n if par.vocab_degree > 1 else n / d, d, 0, False, True, batch)
    if s in ("sp", "fsdp_sp"):  # fsdp_sp: sp's tokens and attention (its weights are FSDP's, see fsdp_buffers)
        kv = 0 if par.sp_variant == "ulysses" else n  # Ulysses: head shards of the whole sequence (#ulysses)
        # Σ = 1 (fsdp_sp only, as tspbench.validate models plain FSDP; runs refuse degree 1): no zigzag chunks,
        # the kernel output is W_O's input itself
        return Geometry(n / d, n / d, n / d, 1, kv, d > 1, False, batch)
    if s == "tp_sp":
        t, sig = par.tp_degree, par.sp_degree
        kv = n if sig > 1 and par.sp_variant != "ulysses" else 0
        if megatron_sp(par):  # the residual stream is rank (σ, t)'s piece; attention / MLP gather shard σ
            loss = n / sig if par.vocab_degree > 1 else n / (sig * t)
            return Geometry(n / (sig * t), n / sig, loss, t, kv, True, True, batch)
        return Geometry(n / sig, n / sig, n / sig, t, kv, True, False, batch)
    if s == "tsp":
        return Geometry(n / d, n / d, n / d, 1, n, True, False, batch)
    raise ValueError(f"scheme={s!r} is unknown")


def norm_saved_per_token(model: ModelConfig, b: int) -> float:
    """RMSNorm: the fp32 input (a float() copy for 16-bit dtypes, the input itself in fp32), the normalised
    tensor in the run dtype and the fp32 rsqrt (model.RMSNorm saves these three)."""
    return 4 * model.dim + b * model.dim + 4


def attention_saved_bytes(
    model: ModelConfig, par: ParallelConfig, seq_len: int, batch: int, dtype: str = "bfloat16"
) -> float:
    """Attention sub-block, bytes saved for backward per layer (attention norm excluded).

    Non-TSP schemes: the projections' input (h), Q after RoPE (h/T), K after RoPE and V (2h/(gT) per token,
    on the full sequence when exchanged, since the un-zigzagged all-gather is what SDPA saves), the output
    (h/T; twice for attend_shard, whose cat + flatten makes the copy W_O saves), the fp32 log-sum-exp (n_h/T)
    and the RoPE cos/sin tables (d per position). recompute=selective re-runs the core attention in backward (for
    token-sharded schemes the K/V exchange too), so its own saved tensors are not kept: the exchanged K/V (the
    local K, V stay), a zigzag shard's chunk outputs, the log-sum-exp; W_O's input stays (the flash kernel writes
    its output in [B, S, n, d] order, so without chunks that input is the kernel's output itself). TSP's owner
    loop (schemes/ops/owner_attention.py) keeps, summed over the D owners, its input x (h), q (h), the local k, v
    (2h/g), the output (h), the fp32 log-sum-exp (n_h) and cos/sin: the single device's minus the full-sequence
    K/V, which backward re-gathers; selective equals none for TSP (nothing of the kernel's is left to drop).
    """
    geo, b, h = geometry(par, seq_len, batch), BYTES[dtype], model.dim
    if par.scheme == "tsp":
        na, kv_d = geo.n_gemm, par.degree * kv_heads_per_rank(model, par.degree) * model.head_dim  # all owners
        return na * (3 * h + 2 * kv_d) * b + na * model.n_heads * 4 + na / geo.batch * model.head_dim * b
    na, t = geo.n_gemm, geo.t
    kv_d = model.head_dim * kv_heads_per_rank(model, t)  # h/(g·T); d when a KV head is replicated (T > n_kv)
    selective = par.recompute == "selective"
    kv_tok = na if selective else (geo.kv_tokens or na)  # selective: the exchanged K/V are rebuilt in backward
    out_copies = 2 if geo.chunked and not selective else 1
    return (
        na * h * b
        + na * h / t * b
        + 2 * kv_tok * kv_d * b
        + na * h / t * b * out_copies
        + (0 if selective else na * model.n_heads / t * 4)
        + na / geo.batch * model.head_dim * b
    )  # cos/sin: per position, not per sequence


def mlp_saved_bytes(
    model: ModelConfig, par: ParallelConfig, seq_len: int, batch: int, dtype: str = "bfloat16"
) -> float:
    """MLP sub-block: its input (h) and gate, up, product (3·ffn/T) per token (silu is recomputed); TSP's ring
    keeps its input and each shard's gate and up (2·ffn in all: the product is rebuilt elementwise in backward)."""
    geo, b, h = geometry(par, seq_len, batch), BYTES[dtype], model.dim
    if par.scheme == "tsp":
        return geo.n_gemm * (h + 2 * model.ffn_hidden) * b
    return geo.n_gemm * h * b + 3 * geo.n_gemm * model.ffn_hidden / geo.t * b


def layer_activation_bytes(
    model: ModelConfig, par: ParallelConfig, seq_len: int, batch: int, dtype: str = "bfloat16"
) -> float:
    """Everything one block saves for backward on one rank, without recompute: two norms, attention, MLP."""
    geo, b = geometry(par, seq_len, batch), BYTES[dtype]
    return (
        2 * geo.n_res * norm_saved_per_token(model, b)
        + attention_saved_bytes(model, par, seq_len, batch, dtype)
        + mlp_saved_bytes(model, par, seq_len, batch, dtype)
    )


def _gathered_saved_bytes(model: ModelConfig, par: ParallelConfig, seq_len: int, batch: int, b: int) -> float:
    """tp_msp: the all-gathered attention and MLP inputs among a layer's saved tensors (comm buffers)."""
    geo = geometry(par, seq_len, batch)
    return 2 * geo.n_gemm * model.dim * b if geo.gathered_inputs else 0.0


def layer_backward_working_set(
    model: ModelConfig, par: ParallelConfig, seq_len: int, batch: int, dtype: str = "bfloat16"
) -> dict[str, float]:
    """The largest moment of one block's backward, beyond the stored state (read off the code's backward):

    mlp   during the MLP backward, with the whole layer's saved tensors alive. Non-TSP: the incoming
          gradient on the GEMM tokens (all-gathered in tp_msp) + d(gate·up) (ffn/T) + the W_down gradient
          slice, or gradients of gate and up (2·ffn/T), whichever is larger, + the residual-stream gradient.
          TSP's ring backward: 7 token-wise h-vectors (dx accumulator, the shard's dx pieces, residual
          gradients), 4 of the shard's [tokens, ffn/D] elementwise terms (σ(gate), silu, d(gate·up), d(gate) /
          d(up)) and 5 packed MLP shards 3·ffn·h/D (my packed shard, the partial dW pieces and their
          concatenation, my own shard's gradient, the running sum), + the 2 gradient receive buffers (comm).
    norm  during the MLP-norm backward, with the attention part of the layer alive: RMSNorm's backward in
          fp32 holds 6 fp32 copies of its input (the saved fp32 input, the upcast gradient and the product /
          reduction terms), plus the residual-stream gradient; the layer's MLP weight gradients exist by then.
    attn  (sp, tp_sp, fsdp_sp with the K/V all-gather) during the zigzag chunk's kernel backward
          (attention.chunk_backward), with the attention norm's and the attention's saved tensors alive but W_O's
          flattened input freed: the chunk's dq of the prefix and of the diagonal, their sum and a contiguous copy
          of its output gradient (4 chunk-sized h/T terms, chunk = half the rank's tokens), the prefix's and the
          diagonal's dK, dV and their concatenation over the whole key range (4·P·h/(gT), P = the exchanged key
          tokens), W_O's input gradient and the residual-stream gradient; the layer's MLP and W_O weight
          gradients exist by then (recompute=selective: + what the replayed core holds, the re-gathered K/V, the
          chunk outputs and log-sum-exp). It outgrows the MLP moment when the whole-sequence dK/dV do (long
          sequences over many token shards); it is not a moment for the ring (its own Function) or Ulysses.
    Returns the moments' extra bytes ("mlp", "norm", and "attn" where it applies), the saved part alive at each
    ("mlp_saved", "norm_saved", "attn_saved") and their communication-buffer parts.
    """
    geo, b, h, ffn = geometry(par, seq_len, batch), BYTES[dtype], model.dim, model.ffn_hidden
    norm_tok = norm_saved_per_token(model, b)
    attn = attention_saved_bytes(model, par, seq_len, batch, dtype)
    layer = layer_activation_bytes(model, par, seq_len, batch, dtype)
    res_grad = geo.n_res * h * b
    if par.scheme == "tsp":  # schemes/tsp.py _RingMLP.backward; the two weight receive buffers are persistent
        packed, ffn_loc = 3 * ffn * h / par.degree * b, geo.n_gemm * ffn / par.degree * b
        mlp, mlp_comm = 7 * geo.n_res * h * b + 4 * ffn_loc + 5 * packed, 2 * packed
    else:
        ffn_a = geo.n_gemm * ffn / geo.t * b
        d_out = geo.n_gemm * h * b
        after_down = d_out + ffn_a + ffn / geo.t * h * b  # dY, d(gate·up), dW_down
        after_mul = 3 * ffn_a  # silu_mul backward: σ(gate), d(up), d(gate) (model._SiluMul; d(gate·up) freed)
        mlp = max(after_down, after_mul) + res_grad
        # tp_msp: dY is the all-gather of the output gradient and the residual gradient its reduce-scatter
        mlp_comm = 0.0
        if geo.gathered_inputs and after_down >= after_mul:
            mlp_comm = d_out + res_grad
    out = {
        "mlp": mlp,
        "mlp_saved": layer,
        "mlp_comm": mlp_comm,
        "norm": geo.n_res * (6 * 4 * h + h * b),
        "norm_saved": geo.n_res * norm_tok + attn,
        "norm_comm": 0.0,
    }
    if has_attention_moment(par, geo):
        kv_d, h_t = model.head_dim * kv_heads_per_rank(model, geo.t), h / geo.t
        wo_in = geo.n_gemm * h_t * b  # W_O's flattened input copy, freed once W_O's backward ran
        out["attn"] = 4 * geo.n_gemm / 2 * h_t * b + 4 * geo.kv_tokens * kv_d * b + wo_in + res_grad
        out["attn_saved"] = geo.n_res * norm_tok + attn - wo_in
        if par.recompute == "selective":  # the replayed core: the re-gathered K/V, the chunk outputs, the lse
            out["attn_saved"] += 2 * geo.kv_tokens * kv_d * b + wo_in + geo.n_gemm * model.n_heads / geo.t * 4
        out["attn_comm"] = 0.0
    return out


def has_attention_moment(par: ParallelConfig, geo: Geometry) -> bool:
    """Whether a block's backward has the `attn` moment of `layer_backward_working_set`: a zigzag shard attending
    over all-gathered whole-sequence K/V (sp, tp_sp, fsdp_sp with sp_variant=allgather)."""
    return par.exchange == "allgather" and geo.kv_tokens > 0


def head_saved_bytes(
    model: ModelConfig, par: ParallelConfig, seq_len: int, batch: int, dtype: str = "bfloat16"
) -> float:
    """Final norm (on the residual tokens), the LM-head input and the cross-entropy's fp32 [tokens, V/vocab_div]
    buffer: log-softmax (F.cross_entropy, replicated head) or softmax (vocabulary-parallel, which also saves
    each token's int64 id within the slice and a bool mask)."""
    geo, b, vd = geometry(par, seq_len, batch), BYTES[dtype], layout(par).vocab_div
    if par.vocab == "ring":  # TSP's ring cross-entropy keeps the head input and an fp32 log-sum-exp only
        return geo.n_res * norm_saved_per_token(model, b) + geo.n_loss * (model.dim * b + 4)
    ids = 9 if vd > 1 else 0
    return geo.n_res * norm_saved_per_token(model, b) + geo.n_loss * (model.dim * b + model.vocab_size / vd * 4 + ids)


def ring_buffer_bytes(model: ModelConfig, par: ParallelConfig, dtype: str = "bfloat16") -> float:
    """TSP's persistent receive buffers (schemes/ops/ring.py RingBuffers, shared by every layer): two for the
    attention shard being broadcast ((2 + 2/g)·h²/D) and two for the MLP shard on the ring (3·ffn·h/D),
    allocated in the first forward and alive from then on. The gradient buffers of the same sizes appear in the
    first backward (counted in its working set). 0 for other schemes."""
    if par.scheme != "tsp":
        return 0.0
    return 2 * layer_weight_params_per_rank(model, par) * BYTES[dtype]  # one owner's attention + MLP shard


def kv_cache_bytes(model: ModelConfig, par: ParallelConfig, seq_len: int, batch: int, dtype: str = "bfloat16") -> float:
    """One rank's KV cache for seq_len tokens (schemes/ops/decode.py): K and V of every layer, 2·L·B·S·(h/g)·b
    per replica, split by heads over T (tp, tp_msp, tp_sp) and by tokens over Σ or D (sp, tp_sp, tsp), i.e.
    ÷ degree in every scheme (tsp: every head of its own 1/D of the tokens). With T (or D) > n_kv a KV head is
    replicated over T/n_kv ranks, and so is its cache: n_kv_local = max(n_kv/T, 1) heads per rank (tsp: D owners'
    heads of its tokens, max(n_kv, D)); the group then caches T/n_kv copies."""
    geo, b = geometry(par, seq_len, batch), BYTES[dtype]
    t = par.degree if par.scheme == "tsp" else geo.t
    heads = kv_heads_per_rank(model, t) * (t if par.scheme == "tsp" else 1)
    return 2 * model.n_layers * geo.n_gemm * model.head_dim * heads * b


def largest_param_elems(model: ModelConfig, par: ParallelConfig) -> float:
    """The biggest single parameter a rank holds (its optimizer update's transient is per parameter)."""
    lay = layout(par)
    if par.scheme == "fsdp_sp":  # every parameter's rows ÷ N
        return max(model.vocab_size, model.ffn_hidden, model.n_heads * model.head_dim) * model.dim / lay.weight_div
    return max(
        model.vocab_size * model.dim / lay.vocab_div,
        model.ffn_hidden * model.dim / lay.weight_div,
        model.n_heads * model.head_dim * model.dim / lay.weight_div,
    )


def grad_sync_bucket_elems(model: ModelConfig, par: ParallelConfig) -> float:
    """Elements `ParallelModel.finish_grad_sync` concatenates at once: one bucket of at most
    GRAD_BUCKET_ELEMS (the in-group sum, then the data-parallel average), freed before the next. Bounded
    by the bucket cap; a lone oversized gradient is reduced in place, so this is an upper estimate when
    buckets do not fill exactly."""
    if par.scheme == "fsdp_sp":  # FSDP reduce-scatters every gradient during backward: no bucket
        return 0.0
    groups = [*grad_sync_groups(model, par), kv_grad_sync_group(model, par)]
    n = min(max((n for n, p in groups if p > 1), default=0.0), GRAD_BUCKET_ELEMS)  # one group at a time
    if par.dp > 1:
        n = max(n, min(params_per_device(model, par), GRAD_BUCKET_ELEMS))
    return n


FSDP_BUFFERS = ("unit", "unit_grad", "head", "head_grad", "embed")


def fsdp_buffers(model: ModelConfig, dtype: str, grad_dtype: str | None = None) -> dict[str, float]:
    """fsdp_sp's gathered weights and gradient buffers (bytes; docs/method.md#fsdp-sp), read off FSDP2:
    unit   a block unit's unsharded weights (W + 2h)·b; in backward the prefetched neighbour's too, and FSDP keeps
           the last reduce-scatter input (a unit's gradients, (W + 2h)·bg) until the next one is issued, so a
           middle layer's backward holds three unit-sized buffers
    head   final norm + LM head (V·h + h)·b, gathered from its forward until its backward
    embed  the embedding V·h·b, gathered from layer 0's backward (prefetch) through its own
    The unsharded gradient of the layer in backward is a temporary (autograd's, before the reduce-scatter)."""
    b, bg = BYTES[dtype], BYTES[grad_dtype or dtype]
    h, v = model.dim, model.vocab_size
    return {
        "unit": (layer_weight_params(model) + 2 * h) * b,
        "unit_grad": (layer_weight_params(model) + 2 * h) * bg,
        "head": (v * h + h) * b,
        "head_grad": (v * h + h) * bg,
        "embed": v * h * b,
    }


def memory_phases(
    model: ModelConfig,
    par: ParallelConfig,
    seq_len: int,
    batch: int,
    *,
    mode: str = "train",
    dtype: str = "bfloat16",
    optimizer: str = "adamw",
    master_fp32: bool = True,
    grad_dtype: str | None = None,
    kv_cache: bool = True,
) -> dict[str, dict[str, float]]:
    """Bytes per device at each phase's peak of one training step (or forward), by category.

    Train. The optimizer state exists throughout (steady state); gradients start as None (zero_grad with
    set_to_none) and appear layer by layer in backward. Phases (the moments tspbench.predict.estimate reports):
        backward   loss backward: every stored activation (L layers + head) + two fp32 [tokens, V] gradients
        bwd_first  the last layer's backward: L layers' stored activations + the LM-head gradient + one
                   layer's backward working set (with full recompute: that layer's recomputed activations too)
        bwd_last   layer 0's backward: one layer's stored activations + every gradient but layer 0's and the
                   embedding's + the working set (layers in between are linear between the two)
        embed_bwd  embedding backward: the incoming gradient and the dense embedding gradient
        grad_sync  finish_grad_sync's flat bucket(s)
        optimizer  AdamW: one fp32 gradient copy of the largest parameter (master_fp32: per-parameter upcast +
                   fused update) or two parameter-sized temporaries (torch's single-tensor AdamW)
    The forward phases are below `backward` (which holds every stored activation plus the loss gradients).
    Forward (no grad): the LM head (logits, their fp32 copy and the log-softmax output) or one layer's
    working set, + a KV cache of K and V per layer when `kv_cache` (prefill; tspbench's forward keeps none).
    """
    if mode not in ("train", "forward"):
        raise ValueError(f"mode={mode!r} is unknown; allowed: train, forward")
    geo, b, h, L = geometry(par, seq_len, batch), BYTES[dtype], model.dim, model.n_layers
    k = state_bytes_per_param(dtype, optimizer, master_fp32, grad_dtype, mode)
    n_dev = params_per_device(model, par)
    bg = k["grads"]
    state = {key: n_dev * k[key] for key in ("params", "optimizer")}
    zero = dict.fromkeys(MEMORY_KEYS, 0.0)

    ring = ring_buffer_bytes(model, par, dtype)  # allocated in forward, alive through the step

    def phase(**kv) -> dict[str, float]:
        out = {**zero, **state, **kv}
        out["activations"] += ring
        out["total"] = sum(out[key] for key in MEMORY_KEYS)
        return out

    lay = layout(par)
    vd, v_loc = lay.vocab_div, model.vocab_size / lay.vocab_div
    fsdp = par.scheme == "fsdp_sp"
    fb = fsdp_buffers(model, dtype, grad_dtype) if fsdp else dict.fromkeys(FSDP_BUFFERS, 0.0)
    if mode == "forward":
        if vd > 1:  # logits [tokens, V/T] + the cross-entropy's shifted fp32 copy (exp, softmax in place),
            # or, tp_msp, the all-gathered head input while the logits are computed
            gathered = geo.n_loss * h * b if geo.n_loss > geo.n_res else 0.0
            logits = max(geo.n_loss * v_loc * (b + 4), gathered + geo.n_loss * v_loc * b)
        else:  # logits + their fp32 copy + log-softmax
            logits = geo.n_loss * model.vocab_size * (b + (4 if b < 4 else 0) + 4)
        ffn_a = geo.n_gemm * model.ffn_hidden / geo.t * b
        if par.scheme == "tsp":
            ffn_a = geo.n_gemm * model.ffn_hidden / par.degree * b
        layer = max(
            geo.n_res * (h * b + 3 * 4 * h),  # RMSNorm in fp32
            geo.n_res * h * b + geo.n_gemm * h * b + 3 * ffn_a,  # SwiGLU: silu(gate), up, product
            geo.n_res * h * b
            + 2 * 2 * (geo.kv_tokens or geo.n_gemm) * model.head_dim * kv_heads_per_rank(model, geo.t) * b,
        )
        if par.ulysses:
            # block input, its norm, local Q/K/V, their head shards as received and un-zigzagged, the kernel output
            # and its re-zigzagged copy
            qkv = 3 * (h + 2 * h / model.gqa_ratio) / geo.t
            layer = max(layer, geo.n_res * (2 * h + qkv + 2 * h / geo.t) * b)
        kv = kv_cache_bytes(model, par, seq_len, batch, dtype) if kv_cache else 0.0
        return {  # fsdp_sp: the gathered head; a layer's unit, the prefetched next one and the last flat all-gather
            "head": phase(temporaries=logits + geo.n_res * h * b, kv_cache=kv, comm_buffers=fb["head"]),
            "layer": phase(temporaries=layer, kv_cache=kv, comm_buffers=3 * fb["unit"]),
        }

    layer_saved = layer_activation_bytes(model, par, seq_len, batch, dtype)
    block_in = geo.n_res * h * b
    stored = block_in if par.recompute == "full" else layer_saved  # per layer, at the end of forward
    head = head_saved_bytes(model, par, seq_len, batch, dtype)
    g_layer = (layer_weight_params_per_rank(model, par) + 2 * h) * bg
    g_mlp = 3 * model.ffn_hidden * h / lay.weight_div * bg
    g_embed, g_head = v_loc * h * bg, (v_loc * h + h) * bg
    g_embed_full = g_embed  # the embedding backward's dense gradient (fsdp_sp: unsharded, before its reduce-scatter)
    if fsdp:  # sharded gradients ÷ N; the layer's own in backward is autograd's unsharded one (a temporary)
        nf = lay.weight_div
        g_layer, g_embed, g_head = (layer_weight_params(model) + 2 * h) / nf * bg, g_embed / nf, g_head / nf
        g_mlp_tmp, g_mlp = 3.0 * model.ffn_hidden * h * bg, 0.0
    else:
        g_mlp_tmp = 0.0
    g_all = n_dev * bg
    gath = _gathered_saved_bytes(model, par, seq_len, batch, b)

    # Loss backward: F.cross_entropy's two fp32 [tokens, V] gradients (replicated head), or the vocabulary-
    # parallel softmax turned into the gradient in place plus its copy in the run dtype; then the final norm's
    # fp32 backward (its saved fp32 input + 5 fp32 temporaries per element) with the head's weight gradient.
    ce_tmp = 2 * geo.n_loss * model.vocab_size * 4 if vd == 1 else geo.n_loss * v_loc * b
    out = {
        "backward": max(
            phase(activations=L * stored + head, temporaries=ce_tmp, comm_buffers=fb["head"]),
            phase(
                grads=g_head,
                activations=L * stored + geo.n_res * 4 * h,
                temporaries=5 * 4 * h * geo.n_res,
                comm_buffers=fb["head"],
            ),
            key=lambda p: p["total"],
        )
    }
    ws = layer_backward_working_set(model, par, seq_len, batch, dtype)
    # fsdp_sp: the layer's unit, the prefetched one before it (the embedding for layer 0) and the last
    # reduce-scatter input (the head's for the last layer); a middle layer holds three block-sized buffers, more
    # than either end, so it is a moment of its own
    fsdp_comm = {
        "bwd_first": 2 * fb["unit"] + fb["head_grad"],
        "bwd_mid_first": 2 * fb["unit"] + fb["unit_grad"],
        "bwd_last": fb["unit"] + fb["embed"] + fb["unit_grad"],
    }
    moments = [("bwd_first", L, g_head), ("bwd_last", 1, g_all - g_embed - g_layer)]
    if fsdp and L >= 3:
        moments.insert(1, ("bwd_mid_first", L - 1, g_head + g_layer))
    g_wo = model.dim * model.dim / geo.t * bg  # W_O's gradient (attn moment; fsdp_sp: unsharded, a temporary)
    for name, n_stored, grads in moments:
        best = None
        for moment in ("mlp", "norm", "attn"):
            if moment not in ws:
                continue
            saved, extra, comm = ws[f"{moment}_saved"], ws[moment], ws[f"{moment}_comm"]
            g = grads + (g_mlp if moment in ("norm", "attn") else 0.0) + (g_wo if moment == "attn" and not fsdp else 0)
            if par.recompute == "full":  # the layer's activations are rebuilt in backward: temporaries
                act = n_stored * stored
                comm_b = comm + (gath if moment == "mlp" else 0.0)
                tmp = saved + extra - comm_b
            else:  # saved in forward: activations (minus what is already freed)
                act = (n_stored - 1) * stored + saved
                if moment == "norm":  # the MLP-norm's saved fp32 input is one of the 6 fp32 copies
                    act += 4 * h * geo.n_res
                    extra -= 4 * h * geo.n_res
                comm_b, tmp = comm, extra - comm
            if moment in ("norm", "attn"):
                tmp += g_mlp_tmp + (g_wo if moment == "attn" and fsdp else 0.0)
            p = phase(grads=g, activations=act, temporaries=tmp, comm_buffers=comm_b + fsdp_comm[name])
            if best is None or p["total"] > best["total"]:
                best = p
        assert best is not None
        out[name] = best
    if vd == 1:  # the incoming gradient and the dense embedding gradient (+ fsdp_sp: the gathered embedding and
        # layer 0's last reduce-scatter input)
        out["embed_bwd"] = phase(
            grads=g_all - g_embed,
            temporaries=geo.n_res * h * b + g_embed_full,
            comm_buffers=fb["embed"] + fb["unit_grad"],
        )
    else:  # + the masked lookup's gradient; tp_msp's incoming gradient is an all-gather output
        n_emb = geo.n_loss  # the embedding sees the head's tokens (tp_msp: all)
        gathered = n_emb * h * b if geo.n_loss > geo.n_res else 0.0
        out["embed_bwd"] = phase(
            grads=g_all - g_embed, temporaries=2 * n_emb * h * b - gathered + g_embed, comm_buffers=gathered
        )
    out["grad_sync"] = phase(grads=g_all, comm_buffers=grad_sync_bucket_elems(model, par) * bg)
    big = largest_param_elems(model, par)
    opt_tmp = (
        big * 4 if (master_fp32 and b < 4 and optimizer == "adamw") else (2 * big * b if optimizer == "adamw" else 0.0)
    )
    out["optimizer"] = phase(grads=g_all, temporaries=opt_tmp)
    return out


def memory_breakdown(
    model: ModelConfig,
    par: ParallelConfig,
    seq_len: int,
    batch: int,
    *,
    mode: str = "train",
    dtype: str = "bfloat16",
    optimizer: str = "adamw",
    master_fp32: bool = True,
    grad_dtype: str | None = None,
    kv_cache: bool = True,
) -> dict[str, float]:
    """Predicted peak bytes per device and its breakdown by category (keys MEMORY_KEYS + total): the phase
    of `memory_phases` with the largest total, i.e. what is live at the step's peak (not the sum of each
    category's own maximum: weight gradients and stored activations, for instance, peak at different
    moments). `peak_phase()` names the phase."""
    phases = memory_phases(
        model,
        par,
        seq_len,
        batch,
        mode=mode,
        dtype=dtype,
        optimizer=optimizer,
        master_fp32=master_fp32,
        grad_dtype=grad_dtype,
        kv_cache=kv_cache,
    )
    best = max(phases.values(), key=lambda p: p["total"])
    return {key: float(best[key]) for key in (*MEMORY_KEYS, "total")}


def peak_phase(model: ModelConfig, par: ParallelConfig, seq_len: int, batch: int, **kw) -> str:
    """Name of the phase `memory_breakdown` reports."""
    phases = memory_phases(model, par, seq_len, batch, **kw)
    return max(phases, key=lambda k: phases[k]["total"])


def comm_buffer_bytes(
    model: ModelConfig, par: ParallelConfig, seq_len: int, batch: int, dtype: str = "bfloat16"
) -> float:
    """Communication buffers live at one layer's backward peak (mlp moment; full recompute)."""
    ws = layer_backward_working_set(model, par, seq_len, batch, dtype)
    return ws["mlp_comm"] + _gathered_saved_bytes(model, par, seq_len, batch, BYTES[dtype])
