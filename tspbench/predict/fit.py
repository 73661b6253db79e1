"""Fitting a small, named set of constants on the calibration rows only (docs/method.md#fit).

The cost model's a-priori constants (conf/hardware: `matmul_efficiency`, and the attention kernel at the GEMM
efficiency) are stated assumptions. This module fits, per implementation stack (`Row.stack`; "" reads as eager
PyTorch; a non-eager stack fits its GEMM efficiency alone and shares eager's attention kernel, `fit`), the two
kernel-class efficiencies

    gemm_efficiency       the profile's `matmul_efficiency`: every GEMM of the step
    attention_efficiency  the attention kernel's forward and backward (HardwareProfile.attention_*_efficiency)

on the in-scope **calibration** rows that publish tokens/s per GPU, by least squares on log(predicted ÷ published)
(a grid of 0.05 from 0.10 to 0.95, then of 0.01 around the best point; deterministic, no solver). The validation
rows never enter: `fit` filters on `subset`, and tests/unit/test_fit.py changes a validation row's published number
and requires the fitted values to stay the same (and a calibration row's to move them). `python -m tspbench.validate`
prints the fit's inputs, values and residuals, and the validation errors under the fitted constants beside the
a-priori ones; the headline and the planner keep the a-priori constants.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from tspbench.config import GIB
from tspbench.predict.costmodel.hardware import HardwareProfile
from tspbench.predict.costmodel.memory import ALLOCATOR_RESERVE
from tspbench.predict.published import LONG_SEQ, Row, predict, predicted_memory_gib

FITTED = ("gemm_efficiency", "attention_efficiency")
"""The named constants a fit may set, per stack."""
QUANTITY = "tokens_per_s_per_gpu"
"""The published quantity fitted to."""
COARSE = [round(0.10 + 0.05 * i, 2) for i in range(18)]
"""The first grid, 0.10 … 0.95."""


def stack_of(row: Row) -> str:
    """The row's implementation stack; unstated reads as eager PyTorch."""
    return row.stack or "eager"


def calibration_rows(rows: Iterable[Row], stack: str) -> list[Row]:
    """The rows a fit for `stack` may use: in scope, calibration subset, publishing tokens/s per GPU."""
    rows = list(rows)
    return [
        r
        for r in rows
        if r.subset == "calibration" and not r.out_of_scope and QUANTITY in r.measured and stack_of(r) == stack
    ]


def with_constants(gemm: float, attention: float):
    """A hardware override setting the two fitted constants."""

    def apply(hw: HardwareProfile) -> HardwareProfile:
        return replace(
            hw, matmul_efficiency=gemm, attention_forward_efficiency=attention, attention_backward_efficiency=attention
        )

    return apply


def _loss(rows: list[Row], gemm: float, attention: float) -> float:
    override = with_constants(gemm, attention)
    out = 0.0
    for r in rows:
        pred = predict(r, override)[QUANTITY]
        out += math.log(pred / r.measured[QUANTITY]) ** 2 if pred else math.inf
    return out


def _best(rows: list[Row], gemms: list[float], attns: list[float]) -> tuple[float, float]:
    scored = [(_loss(rows, g, a), g, a) for g in gemms for a in attns]
    _, g, a = min(scored)
    return g, a


@dataclass(frozen=True)
class Fit:
    """One stack's fitted constants, what they were fitted on, and the residuals."""

    stack: str
    """The implementation stack."""
    values: dict[str, float]
    """FITTED name → value (fraction of the bf16 peak)."""
    rows: tuple[str, ...]
    """The calibration rows used (ids)."""
    before_pct: dict[str, float]
    """Row id → signed tokens/s error with the a-priori constants."""
    residuals_pct: dict[str, float]
    """Row id → signed tokens/s error with the fitted constants."""

    @property
    def at_bound(self) -> bool:
        """A fitted value sits at the search's edge (≤ 0.10 or ≥ 0.99 of the peak): the rows do not determine it (or
        the model's structure is wrong for them), so its validation errors are no evidence."""
        return any(v <= 0.10 or v >= 0.99 for v in self.values.values())


def _fine(c: float) -> list[float]:
    return [round(c + 0.01 * i, 2) for i in range(-5, 6) if 0.05 <= c + 0.01 * i <= 1.0]


def fit(rows: Iterable[Row], stack: str = "eager", eager: Fit | None = None) -> Fit | None:
    """The constants of `stack` fitted on its calibration rows. Eager PyTorch: both constants (None with fewer than
    two rows). Any other stack runs the same attention kernel (PyTorch's SDPA flash kernel, which torch.compile
    leaves in place and float8 does not convert), so it shares eager's attention efficiency and fits its GEMM
    efficiency alone (None without a calibration row, or without an eager fit; `eager`: that fit, when the caller
    has it already)."""
    rows = list(rows)
    cal = calibration_rows(rows, stack)
    if stack == "eager":
        if len(cal) < 2:
            return None
        g, a = _best(cal, COARSE, COARSE)
        g, a = _best(cal, _fine(g), _fine(a))
    else:
        eager = eager if eager is not None else fit(rows, "eager")
        if not cal or eager is None:
            return None
        a = eager.values["attention_efficiency"]
        g, _ = _best(cal, COARSE, [a])
        g, _ = _best(cal, _fine(g), [a])
    override = with_constants(g, a)
    err = lambda pred, r: 100.0 * (pred - r.measured[QUANTITY]) / r.measured[QUANTITY]  # noqa: E731
    return Fit(
        stack,
        {"gemm_efficiency": g, "attention_efficiency": a},
        tuple(r.id for r in cal),
        {r.id: err(predict(r)[QUANTITY], r) for r in cal},
        {r.id: err(predict(r, override)[QUANTITY], r) for r in cal},
    )


