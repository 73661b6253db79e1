"""What an experiment writes beside its results from the "what fits" search (tspbench/predict/maxfit.py): `fit_records`
(the longest sequence per layout and recompute mode on a cluster of each device profile) and `comm_crossover` (the
TSP ≤ TP communication crossover from the cost model on a fine grid), for the report's "what fits" figure and its
communication crossover (kinds "fit" and "crossover", guarded by `check_fit` through record/kinds.py, written by
tspbench/run/context.py `write_fit_records` and by `python -m tspbench.plan fit ... out=PATH`). Modelled, never
measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tspbench.config import ModelConfig
from tspbench.parallel import ALL_EXCHANGES, RECOMPUTE, LayoutOptions, ParallelConfig, layout_fields
from tspbench.predict.costmodel import Workload, comm_per_layer, load_hardware
from tspbench.predict.maxfit import (
    SEQ_MULTIPLE,
    FitRequest,
    best_per_option_set,
    cluster_layouts,
    fit_cluster,
)
from tspbench.predict.planner import ALLOCATOR_RESERVE, MAX_DEGREE, PLAN_ORDER, RUNTIME_HEADROOM

FIT_FILE = "fit.jsonl"
FIT_KINDS = ("fit", "crossover")
FIT_HARDWARE = ("a100", "h100", "h100_96gb", "h200", "mi300x")
"""The device profiles the experiment's "what fits" records span (the x axis of the report's figure)."""


def fit_records(
    model: ModelConfig,
    gpus: int = 8,
    hardware: Sequence[str] = FIT_HARDWARE,
    schemes: Sequence[str] = PLAN_ORDER,
    options: LayoutOptions = ALL_EXCHANGES,
    *,
    batch: int = 1,
    seq_multiple: int = SEQ_MULTIPLE,
    max_degree: int = MAX_DEGREE,
    recomputes: Sequence[str] = RECOMPUTE,
) -> list[dict[str, Any]]:
    """One "fit" record per (hardware profile, option set, recompute mode): the longest S at the option set's best
    group size on `gpus` devices. Profiles of equal memory give equal answers (the
    memory model does not depend on anything else of the profile): they are computed once."""
    by_capacity: dict[float, list[dict[str, Any]]] = {}
    out: list[dict[str, Any]] = []
    for hw in hardware:
        capacity = float(load_hardware(hw).mem_bytes)
        req = FitRequest(model, hw, gpus, batch, seq_multiple)
        if capacity not in by_capacity:
            fits = fit_cluster(req, cluster_layouts(req, schemes, options, max_degree, recomputes))
            rows = []
            for par, by_rc in best_per_option_set(fits):
                for rc, f in by_rc.items():
                    rows.append(
                        {
                            "layout": par.label(),
                            **layout_fields(f.par),
                            "recompute": rc,
                            "max_seq_len": f.max_seq_len,
                            "capped": f.capped,
                            "seq_step": f.step,
                            "limit": f.limit,
                            "fail_phase": f.fail_phase,
                            "mem_bytes_at_max": f.at_max.get("total", 0.0),
                            "mem_bytes_at_fail": f.at_fail.get("total", 0.0),
                        }
                    )
            by_capacity[capacity] = rows
        base = {
            "kind": "fit",
            "method": "modelled",
            "model": model.name,
            "hardware": hw,
            "gpus": gpus,
            "device_mem_bytes": capacity,
            "mode": "train",
            "dtype": "bfloat16",
            "batch": batch,
            "reserve": ALLOCATOR_RESERVE,
            "headroom_bytes": RUNTIME_HEADROOM,
        }
        out += [{**base, **r} for r in by_capacity[capacity]]
    return out


def comm_crossover(model: ModelConfig, degree: int, batch: int, mode: str, step: int | None = None) -> dict[str, Any]:
    """Where TSP D=degree's per-layer communication per device first drops to TP T=degree's or below, by the cost
    model (costmodel.comm_per_layer: forward volume, or forward + backward for train) evaluated on every multiple of
    `step` tokens (default 2·degree, the zigzag's grid): a geometric scan finds the sign change, bisection on the grid
    finds its first grid point. None as `seq_len` when they do not cross below 2^24 tokens."""
    step = step or 2 * degree
    tsp, tp = ParallelConfig(scheme="tsp", degree=degree), ParallelConfig(scheme="tp", degree=degree)

    def diff(k: int) -> float:
        w = Workload(model, k * step, batch, mode=mode)
        a, b = comm_per_layer(tsp, w), comm_per_layer(tp, w)
        key = ("fwd_total",) if mode == "forward" else ("fwd_total", "bwd_total")
        return sum(a[x] for x in key) - sum(b[x] for x in key)

    ks = sorted({max(1, round(2 ** (e / 16))) for e in range(0, 16 * 24)} | {1})
    ks = [k for k in ks if k * step <= 1 << 24]
    found = None
    prev = ks[0]
    if diff(prev) <= 0:
        found = prev
    else:
        for k in ks[1:]:
            if diff(k) <= 0:
                lo, hi = prev, k
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if diff(mid) <= 0 else (mid, hi)
                found = hi
                break
            prev = k
    return {
        "kind": "crossover",
        "method": "modelled",
        "quantity": "communication bytes per layer per device ("
        + ("forward" if mode == "forward" else "forward + backward")
        + ")",
        "a": tsp.label(),
        "b": tp.label(),
        "model": model.name,
        "degree": degree,
        "batch": batch,
        "mode": mode,
        "seq_step": step,
        "seq_len": None if found is None else found * step,
        "how": f"costmodel.comm_per_layer at every multiple of {step} tokens up to 2^24 (scan, then bisection)",
    }


def check_fit(rec: dict[str, Any]) -> list[str]:
    """Why a fit / crossover record is implausible ([] when it is not): lengths must be non-negative multiples of
    their grid step, memory finite and positive."""
    bad = []
    if rec.get("kind") == "fit":
        s, step = rec.get("max_seq_len"), rec.get("seq_step")
        if not isinstance(s, int) or not isinstance(step, int) or s < 0 or step < 1 or s % step:
            bad.append(f"max_seq_len={s!r} is not a non-negative multiple of seq_step={step!r}")
        dev = rec.get("device_mem_bytes")
        if not isinstance(dev, (int, float)) or not math.isfinite(dev) or dev <= 0:
            bad.append(f"device_mem_bytes={dev!r} must be a positive number")
        at_max = rec.get("mem_bytes_at_max")
        if isinstance(s, int) and s > 0 and isinstance(at_max, (int, float)) and isinstance(dev, (int, float)):
            if not 0 < at_max <= dev:
                bad.append(f"mem_bytes_at_max={at_max!r} is not within (0, device memory]")
    elif rec.get("kind") == "crossover":
        s = rec.get("seq_len")
        if s is not None and (not isinstance(s, int) or s <= 0 or s % int(rec.get("seq_step") or 1)):
            bad.append(f"seq_len={s!r} is not a positive multiple of seq_step")
    else:
        bad.append(f"kind={rec.get('kind')!r}; allowed: {', '.join(FIT_KINDS)}")
    return bad
