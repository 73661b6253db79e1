"""Elementwise (memory-bound) work: the bytes the step's non-matmul ops move through device memory, priced at the
device's memory bandwidth (docs/method.md#elementwise).

The roofline (time.compute_time_s) prices the GEMMs and the attention kernel; between them a Llama block runs
token-wise ops whose time is their traffic ÷ `HardwareProfile.mem_bw`: two RMSNorms and two residual adds on the
residual stream, RoPE on Q and K, SwiGLU's silu(gate)·up; after the last block a final norm and the fp32
cross-entropy over the vocabulary. `EAGER` is each op's traffic as eager PyTorch runs tspbench/model.py, bytes per
element in bf16 (forward, backward), counted op by op on the model code (tspbench/predict/traffic.py: every op reads
its inputs and writes its outputs once; tests/unit/test_elementwise.py holds the closed form to that count for the
whole model, forward and backward):

    RMSNorm           x.float(), pow(2), mean, x·rsqrt, type_as, ·weight   36 / 96 per element of h (weight grad in)
    residual add      read two, write one; backward: the two gradients'    6 / 6
                      sum on the residual stream
    RoPE (Q and K)    four products, two sums, stack (interleaved pairs)   19 / 29 per element of Q and K
    SwiGLU            silu(g)·u; its Function's in-place backward          10 / 48 per element of ffn
    loss              fp32 upcast, log-softmax, NLL and their gradients    18 / 26 per class

`COMPILED` (torch.compile, a published row's torch_compile stack: an estimate, not counted) fuses each region into one
kernel that reads its inputs and writes its outputs once, the backward moving twice the forward's bytes: a norm with
the residual add before it 8 / 16, RoPE 4 / 8, SwiGLU 6 / 12, the loss 2 / 4 (the final norm 8 / 16). Other dtypes
scale by their element size ÷ 2. Full recompute, and torchtitan's op-level SAC (which saves matmul and attention
outputs only), run every elementwise op of the block forward again. Tokens and widths per rank follow the scheme's
geometry (activations.geometry): the residual stream's n_res tokens at the full width h, the attention / MLP regions'
n_gemm tokens at the head / channel shard 1/t, the loss's n_loss tokens over V / vocab_div classes. The bandwidth is
the datasheet's (an upper bound: no efficiency applied; stated, not fitted). `"none"` prices none of it (the time
model before this term).
"""

from __future__ import annotations

from dataclasses import dataclass

from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel.activations import geometry
from tspbench.predict.costmodel.params import kv_heads_per_rank, layout
from tspbench.predict.costmodel.workload import Workload

ELEMENTWISE = ("eager", "compiled", "none")
"""How the elementwise work is priced (Pricing.elementwise)."""
RERUN_ELEMENTWISE = ("full", "op_sac")
"""Recompute modes that run every elementwise op of the block forward again in backward."""


@dataclass(frozen=True)
class Traffic:
    """Bytes per element (bf16), forward and backward, of each elementwise region (module docstring)."""

    norm: tuple[float, float]
    """An RMSNorm, per element of h (compiled: with the residual add before it)."""
    add: tuple[float, float]
    """A residual add, per element of h (compiled: 0, inside the norm's kernel)."""
    rope: tuple[float, float]
    """RoPE, per element of Q and of K."""
    swiglu: tuple[float, float]
    """silu(gate)·up, per element of the intermediate width."""
    loss: tuple[float, float]
    """The cross-entropy, per class."""


EAGER = Traffic(norm=(36, 96), add=(6, 6), rope=(19, 29), swiglu=(10, 48), loss=(18, 26))
"""Counted on tspbench/model.py in bf16 (tspbench/predict/traffic.py)."""
COMPILED = Traffic(norm=(8, 16), add=(0, 0), rope=(4, 8), swiglu=(6, 12), loss=(2, 4))
"""torch.compile's fused regions: each reads its inputs and writes its outputs once; backward twice forward."""


def block_bytes(par: ParallelConfig, work: Workload, table: Traffic, direction: int) -> float:
    """Bytes one rank's elementwise ops move in one block, forward (`direction` 0) or backward (1)."""
    model, geo = work.model, geometry(par, work)
    scale = work.elem_bytes / 2
    h, t = model.dim, geo.t
    qk = (model.n_heads / t + kv_heads_per_rank(model, t)) * model.head_dim
    stream = 2 * h * (table.norm[direction] + table.add[direction])
    inner = qk * table.rope[direction] + model.ffn_hidden / t * table.swiglu[direction]
    return scale * (geo.n_res * stream + geo.n_gemm * inner)


def head_bytes(par: ParallelConfig, work: Workload, table: Traffic, direction: int) -> float:
    """Bytes of the final norm (on the residual stream) and the loss (over the rank's tokens and classes)."""
    lay, geo = layout(par), geometry(par, work)
    classes = work.model.vocab_size / lay.vocab_div
    norm = geo.n_res * work.model.dim * table.norm[direction]
    return work.elem_bytes / 2 * (norm + work.tokens / lay.loss_div * classes * table.loss[direction])


def elementwise_time_s(
    par: ParallelConfig, work: Workload, mem_bw: float, how: str, n_layers: int, with_loss: bool
) -> float:
    """Seconds of one rank's elementwise work in one step (`how`: ELEMENTWISE; `with_loss`: the full model's final
    norm and cross-entropy too). Training: forward and backward, and the block forward again under full recompute or
    op-level SAC; forward: the forward alone; decode: none (its step is the weights' and KV cache's read)."""
    if how not in ELEMENTWISE:
        raise ValueError(f"Pricing.elementwise={how!r} is unknown; allowed: {', '.join(ELEMENTWISE)}")
    if how == "none" or work.mode == "decode":
        return 0.0
    table = COMPILED if how == "compiled" else EAGER
    fwd, bwd = block_bytes(par, work, table, 0), block_bytes(par, work, table, 1)
    total = n_layers * fwd
    if work.mode == "train":
        total += n_layers * (bwd + (fwd if par.recompute in RERUN_ELEMENTWISE else 0.0))
    if with_loss:
        total += head_bytes(par, work, table, 0) + (head_bytes(par, work, table, 1) if work.mode == "train" else 0.0)
    return total / mem_bw
