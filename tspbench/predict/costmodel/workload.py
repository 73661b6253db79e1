"""What a step runs and how it trains: the first layer of the cost model (imports nothing of it).

Every formula of the cost model is a function of a layout (tspbench.parallel.ParallelConfig: which scheme, over
how many ranks, with which options), a `Workload` (the model, B sequences of S tokens, forward or training, the
number format) and, for memory, a `Training` setting (optimizer state, master weights, gradient format); the time
model adds a hardware profile (hardware.py). Notation: docs/method.md#notation.
"""

from __future__ import annotations

from dataclasses import dataclass

from tspbench.config import ModelConfig

BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of each number format."""


@dataclass(frozen=True)
class Workload:
    """One replica's step: which model, on how many tokens, forward or training, in which number format."""

    model: ModelConfig
    """The Llama-style model (h, L, n_h, n_kv, ffn, V)."""
    seq_len: int
    """S: tokens per sequence (for a decode step: the cached context, tokens already in the KV cache)."""
    batch: int = 1
    """B: sequences per replica (the micro-batch)."""
    mode: str = "train"
    """train (forward, backward, optimizer step) or forward (no grad: prefill); the decode functions
    (decode_step_time, kv_cache_bytes) ignore it. Each function refuses a mode it has no formula for."""
    dtype: str = "bfloat16"
    """Number format of weights and activations (a key of BYTES)."""

    @property
    def tokens(self) -> int:
        """N = B·S: the replica's tokens."""
        return self.batch * self.seq_len

    @property
    def elem_bytes(self) -> int:
        """b: bytes per element of `dtype`."""
        return BYTES[self.dtype]


@dataclass(frozen=True)
class Training:
    """How a training step keeps its model state (params.state_bytes_per_param: k bytes per parameter)."""

    optimizer: str = "adamw"
    """adamw (two moments per parameter) or sgd (no state)."""
    master_fp32: bool = True
    """AdamW with 16-bit weights keeps an fp32 master copy and fp32 moments (Megatron's mixed precision); false:
    the moments in the parameter dtype, as torch's AdamW keeps them."""
    grad_dtype: str | None = None
    """Number format of the gradients; None: the workload's dtype (bf16 grads, k = 16; float32 gives k = 18)."""

    def grad_bytes(self, work: Workload) -> int:
        """bg: bytes per gradient element."""
        return BYTES[self.grad_dtype or work.dtype]


TRAINING = Training()
"""The default training setting: AdamW, fp32 master weights and moments, gradients in the run dtype."""


@dataclass(frozen=True)
class Pricing:
    """Which of the time model's priced mechanisms apply (all, by default). Each is something the code does (an
    overlap it issues, a link it uses); switching one off prices the code as it was before that change, which is how
    the before → after table of the fair-fight changes is made (every change alone and all together)."""

    links: str = "topology"
    """topology: a collective is priced on the links its group really has (on a fully connected mesh a p-GPU group
    has p − 1 links per GPU; on a switched node the full per-GPU bandwidth; across nodes the NIC); node: every
    intra-node collective gets the whole node's bandwidth (the rule before the topology model)."""
    dp_overlap: bool = True
    """The data-parallel gradient reduction runs behind the backward (bucketed, launched from gradient hooks as DDP
    and Megatron's --overlap-grad-reduce do); false: it follows the backward, exposed."""
    tp_async: bool = True
    """Megatron's default backward overlap of the TP family (the sequence-parallel input re-gathered behind the dgrad
    GEMM, dgrad reduce-scattered behind the wgrad GEMM); false: every TP collective synchronous (and, under
    Megatron-SP, the gathered inputs kept instead of re-gathered: the code before it)."""
    ulysses_overlap: bool = True
    """DeepSpeed-Ulysses' communication overlap (DeepSpeed ≥ 0.14.5 with sp_stream): Q, K, V exchanged one by one,
    each behind the next projection forward and the next projection's backward, O's gradient behind W_O's wgrad
    GEMM; false: the code before it, one packed [Q; K; V] all-to-all and O's, synchronous."""
    tsp_kv_pipeline: bool = True
    """TSP's K/V all-gathers pipelined across owners (owner r+1's projections and gather posted before owner r's
    attention); false: each owner's gather waited at once."""
    elementwise: str = "eager"
    """eager: the token-wise ops between the GEMMs (norms, residual adds, RoPE, SwiGLU's product, the loss) at the
    device's memory bandwidth, each op's traffic as eager PyTorch runs it (costmodel/elementwise.py); compiled: as
    torch.compile fuses them (a published row's torch_compile stack); none: not priced (the time model before)."""
    kernels: str = "flat"
    """flat: every FLOP at the profile's one matmul_efficiency (the attention kernel at its calibrated rates on a
    calibrated profile); shape: each GEMM and flash-attention call a layer issues at the efficiency of its own shape,
    from published kernel benchmarks and wave quantisation on the device's compute units (costmodel/kernels.py), the
    LM head still flat."""


PRICING = Pricing()
"""Every priced mechanism the code has."""
