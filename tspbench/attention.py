"""Attention kernels that return their log-sum-exp, and causal attention that means the same on every vendor.

A zigzag token shard holds query chunks whose keys are a longer prefix (queries at positions s … s+n−1, keys
0 … s+n−1). "Causal" for such a non-square block is aligned to the bottom-right corner by PyTorch's
CausalBias, but to the TOP-LEFT corner by the CPU flash kernel and by ROCm's aotriton kernels
(ROCm/aotriton#55), which would silently attend the wrong keys on MI300X. So a non-square chunk is never handed
to a kernel as causal. It is composed of two pieces whose meaning is unambiguous (docs/method.md#tsp-attention):

    prefix    queries × keys 0 … s−1, no mask (every prefix key precedes every query)
    diagonal  queries × keys s … s+n−1, square and causal
    merge     o = (e^{lse₁}·o₁ + e^{lse₂}·o₂) / (e^{lse₁} + e^{lse₂}),  lse = log(e^{lse₁} + e^{lse₂})

Backward runs each piece's kernel backward with the MERGED output and log-sum-exp, which gives exactly that
piece's share of dq, dk, dv (the flash-attention identity ring attention relies on).

Kernels (`kernel_family`): the CPU flash kernel (every dtype, GQA native), CUDA/ROCm flash for 16-bit (GQA
native), CUDA memory-efficient attention for fp32 (K/V heads repeated for GQA, as SDPA does), and a
differentiable math path for any other device. Every call first checks the CUDA flash kernel's input contract
(`check_contract`), on every device, so a CPU run refuses what the GPU kernel would refuse or misread
(docs/method.md#gpu-rules). This module imports nothing from torch.distributed.
"""

from __future__ import annotations

import math
from typing import NoReturn

import torch
import torch.nn.functional as F

aten = torch.ops.aten


def kernel_family(q: torch.Tensor) -> str:
    """cpu | flash | math: which kernel computes attention with its log-sum-exp for these queries."""
    if q.device.type == "cpu":
        return "cpu"
    if q.device.type != "cuda":
        return "math"
    return "flash" if q.dtype in (torch.float16, torch.bfloat16) else "efficient"


class KernelContractError(ValueError):
    """Attention inputs that break the flash kernels' contract (`check_contract`)."""


def _spell(name: str, t: torch.Tensor) -> str:
    return f"{name}: shape {tuple(t.shape)}, stride {tuple(t.stride())}, {t.dtype}, {t.device}"


def check_contract(family: str, q, k, v, do=None, o=None, lse=None) -> None:
    """Raise KernelContractError naming the tensor and the rule if the attention inputs break what PyTorch's flash
    API checks (flash_api.cpp mha_fwd / mha_bwd: same dtype and device, last dim of stride 1, one batch size and
    head dim, K/V heads dividing the query heads; for the CUDA flash family also a 16-bit dtype and a head dim that
    is a multiple of 8 and at most 256) or what its backward reads without checking: `o` and `do` shaped and typed
    as `q`, and `lse` a contiguous [B, H, L_q] in float32 (float64 beside float64 inputs), since the kernel indexes
    it from its data pointer (GPU review finding 2). Checked on every device, the CPU path too
    (docs/method.md#gpu-rules)."""
    named = {"q": q, "k": k, "v": v, "do": do, "o": o, "lse": lse}
    given = {n: t for n, t in named.items() if t is not None}

    def refuse(name: str, rule: str) -> NoReturn:
        raise KernelContractError(f"attention kernel contract ({family}): {rule}; {_spell(name, given[name])}")

    for n, t in given.items():
        if t.device != q.device:
            refuse(n, f"{n} must be on q's device {q.device}")
        if n != "lse" and t.dtype != q.dtype:
            refuse(n, f"{n} must have q's dtype {q.dtype}")
        if n != "lse" and (t.dim() != 4 or t.stride(-1) != 1):
            refuse(n, f"{n} must be 4-D [B, H, L, d] with a last dim of stride 1 ('contiguous last dimension')")
    b, h, lq, d = q.shape
    if b == 0:
        refuse("q", "the batch must not be empty")
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        refuse("k", f"k and v must be [B={b}, H_kv, L_k, d={d}], the same shape (v: {tuple(v.shape)})")
    if h % k.shape[1]:
        refuse("k", f"the KV heads ({k.shape[1]}) must divide the query heads ({h}) (GQA)")
    if family == "flash" and (q.dtype not in (torch.float16, torch.bfloat16) or d % 8 or d > 256):
        refuse("q", "the CUDA flash kernel takes float16/bfloat16 with a head dim that is a multiple of 8, ≤ 256")
    if lse is not None:
        if lse.shape != (b, h, lq) or not lse.is_contiguous():
            refuse(
                "lse", f"lse must be a contiguous [B, H, L_q] = {(b, h, lq)}: the kernel reads it from its data pointer"
            )
        if lse.dtype not in (torch.float32, torch.promote_types(q.dtype, torch.float32)):
            refuse("lse", f"lse must be float32 (or float64 beside float64 inputs), not {lse.dtype}")
    for n in ("do", "o"):
        t = given.get(n)
        if t is not None and (t.shape != q.shape or not t.is_contiguous()):
            refuse(n, f"{n} must be contiguous and shaped as q {tuple(q.shape)}")


