"""Paper scale without GPUs: run the real scheme code on fake tensors and a fake process group.

`estimate(par, Workload(model, seq_len, batch, mode=..., dtype=...), EstimateOptions(...))` builds the target world
(dp × degree ranks) as torch's fake process group (`dist.init_process_group("fake", ...)`: every collective is a
no-op that returns at once) and traces one training step (or one forward) of ONE rank under `FakeTensorMode`
(tspbench.predict.trace.trace_step: the same `build_mesh` → `apply_scheme` → `local_batch` → `loss` → `backward` →
`finish_grad_sync` → AdamW as tspbench.verify and the worker, at the real shapes, with no real memory and no
devices; its docstring says what is patched and how the steady state is reached). Ranks of one scheme are
symmetric (same shapes, same collectives), so one rank stands for all of them.

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

Process group: torch's fake backend is initialised for the call and destroyed after it
(tspbench.predict.trace.fake_process_group), so `estimate` can be called repeatedly; it refuses to run in a process
that already has a default process group. The real-run counterpart the estimate is tested against is
tspbench.predict.realrun.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from tspbench.config import DTYPES, GB, GIB, MODES
from tspbench.parallel import ParallelConfig, layout_fields, validate_parallel
from tspbench.predict.costmodel import Workload
from tspbench.predict.memtrack import CATEGORIES
from tspbench.predict.trace import StepTrace, Tracing, comm_layer0, comm_ops_layer0, fake_process_group, trace_step


@dataclass(frozen=True)
class EstimateOptions:
    """How `estimate` traces, which rank, and against which device's memory."""

    attention: str = "auto"
    """auto (= gpu, or native for hardware="cpu"), gpu (what a GPU's attention kernels allocate) or native (the
    CPU kernels): tspbench.predict.trace.Tracing.attention, tspbench.predict.memtrack."""
    layers: str = "auto"
    """all traces every layer; auto traces 3- and 4-layer copies of the model and extrapolates exactly
    (`extrapolate_layers`) when it has more than 4 layers: seconds instead of minutes."""
    rank: int = 0
    """The rank of the fake world that is traced (0 ≤ rank < world size; ranks of one scheme are symmetric)."""
    hardware: str | None = None
    """Hardware profile (conf/hardware): the record's status is "oom" when the peak exceeds its memory; None: no
    capacity check."""


def resolve_attention(attention: str, hardware: str | None) -> str:
    if attention == "auto":
        return "native" if hardware == "cpu" else "gpu"
    if attention not in ("gpu", "native"):
        raise ValueError(f"attention={attention!r} is unknown; allowed: auto, gpu, native")
    return attention


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


@dataclass
class _Traced:
    """What the traces of one estimate give: memory at the peak (bytes, phase, every phase's peak), FLOPs of the
    full model, the last trace's collectives and the depths traced."""

    mem: dict[str, Any]
    flops: int
    comm_records: list
    depths: tuple[int, ...]

    @property
    def extrapolated(self) -> bool:
        return len(self.depths) > 1


def _check(par: ParallelConfig, work: Workload, options: EstimateOptions) -> str:
    """Refuse what cannot be estimated; returns the attention kernel."""
    if work.mode not in MODES or work.mode == "decode":
        raise ValueError(f"mode={work.mode!r} cannot be estimated; allowed: train, forward (decode is measured only)")
    if work.dtype not in DTYPES:
        raise ValueError(f"dtype={work.dtype!r} is unknown; allowed: {', '.join(DTYPES)}")
    if options.layers not in ("auto", "all"):
        raise ValueError(f"layers={options.layers!r} is unknown; allowed: auto, all")
    validate_parallel(work.model, par, work.seq_len, work.batch)
    if not 0 <= options.rank < par.world_size:
        raise ValueError(f"rank={options.rank} is outside the world of {par.world_size} ranks")
    return resolve_attention(options.attention, options.hardware)


def _trace(par: ParallelConfig, work: Workload, rank: int, kernel: str, layers: str) -> _Traced:
    """Trace every layer, or 3- and 4-layer copies extrapolated to the model's depth, under the fake world."""
    model = work.model
    depths = (3, 4) if layers == "auto" and model.n_layers > 4 else (model.n_layers,)
    traces = []
    with fake_process_group(par.world_size, rank):
        for n in depths:
            cut = replace(work, model=replace(model, n_layers=n))
            traces.append(trace_step(par, cut, Tracing(fake=True, attention=kernel)))
    if len(depths) > 1:
        mem, flops = extrapolate_layers(traces[0], traces[1], model.n_layers)
    else:
        mem, flops = traces[0].memory(), traces[0].flops
    return _Traced(mem, flops, traces[-1].comm_records, depths)


