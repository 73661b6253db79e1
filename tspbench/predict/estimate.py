"""Paper scale without GPUs: run the real scheme code on fake tensors and a fake process group.

`estimate(model, par, seq_len, batch, mode=..., dtype=...)` builds the target world (dp × degree ranks) as
torch's fake process group (`dist.init_process_group("fake", ...)`: every collective is a no-op that
returns at once) and runs one training step (or one forward) of ONE rank under `FakeTensorMode`: the same
`build_mesh` → `apply_scheme` → `local_batch` → `loss` → `backward` → `finish_grad_sync` → AdamW as
tspbench.verify and the worker, at the real shapes, with no real memory and no devices. Ranks of one
scheme are symmetric (same shapes, same collectives), so one rank stands for all of them.

Per rank it returns peak memory with a category breakdown, FLOPs, and the collectives issued for one
layer (the CommLog records tagged "layer0", the same records the parity tests assert), as a result record
(docs/records.md) with method "estimated": metrics mem_{params,grads,optimizer,activations,temporaries,
comm_buffers,total}_gib and peak_allocated_gib (= mem_total_gib) at the step's peak, flops_per_step (this
rank) and flops_per_token, comm_{elems,bytes}_per_layer_{fwd,bwd} (received by this rank for layer 0, CommLog's
recv_numel convention; bwd includes collectives replayed by recompute), estimate_wall_s and estimate_cpu_s; top-level
peak_phase (where the peak falls), mem_bytes (the breakdown in bytes), phase_peak_bytes (every phase's
peak) and comm_ops_layer0 (op, phase, group size, numel, received elements, bytes, recompute).

Memory: `tspbench.predict.memtrack.MemoryTracker` (its docstring says what is counted and how live bytes are
classified), the same tracker on real and fake tensors.

Steady state: the optimizer state is created by an untimed AdamW step on zero gradients before the
measured step, as it exists from the second training step on; gradients start as None (zero_grad with
set_to_none, as the worker does).

The step is tspbench.schemes.train.train_step, the one verify proves and the worker times, with its
mixed-precision AdamW: for bf16, fp32 master copies with fp32 m, v (category optimizer: 12 B/param), each
bf16 gradient upcast one parameter at a time; for fp32/fp64, AdamW on the parameters.

FLOPs: FlopCounterMode's formulas (`torch.utils.flop_counter.flop_registry`, + the CPU flash-attention
kernels) applied by the tracker to every op of the measured step (matmuls and attention kernels; the
attention formula counts the full Lq × Lk rectangle of each call, so a causal chunk that attends to its
prefix counts the prefix; elementwise ops count 0). Running FlopCounterMode itself as a second mode is
avoided on purpose: it decomposes ops it has no formula for, which changes the allocations the tracker sees.
`flops_per_token` = rank FLOPs × degree / (B·S): the replica's hardware FLOPs per token, counting replicated
work (e.g. TP's LM head) on every rank and recompute.

Speed: every op goes through Python (FakeTensorMode + the tracker), ~10⁴ ops per layer for TSP at D = 8.
`layers="auto"` therefore traces 3- and 4-layer copies of the model and extrapolates to L layers exactly
(`extrapolate_layers`: identical layers make every phase's peak, its breakdown and the FLOPs linear in L);
`layers="all"` traces the whole model (the tests check both agree byte for byte).

What the estimate patches (values are irrelevant for memory and FLOPs; the scheme code paths are not
changed): `tspbench.schemes.ops.sharding.init_full_param` returns `torch.empty` (the seeded CPU generator cannot run
under FakeTensorMode); with attention="gpu", `torch.nn.functional.scaled_dot_product_attention` (see above).
Process group: torch's fake backend is initialised for the call and destroyed after it, so `estimate` can be called
repeatedly; it refuses to run in a process that already has a default process group.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from tspbench.config import DTYPES, MODES, ModelConfig
from tspbench.parallel import ParallelConfig, layout_fields, validate_parallel
from tspbench.predict.memtrack import CATEGORIES, MemoryTracker, fsdp_events, gpu_attention

GIB = float(2**30)


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


def trace_step(
    model: ModelConfig,
    par: ParallelConfig,
    seq_len: int,
    batch: int,
    *,
    mode: str = "train",
    dtype: str = "float32",
    device: str = "cpu",
    fake: bool = False,
    attention: str = "native",
    seed: int = 0,
    tokens: torch.Tensor | None = None,
    targets: torch.Tensor | None = None,
) -> StepTrace:
    """Build the scheme on the current default process group and trace one step of this rank.

    Real tensors (fake=False: inside a spawned gloo/NCCL rank) or fake ones (fake=True: under the fake
    process group). The same driver in both cases, so their numbers can be compared one to one. The step
    is what tspbench.run.worker runs (forward + loss, backward, finish_grad_sync, AdamW, zero_grad with
    set_to_none), after an untimed optimizer step that creates the optimizer state (steady state); the
    logits are dropped before backward. Phase marks: step (embedding), fwd<i>, head (final norm, LM head,
    loss), backward (loss and head backward), bwd<i>, embed_bwd, grad_sync, optimizer, end.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh
    from tspbench.schemes.comm import CommLog
    from tspbench.schemes.train import MixedPrecisionAdamW, train_step

    t0 = time.perf_counter()
    mesh = build_mesh(par, "cuda" if device.startswith("cuda") else "cpu")  # outside fake mode
    tracker = MemoryTracker()
    log = CommLog()
    train = mode == "train"
    in_fwd = [False]

    def fwd_mark(name):
        if in_fwd[0]:
            tracker.mark(name)

    def bwd_mark_on(out, name):  # the gradient of a block's output arrives: that block's backward starts
        if in_fwd[0] and isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda g: tracker.mark(name))

    with contextlib.ExitStack() as stack:
        if fake:
            stack.enter_context(FakeTensorMode())
            stack.enter_context(_fake_patches())
        if attention == "gpu":
            stack.enter_context(gpu_attention())
        if tokens is None:  # the global batch is input data: not tracked (as in a real run)
            tokens = torch.zeros((par.dp * batch, seq_len), dtype=torch.long, device=device)
            targets = torch.zeros((par.dp * batch, seq_len), dtype=torch.long, device=device)
        stack.enter_context(tracker)
        stack.enter_context(fsdp_events(tracker))
        pm = apply_scheme(model, par, ApplyArgs(mesh, seq_len, seed, DTYPES[dtype], device, log))
        params = list(pm.parameters())
        tracker.own(params, "params")
        hooks = []
        for i, block in enumerate(pm.module.blocks):
            hooks.append(block.register_forward_pre_hook(lambda m, a, i=i: fwd_mark(f"fwd{i}")))
            hooks.append(block.register_forward_hook(lambda m, a, out, i=i: bwd_mark_on(out, f"bwd{i}")))
        hooks.append(pm.module.norm.register_forward_pre_hook(lambda m, a: fwd_mark("head")))
        hooks.append(pm.module.embed.register_forward_hook(lambda m, a, out: bwd_mark_on(out, "embed_bwd")))
        assert targets is not None
        tok, tgt, pos = pm.local_batch(tokens, targets)
        opt = None
        if train:
            hooks += [p.register_post_accumulate_grad_hook(lambda p: tracker.grad_attached(p.grad)) for p in params]
            opt = MixedPrecisionAdamW(params, lr=1e-4)
            for p in params:  # steady state: the optimizer state exists before the measured step
                p.grad = torch.zeros_like(p)
            opt.step()
            opt.zero_grad()
            tracker.own(opt.state_tensors(), "optimizer")
        log.clear()
        tracker.mark("step")
        tracker.counting = in_fwd[0] = True
        if opt is not None:

            def phase(name: str) -> None:
                in_fwd[0] = in_fwd[0] and name != "backward"
                tracker.mark(name)

            train_step(pm, opt, tok, tgt, pos, phase=phase)
        else:
            with torch.no_grad():
                loss, logits = pm.loss(tok, tgt, pos)
                del logits, loss
            in_fwd[0] = False
            tracker.mark("backward")
        tracker.counting = False
        tracker.mark("end")
        for h in hooks:
            h.remove()
        records = list(log.records)
        del pm, opt, params, tok, tgt, pos, tokens, targets
    return StepTrace(tracker, model.n_layers, mode, records, time.perf_counter() - t0)


