"""What fits: the longest sequence each layout trains at, and the largest model of a family that trains at
a given sequence length, on one cluster, by the closed-form memory model (`python -m tspbench.plan fit=true ...`).

The fit rule is the planner's (predict/planner.py `fits_device`): the modelled peak per device
(costmodel.memory_breakdown: training, bf16 with fp32 AdamW master, m, v; no KV cache) × (1 + allocator reserve) +
runtime headroom ≤ the device's memory. The longest sequence is a search over the sequence lengths the layout can
run: multiples of `seq_multiple` and of what the layout requires (the zigzag's 2·Σ; `seq_step`), doubling until the
peak no longer fits, then bisecting, so the answer is exact on that grid (the peak grows with S). The limiting term
is the memory category that grew most between the shortest length and the first length that does not fit, named
as the code allocates it (`limiting_term`: the cross-entropy's fp32 [tokens, V] buffers are "logits").

Every number here is modelled (formula + hardware profile's memory), not measured; the model agrees with the
fake-tensor estimate within the documented 1.1 % on llama7b (costmodel/memory.py) and a few % on small GQA models
(tests/unit/test_maxfit.py checks one answer against the estimate).

What an experiment writes from it (fit and crossover records) is tspbench/predict/fitrecords.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from tspbench.config import GB, ConfigError, ModelConfig, model_preset
from tspbench.parallel import (
    ALL_EXCHANGES,
    RECOMPUTE,
    LayoutOptions,
    ParallelConfig,
    layout_fields,
    layouts,
    validate_parallel,
)
from tspbench.predict.costmodel import MEMORY_KEYS, Workload, load_hardware, memory_breakdown
from tspbench.predict.costmodel.memory import peak_phase
from tspbench.predict.planner import ALLOCATOR_RESERVE, MAX_DEGREE, PLAN_ORDER, RUNTIME_HEADROOM, fits_device

SEQ_MULTIPLE = 256
"""Sequence lengths searched are multiples of this (and of the layout's own requirement)."""
SEQ_CAP = 1 << 27
"""The search stops here (134M tokens): a layout that still fits is reported as "≥ this"."""
STATE_KEYS = ("params", "grads", "optimizer")
"""The categories that do not grow with S (the model state)."""
TERM_NAMES = {
    "params": "weights",
    "grads": "gradients",
    "optimizer": "optimizer state",
    "activations": "stored activations",
    "temporaries": "working set",
    "comm_buffers": "communication buffers",
    "kv_cache": "KV cache",
}


def family(name: str) -> tuple[ModelConfig, ...]:
    """A family's models, smallest first: conf/model/hf/families.yaml's list of Hugging Face config.json files, or
    "presets" (conf/model's presets). One-line ConfigError naming the allowed families."""
    import json

    import yaml

    from tspbench.hf.convert import model_config_from_hf
    from tspbench.paths import conf_dir

    if name == "presets":
        models = [model_preset(p.stem) for p in (conf_dir() / "model").glob("*.yaml")]
        return tuple(sorted(models, key=_param_count))
    hf = conf_dir() / "model" / "hf"
    families: dict[str, list[str]] = yaml.safe_load((hf / "families.yaml").read_text())
    if name not in families:
        raise ConfigError(f"family={name!r} is unknown; allowed: {', '.join([*families, 'presets'])}")
    return tuple(model_config_from_hf(json.loads((hf / f"{s}.json").read_text()), name=s) for s in families[name])


def _param_count(m: ModelConfig) -> float:
    from tspbench.predict.costmodel import non_embedding_params

    return non_embedding_params(m) + 2 * m.vocab_size * m.dim


# ------------------------------------------------------------------------------------------------ one layout
@dataclass(frozen=True)
class FitRequest:
    """One cluster: the model, the device profile and how many, and the fit rule's constants."""

    model: ModelConfig
    hardware: str
    gpus: int
    batch: int = 1
    seq_multiple: int = SEQ_MULTIPLE
    reserve: float = ALLOCATOR_RESERVE
    headroom: float = RUNTIME_HEADROOM
    cap: int = SEQ_CAP

    @property
    def capacity(self) -> float:
        return float(load_hardware(self.hardware).mem_bytes)


@dataclass(frozen=True)
class Fit:
    """The longest sequence one layout (with its recompute) trains at, and what stops it."""

    par: ParallelConfig
    max_seq_len: int
    """0: not even the shortest length fits (the model state alone is too big); `capped`: at least this."""
    capped: bool
    step: int
    """The grid the search ran on (multiples of it)."""
    at_max: dict[str, float] = field(default_factory=dict)
    """memory_breakdown at max_seq_len (empty when 0)."""
    at_fail: dict[str, float] = field(default_factory=dict)
    """memory_breakdown at the first length that does not fit (empty when capped)."""
    fail_phase: str = ""
    limit: str = ""
    """The term that breaks first (`limiting_term`)."""

    @property
    def name(self) -> str:
        return f"{self.par.label()} rc={self.par.recompute}"


def seq_step(par: ParallelConfig, multiple: int = SEQ_MULTIPLE) -> int:
    """The grid of sequence lengths a layout runs: multiples of lcm(multiple, 2·Σ) (the zigzag over the token axis,
    tspbench.parallel.checks; 2 for single-token-axis layouts keeps S even)."""
    return math.lcm(max(1, multiple), 2 * max(1, par.sp_degree), 2)


def _peak(req: FitRequest, par: ParallelConfig, s: int) -> dict[str, float]:
    return memory_breakdown(par, Workload(req.model, s, req.batch), kv_cache=False)


def _fits(req: FitRequest, par: ParallelConfig, s: int, capacity: float) -> bool:
    return fits_device(_peak(req, par, s)["total"], capacity, req.reserve, req.headroom)


def limiting_term(low: dict[str, float], fail: dict[str, float], phase: str) -> str:
    """The category that grew most from the shortest length (`low`) to the first that does not fit (`fail`), in
    words; the model state when nothing fits at all (`low` empty); "logits" for the loss backward's working set
    (the cross-entropy's fp32 [tokens, V] buffers)."""
    if not low:
        big = max(STATE_KEYS, key=lambda k: fail.get(k, 0.0))
        return f"model state ({TERM_NAMES[big]} largest)"
    growth = {k: fail.get(k, 0.0) - low.get(k, 0.0) for k in MEMORY_KEYS if k not in STATE_KEYS}
    key = max(growth, key=lambda k: growth[k])
    if key == "temporaries" and phase == "backward":
        return "logits (cross-entropy fp32 buffers)"
    return TERM_NAMES[key]


def max_seq_len(req: FitRequest, par: ParallelConfig, capacity: float | None = None) -> Fit:
    """The longest S on the layout's grid (`seq_step`) whose modelled peak fits (`fits_device`), by doubling then
    bisection (the peak grows with S). validate_parallel must accept the layout (ConfigError otherwise)."""
    cap_bytes = req.capacity if capacity is None else capacity
    step = seq_step(par, req.seq_multiple)
    validate_parallel(req.model, par, step, req.batch)
    low = _peak(req, par, step)
    if not fits_device(low["total"], cap_bytes, req.reserve, req.headroom):
        return Fit(
            par,
            0,
            False,
            step,
            {},
            low,
            peak_phase(par, Workload(req.model, step, req.batch), kv_cache=False),
            limiting_term({}, low, ""),
        )
    k_lo, k_hi = 1, 2  # fits at k_lo·step; find a k_hi that does not
    while k_hi * step <= req.cap and _fits(req, par, k_hi * step, cap_bytes):
        k_lo, k_hi = k_hi, k_hi * 2
    if k_hi * step > req.cap:
        k_hi = req.cap // step + 1
        if _fits(req, par, (k_hi - 1) * step, cap_bytes):
            s = (k_hi - 1) * step
            return Fit(par, s, True, step, _peak(req, par, s), {}, "", "")
    while k_hi - k_lo > 1:
        mid = (k_lo + k_hi) // 2
        if _fits(req, par, mid * step, cap_bytes):
            k_lo = mid
        else:
            k_hi = mid
    s_max, s_fail = k_lo * step, k_hi * step
    fail = _peak(req, par, s_fail)
    phase = peak_phase(par, Workload(req.model, s_fail, req.batch), kv_cache=False)
    return Fit(par, s_max, False, step, _peak(req, par, s_max), fail, phase, limiting_term(low, fail, phase))


# ------------------------------------------------------------------------------------------------ a cluster
def cluster_layouts(
    req: FitRequest,
    schemes: Sequence[str] = PLAN_ORDER,
    options: LayoutOptions = ALL_EXCHANGES,
    max_degree: int = MAX_DEGREE,
    recomputes: Sequence[str] = RECOMPUTE,
) -> list[ParallelConfig]:
    """Every layout of `req.gpus` devices the planner enumerates (group sizes d | gpus up to max_degree, dp = gpus/d)
    that the model allows at some sequence length (validate_parallel at the layout's own grid step), × recomputes."""
    out = []
    for d in [d for d in range(1, min(req.gpus, max_degree) + 1) if req.gpus % d == 0]:
        for p in layouts(d, dp=req.gpus // d, schemes=tuple(schemes), options=options):
            try:
                validate_parallel(req.model, p, seq_step(p, req.seq_multiple), req.batch)
            except ConfigError:
                continue
            out += [replace(p, recompute=rc) for rc in recomputes]
    return out


def option_key(par: ParallelConfig) -> tuple:
    """A layout's scheme and option set without its group size, tensor factorisation, dp or recompute: the rows of
    `python -m tspbench.plan fit=true` (each shown at the group size where it fits longest)."""
    f = layout_fields(par)
    return tuple(v for k, v in f.items() if k not in ("degree", "tp_degree", "sp_degree", "dp", "recompute"))


def fit_cluster(req: FitRequest, pars: Iterable[ParallelConfig]) -> list[Fit]:
    """`max_seq_len` of every layout, in the order given."""
    capacity = req.capacity
    return [max_seq_len(req, p, capacity) for p in pars]


def best_per_option_set(fits: list[Fit]) -> list[tuple[ParallelConfig, dict[str, Fit]]]:
    """For each option set (`option_key`), the group size / factorisation whose longest fit (over recompute modes)
    is longest, with its Fit per recompute mode; scheme order kept, longest first within a scheme."""
    by: dict[tuple, dict[tuple, dict[str, Fit]]] = {}
    for f in fits:
        base = replace(f.par, recompute="none")
        by.setdefault(option_key(f.par), {}).setdefault(base.key(), {})[f.par.recompute] = f
    out = []
    for groups in by.values():
        # the longest fit over recompute modes; on a tie (none fits anywhere, say) the largest group size
        best = max(groups.values(), key=lambda g: (max(f.max_seq_len for f in g.values()), _degree(g)))
        par = replace(next(iter(best.values())).par, recompute="none")
        out.append((par, best))
    order = {s: i for i, s in enumerate(PLAN_ORDER)}
    out.sort(key=lambda x: (order.get(x[0].scheme, 99), -max(f.max_seq_len for f in x[1].values())))
    return out


def _degree(g: dict[str, Fit]) -> int:
    return next(iter(g.values())).par.degree


@dataclass(frozen=True)
class ModelFit:
    """One model of a family at one sequence length: the layout with the least memory that fits, if any."""

    model: ModelConfig
    fit: bool
    layout: str
    mem_bytes: float
    """The chosen layout's modelled peak (the leanest layout's when none fits)."""


def largest_model(
    models: Sequence[ModelConfig],
    seq_len: int,
    hardware: str,
    gpus: int,
    *,
    schemes: Sequence[str] = PLAN_ORDER,
    options: LayoutOptions = ALL_EXCHANGES,
    max_degree: int = MAX_DEGREE,
    batch: int = 1,
    reserve: float = ALLOCATOR_RESERVE,
    headroom: float = RUNTIME_HEADROOM,
) -> list[ModelFit]:
    """For each model (smallest first), whether some layout of the cluster (any recompute mode) trains it at
    `seq_len` under the fit rule, and the leanest layout."""
    capacity = float(load_hardware(hardware).mem_bytes)
    out = []
    for m in models:
        req = FitRequest(m, hardware, gpus, batch, reserve=reserve, headroom=headroom)
        best: tuple[float, str] | None = None
        for p in cluster_layouts(req, schemes, options, max_degree):
            try:
                validate_parallel(m, p, seq_len, batch)
            except ConfigError:
                continue
            mem = _peak(req, p, seq_len)["total"]
            if best is None or mem < best[0]:
                best = (mem, f"{p.label()} rc={p.recompute}")
        if best is None:
            out.append(ModelFit(m, False, "no layout accepts this sequence length", float("nan")))
            continue
        out.append(ModelFit(m, fits_device(best[0], capacity, reserve, headroom), best[1], best[0]))
    return out


# ------------------------------------------------------------------------------------------------ printing
def breakdown_text(b: dict[str, float]) -> str:
    """ "weights 13.5 + gradients … = 71.2 GB" (the non-zero categories)."""
    parts = [f"{TERM_NAMES[k]} {b[k] / GB:.1f}" for k in MEMORY_KEYS if b.get(k, 0.0) > 0.05 * GB]
    return " + ".join(parts) + f" = {b.get('total', 0.0) / GB:.1f} GB"


def fmt_len(f: Fit | None) -> str:
    if f is None:
        return "-"
    if f.max_seq_len == 0:
        return "none"
    return f"{'≥' if f.capped else ''}{f.max_seq_len:,}"


def fit_table(
    req: FitRequest, rows: list[tuple[ParallelConfig, dict[str, Fit]]], recomputes: Sequence[str]
) -> list[str]:
    """The fit mode's table: one row per option set (at its best group size), the longest S per recompute mode, and
    the limit of the longest one (its term, the breakdown at the first length that does not fit)."""
    cap = req.capacity
    lines = [f"{'layout (at its best group size)':44s} " + " ".join(f"{rc:>11s}" for rc in recomputes) + "  limit"]
    for par, by_rc in rows:
        cells = " ".join(f"{fmt_len(by_rc.get(rc)):>11s}" for rc in recomputes)
        best = max(by_rc.values(), key=lambda f: f.max_seq_len)
        if best.capped:
            why = f"fits up to the search cap {req.cap:,}"
        elif best.max_seq_len == 0:
            why = f"{best.limit}: {breakdown_text(best.at_fail)} at S={best.step:,}"
        else:
            need = best.at_fail["total"] * (1 + req.reserve) + req.headroom
            why = (
                f"rc={best.par.recompute}: {best.limit} — at S={best.max_seq_len + best.step:,} ({best.fail_phase}) "
                f"{breakdown_text(best.at_fail)}; ×{1 + req.reserve:g} + {req.headroom / GB:.0f} = {need / GB:.2f} "
                f"> {cap / GB:.0f} GB"
            )
        lines.append(f"{par.label():44s} {cells}  {why}")
    return lines
