"""One training step, the same everywhere: `tspbench.verify` proves it, the worker times it, the estimate
traces it. There is no second copy of the step to drift from the proven one.

    forward     loss = this rank's share of the replica's mean token loss (logits dropped before backward)
    backward    loss.backward()
    grad_sync   ParallelModel.finish_grad_sync(): partial gradients of replicated weights summed over the
                group that saw different tokens, averaged over data-parallel replicas (one collective)
    optimizer   AdamW, then zero_grad(set_to_none=True)

The optimizer is the mixed-precision AdamW the memory model assumes (docs/method.md#memory): for 16-bit
parameters, fp32 master copies with fp32 m and v (12 B/param), the 16-bit gradients upcast a bin at a time (a
transient of at most one fp32 copy of the largest parameter) and the 16-bit weights refreshed from their masters;
for 32- and 64-bit parameters, AdamW on the parameters themselves. bf16 weights + bf16 gradients + 12 B of
optimizer state is k = 16 bytes per parameter.
"""

from __future__ import annotations

import typing
from collections.abc import Callable

import torch

from tspbench.schemes.base import ParallelModel, local_tensor


class MixedPrecisionAdamW:
    """AdamW on fp32 master copies of 16-bit parameters (or on the parameters when they are 32/64-bit).

    16-bit: the masters are cut into bins of consecutive parameters holding at most as many elements as the largest
    parameter (`bins`), each with its own fused AdamW. A step upcasts one bin's gradients, updates the bin in one
    optimizer call and copies it back in one `torch._foreach_copy_`: one fp32 gradient transient of at most the
    largest parameter (what the memory model counts), O(parameters) Python per step, and per parameter the same
    arithmetic as a per-parameter AdamW (tests/unit/test_optimizer_step.py)."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float, weight_decay: float = 0.01):
        self.params = params
        self.masters: list[torch.Tensor] | None = None
        self.bins: list[list[int]] = []
        """Indices into `params` of each bin (16-bit only)."""
        if params and params[0].dtype.itemsize < 4:
            with torch.no_grad():
                self.masters = [p.detach().float() for p in params]
            self.bins = bins([local_tensor(p).numel() for p in params])
            self.optimizers = [
                torch.optim.AdamW([self.masters[i] for i in b], lr=lr, weight_decay=weight_decay, fused=True)
                for b in self.bins
            ]
        else:
            self.optimizers = [torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)]

    def step(self) -> None:
        if self.masters is None:
            self.optimizers[0].step()
            return
        with torch.no_grad():
            for b, opt in zip(self.bins, self.optimizers):
                have = [i for i in b if self.params[i].grad is not None]  # a parameter without one is skipped
                if not have:
                    continue
                for i in have:
                    self.masters[i].grad = typing.cast(torch.Tensor, self.params[i].grad).float()
                opt.step()
                for i in have:
                    self.masters[i].grad = None  # this bin's fp32 gradients freed before the next bin's
                # on local tensors: DTensor (fsdp_sp) has no _foreach_copy_ rule; each shard is its own master's
                mine = [local_tensor(self.params[i]) for i in have]
                torch._foreach_copy_(mine, [local_tensor(self.masters[i]) for i in have])

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_tensors(self) -> list[torch.Tensor]:
        """Master copies, m, v and the step counters (what the memory model counts as optimizer state)."""
        out = list(self.masters or [])
        for opt in self.optimizers:
            for st in opt.state.values():
                out += [v for v in st.values() if torch.is_tensor(v)]
        return out

    def state_bytes(self) -> int:
        """This rank's bytes (an FSDP2 DTensor's local shard, not its global size)."""
        return sum(local_tensor(t).numel() * t.element_size() for t in self.state_tensors())


def bins(numels: list[int]) -> list[list[int]]:
    """Consecutive runs of parameter indices, each of at most max(numels) elements (a parameter is never split)."""
    cap = max(numels, default=0)
    out: list[list[int]] = []
    total = cap + 1
    for i, n in enumerate(numels):
        if total + n > cap:
            out.append([])
            total = 0
        out[-1].append(i)
        total += n
    return out


def train_step(
    pm: ParallelModel,
    opt: MixedPrecisionAdamW,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    positions: torch.Tensor,
    *,
    phase: Callable[[str], None] | None = None,
    on_forward: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    on_grads: Callable[[], None] | None = None,
) -> torch.Tensor:
    """One step (module docstring); returns the loss. `phase(name)` is called as each of backward, grad_sync
    and optimizer begins (the estimate marks its memory timeline there); `on_forward(loss, logits)` sees the
    forward's outputs before the logits are dropped; `on_grads()` runs after the gradient sync, before the
    optimizer changes anything (verify reads the gradients there)."""
    mark = phase or (lambda name: None)
    loss, logits = pm.loss(tokens, targets, positions)
    if on_forward is not None:
        on_forward(loss, logits)
    del logits  # not kept alive through backward
    mark("backward")
    loss.backward()
    mark("grad_sync")
    pm.finish_grad_sync()
    if on_grads is not None:
        on_grads()
    mark("optimizer")
    opt.step()
    opt.zero_grad()
    return loss.detach()