def _metrics(par: ParallelConfig, work: Workload, tr: _Traced) -> dict[str, Any]:
    """The record's metrics but the estimate's own timings (module docstring)."""
    mem = tr.mem
    metrics: dict[str, Any] = {f"mem_{c}_gib": mem[c] / GIB for c in CATEGORIES}
    metrics["mem_total_gib"] = mem["total"] / GIB
    metrics["peak_allocated_gib"] = mem["total"] / GIB
    metrics["flops_per_step"] = tr.flops
    metrics["flops_per_token"] = tr.flops * par.degree / (work.batch * work.seq_len)
    metrics.update(comm_layer0(tr.comm_records))
    return metrics


def _status(total: float, hw) -> tuple[str, str | None]:
    """("oom", why) when the peak exceeds the hardware profile's memory (None: no check), else ("ok", None)."""
    if hw is not None and total > hw.mem_bytes:
        return "oom", f"estimated peak {total / GB:.1f} GB > {hw.name} capacity {hw.mem_bytes / GB:.1f} GB"
    return "ok", None


def _provenance(work: Workload, kernel: str, master_fp32: bool, tr: _Traced) -> dict[str, Any]:
    """How the estimate was made: torch, the attention kernel, the optimizer state traced, the depths traced."""
    state: str | None = None  # a forward has no optimizer state
    if master_fp32:
        state = "AdamW on fp32 master copies (fp32 master + m + v = 12 B/param)"
    elif work.mode == "train":
        state = "AdamW on the parameters as the worker runs it"
    return {
        "torch": torch.__version__,
        "attention_kernel": kernel,
        "optimizer_state": state,
        "layers_traced": list(tr.depths),
        "extrapolated": tr.extrapolated,
        "estimator": "tspbench.predict.estimate (FakeTensorMode + fake process group, one rank)",
    }


def estimate(par: ParallelConfig, work: Workload, options: EstimateOptions = EstimateOptions()) -> dict[str, Any]:
    """Per-rank memory, FLOPs and layer-0 collectives of one step of `work` (train or forward) under layout `par`,
    from the real scheme code on fake tensors and a fake process group of par.world_size ranks. Returns a result
    record (docs/records.md) with method "estimated"; status "oom" when the peak exceeds the hardware profile's
    memory (`EstimateOptions`: attention kernel, layers traced, rank, hardware)."""
    kernel = _check(par, work, options)
    master_fp32 = DTYPES[work.dtype].itemsize < 4 and work.mode == "train"  # MixedPrecisionAdamW's rule
    hw = None
    if options.hardware is not None:
        from tspbench.predict.costmodel.time import load_hardware

        hw = load_hardware(options.hardware)
    t0, c0 = time.perf_counter(), time.process_time()
    tr = _trace(par, work, options.rank, kernel, options.layers)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    metrics = _metrics(par, work, tr)
    metrics["estimate_wall_s"] = wall
    metrics["estimate_cpu_s"] = cpu  # this process's CPU time: what a loaded machine does not inflate
    status, reason = _status(tr.mem["total"], hw)
    return {
        "method": "estimated",
        "status": status,
        "reason": reason,
        **layout_fields(par),
        "world_size": par.world_size,
        "seq_len": work.seq_len,
        "batch": work.batch,
        "mode": work.mode,
        "dtype": work.dtype,
        "model": work.model.name,
        "model_cfg": asdict(work.model),
        "hardware": options.hardware,
        "device": None,
        "rank": options.rank,
        "metrics": metrics,
        "per_rank": {},
        "peak_phase": tr.mem["phase"],
        "mem_bytes": {k: tr.mem[k] for k in (*CATEGORIES, "total")},
        "phase_peak_bytes": tr.mem["phases"],
        "comm_ops_layer0": comm_ops_layer0(tr.comm_records),
        "attention": kernel,
        "master_fp32": master_fp32,
        "layers": options.layers,
        "provenance": _provenance(work, kernel, master_fp32, tr),
    }
