"""One rank's training step (or forward), traced: memory timeline, FLOPs, collectives and phase marks.

`trace_step(par, work, tracing)` is the driver of the fake-tensor estimate (tspbench.predict.estimate, under
`FakeTensorMode` and `fake_process_group`) and of its real counterparts (tspbench.predict.realrun: gloo ranks;
tspbench.predict.gpu_check: one real rank under the fake process group): the same `build_mesh` → `apply_scheme`
→ `local_batch` → `loss` → `backward` → `finish_grad_sync` → AdamW as tspbench.verify and the worker, at the real
shapes, so the numbers of a fake and a real trace compare one to one.

Memory: `tspbench.predict.memtrack.MemoryTracker` (its docstring says what is counted and how live bytes are
classified), the same tracker on real and fake tensors.

Steady state: the optimizer state is created by an untimed AdamW step on zero gradients before the
measured step, as it exists from the second training step on; gradients start as None (zero_grad with
set_to_none, as the worker does).

The step is tspbench.schemes.train.train_step, the one verify proves and the worker times, with its
mixed-precision AdamW: for bf16, fp32 master copies with fp32 m, v (category optimizer: 12 B/param), each
bf16 gradients upcast a bin of at most the largest parameter at a time; for fp32/fp64, AdamW on the parameters.

Phases (`StepTrace.segment_peaks`, the estimate's peak_phase and phase_peak_bytes): the marks step (embedding),
fwd<i>, head (final norm, LM head, loss), backward (loss and head backward), bwd<i>, embed_bwd, grad_sync,
optimizer, end, named structurally (`_kinds`: fwd/bwd × first, mid_first, mid_last, mid_inner, last) so that
traces of different depths line up (tspbench.predict.estimate.extrapolate_layers).

What a fake trace patches (values are irrelevant for memory and FLOPs; the scheme code paths are not
changed): `tspbench.schemes.ops.sharding.init_full_param` returns `torch.empty` (the seeded CPU generator cannot run
under FakeTensorMode); with attention="gpu", `torch.nn.functional.scaled_dot_product_attention`
(tspbench.predict.memtrack.gpu_attention). Process group: `fake_process_group` initialises torch's fake backend
(every collective a no-op that returns at once) and destroys it on exit, so it can be entered repeatedly; it
refuses to run in a process that already has a default process group.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from tspbench.config import DTYPES
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel import Workload
from tspbench.predict.memtrack import MemoryTracker, fsdp_events, gpu_attention


@dataclass(frozen=True)
class Tracing:
    """How one rank's step is traced (`trace_step`)."""

    device: str = "cpu"
    """Where the tensors live: cpu, cuda[:i] (tspbench.predict.gpu_check) or meta (tests/integration/
    test_no_host_sync.py)."""
    fake: bool = False
    """True: under FakeTensorMode with value-free weights (the estimate, inside `fake_process_group`); False: real
    tensors (a spawned gloo / NCCL rank, or gpu_check's one rank under the fake process group)."""
    attention: str = "native"
    """The attention kernel, resolved: native (the CPU kernels, what a real gloo run executes) or gpu
    (scaled_dot_product_attention patched to what a GPU's kernels allocate: tspbench.predict.memtrack)."""
    seed: int = 0
    """Weight-initialisation seed (values only: memory, FLOPs and collectives do not depend on it)."""


# ------------------------------------------------------------------------------------------- one step
@dataclass
class StepTrace:
    """One rank's step: the tracker (memory timeline, FLOPs), the CommLog records and the phase marks."""

    tracker: MemoryTracker
    n_layers: int
    mode: str
    comm_records: list
    wall_s: float

    @property
    def flops(self) -> int:
        return self.tracker.flops

    def fwd_range(self) -> tuple[int, int]:
        m = self.tracker.marks
        return m["step"], m["backward"]

    def segment_peaks(self) -> dict[str, tuple[int, int]]:
        """Segment kind (see `_kinds`) → (clock, bytes) of its peak."""
        out: dict[str, tuple[int, int]] = {}
        for k, (name, lo, hi) in enumerate(self.tracker.segments("step", "end")):
            pk = self.tracker.peak_in(lo, hi, include_before=k == 0)
            for kind in _kinds(name, self.n_layers):
                if kind not in out or pk[1] > out[kind][1]:
                    out[kind] = pk
        return out

    def memory(self) -> dict[str, Any]:
        """Peak over the measured step and its breakdown (bytes), with the phase it falls in."""
        peaks = self.segment_peaks()
        kind = max(peaks, key=lambda k: peaks[k][1])
        t, total = peaks[kind]
        out: dict[str, Any] = dict(self.tracker.breakdown_at(t, self.fwd_range()))
        out["total"], out["phase"] = total, kind
        out["phases"] = {k: v[1] for k, v in sorted(peaks.items(), key=lambda kv: kv[1][0])}
        return out


