"""GPU side of the peer comparison (docs/method.md#peers): the CUDA-only peers against our code on the same inputs.

- ring-flash-attention (zhuzilin/ring-flash-attention, `zigzag_ring_flash_attn_func`): our ring attention
  (tspbench/schemes/ops/ring_attention.py) over the same zigzag layout, output and dQ/dK/dV of every rank's shard.
- yunchang (feifeibear/long-context-attention, `UlyssesAttention`): DeepSpeed-Ulysses over contiguous shards, against
  the full-sequence causal attention our schemes are proven equal to (tspbench.attention.causal_attention).
- Megatron-Core (`tensor_parallel.ColumnParallelLinear` / `RowParallelLinear`): the gated MLP split as our tp
  splits it (tspbench/schemes/ops/tensor_parallel.py TPMLP), output and input gradient.

All need CUDA (flash-attn kernels, NCCL) and at least 2 GPUs: each test skips without them, and without its peer
installed. bf16, so the tolerance is bf16's (2e-2 normwise relative: ε_bf16 = 7.8e-3, a few roundings of the
partial outputs and their log-sum-exp merge; a wrong layout or a missing hop is O(1)). Not run on the CPU CI, and
not yet run anywhere: no machine with ≥ 2 GPUs and these packages was available when they were written.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

TOL = 2e-2  # module docstring
B, HEADS, D, SEQ = 2, 8, 64, 1024


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


needs_gpus = pytest.mark.skipif(_gpus() < 2, reason="needs CUDA and ≥ 2 GPUs (NCCL rank groups, one GPU per rank)")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def _qkv(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """The same full-sequence q, k, v [B, S, H, d] on every rank (bf16, on this rank's GPU)."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, SEQ, HEADS, D, generator=gen).to("cuda", torch.bfloat16) for _ in range(3))


def _ring_rank(rank: int, world: int) -> None:
    import torch.distributed as dist
    from ring_flash_attn import zigzag_ring_flash_attn_func

    from tspbench.schemes.comm import Comm
    from tspbench.schemes.ops.layout import SeqLayout
    from tspbench.schemes.ops.ring_attention import ring_attention

    layout = SeqLayout(SEQ, world, rank, zigzag=True, device="cuda")
    pos = layout.positions
    full = _qkv()
    theirs_in = [t.index_select(1, pos).contiguous().requires_grad_() for t in full]  # [B, S/Σ, H, d]
    ours_in = [t.detach().transpose(1, 2).contiguous().requires_grad_() for t in theirs_in]  # [B, H, S/Σ, d]
    dout = torch.randn_like(theirs_in[0])
    theirs = zigzag_ring_flash_attn_func(*theirs_in, causal=True, group=dist.group.WORLD)
    theirs.backward(dout)
    ours = ring_attention(*ours_in, Comm(dist.group.WORLD), layout)
    ours.backward(dout.transpose(1, 2))
    assert _rel(ours.transpose(1, 2), theirs) < TOL
    for o, t in zip(ours_in, theirs_in):
        assert o.grad is not None and t.grad is not None
        assert _rel(o.grad.transpose(1, 2), t.grad) < TOL


@needs_gpus
def test_ring_flash_attention_equals_ours():
    pytest.importorskip("ring_flash_attn", reason="ring-flash-attention (and flash-attn) not installed")
    from tspbench.spawn import spawn

    spawn(_ring_rank, min(_gpus(), 4), device="cuda")


def _ulysses_rank(rank: int, world: int) -> None:
    import torch.distributed as dist
    from yunchang import UlyssesAttention

    from tspbench.attention import causal_attention

    c = SEQ // world
    full = _qkv(1)
    mine = [t[:, rank * c : (rank + 1) * c].contiguous() for t in full]  # yunchang: contiguous shards
    out = UlyssesAttention(dist.group.WORLD)(*mine, causal=True)  # [B, S/Σ, H, d]
    ref = causal_attention(*(t.transpose(1, 2) for t in full), 0).transpose(1, 2)  # [B, S, H, d]
    assert _rel(out, ref[:, rank * c : (rank + 1) * c]) < TOL


@needs_gpus
def test_yunchang_ulysses_equals_reference():
    pytest.importorskip("yunchang", reason="yunchang (long-context-attention) not installed")
    from tspbench.spawn import spawn

    spawn(_ulysses_rank, min(_gpus(), 4), device="cuda")


def _megatron_rank(rank: int, world: int) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.model_parallel_config import ModelParallelConfig

    from tspbench.schemes.comm import Comm
    from tspbench.schemes.ops.tensor_parallel import TPMLP

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    h, f = 256, 512
    gen = torch.Generator().manual_seed(2)
    wg, wu, wd = (torch.randn(*s, generator=gen) / s[1] ** 0.5 for s in ((f, h), (f, h), (h, f)))
    x = torch.randn(B, 128, h, generator=gen).to("cuda", torch.bfloat16)
    c = f // world
    mine = {
        "w_gate": wg[rank * c : (rank + 1) * c],
        "w_up": wu[rank * c : (rank + 1) * c],
        "w_down": wd[:, rank * c : (rank + 1) * c],
    }
    ours = TPMLP({k: torch.nn.Parameter(v.to("cuda", torch.bfloat16)) for k, v in mine.items()}, Comm(dist.group.WORLD))
    cfg = ModelParallelConfig(tensor_model_parallel_size=world, params_dtype=torch.bfloat16, bf16=True)
    kw = {"config": cfg, "init_method": lambda w: None, "bias": False}
    gate = tensor_parallel.ColumnParallelLinear(h, f, gather_output=False, **kw)
    up = tensor_parallel.ColumnParallelLinear(h, f, gather_output=False, **kw)
    down = tensor_parallel.RowParallelLinear(f, h, input_is_parallel=True, skip_bias_add=True, **kw)
    with torch.no_grad():
        gate.weight.copy_(ours.w_gate)
        up.weight.copy_(ours.w_up)
        down.weight.copy_(ours.w_down)
    xo, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours = ours(xo)
    y_meg = down(torch.nn.functional.silu(gate(xm)[0]) * up(xm)[0])[0]
    dy = torch.randn_like(y_ours)
    y_ours.backward(dy)
    y_meg.backward(dy)
    assert _rel(y_ours, y_meg) < TOL
    assert xo.grad is not None and xm.grad is not None and _rel(xo.grad, xm.grad) < TOL
    parallel_state.destroy_model_parallel()


@needs_gpus
def test_megatron_core_tp_mlp_equals_ours():
    pytest.importorskip("megatron.core", reason="megatron-core not installed")
    from tspbench.spawn import spawn

    spawn(_megatron_rank, min(_gpus(), 4), device="cuda")
