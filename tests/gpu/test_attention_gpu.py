"""The zigzag chunk composition on one GPU in bf16 (flash kernels; on ROCm the aotriton kernels whose
non-square causal mask is top-left aligned, which is why the composition exists): every chunk shape of the
zigzag layout at D ∈ {2, 4, 8}, compared with a float32 math reference. Tolerance 2e-2 relative to the largest
output: bf16 rounds to 2⁻⁸ ≈ 4e-3 per element and the softmax sums a few hundred terms."""

from __future__ import annotations

import pytest
import torch

from tspbench.attention import causal_attention
from tspbench.schemes.ops.layout import SeqLayout

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA (or ROCm) device"),
]
TOL = 2e-2


def math_reference(q, k, v, offset):
    g = q.shape[1] // k.shape[1]
    qf, kf, vf = q.float(), k.float().repeat_interleave(g, 1), v.float().repeat_interleave(g, 1)
    s = qf @ kf.transpose(-1, -2) / q.shape[-1] ** 0.5
    n, lk = q.shape[-2], k.shape[-2]
    mask = torch.arange(lk, device=q.device)[None, :] > (offset + torch.arange(n, device=q.device))[:, None]
    return torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ vf


@pytest.mark.parametrize("degree", [2, 4, 8])
@pytest.mark.parametrize("n_kv", [8, 2])
def test_chunks_bf16_vs_fp32_math(degree, n_kv):
    torch.manual_seed(0)
    seq, b, h, d = 4096, 1, 8, 128
    for offset, n in sorted({c for r in range(degree) for c in SeqLayout(seq, degree, r).chunks}):
        q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, n_kv, offset + n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, n_kv, offset + n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        o = causal_attention(q, k, v, offset)
        ref = math_reference(q, k, v, offset)
        assert (o.float() - ref).abs().max() <= TOL * ref.abs().max(), (offset, n)
        o.sum().backward()  # the backward runs on the vendor's kernels too
        assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