def _kinds(mark: str, n_layers: int) -> list[str]:
    """Structural name(s) of a phase, the same for every layer count ≥ 3: fwd/bwd × first, mid_first,
    mid_last, mid_inner, last in execution order (backward runs the layers in reverse). With 3 layers the
    one middle layer is both mid_first and mid_last."""
    if mark[:3] not in ("fwd", "bwd") or not mark[3:].isdigit():
        return [mark]
    d, i = mark[:3], int(mark[3:])
    pos = i if d == "fwd" else n_layers - 1 - i
    kinds = [f"{d}_first"] if pos == 0 else []
    if pos == n_layers - 1:
        kinds.append(f"{d}_last")
    if 1 <= pos <= n_layers - 2:
        if pos == 1:
            kinds.append(f"{d}_mid_first")
        if pos == n_layers - 2:
            kinds.append(f"{d}_mid_last")
        if not kinds:
            kinds.append(f"{d}_mid_inner")
    return kinds


class _PhaseMarks:
    """The tracker's phase marks from module hooks, during the measured forward only: fwd<i> when block i's
    forward starts, head when the final norm's does; bwd<i> (embed_bwd) when the gradient of block i's (the
    embedding's) output arrives, i.e. when that block's backward starts."""

    def __init__(self, tracker: MemoryTracker) -> None:
        self.tracker = tracker
        self.in_fwd = False

    def fwd(self, name: str) -> None:
        if self.in_fwd:
            self.tracker.mark(name)

    def bwd_on(self, out, name: str) -> None:
        if self.in_fwd and isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda g: self.tracker.mark(name))

    def phase(self, name: str) -> None:
        """train_step's phase callback: backward ends the forward."""
        self.in_fwd = self.in_fwd and name != "backward"
        self.tracker.mark(name)

    def install(self, pm) -> list:
        """Register the hooks on a ParallelModel; returns their handles."""
        hooks = []
        for i, block in enumerate(pm.module.blocks):
            hooks.append(block.register_forward_pre_hook(lambda m, a, i=i: self.fwd(f"fwd{i}")))
            hooks.append(block.register_forward_hook(lambda m, a, out, i=i: self.bwd_on(out, f"bwd{i}")))
        hooks.append(pm.module.norm.register_forward_pre_hook(lambda m, a: self.fwd("head")))
        hooks.append(pm.module.embed.register_forward_hook(lambda m, a, out: self.bwd_on(out, "embed_bwd")))
        return hooks


def _steady_optimizer(params: list, tracker: MemoryTracker):
    """The optimizer with its state, as it exists from the second training step on (one untimed step on zero
    gradients), owned as "optimizer"."""
    from tspbench.schemes.train import MixedPrecisionAdamW

    opt = MixedPrecisionAdamW(params, lr=1e-4)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad()
    tracker.own(opt.state_tensors(), "optimizer")
    return opt


def _measured_step(pm, opt, batch: tuple, marks: _PhaseMarks) -> None:
    """The measured step between the marks step and end: train_step with an optimizer, else one forward with the
    logits dropped."""
    from tspbench.schemes.train import train_step

    tracker = marks.tracker
    tracker.mark("step")
    tracker.counting = marks.in_fwd = True
    if opt is not None:
        train_step(pm, opt, *batch, phase=marks.phase)
    else:
        with torch.no_grad():
            loss, logits = pm.loss(*batch)
            del logits, loss
        marks.in_fwd = False
        tracker.mark("backward")
    tracker.counting = False
    tracker.mark("end")