def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, ...]:
    """(o [B, n_q, L_q, d], lse [B, n_q, L_q] fp32, *kernel state for the backward). No autograd graph.
    `causal` is only ever asked of square blocks (module docstring). k, v may have fewer heads (GQA)."""
    family = kernel_family(q)
    check_contract(family, q, k, v)
    if family == "cpu":
        o, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
        return o, lse
    if family == "flash":
        out = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)
        return out[0], out[1], *out[2:8]  # + cum_seq_q, cum_seq_k, max_q, max_k, philox seed, offset
    if family == "efficient":
        g = q.shape[1] // k.shape[1]
        kr, vr = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        o, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, kr, vr, None, True, 0.0, causal)
        return o, lse[..., : q.shape[-2]], seed, offset  # the kernel pads the log-sum-exp to 32 rows
    return _math_forward(q, k, v, causal)


def attention_lse_backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    state: tuple,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of one block given the (possibly merged) output and log-sum-exp of the whole row.
    `lse`, `o` and `do` may be head or chunk slices of the whole row's: the CUDA flash backward reads the
    log-sum-exp as a contiguous [B, H, L_q] (PyTorch makes only `out` and `grad_out` contiguous), so all three are
    made contiguous here (a no-op when they already are; GPU review finding 2), then the kernel's contract is
    checked on what the kernel will get (`check_contract`, docs/method.md#gpu-rules)."""
    do, o, lse = _kernel_layout(do, o, lse)
    family = kernel_family(q)
    check_contract(family, q, k, v, do, o, lse)
    if family == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, o, lse, 0.0, causal)
    if family == "flash":
        cq, ck, mq, mk, seed, offset = state
        return aten._scaled_dot_product_flash_attention_backward(
            do, q, k, v, o, lse, cq, ck, mq, mk, 0.0, causal, seed, offset
        )[:3]
    if family == "efficient":
        seed, offset = state
        g = q.shape[1] // k.shape[1]
        padded = F.pad(lse, (0, -lse.shape[-1] % 32), value=-math.inf)
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            do,
            q,
            k.repeat_interleave(g, 1),
            v.repeat_interleave(g, 1),
            None,
            o,
            padded,
            seed,
            offset,
            0.0,
            [True, True, True, False],
            causal,
        )
        return dq, _fold(dk, g), _fold(dv, g)
    return _math_backward(do, q, k, v, o, lse, causal)


def _kernel_layout(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Contiguous copies of the backward's row tensors where they are slices (a no-op otherwise)."""
    return tuple(t.contiguous() for t in ts)


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool) -> torch.Tensor:
    g = q.shape[1] // k.shape[1]
    s = (q.float() @ k.float().repeat_interleave(g, 1).transpose(-1, -2)) / math.sqrt(q.shape[-1])  # fp32
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), -math.inf)
    return s


def _math_forward(q, k, v, causal):
    s = _scores(q, k, causal)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1))
    g = q.shape[1] // v.shape[1]
    return (p @ v.float().repeat_interleave(g, 1)).to(q.dtype), lse