def extrapolate_layers(short: StepTrace, long: StepTrace, n_layers: int) -> tuple[dict[str, Any], int]:
    """Memory breakdown at the peak and FLOPs of an n_layers model from two traces of the same model with
    L₁ and L₂ = L₁ + 1 layers (L₁ ≥ 3). Exact for identical layers: a phase's live bytes are a fixed
    in-phase pattern plus per-layer state (weights, optimizer state, stored activations, gradients) of a
    number of layers that grows linearly with L, so each structural phase's peak (first, second, second
    to last and last layer, forward and backward; embedding, head, loss, grad sync, optimizer) is linear
    in L; the layers in between are dominated by the second and second-to-last (linear in their index).
    FLOPs are linear in L."""
    l1, l2 = short.n_layers, long.n_layers
    assert l2 == l1 + 1 and l1 >= 3, (l1, l2)
    p1, p2 = short.segment_peaks(), long.segment_peaks()
    kinds = [k for k in p2 if k in p1 and not k.endswith("mid_inner")]
    assert set(kinds) == {k for k in p1 if not k.endswith("mid_inner")}, (sorted(p1), sorted(p2))
    n = n_layers - l2
    value = {k: p2[k][1] + n * (p2[k][1] - p1[k][1]) for k in kinds}
    kind = max(kinds, key=lambda k: value[k])
    phases = dict(sorted(value.items(), key=lambda kv: p2[kv[0]][0]))
    b1 = short.tracker.breakdown_at(p1[kind][0], short.fwd_range())
    b2 = long.tracker.breakdown_at(p2[kind][0], long.fwd_range())
    mem: dict[str, Any] = {c: b2[c] + n * (b2[c] - b1[c]) for c in CATEGORIES}
    mem["total"], mem["phase"], mem["phases"] = value[kind], kind, phases
    assert sum(mem[c] for c in CATEGORIES) == mem["total"]
    flops = long.flops + n * (long.flops - short.flops)
    return mem, flops


