"""tp_msp / tp_sp (Megatron-SP) at B > 1: the sequence all-gather hands back a [B, S, h] view of a contiguous
[S, B, h] buffer (Megatron's layout). The projections must multiply it in that order: no GEMM may copy its input or
save a copy for backward (issue: a copy per projection was a handicap Megatron does not have)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tspbench.model import linear, project_qkv, swiglu

S, B, H = 8, 3, 16


def _saved_storages(fn, *args):
    saved: list[int] = []

    def pack(t):
        saved.append(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, saved


def test_sequence_first_input_is_saved_not_copied():
    base = torch.randn(S, B, H, dtype=torch.float64, requires_grad=True)
    x = base.transpose(0, 1)  # what gather_from_sequence returns at B > 1
    wg, wu, wd = (
        torch.randn(*shape, dtype=torch.float64, requires_grad=True) for shape in ((2 * H, H),) * 2 + ((H, 2 * H),)
    )
    wq, wk, wv = (torch.randn(H, H, dtype=torch.float64, requires_grad=True) for _ in range(3))
    ptr = base.untyped_storage().data_ptr()
    _, saved = _saved_storages(swiglu, x, wg, wu, wd)
    assert saved.count(ptr) == 2  # the gate and up GEMMs save the gathered buffer itself
    _, saved = _saved_storages(project_qkv, x, wq, wk, wv, torch.arange(S), 4, 10000.0)
    assert saved.count(ptr) == 3
    # the check can fail: F.linear on the same view saves a contiguous copy
    _, saved = _saved_storages(F.linear, x, wq)
    assert ptr not in saved


def test_sequence_first_linear_equals_linear():
    base = torch.randn(S, B, H, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, H, dtype=torch.float64, requires_grad=True)
    y = linear(base.transpose(0, 1), w)
    assert y.shape == (B, S, 5) and y.transpose(0, 1).is_contiguous()  # keeps the sequence-first order
    ref = F.linear(base.detach().transpose(0, 1).contiguous(), w.detach())
    torch.testing.assert_close(y, ref, rtol=0, atol=1e-12)  # the same GEMM, rows in another order
    gx, gw = torch.autograd.grad(y.sum(), (base, w))
    b2, w2 = base.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    rx, rw = torch.autograd.grad(F.linear(b2.transpose(0, 1).contiguous(), w2).sum(), (b2, w2))
    torch.testing.assert_close(gx, rx, rtol=0, atol=1e-12)
    torch.testing.assert_close(gw, rw, rtol=0, atol=1e-12)