def fit_summaries(rows: list[Row]) -> list[dict[str, Any]]:
    """Per stack of the in-scope rows: the fit (None values: nothing fitted), and the validation rows' tokens/s
    |error| (%) under the a-priori and the fitted constants (n, median and worst of each), for printing."""
    out: list[dict[str, Any]] = []
    eager = fit(rows, "eager")  # once: every other stack shares its attention constant
    for stack in sorted({stack_of(r) for r in rows if not r.out_of_scope}):
        f = eager if stack == "eager" else fit(rows, stack, eager)
        item: dict[str, Any] = {"stack": stack, "values": None, "validation": None}
        out.append(item)
        if f is None:
            continue
        item.update(
            values=f.values, rows=f.rows, before_pct=f.before_pct, residuals_pct=f.residuals_pct, at_bound=f.at_bound
        )
        held = [
            r
            for r in rows
            if r.subset == "validation" and not r.out_of_scope and stack_of(r) == stack and QUANTITY in r.measured
        ]
        if held:
            over = with_constants(f.values["gemm_efficiency"], f.values["attention_efficiency"])
            err = lambda r, hw=None: abs(predict(r, hw)[QUANTITY] / r.measured[QUANTITY] - 1) * 100  # noqa: E731
            before, after = [err(r) for r in held], [err(r, over) for r in held]
            item["validation"] = {
                "n": len(held),
                "median_before": statistics.median(before),
                "worst_before": max(before),
                "median_after": statistics.median(after),
                "worst_after": max(after),
            }
            long = [i for i, r in enumerate(held) if r.seq_len >= LONG_SEQ]
            if long:
                item["validation"].update(
                    n_long=len(long),
                    median_before_long=statistics.median(before[i] for i in long),
                    median_after_long=statistics.median(after[i] for i in long),
                )
    return out


# ------------------------------------------------------------------------------------- the allocator's reserve
MEMORY = "peak_mem_gib"
"""The published memory quantity the allocator's reserve is fitted to."""


def reserved_rows(rows: Iterable[Row], subset: str) -> list[Row]:
    """In-scope rows of `subset` whose published peak is the caching allocator's reserved memory and whose memory the
    model prices (`Row.memory_out_of_scope` unset)."""
    return [
        r
        for r in rows
        if r.subset == subset
        and not r.out_of_scope
        and not r.memory_out_of_scope
        and r.memory_kind == "reserved"
        and MEMORY in r.measured
    ]


@dataclass(frozen=True)
class ReserveFit:
    """The caching allocator's reserve (reserved ÷ allocated − 1) fitted on calibration rows, with its residuals and
    the validation rows' memory errors before and after."""

    value: float
    """The fitted reserve (the a-priori one is costmodel.memory.ALLOCATOR_RESERVE)."""
    rows: tuple[str, ...]
    """The calibration rows used (ids)."""
    before_pct: dict[str, float]
    """Row id → signed memory error with the a-priori reserve."""
    residuals_pct: dict[str, float]
    """Row id → signed memory error with the fitted reserve."""
    validation: dict[str, float] | None
    """n, median and worst |error| (%) of the validation rows' memory, a priori and fitted; None without rows."""


def fit_reserve(rows: Iterable[Row]) -> ReserveFit | None:
    """The reserve fitted on the calibration rows that publish a reserved peak: log least squares of published ÷
    allocated, i.e. 1 + reserve = exp(mean(log(published ÷ allocated))) (closed form). None without such a row. The
    validation rows never enter (tests/unit/test_fit.py)."""
    rows = list(rows)
    cal = reserved_rows(rows, "calibration")
    if not cal:
        return None
    held = reserved_rows(rows, "validation")
    alloc = {r.id: float(predict(r)["allocated_mem_gib"] or 0.0) for r in cal + held}  # one prediction per row
    value = math.exp(statistics.fmean(math.log(r.measured[MEMORY] / alloc[r.id]) for r in cal)) - 1.0

    def signed(r: Row, reserve: float = ALLOCATOR_RESERVE) -> float:
        pred = predicted_memory_gib(r, alloc[r.id] * GIB, reserve)
        return 100.0 * (pred - r.measured[MEMORY]) / r.measured[MEMORY]

    validation = None
    if held:
        before, after = [abs(signed(r)) for r in held], [abs(signed(r, value)) for r in held]
        validation = {
            "n": len(held),
            "median_before": statistics.median(before),
            "worst_before": max(before),
            "median_after": statistics.median(after),
            "worst_after": max(after),
        }
    return ReserveFit(
        value,
        tuple(r.id for r in cal),
        {r.id: signed(r) for r in cal},
        {r.id: signed(r, value) for r in cal},
        validation,
    )
