"""What one rank saves and allocates in a step: its geometry (tokens, head split) and the bytes one block, the LM head,
TSP's ring buffers and the KV cache hold (docs/method.md#memory). The step's phases (memory.py) add them up.

Nothing here is fitted to the paper. Every term is read off tspbench's own code and checked against the fake-tensor
estimate (tspbench/predict/estimate.py, which runs the scheme code itself on the target shapes; see memory.py for
how closely they agree). Per layer without recompute a rank saves (per token of its residual stream / GEMM input, b
= dtype bytes): two RMSNorms at 4h + b·h bytes (fp32 input copy + normalised tensor), the attention input h·b (under
Megatron-SP the rank's piece: Megatron's column-parallel linear re-gathers it in backward), Q h/T·b, K and V
2h/(gT)·b (full-sequence copies after a K/V all-gather; Ulysses' head shards are the local size,
docs/method.md#ulysses), the output h/T·b (twice on the zigzag path), fp32 log-sum-exp and RoPE tables, the MLP
input h·b (a piece, as the attention's) and gate, up, product 3·ffn/T·b (model.silu_mul keeps gate and up only, as
Megatron's fused SwiGLU); TSP checkpoints its owner steps and its MLP ring, so it keeps only the two norms, the
attention and MLP inputs and the packed attention shard. Full recompute keeps each block's input (h·b per residual
token) and rebuilds one block in backward. Korthikanti et al.'s 34·s·b·h (GeLU MLP, dropout, no fp32 norm copies)
does not describe this code.
"""

from __future__ import annotations

from dataclasses import dataclass

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel.params import kv_heads_per_rank, layer_weight_params_per_rank, layout
from tspbench.predict.costmodel.workload import Workload


# Every term below is what tspbench's code allocates (checked op by op against the fake-tensor estimate,
# tspbench/predict/estimate.py, which runs the scheme code itself): `b` = bytes of the run dtype, `bg` of the
# gradients, per-token sizes are per rank. SDPA is the GPU flash kernel (memory-efficient for fp32): it saves
# Q, K, V, the output and an fp32 log-sum-exp, nothing S×S.
@dataclass(frozen=True)
class Geometry:
    """What one rank of a scheme runs on (tokens and head/channel split), as in tspbench.schemes."""

    n_res: float
    """Tokens of the residual stream: norms, residual adds, block inputs."""
    n_gemm: float
    """Tokens entering the attention / MLP GEMMs (Megatron-SP all-gathers them: B·S in tp_msp)."""
    n_loss: float
    """Tokens through the LM head and loss (the final norm runs on n_res)."""
    t: int
    """Head / channel split of the block weights (tsp: handled whole-layer, see the functions below)."""
    kv_tokens: float
    """Tokens of the K/V a rank attends with after the exchange (0: its own or, Ulysses, the same bytes as head
    shards of the whole sequence)."""
    chunked: bool
    """W_O saves a flattened copy of the kernel output (attend_shard's cat; Ulysses' all-to-all back)."""
    gathered_inputs: bool
    """The GEMM inputs are all-gathered (Megatron-SP): in forward, and again in backward from the piece each
    column-parallel linear saves (schemes/ops/tensor_parallel.py, Megatron's
    LinearWithGradAccumulationAndAsyncCommunication); the gathered buffers are communication buffers and none is
    saved. At B > 1 the all-gather hands back a [B, S, h] view of a contiguous [S, B, h] buffer and the projections
    multiply it in that order (model.linear), so no GEMM copies its input."""
    batch: int = 1
    """Micro-batch B."""