@contextlib.contextmanager
def _fake_patches():
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


# ------------------------------------------------------------------------------------------- records
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


def resolve_attention(attention: str, hardware: str | None) -> str:
    if attention == "auto":
        return "native" if hardware == "cpu" else "gpu"
    if attention not in ("gpu", "native"):
        raise ValueError(f"attention={attention!r} is unknown; allowed: auto, gpu, native")
    return attention


def estimate(
    model: ModelConfig,
    par: ParallelConfig,
    seq_len: int,
    batch: int,
    *,
    mode: str = "train",
    dtype: str = "bfloat16",
    rank: int = 0,
    hardware: str | None = None,
    attention: str = "auto",
    layers: str = "auto",
) -> dict[str, Any]:
    """Per-rank memory, FLOPs and layer-0 collectives of one step, from the real scheme code on fake
    tensors and a fake process group of par.world_size ranks. Returns a result record (docs/records.md) with
    method "estimated"; status "oom" when the peak exceeds the hardware profile's memory.

    attention: "auto" (= "gpu", or "native" for hardware="cpu"), "gpu" or "native" (module docstring).
    layers: "all" traces every layer; "auto" (default) traces 3- and 4-layer copies of the model and
    extrapolates exactly (`extrapolate_layers`) when it has more than 4 layers: seconds instead of minutes.
    """
    if mode not in MODES or mode == "decode":
        raise ValueError(f"mode={mode!r} cannot be estimated; allowed: train, forward (decode is measured only)")
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is unknown; allowed: {', '.join(DTYPES)}")
    if layers not in ("auto", "all"):
        raise ValueError(f"layers={layers!r} is unknown; allowed: auto, all")
    validate_parallel(model, par, seq_len, batch)
    if not 0 <= rank < par.world_size:
        raise ValueError(f"rank={rank} is outside the world of {par.world_size} ranks")
    kernel = resolve_attention(attention, hardware)
    master_fp32 = DTYPES[dtype].itemsize < 4 and mode == "train"  # MixedPrecisionAdamW's rule
    hw = None
    if hardware is not None:
        from tspbench.predict.costmodel.time import load_hardware

        hw = load_hardware(hardware)

    t0, c0 = time.perf_counter(), time.process_time()
    extrapolated = layers == "auto" and model.n_layers > 4
    depths = (3, 4) if extrapolated else (model.n_layers,)
    traces = []
    with fake_process_group(par.world_size, rank):
        for n in depths:
            cfg = replace(model, n_layers=n)
            traces.append(
                trace_step(
                    cfg,
                    par,
                    seq_len,
                    batch,
                    mode=mode,
                    dtype=dtype,
                    fake=True,
                    attention=kernel,
                )
            )
    if extrapolated:
        mem, flops = extrapolate_layers(traces[0], traces[1], model.n_layers)
    else:
        mem, flops = traces[0].memory(), traces[0].flops
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0

    metrics: dict[str, Any] = {f"mem_{c}_gib": mem[c] / GIB for c in CATEGORIES}
    metrics["mem_total_gib"] = mem["total"] / GIB
    metrics["peak_allocated_gib"] = mem["total"] / GIB
    metrics["flops_per_step"] = flops
    metrics["flops_per_token"] = flops * par.degree / (batch * seq_len)
    metrics.update(comm_layer0(traces[-1].comm_records))
    metrics["estimate_wall_s"] = wall
    metrics["estimate_cpu_s"] = cpu  # this process's CPU time: what a loaded machine does not inflate
    status, reason = "ok", None
    if hw is not None and mem["total"] > hw.mem_bytes:
        status = "oom"
        reason = f"estimated peak {mem['total'] / 1e9:.1f} GB > {hw.name} capacity {hw.mem_bytes / 1e9:.1f} GB"
    return {
        "method": "estimated",
        "status": status,
        "reason": reason,
        **layout_fields(par),
        "world_size": par.world_size,
        "seq_len": seq_len,
        "batch": batch,
        "mode": mode,
        "dtype": dtype,
        "model": model.name,
        "model_cfg": asdict(model),
        "hardware": hardware,
        "device": None,
        "rank": rank,
        "metrics": metrics,
        "per_rank": {},
        "peak_phase": mem["phase"],
        "mem_bytes": {k: mem[k] for k in (*CATEGORIES, "total")},
        "phase_peak_bytes": mem["phases"],
        "comm_ops_layer0": comm_ops_layer0(traces[-1].comm_records),
        "attention": kernel,
        "master_fp32": master_fp32,
        "layers": layers,
        "provenance": {
            "torch": torch.__version__,
            "attention_kernel": kernel,
            "optimizer_state": (
                "AdamW on fp32 master copies (fp32 master + m + v = 12 B/param)"
                if master_fp32
                else "AdamW on the parameters as the worker runs it"
                if mode == "train"
                else None
            ),
            "layers_traced": list(depths),
            "extrapolated": extrapolated,
            "estimator": "tspbench.predict.estimate (FakeTensorMode + fake process group, one rank)",
        },
    }


