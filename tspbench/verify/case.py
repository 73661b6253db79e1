"""One verification case and its result: the configuration, the tolerances and the per-tensor check.

Tolerance. The error measure is normwise: max|got − ref| / max|ref| per tensor. Sharding only reorders
floating-point sums (split GEMMs, all-reduced partial sums, the online-softmax merge), so the difference
is bounded by ≈ n·ε relative with n ≲ 10³ terms at test sizes: ≈ 2e-13 in float64. TOL[float64] = 1e-10
leaves a wide margin and is still ~10⁸ below what a real sharding bug produces (O(1e-2 … 1): a missing
all-reduce, a skipped ring hop or a wrong zigzag order changes values at the scale of the values).
float32 (ε ≈ 1.2e-7) gets 2e-4; bfloat16 (ε ≈ 7.8e-3, smoke only) 5e-2.

The AdamW-step comparison runs in float64 only. Adam's first update is ≈ lr·sign(g) wherever |g| ≫ its ε,
so an element whose gradient sits near ε moves by up to lr on a last-bit difference of g: that is the
optimiser's conditioning, not the scheme's, and float32/bfloat16 rounding reaches it. float64 rounding
does not, so the optimiser path is checked there.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Annotated

import torch

from tspbench.config import DTYPES, ConfigError, ModelConfig, Range, check_declared
from tspbench.parallel import ParallelConfig, validate_parallel

TOL = {"float64": 1e-10, "float32": 2e-4, "bfloat16": 5e-2}


@dataclass
class VerifyConfig(ParallelConfig):
    """`python -m tspbench.verify`: one case. Flat, so the command reads like the layout it checks
    (`scheme=tsp degree=4 dp=2 model.n_kv_heads=2 seq_len=64`); the layout fields are ParallelConfig's."""

    scheme: str = "tsp"
    degree: Annotated[int, Range(1)] = 2
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model dimensions: a preset (`model=tiny|small|llama7b|llama3_8b`, conf/model) or field overrides
    (`model.n_kv_heads=2`)."""
    seq_len: Annotated[int, Range(1)] = 32
    """Sequence length S (zigzag needs S divisible by 2·Σ)."""
    batch: Annotated[int, Range(1)] = 2
    """Micro-batch per replica."""
    dtype: str = "float64"
    """float64 (parity), float32, bfloat16 (smoke); tolerances in tspbench.verify.case.TOL."""
    seed: Annotated[int, Range(0)] = 0
    """Seed for weights and data."""
    device: str = "cpu"
    """cpu (gloo) | cuda (nccl)."""
    optimizer_step: bool = True
    """Also compare parameters after one AdamW step (float64 only; see the module docstring)."""
    grad_bucket_elems: Annotated[int, Range(0, note="0: the default, 2^25")] = 0
    """Gradient-sync bucket size in elements (0: the default, 2^25); a small value makes every bucketing path
    run at test sizes (a lone gradient reduced in place, several gradients packed in one buffer)."""
    decode_steps: Annotated[int, Range(0, note="0: training parity")] = 0
    """Serving instead of training: prefill seq_len tokens into a KV cache, then decode this many tokens one
    at a time, comparing the prefill and every decode step's logits with the reference (tspbench/verify/serve.py)."""
    greedy: bool = False
    """Serving only: greedy generation instead of teacher forcing. Each decode step is fed the argmax of the
    previous step's logits (the first: the prefill's last position); the generated tokens must equal the
    single-device model's greedy tokens exactly and every step's logits within the dtype tolerance."""

    strict: bool = True
    """Hold the CPU run to NCCL's rules (schemes/nccl_rules.py): every collective refuses, on every rank, a strided
    tensor, a wrong device or dtype, or dtypes and shapes that differ between ranks (docs/method.md#gpu-rules)."""

    def validate(self) -> None:
        check_declared(self)  # each numeric field's declared Range
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype={self.dtype!r} is unknown; allowed: {', '.join(DTYPES)}")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device={self.device!r} is unknown; allowed: cpu, cuda")
        if self.greedy and self.decode_steps == 0:
            raise ConfigError("greedy=true needs decode_steps ≥ 1 (the number of greedily generated tokens)")
        if self.device == "cuda" and torch.cuda.device_count() < self.parallel().world_size:
            raise ConfigError(
                f"device=cuda needs {self.parallel().world_size} GPUs (dp × degree), "
                f"found {torch.cuda.device_count()}; use device=cpu"
            )
        validate_parallel(self.model, self.parallel(), self.seq_len, self.batch)


@dataclass
class TensorCheck:
    name: str
    max_abs: float
    max_rel: float
    tol: float
    ok: bool


@dataclass
class CaseResult:
    case: dict
    checks: list[TensorCheck]
    comm_layer0: dict  # recv elements per phase, layer 0, one forward+backward
    comm_ops_layer0: list  # (op, phase, numel, recv_numel) for layer 0
    comm_edges: dict  # recv elements per phase of the embedding ("embed") and LM head + loss ("head")
    param_bytes: list[int]  # per rank
    activation_bytes: list[int]  # per rank: bytes saved for backward by one forward (params excluded)
    breakage: str | None = None
    kv_cache_bytes: list[int] = field(default_factory=list)  # per rank, after prefill + decode (serving)
    local_numel: list[dict[str, int]] = field(default_factory=list)  # per rank: elements held of each parameter

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def check_tensor(name: str, got: torch.Tensor, ref: torch.Tensor, tol: float) -> TensorCheck:
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    if got.shape != ref.shape:
        return TensorCheck(name, float("inf"), float("inf"), tol, False)
    abs_err = (got - ref).abs().max().item()
    scale = ref.abs().max().item()
    rel = abs_err / scale if scale > 0 else abs_err
    return TensorCheck(name, abs_err, rel, tol, bool(rel <= tol))


def breakage(name: str | None):
    if name is None:
        return contextlib.nullcontext()
    from tspbench.verify.broken import BREAKAGES

    return BREAKAGES[name]()
