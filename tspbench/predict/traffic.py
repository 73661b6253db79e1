"""Memory traffic of the elementwise ops a piece of code runs, counted op by op (the check of the closed form in
tspbench/predict/costmodel/elementwise.py against the model code itself, docs/method.md#elementwise).

`ElementwiseTraffic` is a TorchDispatchMode: every aten op that computes (not a view, not a matmul, not an attention
kernel, not an embedding lookup, not a collective) adds the bytes of its tensor inputs and outputs, i.e. each op reads
its inputs and writes its outputs once, the closed form's rule. An in-place op's output is its input, written: it
counts its inputs and the written tensor. Views (an output aliasing an input without writing it) move nothing.
Counting starts and stops with `phase(name)`, so forward and backward are counted apart.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
NOT_ELEMENTWISE = {
    aten.mm,
    aten.addmm,
    aten.bmm,
    aten.baddbmm,
    aten.embedding,
    aten.embedding_dense_backward,
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_efficient_attention_backward,
    aten.detach,
    aten._unsafe_view,
}
"""Op packets the roofline prices (GEMMs, attention kernels) or that move no data the elementwise term counts."""


def _is_view(func) -> bool:
    """The op returns an alias of an input that it does not write (a view)."""
    rets = func._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


def _nbytes(tree) -> int:
    return sum(t.numel() * t.element_size() for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor))


class ElementwiseTraffic(TorchDispatchMode):
    """Bytes read and written by the elementwise ops of each phase (`bytes[name]`)."""

    def __init__(self):
        super().__init__()
        self.bytes: dict[str, int] = {}
        self.current: str | None = None

    @contextlib.contextmanager
    def phase(self, name: str):
        """Count the ops run inside the block under `name`."""
        self.current, before = name, self.current
        self.bytes.setdefault(name, 0)
        try:
            yield
        finally:
            self.current = before

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.current is None or func.namespace != "aten":
            return out
        if func._overloadpacket in NOT_ELEMENTWISE or _is_view(func):
            return out
        self.bytes[self.current] += _nbytes((args, kwargs)) + _nbytes(out)  # in place: `out` is the written input
        return out