# ------------------------------------------------------------------------------------------- real runs
def summary(tr: StepTrace) -> dict[str, Any]:
    """What the estimate-vs-real comparison looks at: memory at the peak, FLOPs, layer-0 collectives."""
    return {
        "mem": tr.memory(),
        "flops": tr.flops,
        "comm": comm_layer0(tr.comm_records),
        "comm_ops": comm_ops_layer0(tr.comm_records),
    }


def _measure_worker(rank: int, world: int, cases: list, out_file: str) -> None:
    import json

    from tspbench.model import synthetic_batch

    results = []
    for model, par, seq_len, batch, mode, dtype in cases:
        tokens, targets = synthetic_batch(model, par.dp * batch, seq_len, seed=0)
        tr = trace_step(
            model,
            par,
            seq_len,
            batch,
            mode=mode,
            dtype=dtype,
            fake=False,
            attention="native",
            tokens=tokens,
            targets=targets,
        )
        results.append(summary(tr))
        dist.barrier()
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(results, f)


def measure(cases: list[tuple[ModelConfig, ParallelConfig, int, int, str, str]]) -> list[dict[str, Any]]:
    """Real CPU runs (gloo, one process per rank) of (model, par, seq_len, batch, mode, dtype) cases with
    the estimate's driver and tracker (`trace_step(fake=False)`): rank 0's `summary` per case. All cases
    share one world size. This is what the estimate is tested against."""
    import json
    import tempfile
    from pathlib import Path

    from tspbench.spawn import spawn

    worlds = {c[1].world_size for c in cases}
    assert len(worlds) == 1, worlds
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "measured.json")
        spawn(_measure_worker, worlds.pop(), cases, out)
        return json.loads(Path(out).read_text())


def estimate_summary(
    model: ModelConfig,
    par: ParallelConfig,
    seq_len: int,
    batch: int,
    *,
    mode: str = "train",
    dtype: str = "float32",
    attention: str = "native",
    rank: int = 0,
) -> dict[str, Any]:
    """`summary` of a fake-tensor trace of every layer (the counterpart of `measure` for one case)."""
    with fake_process_group(par.world_size, rank):
        tr = trace_step(model, par, seq_len, batch, mode=mode, dtype=dtype, fake=True, attention=attention)
    return summary(tr)
