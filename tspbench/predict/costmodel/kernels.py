"""Kernels priced by shape (`Pricing.kernels="shape"`): each GEMM and flash-attention call a layer issues, at the
efficiency its own shape reaches on the device.

    efficiency = curve(x) / wave(source shape at x) × wave(call),   wave = tiles / (⌈tiles / units⌉ · units)

`curve` is the published TFLOP/s ÷ the profile's bf16 peak, interpolated linearly in log₂ x between the points the
profile's yaml cites (x: the key length of an attention call, K of a GEMM; clamped at the end points, no
extrapolation). Dividing each point by the wave quantisation its own benchmark shape had and multiplying by the call's
leaves the source's per-tile roll-off (short key loops, short K) and replaces its occupancy by the call's: output
tiles of 128 × 128 for a GEMM; 128 queries × heads × batch for the flash forward, 128 keys × heads × batch for its
backward (it parallelises over key blocks), against `compute_units` (CUs / SMs). Nothing is fitted.

Where a profile has no published curve (no `compute_units`, no points for that mask or direction, another head dim
than the source's, a non-16-bit dtype) the asymptote is the profile's flat figure: `attention_forward_efficiency` /
`attention_backward_efficiency` for an attention call where the profile has them (16-bit), else `matmul_efficiency`
(the measured best-shape GEMM ceiling, MAMF, conf/hardware), still times the call's wave factor when
`compute_units` is known. FLOP conventions are the sources' and
flops.py's: a causal block counts half its q·k pairs, a flash backward 2.5 forwards.

Measured on the device replaces published (`measured_or`): when conf/hardware/<name>.shapes.jsonl holds the calls
`python -m tspbench.gpu_check shapes=true` timed there (scripts/device_check.sh brings them back), a call timed
takes its measured efficiency, and every other call of its class the model's value scaled by the median measured ÷
modelled ratio of the timed ones. Caveat: the H100 curves are FlashAttention-3's, while PyTorch's SDPA runs
FlashAttention-2 (the flat profile's attention_*_efficiency says so): a device's timed calls are the remedy.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel.hardware import HardwareProfile
from tspbench.predict.costmodel.params import kv_heads_per_rank, megatron_tp_degree
from tspbench.predict.costmodel.workload import Workload

TILE = 128
"""Output tile edge of the GEMM and flash-attention kernels (128 × 128 GEMM tiles, 128-row attention blocks)."""
MASKS = ("causal", "unmasked", "diagonal")
DIRECTIONS = ("fwd", "bwd")
HALF = ("bfloat16", "float16")
"""The dtypes the published curves were measured in."""
KERNELS = ("flat", "shape")
"""Values of Pricing.kernels."""


def wave_factor(tiles: int, hw: HardwareProfile) -> float:
    """tiles / (waves · units): the fraction of the last wave's units that are busy, averaged over the waves; 1.0 when
    the profile has no `compute_units`."""
    units = hw.compute_units
    if not units or tiles <= 0:
        return 1.0
    return tiles / (math.ceil(tiles / units) * units)


def _interp(points: list[list[float]], x: float, norm) -> float:
    """Piecewise-linear in log₂ x over [[x, y], …] (x increasing), each y passed through norm(x, y); clamped."""
    xs = [math.log2(p[0]) for p in points]
    ys = [norm(p[0], p[1]) for p in points]
    lx = math.log2(max(x, 1.0))
    if lx <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        if lx <= xs[i]:
            t = (lx - xs[i - 1]) / (xs[i] - xs[i - 1])
            return ys[i - 1] + t * (ys[i] - ys[i - 1])
    return ys[-1]


def _attention_tiles(rows: int, heads: int, batch: int) -> int:
    return math.ceil(rows / TILE) * heads * batch


def attention_curve(hw: HardwareProfile, k_tokens: int, head_dim: int, mask: str, direction: str) -> float | None:
    """The source's efficiency at key length k_tokens with its own wave quantisation divided out, or None where the
    profile has no published curve for this mask, direction and head dim."""
    table = hw.attention_fwd_points if direction == "fwd" else hw.attention_bwd_points
    shape = hw.attention_points_shape or {}
    points = (table or {}).get("unmasked" if mask == "unmasked" else "causal")
    if not points or not hw.compute_units or head_dim != shape.get("head_dim"):
        return None
    peak = hw.peak_flops_bf16 / 1e12

    def norm(x: float, tflops: float) -> float:
        return tflops / peak / wave_factor(_attention_tiles(int(x), shape["heads"], shape["batch"]), hw)

    return _interp(points, k_tokens, norm)


def measured_or(hw: HardwareProfile, key: tuple, modelled: float) -> float:
    """A kernel call's efficiency where the device's timed calls say it (`HardwareProfile.measured_shapes`, from
    `gpu_check shapes=true`): the measured value for exactly this call; for a call not timed, the model's value × the
    median measured ÷ modelled ratio of the timed calls of its class (attention forward, attention backward, GEMM),
    so the measurements replace the published curve's level everywhere; without timed calls, the model's value."""
    table = hw.measured_shapes
    if not table:
        return modelled
    if key in table:
        return table[key][0]
    same = [m / mod for k, (m, mod) in table.items() if k[0] == key[0] and (k[0] == "gemm" or k[-1] == key[-1])]
    return min(1.0, modelled * statistics.median(same)) if same else modelled


def attention_efficiency(
    q_tokens: int,
    k_tokens: int,
    heads: int,
    head_dim: int,
    mask: str,
    direction: str,
    batch: int,
    hw: HardwareProfile,
    dtype: str = "bfloat16",
) -> float:
    """Fraction of the peak one flash-attention call reaches (module docstring). mask: causal (a square causal
    block, the whole sequence), diagonal (a square causal block of a chunk against its own keys: priced as causal),
    unmasked (a chunk against keys that all precede it); direction: fwd or bwd. Without a curve the asymptote is the
    profile's flat attention figure for that direction (attention_*_efficiency), else matmul_efficiency. The
    published curves and flat figures are 16-bit: another dtype takes matmul_efficiency."""
    if mask not in MASKS or direction not in DIRECTIONS:
        raise ValueError(f"mask={mask!r} / direction={direction!r}: allowed {MASKS} / {DIRECTIONS}")
    curve = attention_curve(hw, k_tokens, head_dim, mask, direction) if dtype in HALF else None
    flat = hw.attention_forward_efficiency if direction == "fwd" else hw.attention_backward_efficiency
    base = curve if curve is not None else (flat if flat is not None and dtype in HALF else hw.matmul_efficiency)
    rows = q_tokens if direction == "fwd" else k_tokens
    modelled = min(1.0, base * wave_factor(_attention_tiles(rows, heads, batch), hw))
    key = ("attention", q_tokens, k_tokens, heads, head_dim, mask, batch, direction)
    return measured_or(hw, key, modelled) if dtype in HALF else modelled


def gemm_efficiency(m: int, n: int, k: int, dtype: str, hw: HardwareProfile) -> float:
    """Fraction of the peak one GEMM (m × k by k × n) reaches: the published square-GEMM curve at K (16-bit dtypes,
    `gemm_points`; else matmul_efficiency) × the wave factor of its ⌈m/128⌉·⌈n/128⌉ output tiles."""
    base = hw.matmul_efficiency
    if hw.gemm_points and hw.compute_units and dtype in HALF:
        peak = hw.peak_flops_bf16 / 1e12
        tiles = lambda s: math.ceil(s / TILE) ** 2  # noqa: E731 (the square source shape)
        base = _interp(hw.gemm_points, k, lambda x, tf: tf / peak / wave_factor(tiles(int(x)), hw))
    modelled = min(1.0, base * wave_factor(math.ceil(m / TILE) * math.ceil(n / TILE), hw))
    return measured_or(hw, ("gemm", m, n, k), modelled) if dtype in HALF else modelled


# ---------------------------------------------------------------------------------------------- kernel calls
@dataclass(frozen=True)
class AttentionCall:
    """`count` identical flash-attention calls of q_tokens queries against k_tokens keys."""

    q_tokens: int
    k_tokens: int
    heads: int
    head_dim: int
    mask: str
    batch: int = 1
    count: int = 1

    @property
    def flops(self) -> float:
        """Forward FLOPs of all `count` calls (4·q·k·heads·d·B, half of it for a causal or diagonal block)."""
        half = 0.5 if self.mask != "unmasked" else 1.0
        return 4.0 * self.q_tokens * self.k_tokens * self.heads * self.head_dim * self.batch * half * self.count


@dataclass(frozen=True)
class GemmCall:
    """`count` identical GEMMs Y[m, n] = X[m, k]·Wᵀ of weight `name` (q, k, v, o, gate, up, down)."""

    name: str
    m: int
    n: int
    k: int
    count: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count

    def backward(self) -> list[GemmCall]:
        """dgrad dX[m, k] = dY·W (m × n by n × k) and wgrad dW[n, k] = dYᵀ·X (n × m by m × k)."""
        return [
            GemmCall(f"{self.name}.dgrad", self.m, self.k, self.n, self.count),
            GemmCall(f"{self.name}.wgrad", self.n, self.k, self.m, self.count),
        ]


def _zigzag(seq_len: int, degree: int, rank: int) -> list[tuple[int, int]]:
    """(global start, length) of rank's chunks (schemes/ops/layout.py SeqLayout.chunks_of, zigzag)."""
    if degree == 1:
        return [(0, seq_len)]
    c = seq_len // (2 * degree)
    return [(rank * c, c), ((2 * degree - 1 - rank) * c, c)]