def trace_step(
    par: ParallelConfig,
    work: Workload,
    tracing: Tracing = Tracing(),
    data: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> StepTrace:
    """Build the scheme on the current default process group and trace one step of this rank.

    Real tensors (tracing.fake=False: inside a spawned gloo/NCCL rank) or fake ones (fake=True: under the fake
    process group). The same driver in both cases, so their numbers can be compared one to one. The step
    is what tspbench.run.loop runs (forward + loss, backward, finish_grad_sync, AdamW, zero_grad with
    set_to_none), after an untimed optimizer step that creates the optimizer state (steady state); the
    logits are dropped before backward. `data`: the global (tokens, targets) of dp × B sequences (default:
    zeros; input data, not tracked). Phase marks: module docstring.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh
    from tspbench.schemes.comm import CommLog

    t0 = time.perf_counter()
    model, device = work.model, tracing.device
    mesh = build_mesh(par, "cuda" if device.startswith("cuda") else "cpu")  # outside fake mode
    tracker = MemoryTracker()
    log = CommLog()
    marks = _PhaseMarks(tracker)
    with contextlib.ExitStack() as stack:
        if tracing.fake:
            stack.enter_context(FakeTensorMode())
            stack.enter_context(fake_patches())
        if tracing.attention == "gpu":
            stack.enter_context(gpu_attention())
        if data is None:  # the global batch is input data: not tracked (as in a real run)
            shape = (par.dp * work.batch, work.seq_len)
            tokens = torch.zeros(shape, dtype=torch.long, device=device)
            data = (tokens, torch.zeros(shape, dtype=torch.long, device=device))
            del tokens
        stack.enter_context(tracker)
        stack.enter_context(fsdp_events(tracker))
        pm = apply_scheme(model, par, ApplyArgs(mesh, work.seq_len, tracing.seed, DTYPES[work.dtype], device, log))
        params = list(pm.parameters())
        tracker.own(params, "params")
        hooks = marks.install(pm)
        batch = pm.local_batch(*data)
        opt = None
        if work.mode == "train":
            hooks += [p.register_post_accumulate_grad_hook(lambda p: tracker.grad_attached(p.grad)) for p in params]
            opt = _steady_optimizer(params, tracker)
        log.clear()
        _measured_step(pm, opt, batch, marks)
        for h in hooks:
            h.remove()
        records = list(log.records)
        del pm, opt, params, batch, data
    return StepTrace(tracker, model.n_layers, work.mode, records, time.perf_counter() - t0)


# ------------------------------------------------------------------------------------------- fake world
@contextlib.contextmanager
def fake_patches():
    """Value-free weights: the seeded CPU generator cannot run under FakeTensorMode; restored on exit."""
    import tspbench.schemes.ops.sharding as base_mod

    def init_full_param(name, shape, seed, dtype, device="cpu"):
        return torch.empty(shape, dtype=dtype, device=device)

    old = base_mod.init_full_param
    base_mod.init_full_param = init_full_param
    try:
        yield
    finally:
        base_mod.init_full_param = old


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0):
    """torch's fake process group as the default group (collectives are no-ops); destroyed on exit."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError(
            "estimate() needs a process without a default process group (one is initialised); "
            "call it from the parent process, not from inside a rank"
        )
    hook = sys.excepthook  # init_process_group chains a "[rank0]:" excepthook on every call
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


# ------------------------------------------------------------------------------------------- collectives
def comm_layer0(records) -> dict[str, float]:
    """Elements and bytes received by this rank for layer 0, per phase (recompute replays count as bwd)."""
    out = {f"comm_{k}_per_layer_{ph}": 0.0 for k in ("elems", "bytes") for ph in ("fwd", "bwd")}
    for r in records:
        if r.tag != "layer0":
            continue
        elem_size = r.bytes // r.numel if r.numel else 0
        out[f"comm_elems_per_layer_{r.phase}"] += r.recv_numel
        out[f"comm_bytes_per_layer_{r.phase}"] += r.recv_numel * elem_size
    return out


def comm_ops_layer0(records) -> list[tuple]:
    """(op, phase, group_size, numel, recv_numel, bytes, recompute) of every layer-0 collective, in order."""
    return [
        (r.op, r.phase, r.group_size, r.numel, r.recv_numel, r.bytes, r.recompute) for r in records if r.tag == "layer0"
    ]
