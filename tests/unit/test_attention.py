"""Causal attention of a zigzag chunk is composed of square pieces only (tspbench/attention.py): the unmasked
key prefix merged by log-sum-exp with the square causal diagonal. Equal to the reference in float64 on CPU,
forward and every gradient, for every chunk shape the zigzag layout produces, MHA and GQA; and the reason it
exists: a kernel asked for a non-square causal block may align the mask to the top-left corner (the CPU flash
kernel here, ROCm's aotriton), which attends the wrong keys."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tspbench.attention import causal_attention
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