def _math_backward(do, q, k, v, o, lse, causal):
    g = q.shape[1] // k.shape[1]
    p = torch.exp(_scores(q, k, causal) - lse.unsqueeze(-1))
    vv = v.float().repeat_interleave(g, 1)
    dof = do.float()
    dv = p.transpose(-1, -2) @ dof
    dp = dof @ vv.transpose(-1, -2)
    ds = p * (dp - (dof * o.float()).sum(-1, keepdim=True)) / math.sqrt(q.shape[-1])
    dq = ds @ k.float().repeat_interleave(g, 1)
    dk = ds.transpose(-1, -2) @ q.float()
    return dq.to(q.dtype), _fold(dk, g).to(k.dtype), _fold(dv, g).to(v.dtype)


def _fold(t: torch.Tensor, g: int) -> torch.Tensor:
    """GQA: the gradient of a repeated K/V head is the sum of its g query heads' shares."""
    return t if g == 1 else t.unflatten(1, (t.shape[1] // g, g)).sum(2)


def merge_lse(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor):
    """Exact combination of two partial attentions over disjoint key sets (fp32 weights)."""
    acc = torch.promote_types(o1.dtype, torch.float32)  # float64 parity runs stay float64
    lse = torch.logaddexp(lse1, lse2)
    w1, w2 = torch.exp(lse1 - lse).unsqueeze(-1), torch.exp(lse2 - lse).unsqueeze(-1)
    return (o1.to(acc) * w1 + o2.to(acc) * w2).to(o1.dtype), lse


def chunk_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int):
    """A query chunk at global offset s against keys 0 … s+n−1 (no autograd graph): (o, lse, kernel states).
    A square chunk (s = 0) is one causal kernel; otherwise the unmasked prefix merged with the square causal
    diagonal (module docstring). Each kernel call checks its contract (attention_lse)."""
    if offset == 0:
        o, lse, *state = attention_lse(q, k, v, True)
        return o, lse, (tuple(state),)
    prefix = attention_lse(q, k[:, :, :offset], v[:, :, :offset], False)
    diag = attention_lse(q, k[:, :, offset:], v[:, :, offset:], True)
    o, lse = merge_lse(prefix[0], prefix[1], diag[0], diag[1])
    return o, lse, (tuple(prefix[2:]), tuple(diag[2:]))


def chunk_backward(do, q, k, v, o, lse, offset: int, states: tuple):
    """dq, dk, dv of `chunk_forward` (dk, dv cover keys 0 … s+n−1), from the merged output and log-sum-exp. Each
    kernel call checks its contract (attention_lse_backward)."""
    do = do.contiguous()
    if offset == 0:
        return attention_lse_backward(do, q, k, v, o, lse, states[0], True)
    dq1, dkp, dvp = attention_lse_backward(do, q, k[:, :, :offset], v[:, :, :offset], o, lse, states[0], False)
    dq2, dkd, dvd = attention_lse_backward(do, q, k[:, :, offset:], v[:, :, offset:], o, lse, states[1], True)
    return dq1 + dq2, torch.cat([dkp, dkd], 2), torch.cat([dvp, dvd], 2)


class _PrefixCausal(torch.autograd.Function):
    """A query chunk at offset s against keys 0 … s+n−1: the unmasked prefix merged with the square causal
    diagonal (module docstring)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int) -> torch.Tensor:
        o, lse, states = chunk_forward(q, k, v, offset)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.offset, ctx.states = offset, states
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        q, k, v, o, lse = ctx.saved_tensors
        return *chunk_backward(do, q, k, v, o, lse, ctx.offset, ctx.states), None


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int) -> torch.Tensor:
    """Causal attention of a contiguous query chunk against a key prefix, never materialising S×S in Python.

    q: [B, n_q, Lq, d] at global positions q_offset … q_offset+Lq−1; k, v: [B, n_kv, Lk, d] at positions
    0 … Lk−1 with Lk = q_offset + Lq; n_q may be a multiple of n_kv (GQA). A square block goes to SDPA with
    is_causal (its meaning is the same everywhere); a longer prefix is composed (module docstring).
    """
    lq, lk = q.shape[-2], k.shape[-2]
    assert lk == q_offset + lq, (lq, lk, q_offset)
    if lq == lk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
    return _PrefixCausal.apply(q, k, v, q_offset)
