"""Causal attention of a zigzag chunk is composed of square pieces only (tspbench/attention.py): the unmasked
key prefix merged by log-sum-exp with the square causal diagonal. Equal to the reference in float64 on CPU,
forward and every gradient, for every chunk shape the zigzag layout produces, MHA and GQA; and the reason it
exists: a kernel asked for a non-square causal block may align the mask to the top-left corner (the CPU flash
kernel here, ROCm's aotriton), which attends the wrong keys. Every kernel call checks the flash kernels' input
contract (check_contract), which names the tensor and the rule it breaks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tspbench.attention import (
    KernelContractError,
    attention_lse,
    attention_lse_backward,
    causal_attention,
    check_contract,
)
from tspbench.schemes.ops.layout import SeqLayout

TOL = 1e-12  # float64; the composition only reorders the softmax sums (observed ≈ 5e-16)


def reference(q, k, v, offset):
    """The same rows of a full square causal attention: queries padded with zeros for the earlier positions."""
    b, h, _n, d = q.shape
    pad = torch.zeros(b, h, offset, d, dtype=q.dtype)
    full = F.scaled_dot_product_attention(torch.cat([pad, q], 2), k, v, is_causal=True, enable_gqa=h != k.shape[1])
    return full[:, :, offset:]


def chunk_shapes(seq_len: int, degree: int) -> list[tuple[int, int]]:
    """(offset, length) of every query chunk of every rank of a zigzag layout."""
    return sorted({c for r in range(degree) for c in SeqLayout(seq_len, degree, r).chunks})


@pytest.mark.parametrize("degree", [2, 3, 4, 8])
@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_composition_equals_reference(degree, n_kv):
    torch.manual_seed(degree)
    b, h, d, seq = 2, 4, 8, 48
    for offset, n in chunk_shapes(seq, degree):
        q = torch.randn(b, h, n, d, dtype=torch.float64, requires_grad=True)
        k = torch.randn(b, n_kv, offset + n, d, dtype=torch.float64, requires_grad=True)
        v = torch.randn(b, n_kv, offset + n, d, dtype=torch.float64, requires_grad=True)
        do = torch.randn(b, h, n, d, dtype=torch.float64)
        got = torch.autograd.grad(causal_attention(q, k, v, offset), (q, k, v), do, retain_graph=False)
        o = causal_attention(q, k, v, offset)
        ref = reference(q, k, v, offset)
        want = torch.autograd.grad(ref, (q, k, v), do)
        assert (o - ref).abs().max() <= TOL * ref.abs().max(), (offset, n)
        for name, g, w in zip("qkv", got, want):
            assert (g - w).abs().max() <= TOL * w.abs().max(), (name, offset, n)


def test_a_non_square_causal_kernel_call_would_be_wrong():
    """Non-vacuity: the CPU flash kernel aligns a non-square causal mask to the top-left corner, so handing it
    a chunk against its key prefix (what the composition avoids) attends to the wrong keys."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 8, dtype=torch.float64) for n in (4, 12, 12))
    top_left, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
    right = reference(q, k, v, 8)
    assert (top_left - right).abs().max() > 1e-2 and (causal_attention(q, k, v, 8) - right).abs().max() < TOL


# ---- the kernels' input contract (attention.check_contract; docs/method.md#gpu-rules) --------------------------------
def _block(b=2, h=4, h_kv=2, n=8, d=8, dtype=torch.float64):
    """q, k, v, and a forward's o and lse of one causal block (GQA), plus an output gradient."""
    torch.manual_seed(1)
    q = torch.randn(b, h, n, d, dtype=dtype)
    k, v = torch.randn(b, h_kv, n, d, dtype=dtype), torch.randn(b, h_kv, n, d, dtype=dtype)
    o, lse = attention_lse(q, k, v, True)  # the CPU kernel's lse is a [B, L, H] transposed: made contiguous
    return q, k, v, o.contiguous(), lse.contiguous(), torch.randn_like(o)


def test_a_sliced_lse_is_refused_at_the_kernel_call():
    """GPU finding 2: one zigzag chunk's slice of the row's log-sum-exp, [B, H, n/2] with head stride n, is what the
    CUDA flash backward misreads (it indexes a contiguous [B, H, L_q]). The contract refuses it where the kernel
    would get it; attention_lse_backward itself hands the kernel a contiguous copy and gives the unsliced answer."""
    q, k, v, o, lse, do = _block()
    row_lse = torch.cat([lse, lse], 2)  # a row of two chunks
    sliced = row_lse[:, :, :8]
    assert not sliced.is_contiguous() and torch.equal(sliced, lse)
    with pytest.raises(KernelContractError, match=r"lse must be a contiguous \[B, H, L_q\] = \(2, 4, 8\).*stride"):
        check_contract("cpu", q, k, v, do, o, sliced)
    got = attention_lse_backward(do, q, k, v, o, sliced, (), True)
    want = attention_lse_backward(do, q, k, v, o, lse, (), True)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize(
    "breakage,rule",
    [
        (lambda t: {**t, "q": t["q"].transpose(2, 3)}, "q must be 4-D .* last dim of stride 1"),
        (lambda t: {**t, "k": t["k"].float()}, "k must have q's dtype"),
        (lambda t: {**t, "v": t["v"][:, :, :4]}, "k and v must be .* the same shape"),
        (lambda t: {**t, "k": t["k"][:, :1].repeat(1, 3, 1, 1), "v": t["v"][:, :1].repeat(1, 3, 1, 1)}, "KV heads"),
        (lambda t: {**t, "o": t["o"].transpose(1, 2).contiguous().transpose(1, 2)}, "o must be contiguous"),
        (lambda t: {**t, "do": t["do"][:, :, :4]}, "do must be contiguous and shaped as q"),
        (lambda t: {**t, "lse": t["lse"][:1]}, "lse must be a contiguous"),
        (lambda t: {**t, "lse": t["lse"].to(torch.float16)}, "lse must be float32"),
    ],
)
def test_the_contract_names_the_tensor_and_the_rule(breakage, rule):
    q, k, v, o, lse, do = _block()
    t = breakage({"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do})
    check_contract("cpu", q, k, v, do, o, lse)  # the unbroken block passes
    with pytest.raises(KernelContractError, match=rule):
        check_contract("cpu", t["q"], t["k"], t["v"], t["do"], t["o"], t["lse"])


def test_the_flash_family_adds_its_dtype_and_head_dim_rules():
    """The CUDA flash kernel: 16-bit only, head dim a multiple of 8 and ≤ 256 (flash_api.cpp); the CPU kernel takes
    any, so these hold only for the flash family."""
    q, k, v, *_ = _block(d=4)
    check_contract("cpu", q, k, v)
    with pytest.raises(KernelContractError, match="multiple of 8"):
        check_contract("flash", q.half(), k.half(), v.half())
    with pytest.raises(KernelContractError, match="float16/bfloat16"):
        check_contract("flash", *_block(d=8)[:3])


def test_every_kernel_call_checks_the_contract():
    """attention_lse refuses a strided head dim before calling the CPU kernel (which would accept it)."""
    q, k, v, *_ = _block()
    with pytest.raises(KernelContractError, match="q must be 4-D"):
        attention_lse(q.transpose(2, 3).contiguous().transpose(2, 3), k, v, True)