def geometry(par: ParallelConfig, work: Workload) -> Geometry:
    """The scheme's table of what one rank runs on (each row as the scheme's code runs it)."""
    n, d, s, batch = work.tokens, par.degree, par.scheme, work.batch
    if s == "single":
        return Geometry(n, n, n, 1, 0, False, False, batch)
    if s == "tp":
        return Geometry(n, n, n, d, 0, False, False, batch)
    if s == "tp_msp":  # the vocabulary-parallel head gathers the sequence; a replicated one runs on S/T tokens
        return Geometry(n / d, n, n if par.vocab_degree > 1 else n / d, d, 0, False, True, batch)
    if s in ("sp", "fsdp_sp"):  # fsdp_sp: sp's tokens and attention (its weights are FSDP's, see fsdp_buffers)
        kv = 0 if par.ulysses else n  # Ulysses: head shards of the whole sequence (#ulysses)
        # Σ = 1 (fsdp_sp only, as tspbench.validate models plain FSDP; runs refuse degree 1): no zigzag chunks,
        # the kernel output is W_O's input itself
        return Geometry(n / d, n / d, n / d, 1, kv, d > 1, False, batch)
    if s == "tp_sp":
        t, sig = par.tp_degree, par.sp_degree
        kv = n if sig > 1 and not par.ulysses else 0
        if par.megatron_sp:  # the residual stream is rank (σ, t)'s piece; attention / MLP gather shard σ
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


