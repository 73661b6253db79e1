"""MixedPrecisionAdamW's 16-bit step (GPU review finding 11): the same update as AdamW stepped one parameter at a
time (the old implementation, kept here as the reference), bit for bit; O(parameters) Python per step (each
parameter is visited once, one optimizer call per bin, not one per parameter); and at most one fp32 copy of the
largest parameter's gradient alive at once (the memory model's optimizer transient, docs/method.md#memory)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from tspbench.schemes.train import MixedPrecisionAdamW, bins

SHAPES = [(64, 32), (8,), (32, 32), (16,), (16, 16), (128, 32), (4,), (4,)]
"""Bins: the largest parameter (128·32) alone, the others packed around it."""


class PerParameterAdamW:
    """The step before finding 11 (tspbench/schemes/train.py at a636d6c): AdamW.step once per parameter."""

    def __init__(self, params, lr, weight_decay=0.01):
        self.params = params
        with torch.no_grad():
            self.masters = [p.detach().float() for p in params]
        self.opt = torch.optim.AdamW(self.masters, lr=lr, weight_decay=weight_decay, fused=True)

    def step(self):
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                if p.grad is None:
                    continue
                m.grad = p.grad.float()
                self.opt.step()
                m.grad = None
                p.copy_(m)


def _params(seed: int) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(torch.bfloat16)) for s in SHAPES]


def _set_grads(params, step: int) -> None:
    gen = torch.Generator().manual_seed(100 + step)
    for i, p in enumerate(params):
        g = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
        p.grad = None if (step == 1 and i == 2) else g  # a parameter without a gradient is skipped


def test_update_equals_per_parameter_adamw_exactly():
    new_p, old_p = _params(0), _params(0)
    new, old = MixedPrecisionAdamW(new_p, lr=1e-2), PerParameterAdamW(old_p, lr=1e-2)
    for step in range(3):
        _set_grads(new_p, step)
        _set_grads(old_p, step)
        new.step()
        old.step()
        new.zero_grad()
    assert new.masters is not None
    state = {}
    for opt in new.optimizers:
        state.update(opt.state)
    for i in range(len(SHAPES)):
        assert torch.equal(new_p[i], old_p[i]), i
        assert torch.equal(new.masters[i], old.masters[i]), i
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(state[new.masters[i]][key], old.opt.state[old.masters[i]][key]), (i, key)
    assert state[new.masters[2]]["step"] == 2  # skipped once


def test_one_optimizer_call_per_bin_and_each_parameter_visited_once():
    params = _params(0)
    opt = MixedPrecisionAdamW(params, lr=1e-2)
    _set_grads(params, 0)
    calls, visited = [0], [0]
    real_step, real_init = torch.optim.AdamW.step, torch.optim.AdamW._init_group

    def step(self, *a, **k):
        calls[0] += 1
        return real_step(self, *a, **k)

    def init_group(self, group, *a, **k):
        visited[0] += len(group["params"])
        return real_init(self, group, *a, **k)

    with (
        mock.patch.object(torch.optim.AdamW, "step", step),
        mock.patch.object(torch.optim.AdamW, "_init_group", init_group),
    ):
        opt.step()
    want = bins([torch.Size(s).numel() for s in SHAPES])
    assert calls[0] == len(want) < len(SHAPES)  # per-parameter stepping made len(SHAPES) calls
    assert visited[0] == len(SHAPES)  # per-parameter stepping walked every parameter on every call: N²


def test_fp32_gradient_transient_is_at_most_the_largest_parameter():
    params = _params(0)
    opt = MixedPrecisionAdamW(params, lr=1e-2)
    _set_grads(params, 0)
    assert opt.masters is not None
    alive: list[int] = []
    real_step = torch.optim.AdamW.step

    def step(self, *a, **k):
        alive.append(sum(m.numel() for m in opt.masters or [] if m.grad is not None))
        return real_step(self, *a, **k)

    with mock.patch.object(torch.optim.AdamW, "step", step):
        opt.step()
    assert alive and max(alive) <= max(p.numel() for p in params)
    assert all(m.grad is None for m in opt.masters)


@pytest.mark.parametrize(
    "numels,want",
    [([4, 1, 1, 2, 4, 3], [[0], [1, 2, 3], [4], [5]]), ([5], [[0]]), ([], []), ([2, 2, 2], [[0], [1], [2]])],
)
def test_bins_are_consecutive_and_bounded(numels, want):
    assert bins(numels) == want
