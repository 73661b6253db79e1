"""One training step, the same everywhere: `tspbench.verify` proves it, the worker times it, the estimate
traces it. There is no second copy of the step to drift from the proven one.

    forward     loss = this rank's share of the replica's mean token loss (logits dropped before backward)
    backward    loss.backward()
    grad_sync   ParallelModel.finish_grad_sync(): partial gradients of replicated weights summed over the
                group that saw different tokens, averaged over data-parallel replicas (one collective)
    optimizer   AdamW, then zero_grad(set_to_none=True)

The optimizer is the mixed-precision AdamW the memory model assumes (docs/method.md#memory): for 16-bit
parameters, fp32 master copies with fp32 m and v (12 B/param), each 16-bit gradient upcast one parameter at a
time (a transient of one fp32 gradient) and the 16-bit weight refreshed from its master; for 32- and 64-bit
parameters, AdamW on the parameters themselves. bf16 weights + bf16 gradients + 12 B of optimizer state is
k = 16 bytes per parameter.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tspbench.schemes.base import ParallelModel, local_tensor


class MixedPrecisionAdamW:
    """AdamW on fp32 master copies of 16-bit parameters (or on the parameters when they are 32/64-bit)."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float, weight_decay: float = 0.01):
        self.params = params
        self.masters: list[torch.Tensor] | None = None
        if params and params[0].dtype.itemsize < 4:
            with torch.no_grad():
                self.masters = [p.detach().float() for p in params]
            self.opt = torch.optim.AdamW(self.masters, lr=lr, weight_decay=weight_decay, fused=True)
        else:
            self.opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)

    def step(self) -> None:
        if self.masters is None:
            self.opt.step()
            return
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):  # one fp32 gradient alive at a time
                if p.grad is None:
                    continue
                m.grad = p.grad.float()
                self.opt.step()  # only `m` has a gradient: the others are skipped
                m.grad = None
                p.copy_(m)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_tensors(self) -> list[torch.Tensor]:
        """Master copies, m, v and the step counters (what the memory model counts as optimizer state)."""
        out = list(self.masters or [])
        for st in self.opt.state.values():
            out += [v for v in st.values() if torch.is_tensor(v)]
        return out

    def state_bytes(self) -> int:
        """This rank's bytes (an FSDP2 DTensor's local shard, not its global size)."""
        return sum(local_tensor(t).numel() * t.element_size() for t in self.state_tensors())


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