def attention_saved_bytes(par: ParallelConfig, work: Workload) -> float:
    """Attention sub-block, bytes saved for backward per layer (attention norm excluded).

    Non-TSP schemes: the projections' input (h; under Megatron-SP the rank's n_res-token piece, re-gathered in
    backward, `gemm_input_tokens`), Q after RoPE (h/T), K after RoPE and V (2h/(gT) per token,
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
    model, geo, b, h = work.model, geometry(par, work), work.elem_bytes, work.model.dim
    if par.scheme == "tsp":
        na, kv_d = geo.n_gemm, par.degree * kv_heads_per_rank(model, par.degree) * model.head_dim  # all owners
        kept = 0.0 if par.regather_kv else 2 * geo.kv_tokens * kv_d * b  # regather_kv=False: the gathered K/V too
        return na * (3 * h + 2 * kv_d) * b + na * model.n_heads * 4 + na / geo.batch * model.head_dim * b + kept
    na, t = geo.n_gemm, geo.t
    kv_d = model.head_dim * kv_heads_per_rank(model, t)  # h/(g·T); d when a KV head is replicated (T > n_kv)
    selective = par.recompute == "selective"
    kv_tok = na if selective else (geo.kv_tokens or na)  # selective: the exchanged K/V are rebuilt in backward
    out_copies = 2 if geo.chunked and not selective else 1
    return (
        gemm_input_tokens(geo) * h * b
        + na * h / t * b
        + 2 * kv_tok * kv_d * b
        + na * h / t * b * out_copies
        + (0 if selective else na * model.n_heads / t * 4)
        + na / geo.batch * model.head_dim * b
    )  # cos/sin: per position, not per sequence


def gemm_input_tokens(geo: Geometry) -> float:
    """Tokens of the attention / MLP input a layer saves for its column-parallel GEMMs' backward: the GEMM tokens,
    or under Megatron-SP the rank's piece of them (the residual stream's; the gathered input is rebuilt in
    backward, as Megatron does)."""
    return geo.n_res if geo.gathered_inputs else geo.n_gemm


def mlp_saved_bytes(par: ParallelConfig, work: Workload) -> float:
    """MLP sub-block: its input (h; Megatron-SP: the piece, `gemm_input_tokens`) and gate, up, product (3·ffn/T) per
    token (silu is recomputed); TSP's ring keeps its input and each shard's gate and up (2·ffn in all: the product
    is rebuilt elementwise in backward)."""
    model, geo, b, h = work.model, geometry(par, work), work.elem_bytes, work.model.dim
    if par.scheme == "tsp":
        return geo.n_gemm * (h + 2 * model.ffn_hidden) * b
    return gemm_input_tokens(geo) * h * b + 3 * geo.n_gemm * model.ffn_hidden / geo.t * b


def layer_activation_bytes(par: ParallelConfig, work: Workload) -> float:
    """Everything one block saves for backward on one rank, without recompute: two norms, attention, MLP."""
    geo = geometry(par, work)
    return (
        2 * geo.n_res * norm_saved_per_token(work.model, work.elem_bytes)
        + attention_saved_bytes(par, work)
        + mlp_saved_bytes(par, work)
    )


PUBLISHED_POLICIES = ("op_sac",)
"""Recompute policies the cost model prices for PUBLISHED rows only (tspbench/predict/published.py), never run by a
scheme here (validate_parallel refuses them; docs/method.md#published-policies): op_sac is torchtitan's op-level
selective activation checkpointing (`op_sac_saved_bytes`)."""


def op_sac_saved_bytes(par: ParallelConfig, work: Workload) -> float:
    """What one block keeps under torchtitan's op-level selective activation checkpointing (torchtitan
    parallelisms/parallelize_llama.py @9dec370 and models/llama3/parallelize_llama.py @e7c0cae: `_save_list`,
    `_custom_policy`), as eager bf16 PyTorch runs it: each block is checkpointed with a policy that saves the outputs
    of aten.mm except every second one (the counter restarts per block and counts the block's seven projections in
    forward order wq, wk, wv, wo, w1, w3, w2: wq, wv, w1 and w2 are saved, wk, wo and w3 recomputed) and of the
    SDPA flash kernel (its output and fp32 log-sum-exp); every other op is recomputed from the block input, which the
    checkpoint keeps. Per token: input h, wq's h, wv's n_kv·d, the kernel output h, w1's ffn, w2's h (all ·b) and
    n_h·4 bytes of log-sum-exp. Priced for layouts without tensor or sequence split (FSDP, DDP), the only ones the
    published rows run it on; float8 (whose _scaled_mm is not in the save list, and whose abs/max are) and
    torch.compile (whose partitioner decides what is saved) change the set, so those rows' memory is not priced by
    it (published.py `memory_in_scope`)."""
    model, geo, b = work.model, geometry(par, work), work.elem_bytes
    if geo.t != 1 or par.degree > 1 or geo.n_gemm != geo.n_res:
        raise ValueError(f"recompute=op_sac is priced for layouts without tensor or sequence split, not {par.label()}")
    h, kv_d = model.dim, model.n_kv_heads * model.head_dim
    return geo.n_res * ((4 * h + kv_d + model.ffn_hidden) * b + model.n_heads * 4)


def rebuilt_in_backward(par: ParallelConfig) -> bool:
    """Whether backward re-runs a block's forward before differentiating it (its activations are then temporaries
    of that block's backward): full recompute, and torchtitan's op-level SAC (whose replay rebuilds everything it
    did not save)."""
    return par.recompute in ("full", "op_sac")


def stored_per_layer(par: ParallelConfig, work: Workload) -> float:
    """What each block keeps from its forward until its backward: its input alone under full recompute (h·b per
    residual token; the block is rebuilt in backward), the op-level SAC's saved outputs under op_sac
    (`op_sac_saved_bytes`), else everything it saves (`layer_activation_bytes`)."""
    if par.recompute == "full":
        return geometry(par, work).n_res * work.model.dim * work.elem_bytes
    if par.recompute == "op_sac":
        return op_sac_saved_bytes(par, work)
    return layer_activation_bytes(par, work)


def layer_backward_working_set(par: ParallelConfig, work: Workload) -> dict[str, float]:
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
    col   (tp, tp_msp, tp_sp with T > 1) the end of the gate/up column-parallel backward (Megatron's
          LinearWithGradAccumulationAndAsyncCommunication, schemes/ops/tensor_parallel.py), with the layer's saved
          tensors alive but the MLP's own (gate, up, product) freed: d(gate), d(up) (2·ffn/T), the input gradient
          on the GEMM tokens in its reduction, + under Megatron-SP the re-gathered input and the reduce-scatter's
          output (communication buffers), + the residual-stream gradient; W_down's gradient exists, gate's and
          up's are just computed (memory._layer_moment). Under Megatron-SP at long sequences it is the largest.
    Returns the moments' extra bytes ("mlp", "norm", and "attn", "col" where they apply), the saved part alive at
    each ("mlp_saved", "norm_saved", …) and their communication-buffer parts.
    """
    model, geo, b = work.model, geometry(par, work), work.elem_bytes
    h, ffn = model.dim, model.ffn_hidden
    norm_tok = norm_saved_per_token(model, b)
    attn = attention_saved_bytes(par, work)
    layer = layer_activation_bytes(par, work)
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
        # Megatron-SP: dY is the all-gather of the output gradient and the residual gradient its reduce-scatter
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
    if geo.t > 1 and par.scheme != "tsp":  # the column-parallel entry's backward (its own Function)
        ffn_a, d_x = geo.n_gemm * ffn / geo.t * b, geo.n_gemm * h * b
        col_comm = d_x + (d_x + geo.n_res * h * b if geo.gathered_inputs else 0.0)  # (re-gather,) dx, (its RS)
        out["col"] = 2 * ffn_a + col_comm + res_grad
        out["col_saved"] = layer - 3 * ffn_a
        out["col_comm"] = col_comm
    return out


