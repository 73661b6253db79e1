"""Live-storage memory tracking and FLOP counting for one step, on real or fake tensors (tspbench.predict.estimate).

Memory (`MemoryTracker`, a TorchDispatchMode that works on real and fake tensors alike). Every op output's
untyped storage is registered once (views share it) with its byte size and the event clock; a weak
reference to the storage records the clock of its release. The running total over the measured step is
the allocated-bytes curve; its maximum is the peak (≈ `torch.cuda.max_memory_allocated`, without the
allocator's 512-B rounding and without reserved-but-free cache). What is live at the peak is classified by
ownership, first match wins:
    params         storages of the model's parameters (a parameter that is a view keeps its whole base
                   storage alive, and is counted with it)
    optimizer      AdamW state (+ the fp32 master copies, see below)
    grads          storages attached as a parameter's .grad (post-accumulate-grad hooks) by that moment
    activations    allocated during the forward of the measured step and still alive at its end (saved
                   for backward, held by checkpoint closures, the loss)
    comm_buffers   storages a c10d collective read or wrote (`torch.ops.c10d.*`: all-gather/reduce-scatter
                   outputs and staging copies, broadcast and ring buffers) that are not activations
    temporaries    everything else live at the peak (backward transients, recomputed activations, ...)
Attention kernel (`attention=`). Fake tensors live on the CPU device, whose kernels are not what a GPU
runs. "gpu" (default unless hardware="cpu") runs attention on the CUDA kernels (flash attention for 16-bit,
memory-efficient attention for fp32; GQA K/V passed to flash without repetition, repeated for
memory-efficient attention, which has no GQA): they save Q, K, V, the output and the fp32 log-sum-exp,
nothing S×S. "native" keeps the CPU kernels (what a real gloo run executes; used by the estimate-vs-real
tests).

The same tracker runs under FakeTensorMode (the estimate) and on real tensors (the checks against real
CPU runs and tspbench.predict.gpu_check), so the two are compared one to one.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

CATEGORIES = ("params", "grads", "optimizer", "activations", "temporaries", "comm_buffers")
INF = sys.maxsize


# ------------------------------------------------------------------------------------------- memory
@dataclass
class _Storage:
    nbytes: int
    t_alloc: int
    t_free: int = INF
    t_grad: int = INF  # attached as a parameter's .grad at this clock
    comm: bool = False  # read or written by a c10d collective
    owner: str | None = None  # "params" | "optimizer" (fixed ownership)


def _flop_registry() -> dict:
    """torch's FLOP formulas (those of FlopCounterMode) + the CPU flash-attention kernels, which torch's
    registry lacks, so a real CPU run and a native-kernel estimate count attention too."""
    from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count, shape_wrapper

    def fwd(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    def bwd(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_backward_flop_count(grad_out, query, key, value)

    aten = torch.ops.aten
    return {
        **flop_registry,
        aten._scaled_dot_product_flash_attention_for_cpu: shape_wrapper(fwd),
        aten._scaled_dot_product_flash_attention_for_cpu_backward: shape_wrapper(bwd),
    }


class MemoryTracker(TorchDispatchMode):
    """Live untyped-storage bytes over time and FLOPs, on real or fake tensors (module docstring).

    The clock advances by one per allocation or release; `totals[c]` is the live total after event c.
    `mark(name)` remembers the clock, so phases (forward, each layer, backward, ...) are clock ranges.
    FLOPs are counted with FlopCounterMode's formulas while `counting` is set (one mode instead of two:
    the estimate runs ~10⁵ ops through Python, so every layer of dispatch counts).
    """

    def __init__(self):
        super().__init__()
        self.clock = 0
        self.total = 0
        self.totals: list[int] = []
        self.storages: list[_Storage] = []
        self.live: dict[int, tuple[_Storage, weakref.ref]] = {}
        self.marks: dict[str, int] = {}
        self.flops = 0
        self.counting = False
        self.host_transfers: list[str] = []  # see _check_host_transfer
        self._flop_formulas = _flop_registry()
        # A real backend may drop the last reference to a buffer on its own thread (gloo's work queue), so
        # the weakref callback can run there: every clock event takes this (re-entrant) lock.
        self._lock = threading.RLock()

    # -- events -----------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _PRIM_DEVICE:  # most frequent call by far; allocates nothing
            dev = getattr(args[0], "fake_device", None)
            return dev if dev is not None else func(*args)
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace == "c10d":
            for t in pytree.tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor):
                    rec = self.note(t)
                    if rec is not None:
                        rec.comm = True
            return out
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.note(t)
        if self.counting:
            self._check_host_transfer(func, args, kwargs, out)
            formula = self._flop_formulas.get(func._overloadpacket)
            if formula is not None:
                self.flops += formula(*args, **kwargs, out_val=out) * _causal_fraction(func, args, kwargs)
        return out

    def _check_host_transfer(self, func, args, kwargs, out) -> None:
        """Record an op of the measured step that moves data between host and device: a host tensor (not a 0-dim
        scalar) copied onto an accelerator, or an accelerator tensor read on the host. On CUDA each is a
        blocking copy, a stream synchronisation inside the step (`host_transfers`; the no-host-sync test)."""
        if func in _HOST_READS:
            self.host_transfers.append(str(func))
            return
        devs: dict[str, set[str]] = {"in": set(), "out": set()}
        for key, tree in (("in", (args, kwargs)), ("out", out)):
            for t in pytree.tree_leaves(tree):
                if isinstance(t, torch.Tensor) and t.dim() > 0:
                    devs[key].add((getattr(t, "fake_device", None) or t.device).type)
        if len(devs["in"] | devs["out"]) > 1:
            self.host_transfers.append(f"{func}: {sorted(devs['in'])} → {sorted(devs['out'])}")

    def note(self, t: torch.Tensor) -> _Storage | None:
        """Register t's storage if new (or grown by a resize); return its record."""
        if isinstance(t, DTensor):  # FSDP2's sharded parameters, gradients, optimizer state: the local shard
            t = t._local_tensor
        dev = getattr(t, "fake_device", None) or t.device
        if dev.type == "meta":  # the meta model before sharding: no memory
            return None
        st = t.untyped_storage()
        key = id(st)
        with self._lock:
            hit = self.live.get(key)
            nbytes = st.nbytes()
            if hit is not None:
                rec = hit[0]
                if nbytes > rec.nbytes:  # resized in place: count the growth
                    self._event(nbytes - rec.nbytes)
                    rec.nbytes = nbytes
                return rec
            rec = _Storage(nbytes, self.clock)
            self.storages.append(rec)
            self.live[key] = (rec, weakref.ref(st, functools.partial(self._on_free, key)))
            self._event(nbytes)
            return rec

    def resized(self, t: torch.Tensor, owner: str | None = None) -> None:
        """`t`'s storage was resized in place (FSDP2 frees and re-allocates its unsharded parameters with
        `storage.resize_`, which no dispatch mode sees): the old size is released and the new one, if any, is a
        new allocation (so every record keeps one size over its lifetime)."""
        st = t.untyped_storage()
        key = id(st)
        with self._lock:
            self._release(key)
            if st.nbytes() > 0:
                rec = _Storage(st.nbytes(), self.clock, owner=owner)
                self.storages.append(rec)
                self.live[key] = (rec, weakref.ref(st, functools.partial(self._on_free, key)))
                self._event(rec.nbytes)

    def _on_free(self, key: int, _ref: object) -> None:
        self._release(key)

    def _release(self, key: int) -> None:
        with self._lock:
            hit = self.live.pop(key, None)
            if hit is not None:
                hit[0].t_free = self.clock
                self._event(-hit[0].nbytes)

    def _event(self, delta: int) -> None:
        self.total += delta
        self.totals.append(self.total)
        self.clock += 1

    def mark(self, name: str) -> None:
        with self._lock:
            self.marks[name] = self.clock

    def own(self, tensors, owner: str) -> None:
        for t in tensors:
            rec = self.note(t)
            if rec is not None:
                rec.owner = owner

    def grad_attached(self, grad: torch.Tensor | None) -> None:
        if grad is not None:
            rec = self.note(grad)
            if rec is not None:
                rec.t_grad = min(rec.t_grad, self.clock)

    # -- results ------------------------------------------------------------------------------------
    def segments(self, start: str, end: str) -> list[tuple[str, int, int]]:
        """(mark, first clock, end clock) of every marked phase between marks `start` and `end`."""
        lo, hi = self.marks[start], self.marks[end]
        inside = sorted((c, n) for n, c in self.marks.items() if lo <= c < hi and n != end)
        out = []
        for k, (c, n) in enumerate(inside):
            nxt = inside[k + 1][0] if k + 1 < len(inside) else hi
            out.append((n, c, nxt))
        return out

    def peak_in(self, lo: int, hi: int, include_before: bool = False) -> tuple[int, int]:
        """(clock, bytes) of the largest total over events lo … hi−1 (and the state before lo)."""
        t_peak, best = -1, -1
        if include_before or lo >= hi:
            t_peak, best = lo - 1, self.totals[lo - 1] if lo > 0 else 0
        for c in range(lo, hi):
            if self.totals[c] > best:
                t_peak, best = c, self.totals[c]
        return t_peak, best

    def breakdown_at(self, t: int, fwd: tuple[int, int]) -> dict[str, int]:
        """Live bytes at clock t by category; `fwd` = clock range of the measured forward."""
        f0, f1 = fwd
        out = dict.fromkeys(CATEGORIES, 0)
        for rec in self.storages:
            if not (rec.t_alloc <= t < rec.t_free):
                continue
            if rec.owner:
                cat = rec.owner
            elif rec.t_grad <= t:
                cat = "grads"
            elif f0 <= rec.t_alloc < f1 and rec.t_free >= f1:
                cat = "activations"
            elif rec.comm:
                cat = "comm_buffers"
            else:
                cat = "temporaries"
            out[cat] += rec.nbytes
        total = self.totals[t] if t >= 0 else 0
        assert sum(out.values()) == total, (sum(out.values()), total)
        return out