def _prefix_calls(chunks, heads: int, d: int, batch: int, count: int = 1) -> list[AttentionCall]:
    """Each chunk against its key prefix (tspbench/attention.py chunk_forward): one causal call at offset 0, else the
    unmasked prefix and the square causal diagonal."""
    calls = []
    for start, n in chunks:
        if start == 0:
            calls.append(AttentionCall(n, n, heads, d, "causal", batch, count))
        else:
            calls.append(AttentionCall(n, start, heads, d, "unmasked", batch, count))
            calls.append(AttentionCall(n, n, heads, d, "diagonal", batch, count))
    return calls


def _ring_calls(seq_len: int, sigma: int, rank: int, heads: int, d: int, batch: int) -> list[AttentionCall]:
    """Every (my query chunk, hop's key chunk) pair that contributes (schemes/ops/ring_attention.py _pairs)."""
    calls = []
    for step in range(sigma):
        src = (rank - step) % sigma
        for qs, n in _zigzag(seq_len, sigma, rank):
            for ks, _ in _zigzag(seq_len, sigma, src):
                if ks == qs:
                    calls.append(AttentionCall(n, n, heads, d, "diagonal", batch))
                elif ks < qs:
                    calls.append(AttentionCall(n, n, heads, d, "unmasked", batch))
    return calls