def has_attention_moment(par: ParallelConfig, geo: Geometry) -> bool:
    """Whether a block's backward has the `attn` moment of `layer_backward_working_set`: a zigzag shard attending
    over all-gathered whole-sequence K/V (sp, tp_sp, fsdp_sp with sp_variant=allgather)."""
    return par.exchange == "allgather" and geo.kv_tokens > 0


def head_saved_bytes(par: ParallelConfig, work: Workload) -> float:
    """Final norm (on the residual tokens), the LM-head input and the cross-entropy's fp32 [tokens, V/vocab_div]
    buffer: log-softmax (F.cross_entropy, replicated head) or softmax (vocabulary-parallel, which also saves
    each token's int64 id within the slice and a bool mask)."""
    model, geo, b, vd = work.model, geometry(par, work), work.elem_bytes, layout(par).vocab_div
    if par.vocab == "ring":  # TSP's ring cross-entropy keeps the head input and an fp32 log-sum-exp only
        return geo.n_res * norm_saved_per_token(model, b) + geo.n_loss * (model.dim * b + 4)
    ids = 9 if vd > 1 else 0
    return geo.n_res * norm_saved_per_token(model, b) + geo.n_loss * (model.dim * b + model.vocab_size / vd * 4 + ids)


def ring_buffer_bytes(par: ParallelConfig, work: Workload) -> float:
    """TSP's persistent receive buffers (schemes/ops/ring.py RingBuffers, shared by every layer): three for the
    attention shard being broadcast ((2 + 2/g)·h²/D: owner r's, whose W_O is still to be applied, r+1's, projected
    before r's attention by the pipelined owner loop, and r+2's in flight) and two for the MLP shard (3·ffn·h/D; on
    the ring, two halves per direction round the bidirectional ring, or broadcast: the same bytes), allocated in the
    first forward and alive from then on. The gradient buffers of the same sizes appear in the first backward
    (counted in its working set). 0 for other schemes."""
    if par.scheme != "tsp":
        return 0.0
    mlp = 3 * work.model.ffn_hidden * work.model.dim / par.degree
    attn = layer_weight_params_per_rank(work.model, par) - mlp  # one owner's attention shard
    return (3 * attn + 2 * mlp) * work.elem_bytes


def kv_cache_bytes(par: ParallelConfig, work: Workload) -> float:
    """One rank's KV cache for work.seq_len tokens (schemes/ops/decode.py): K and V of every layer, 2·L·B·S·(h/g)·b
    per replica, split by heads over T (tp, tp_msp, tp_sp) and by tokens over Σ or D (sp, tp_sp, tsp), i.e.
    ÷ degree in every scheme (tsp: every head of its own 1/D of the tokens). With T (or D) > n_kv a KV head is
    replicated over T/n_kv ranks, and so is its cache: n_kv_local = max(n_kv/T, 1) heads per rank (tsp: D owners'
    heads of its tokens, max(n_kv, D)); the group then caches T/n_kv copies."""
    model, geo, b = work.model, geometry(par, work), work.elem_bytes
    t = par.degree if par.scheme == "tsp" else geo.t
    heads = kv_heads_per_rank(model, t) * (t if par.scheme == "tsp" else 1)
    return 2 * model.n_layers * geo.n_gemm * model.head_dim * heads * b