_PRIM_DEVICE = torch.ops.prim.device.default
_HOST_READS = (torch.ops.aten._local_scalar_dense.default,)  # .item(), bool(tensor), a Python number from a tensor


def _causal_fraction(func, args, kwargs) -> float:
    """The share of an attention call's Lq × Lk rectangle a causal kernel computes: (L + 1) / (2L) for the square
    causal blocks tspbench hands to kernels (tspbench/attention.py), 1 otherwise. FlopCounterMode's attention
    formulas count the whole rectangle whatever `is_causal` says; flash kernels skip the masked tiles."""
    names = [a.name for a in func._schema.arguments]
    if "is_causal" not in names:
        return 1.0
    i = names.index("is_causal")
    causal = kwargs.get("is_causal", args[i] if i < len(args) else False)
    if not causal:
        return 1.0
    length = args[names.index("query")].shape[-2] if "query" in names else args[0].shape[-2]
    return (length + 1) / (2 * length)


@contextlib.contextmanager
def fsdp_events(tracker: MemoryTracker):
    """What FSDP2 does outside the dispatcher, made visible to `tracker` (schemes/fsdp_sp.py): its unsharded
    parameters are allocated and freed by `storage.resize_` (recorded as comm_buffers: all-gathered weights),
    and it assigns each sharded gradient itself after the reduce-scatter (no post-accumulate-grad hook fires),
    so the gradients are marked when a unit's post-backward has run."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    real_alloc, real_free = _fsdp_param.alloc_storage, _fsdp_param.free_storage
    real_post = _fsdp_param_group.FSDPParamGroup.post_backward
    real_init = _fsdp_param.FSDPParam.init_all_gather_outputs

    def init_all_gather_outputs(self, *args, **kwargs):  # the unsharded parameters' first allocation
        real_init(self, *args, **kwargs)
        tracker.own(self.all_gather_outputs, "comm_buffers")

    def alloc_storage(t: torch.Tensor) -> None:
        before = t.untyped_storage().nbytes()
        real_alloc(t)
        if t.untyped_storage().nbytes() != before:
            tracker.resized(t, owner="comm_buffers")

    def free_storage(t: torch.Tensor) -> None:
        before = t.untyped_storage().nbytes()
        real_free(t)
        if t.untyped_storage().nbytes() != before:
            tracker.resized(t)

    def post_backward(self, *args, **kwargs):
        out = real_post(self, *args, **kwargs)
        for fp in self.fsdp_params:
            tracker.grad_attached(fp.sharded_param.grad)
        return out

    patches = [
        (_fsdp_param, "alloc_storage", alloc_storage),
        (_fsdp_param, "free_storage", free_storage),
        (_fsdp_param_group, "alloc_storage", alloc_storage),
        (_fsdp_param_group.FSDPParamGroup, "post_backward", post_backward),
        (_fsdp_param.FSDPParam, "init_all_gather_outputs", init_all_gather_outputs),
    ]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, fn in patches:
        setattr(obj, name, fn)
    try:
        yield
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)


# ------------------------------------------------------------------------------------------- attention
@contextlib.contextmanager
def gpu_attention():
    """Run attention on the CUDA kernels (flash for 16-bit, memory-efficient otherwise) even on fake CPU
    tensors, so the estimate allocates what a GPU allocates (no materialised mask, no S×S scores): the square
    causal calls of `F.scaled_dot_product_attention` are rerouted, and tspbench.attention's kernel choice
    (used for zigzag chunks and decode) answers with the GPU family. Module attributes are patched (a
    TorchFunctionMode would not be active in the recompute that activation checkpointing runs in backward)."""
    from tspbench import attention

    real, real_family = F.scaled_dot_product_attention, attention.kernel_family

    def sdpa(*args, **kwargs):
        out = _gpu_sdpa(*args, **kwargs)
        return real(*args, **kwargs) if out is None else out

    def kernel_family(q: torch.Tensor) -> str:
        return "flash" if q.dtype in (torch.float16, torch.bfloat16) else "efficient"

    F.scaled_dot_product_attention, attention.kernel_family = sdpa, kernel_family
    try:
        yield
    finally:
        F.scaled_dot_product_attention, attention.kernel_family = real, real_family


def _gpu_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if attn_mask is not None or not is_causal:
        return None
    if q.dtype in (torch.float16, torch.bfloat16):
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, True, False, scale=scale)[0]
    if k.shape[1] != q.shape[1]:  # memory-efficient attention has no GQA: K/V heads repeated, as SDPA does
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, None, need_lse, dropout_p, True, scale=scale
    )[0]
