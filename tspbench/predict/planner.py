"""The planner's core (the command line is tspbench/plan.py; the report's page report/pareto.py reads its records).

`plan(PlanRequest(model, seq_len, gpus, hardware, ...))` enumerates every layout the suite implements, for one
cluster of `gpus` devices: at each group size d that divides `gpus` (d ≤ max_degree), with the data-parallel degree
dp = gpus / d that fills the cluster,

    single (d = 1); tsp; tp; tp_msp (TP + Megatron-SP); sp × {allgather, ring, ulysses};
    tp_sp at every factorisation d = T·Σ (1 < T < d) × {allgather, ring, ulysses} × Megatron-SP {on, off};
    fsdp_sp × {allgather, ring, ulysses}

× every recompute mode × micro-batch sizes. A layout `tspbench.parallel.validate_parallel` refuses (heads that do not
divide, Ulysses' head split, the zigzag, FSDP's row split) is dropped, and so is one whose closed-form peak memory
(`memory_breakdown`: training, bf16 with fp32 AdamW master, m, v), with the allocator's reserve and the runtime's
headroom on top (`fits_device`: costmodel.memory.ALLOCATOR_RESERVE, RUNTIME_HEADROOM, both stated assumptions), exceeds
the device's. The rest are ranked by predicted cluster tokens/s (`cluster_throughput` under the chosen overlap rule,
docs/method.md#choice-overlap). Closed form only: about a millisecond per layout, no fake-tensor estimate (the slow test
in tests/unit/test_plan.py checks the memory against the estimate on the paper's 8-GPU setting).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from tspbench.config import ConfigError, ModelConfig
from tspbench.parallel import (
    ALL_EXCHANGES,
    RECOMPUTE,
    LayoutOptions,
    ParallelConfig,
    layout_fields,
    layouts,
    validate_parallel,
)
from tspbench.predict.costmodel import (
    OVERLAPS,
    PRICING,
    Pricing,
    Workload,
    cluster_throughput,
    load_hardware,
    memory_breakdown,
)
from tspbench.predict.costmodel.memory import ALLOCATOR_RESERVE, RUNTIME_HEADROOM, reserved_bytes

BATCHES = (1, 2, 4)
"""Micro-batch sizes (sequences per replica per step) tried by default."""
MAX_DEGREE = 64
"""Largest group size tried by default (llama7b's 32 heads bound every tensor degree well below it)."""
PAPER_SETTING: dict[str, Any] = {"model": "llama7b", "seq_len": 131072, "gpus": 1024, "hardware": "mi300x"}
"""The paper's cluster (docs/method.md#published): the setting whose plan records an experiment writes beside its
results (tspbench/run/context.py, for the report's Pareto page, which reads records and plans nothing)."""
T = TypeVar("T")


@dataclass(frozen=True)
class Layout:
    """One fitting layout and its closed-form predictions (per device unless named cluster)."""

    par: ParallelConfig
    batch: int
    mem_bytes: float
    step_s: float
    compute_s: float
    exposed_comm_s: float
    tokens_per_s_cluster: float
    tokens_per_s_per_gpu: float

    @property
    def name(self) -> str:
        """The layout's label (tspbench.parallel) with its recompute and micro-batch."""
        return f"{self.par.label()} rc={self.par.recompute} B={self.batch}"


PLAN_ORDER = ("single", "tsp", "tp", "tp_msp", "sp", "tp_sp", "fsdp_sp")
"""The order layouts are enumerated in (ties in the ranking keep it): the method first, then the baselines."""


@dataclass(frozen=True)
class PlanRequest:
    """What to plan: one model and sequence length on one cluster, and which layouts to enumerate (`candidates`)."""

    model: ModelConfig
    """The model trained (training, bf16 with fp32 AdamW master, m, v: the planner's memory setting)."""
    seq_len: int
    """S: tokens per sequence."""
    gpus: int
    """Devices in the cluster; every group size d that divides it (d ≤ max_degree) is tried, dp = gpus / d."""
    hardware: str
    """Hardware profile (conf/hardware): device memory, peak FLOP/s, link bandwidths."""
    max_degree: int = MAX_DEGREE
    """Largest group size tried."""
    batches: tuple[int, ...] = BATCHES
    """Micro-batch sizes (sequences per replica per step) tried."""
    overlap: str = "schedule"
    """The time model's overlap rule (tspbench.predict.costmodel.OVERLAPS; docs/method.md#choice-overlap)."""
    options: LayoutOptions = ALL_EXCHANGES
    """The option axes enumerated (tspbench.parallel.layouts): K/V exchanges, Megatron-SP, vocabulary, buckets."""
    schemes: tuple[str, ...] = PLAN_ORDER
    """The schemes enumerated, in this order (ties in the ranking keep it)."""
    reserve: float = ALLOCATOR_RESERVE
    """The allocator's reserve, a fraction of the modelled peak, that must fit too (`fits_device`)."""
    headroom: float = RUNTIME_HEADROOM
    """Bytes of the device left to the runtime (`fits_device`)."""
    degrees: tuple[int, ...] = ()
    """Group sizes tried (each must divide gpus); empty: every d | gpus with d ≤ max_degree."""
    recomputes: tuple[str, ...] = RECOMPUTE
    """Activation-recompute modes tried."""
    mode: str = "train"
    """train (forward + backward + AdamW: the memory of the whole step) or forward (a forward pass: its memory,
    no gradients or optimizer state)."""
    pricing: Pricing = PRICING
    """The time model's priced mechanisms (costmodel.workload.Pricing)."""


def candidates(req: PlanRequest) -> list[tuple[ParallelConfig, int]]:
    """Every (layout, micro-batch) of the request: group sizes d | gpus (req.degrees, or every d ≤ max_degree),
    dp = gpus / d, tspbench.parallel.layouts over req.options (default: every K/V exchange, Megatron-SP on and off,
    tp_sp at every factorisation) × req.recomputes × req.batches."""
    out: list[tuple[ParallelConfig, int]] = []
    every = [d for d in range(1, min(req.gpus, req.max_degree) + 1) if req.gpus % d == 0]
    for d in [d for d in req.degrees if req.gpus % d == 0] if req.degrees else every:
        for p in layouts(d, dp=req.gpus // d, schemes=tuple(req.schemes), options=req.options):
            out += [(replace(p, recompute=rc), b) for rc in req.recomputes for b in req.batches]
    return out


def plan(req: PlanRequest) -> tuple[list[Layout], int]:
    """(the fitting layouts, best predicted cluster tokens/s first, ties: less memory first; how many were
    enumerated). `req.options` and `req.schemes` choose the layouts enumerated (`candidates`)."""
    if req.overlap not in OVERLAPS:
        raise ConfigError(f"overlap={req.overlap!r} is unknown; allowed: {', '.join(OVERLAPS)}")
    if req.gpus < 1 or req.max_degree < 1:
        raise ConfigError(f"gpus={req.gpus} and max_degree={req.max_degree} must be ≥ 1")
    hw = load_hardware(req.hardware)
    cands = candidates(req)
    fits: list[Layout] = []
    for par, b in cands:
        try:
            validate_parallel(req.model, par, req.seq_len, b)
        except ConfigError:
            continue
        work = Workload(req.model, req.seq_len, b, mode=req.mode)
        mem = memory_breakdown(par, work, kv_cache=False)["total"]
        if not fits_device(mem, hw.mem_bytes, req.reserve, req.headroom):
            continue
        ct = cluster_throughput(par, work, hw, req.gpus, overlap=req.overlap, pricing=req.pricing)
        fits.append(
            Layout(
                par,
                b,
                mem,
                ct["step_s"],
                ct["compute_s"],
                ct["exposed_comm_s"],
                ct["tokens_per_s"],
                ct["tokens_per_s_per_device"],
            )
        )
    fits.sort(key=lambda x: (-x.tokens_per_s_cluster, x.mem_bytes))
    return fits, len(cands)


def fits_device(
    mem_bytes: float, capacity: float, reserve: float = ALLOCATOR_RESERVE, headroom: float = RUNTIME_HEADROOM
) -> bool:
    """A layout fits when its modelled peak, with the allocator's reserve on top, leaves the runtime's headroom:
    mem · (1 + reserve) + headroom ≤ capacity."""
    return reserved_bytes(mem_bytes, reserve) + headroom <= capacity


def margin_pct(ranked: list[Layout], i: int) -> float | None:
    """How much faster layout i is than the next one in the ranking (%), None for the last."""
    if i + 1 >= len(ranked):
        return None
    return 100.0 * (ranked[i].tokens_per_s_cluster / ranked[i + 1].tokens_per_s_cluster - 1.0)


def pareto_front(
    items: Iterable[T],
    mem: Callable[[T], float] = lambda x: x.mem_bytes,  # type: ignore[attr-defined]
    tps: Callable[[T], float] = lambda x: x.tokens_per_s_cluster,  # type: ignore[attr-defined]
) -> list[T]:
    """The memory–throughput Pareto front, leanest first: every item that no other beats on per-device memory
    (lower) and cluster tokens/s (higher) without being worse on either (of equal points, one is kept). Items:
    Layouts, or anything with `mem` and `tps` keys (the report passes plan records)."""
    front: list[T] = []
    for x in sorted(items, key=lambda x: (mem(x), -tps(x))):
        if not front or tps(x) > tps(front[-1]):
            front.append(x)
    return front


def plan_records(
    ranked: list[Layout], *, model: str, seq_len: int, gpus: int, hardware: str, overlap: str
) -> list[dict[str, Any]]:
    """One JSON-able record per ranked layout (docs/records.md#plan-records)."""
    on_front = {id(x) for x in pareto_front(ranked)}
    out = []
    for i, lay in enumerate(ranked):
        p = lay.par
        out.append(
            {
                "kind": "plan",
                "method": "modelled",
                "model": model,
                "seq_len": seq_len,
                "gpus": gpus,
                "hardware": hardware,
                "overlap": overlap,
                "mode": "train",
                "dtype": "bfloat16",
                "rank": i + 1,
                "layout": lay.name,
                **layout_fields(p),  # scheme, degree, tp/sp degrees, dp, recompute, every option
                "batch": lay.batch,
                "mem_bytes": lay.mem_bytes,
                "step_s": lay.step_s,
                "compute_s": lay.compute_s,
                "exposed_comm_s": lay.exposed_comm_s,
                "tokens_per_s_cluster": lay.tokens_per_s_cluster,
                "tokens_per_s_per_gpu": lay.tokens_per_s_per_gpu,
                "margin_pct": margin_pct(ranked, i),
                "pareto": id(lay) in on_front,
            }
        )
    return out