def attention_calls(par: ParallelConfig, work: Workload, rank: int = 0) -> list[AttentionCall]:
    """One layer's forward flash-attention calls on `rank` (the zigzag balances every rank's FLOPs; the call shapes of
    rank 0 are listed by default).
      tsp           per owner (D), per K/V head bucket (kv_bucket_heads·g query heads; all n_h/D at 0), per zigzag
                    chunk of S/(2D) queries: its key prefix unmasked + the diagonal causal (schemes/ops/owner_attention)
      allgather     sp, tp_sp, fsdp_sp: per zigzag chunk of S/(2Σ) against its key prefix, n_h/T heads
      ring          per hop, each (query chunk, key chunk) pair that contributes, c × c blocks
      ulysses       one full-length causal call on n_h/(T·Σ) heads
      tp, tp_msp, single   one full-sequence causal call on n_h/T heads"""
    model, s, b, d = work.model, work.seq_len, work.batch, work.model.head_dim
    if par.scheme == "tsp":
        dd = par.degree
        kv_owner = int(kv_heads_per_rank(model, dd))
        g = model.n_heads // model.n_kv_heads
        size = par.kv_bucket_heads or kv_owner
        buckets = [min(size, kv_owner - lo) for lo in range(0, kv_owner, size)]
        calls = []
        for nb in sorted(set(buckets)):
            calls += _prefix_calls(_zigzag(s, dd, rank), nb * g, d, b, count=dd * buckets.count(nb))
        return calls
    t, sigma = megatron_tp_degree(par), par.sp_degree
    if sigma > 1 and par.exchange == "ulysses":
        return [AttentionCall(s, s, model.n_heads // (t * sigma), d, "causal", b)]
    if sigma > 1 and par.exchange == "ring":
        return _ring_calls(s, sigma, rank, model.n_heads // t, d, b)
    return _prefix_calls(_zigzag(s, sigma, rank), model.n_heads // t, d, b)


def gemm_calls(par: ParallelConfig, work: Workload) -> list[GemmCall]:
    """One layer's forward GEMMs on one rank. Token-sharded schemes run them on B·S/Σ tokens (Megatron-SP gathers
    its tokens first: B·S in tp, tp_msp), head/channel-sharded ones on n_h/T heads and ffn/T channels; tsp runs every
    owner's shard on its B·S/D tokens: D skinny projections of n_h·d/D columns (N = 512 for llama7b at D = 8) and D
    MLP shards of ffn/D channels (two half-shard pieces each under mlp_exchange=biring)."""
    model, h, d = work.model, work.model.dim, work.model.head_dim
    m = work.tokens // par.sp_degree
    if par.scheme == "tsp":
        dd = par.degree
        kv = int(kv_heads_per_rank(model, dd)) * d
        pieces = 2 if par.mlp_exchange == "biring" else 1
        f = model.ffn_hidden // dd // pieces
        return [
            GemmCall("q", m, model.n_heads * d // dd, h, dd),
            GemmCall("k", m, kv, h, dd),
            GemmCall("v", m, kv, h, dd),
            GemmCall("o", m, h, model.n_heads * d // dd, dd),
            GemmCall("gate", m, f, h, dd * pieces),
            GemmCall("up", m, f, h, dd * pieces),
            GemmCall("down", m, h, f, dd * pieces),
        ]
    t = megatron_tp_degree(par)
    kv = int(kv_heads_per_rank(model, t)) * d
    f = model.ffn_hidden // t
    return [
        GemmCall("q", m, model.n_heads * d // t, h),
        GemmCall("k", m, kv, h),
        GemmCall("v", m, kv, h),
        GemmCall("o", m, h, model.n_heads * d // t),
        GemmCall("gate", m, f, h),
        GemmCall("up", m, f, h),
        GemmCall("down", m, h, f),
    ]


def layer_shape_time_s(par: ParallelConfig, work: Workload, hw: HardwareProfile, *, reruns: int) -> tuple[float, float]:
    """(FLOPs, seconds) of one layer's attention and GEMM calls on one rank, each at its own efficiency: the forward
    calls, plus in training every GEMM's dgrad and wgrad and every attention call's backward (2.5 × its FLOPs), and
    `reruns` more forwards of the attention kernel (recompute=full, or selective outside tsp). recompute=full's replay
    of the GEMMs (all but W_down; tsp's MLP replays whole) is added here too."""
    peak = hw.peak_flops(work.dtype)
    train = work.mode == "train"
    flops = seconds = 0.0
    for a in attention_calls(par, work):
        passes = 1 + (reruns if train else 0)
        shape = (a.q_tokens, a.k_tokens, a.heads, a.head_dim, a.mask)
        eff = attention_efficiency(*shape, "fwd", a.batch, hw, work.dtype)
        flops += passes * a.flops
        seconds += passes * a.flops / (peak * eff)
        if train:
            eff = attention_efficiency(*shape, "bwd", a.batch, hw, work.dtype)
            flops += 2.5 * a.flops
            seconds += 2.5 * a.flops / (peak * eff)
    for g in gemm_calls(par, work):
        calls = [g]
        if train:
            calls += g.backward()
            if par.recompute == "full" and (par.scheme == "tsp" or g.name != "down"):
                calls.append(g)
            if par.recompute == "op_sac" and g.name in ("k", "o", "up"):  # torchtitan's op SAC: the unsaved mm's
                calls.append(g)
        for c in calls:
            flops += c.flops
            seconds += c.flops / (peak * gemm_efficiency(c.m, c.n, c.k, work.dtype, hw))
    return flops, seconds
