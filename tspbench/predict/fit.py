"""Fitting a small, named set of constants on the calibration rows only (docs/method.md#fit).

The cost model's a-priori constants (conf/hardware: `matmul_efficiency` and the attention kernel's published
efficiency) are stated assumptions. This module fits, per implementation stack (`Row.stack`; "" reads as eager
PyTorch), two kernel-class multipliers of them:

    gemm_scale       × the profile's `matmul_efficiency`: every GEMM of the step
    attention_scale  × the profile's attention efficiency (HardwareProfile.attention_*_efficiency), forward and
                     backward

Multipliers, not absolute fractions, so that what the profiles source per device (FlashAttention-2 at 0.35 of the
H100's peak and 0.6 of the A100's) survives a fit that spans devices. They are fitted on the in-scope
**calibration** rows of the stack that publish a throughput (tokens/s per GPU, else MFU, else the iteration time:
`fit_quantity`; each moves with the fitted constants as tokens/s does, the iteration time inversely), by least squares
on log(predicted ÷ published) (a grid of 0.1 from 0.1 to 1.9, then of 0.02 around the best point; deterministic, no
solver; an efficiency is capped at 1.0):

- a stack with two or more such rows fits both;
- a stack built on another (`base_stack`: torch_compile and float8 run eager PyTorch's kernels, compile fusing the
  elementwise work around them and float8 swapping the GEMMs by the sourced `float8_linear_speedup`) with a single
  row fits the one constant that row determines (the kernel class its prediction is the more sensitive to, at the
  base stack's constants) and takes the other from the base stack;
- a stack built on another without calibration rows takes the base stack's constants (a priori, compile changes no
  constant).

The validation rows never enter: `fit` filters on `subset`, and tests/unit/test_fit.py changes a validation row's
published number and requires the fitted values to stay the same (and a calibration row's to move them). `python -m
tspbench.validate` prints the fit's inputs, values and residuals, and the validation errors under the fitted constants
beside the a-priori ones, per stack and over every stack (`fitted_validation`); the headline and the planner keep the
a-priori constants.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from tspbench.config import GIB
from tspbench.predict.costmodel.hardware import HardwareProfile
from tspbench.predict.costmodel.memory import ALLOCATOR_RESERVE
from tspbench.predict.published import LONG_SEQ, Row, predict, predicted_memory_gib

FITTED = ("gemm_scale", "attention_scale")
"""The named constants a fit may set, per stack: multipliers of the profile's a-priori GEMM and attention
efficiencies."""
QUANTITY = "tokens_per_s_per_gpu"
"""The throughput the validation summary over every stack is stated in (`fitted_validation`)."""
THROUGHPUT = (QUANTITY, "mfu_pct", "step_s")
"""The published quantities a fit may use, in order of preference (`fit_quantity`)."""
COARSE = [round(0.1 * i, 1) for i in range(1, 20)]
"""The first grid, 0.1 … 1.9."""
DERIVED = frozenset({"torch_compile", "float8"})
"""Stack parts that run another stack's kernels (`base_stack`)."""


def stack_of(row: Row) -> str:
    """The row's implementation stack; unstated reads as eager PyTorch."""
    return row.stack or "eager"


def base_stack(stack: str) -> str:
    """The stack whose kernels `stack` runs: its parts without torch_compile and float8 (eager when none is left);
    the stack itself when it has neither."""
    parts = [p for p in stack.split("+") if p not in DERIVED]
    return "+".join(parts) or "eager"


def fit_quantity(row: Row) -> str | None:
    """The throughput a row is fitted and scored on: the first of THROUGHPUT it publishes (None: none)."""
    return next((q for q in THROUGHPUT if q in row.measured), None)


def calibration_rows(rows: Iterable[Row], stack: str) -> list[Row]:
    """The rows a fit for `stack` may use: in scope, calibration subset, publishing a throughput (`fit_quantity`)."""
    rows = list(rows)
    return [
        r for r in rows if r.subset == "calibration" and not r.out_of_scope and fit_quantity(r) and stack_of(r) == stack
    ]


def _signed_pct(row: Row, hw: Callable[[HardwareProfile], HardwareProfile] | None) -> float:
    """Signed error (%) of the row's `fit_quantity` predicted under the override `hw`."""
    q = fit_quantity(row)
    assert q is not None, row.id
    return 100.0 * (float(predict(row, hw)[q] or 0.0) / row.measured[q] - 1.0)


def efficiencies(hw: HardwareProfile, gemm_scale: float, attention_scale: float) -> tuple[float, float, float]:
    """The GEMM, attention-forward and attention-backward efficiencies of `hw` under the two multipliers (each capped
    at 1.0 of the peak)."""
    g = hw.matmul_efficiency
    return (
        min(1.0, g * gemm_scale),
        min(1.0, (hw.attention_forward_efficiency or g) * attention_scale),
        min(1.0, (hw.attention_backward_efficiency or g) * attention_scale),
    )


def with_constants(gemm_scale: float, attention_scale: float) -> Callable[[HardwareProfile], HardwareProfile]:
    """A hardware override applying the two fitted multipliers to a profile's a-priori efficiencies."""

    def apply(hw: HardwareProfile) -> HardwareProfile:
        g, af, ab = efficiencies(hw, gemm_scale, attention_scale)
        return replace(hw, matmul_efficiency=g, attention_forward_efficiency=af, attention_backward_efficiency=ab)

    return apply


def _loss(rows: list[Row], gemm: float, attention: float) -> float:
    override = with_constants(gemm, attention)
    out = 0.0
    for r in rows:
        q = fit_quantity(r)
        assert q is not None, r.id
        pred = predict(r, override)[q]
        out += math.log(pred / r.measured[q]) ** 2 if pred else math.inf
    return out


def _best(rows: list[Row], gemms: list[float], attns: list[float]) -> tuple[float, float]:
    scored = [(_loss(rows, g, a), g, a) for g in gemms for a in attns]
    _, g, a = min(scored)
    return g, a


def _fine(c: float) -> list[float]:
    return [round(c + 0.02 * i, 2) for i in range(-5, 6) if 0.05 <= c + 0.02 * i <= 2.0]


@dataclass(frozen=True)
class Fit:
    """One stack's fitted constants, what they were fitted on, and the residuals."""

    stack: str
    """The implementation stack."""
    values: dict[str, float]
    """FITTED name → multiplier of the profile's a-priori efficiency."""
    rows: tuple[str, ...]
    """The calibration rows used (ids)."""
    before_pct: dict[str, float]
    """Row id → signed error of its `fit_quantity` with the a-priori constants."""
    residuals_pct: dict[str, float]
    """Row id → signed error of its `fit_quantity` with the fitted constants."""
    fitted: tuple[str, ...] = FITTED
    """The constants fitted on this stack's own rows; the others are the base stack's (`taken_from`)."""
    taken_from: str = ""
    """The base stack the constants not in `fitted` come from ("" when both are the stack's own)."""

    @property
    def at_bound(self) -> bool:
        """A fitted value sits at the search's edge (≤ 0.1 or ≥ 1.9 × the a-priori value): the rows do not determine
        it (or the model's structure is wrong for them), so its validation errors are no evidence."""
        return any(self.values[k] <= 0.1 or self.values[k] >= 1.9 for k in self.fitted)

    def override(self) -> Callable[[HardwareProfile], HardwareProfile]:
        """The hardware override of these constants."""
        return with_constants(self.values["gemm_scale"], self.values["attention_scale"])


def _sensitivity(row: Row, gemm: float, attention: float) -> dict[str, float]:
    """How much the row's predicted tokens/s moves when each multiplier moves by 10% (log change)."""
    at = math.log(predict(row, with_constants(gemm, attention))[QUANTITY] or 1.0)
    return {
        "gemm_scale": abs(math.log(predict(row, with_constants(gemm * 1.1, attention))[QUANTITY] or 1.0) - at),
        "attention_scale": abs(math.log(predict(row, with_constants(gemm, attention * 1.1))[QUANTITY] or 1.0) - at),
    }


def fit(rows: Iterable[Row], stack: str = "eager", base: Fit | None = None) -> Fit | None:
    """The constants of `stack` fitted on its calibration rows (the module's rules); None when nothing can be fitted
    or taken (fewer than two rows of a stack built on no other, or no fit of the base stack). `base`: the base stack's
    fit, when the caller has it already."""
    rows = list(rows)
    cal = calibration_rows(rows, stack)
    fitted: tuple[str, ...] = FITTED
    taken = ""
    if len(cal) >= 2:
        g, a = _best(cal, COARSE, COARSE)
        g, a = _best(cal, _fine(g), _fine(a))
    else:
        home = base_stack(stack)
        if home == stack:
            return None
        base = base if base is not None else fit(rows, home)
        if base is None:
            return None
        g, a = base.values["gemm_scale"], base.values["attention_scale"]
        taken, fitted = home, ()
        if cal:  # one row: the constant it determines
            sens = _sensitivity(cal[0], g, a)
            key = max(sens, key=lambda k: sens[k])
            fitted = (key,)
            if key == "gemm_scale":
                g, _ = _best(cal, _fine(_best(cal, COARSE, [a])[0]), [a])
            else:
                _, a = _best(cal, [g], _fine(_best(cal, [g], COARSE)[1]))
    override = with_constants(g, a)
    return Fit(
        stack,
        {"gemm_scale": g, "attention_scale": a},
        tuple(r.id for r in cal),
        {r.id: _signed_pct(r, None) for r in cal},
        {r.id: _signed_pct(r, override) for r in cal},
        fitted,
        taken,
    )


def fits(rows: list[Row]) -> dict[str, Fit | None]:
    """Every in-scope stack's fit (None: nothing fitted), base stacks first so that the others reuse theirs."""
    stacks = sorted({stack_of(r) for r in rows if not r.out_of_scope})
    out: dict[str, Fit | None] = {}
    for stack in sorted(stacks, key=lambda s: base_stack(s) != s):
        home = base_stack(stack)
        if home != stack and home not in out:
            out[home] = fit(rows, home)
        out[stack] = fit(rows, stack, out.get(home)) if home != stack else fit(rows, stack)
    return {s: out[s] for s in stacks}


def fit_summaries(rows: list[Row], by_stack: dict[str, Fit | None] | None = None) -> list[dict[str, Any]]:
    """Per stack of the in-scope rows: the fit (None values: nothing fitted), and the validation rows' throughput
    |error| (%, each row's `fit_quantity`) under the a-priori and the fitted constants (n, median and worst of each),
    for printing. `by_stack`: `fits(rows)`, when the caller has it already."""
    out: list[dict[str, Any]] = []
    for stack, f in (by_stack if by_stack is not None else fits(rows)).items():
        item: dict[str, Any] = {"stack": stack, "values": None, "validation": None}
        out.append(item)
        if f is None:
            continue
        item.update(
            values=f.values,
            rows=f.rows,
            before_pct=f.before_pct,
            residuals_pct=f.residuals_pct,
            at_bound=f.at_bound,
            fitted=f.fitted,
            taken_from=f.taken_from,
        )
        held = [
            r
            for r in rows
            if r.subset == "validation" and not r.out_of_scope and stack_of(r) == stack and fit_quantity(r)
        ]
        if held:
            before = [abs(_signed_pct(r, None)) for r in held]
            after = [abs(_signed_pct(r, f.override())) for r in held]
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


def fitted_error(row: Row, by_stack: dict[str, Fit | None]) -> tuple[str, float]:
    """The row's `fit_quantity` and its signed error (%) under its stack's fitted constants (a priori where the stack
    has no fit): for a calibration row its fit residual, for a validation row its held-out error."""
    q = fit_quantity(row)
    assert q is not None and not row.out_of_scope, row.id
    f = by_stack.get(stack_of(row))
    return q, _signed_pct(row, f.override() if f else None)


def annotate_fitted(records: list[dict[str, Any]], rows: list[Row], by_stack: dict[str, Fit | None]) -> None:
    """Add to each in-scope record whose stack has a fit its `fit_stack` and `fitted_error_pct` (its throughput
    quantity's signed error under the stack's calibration fit: a residual for a calibration row, a held-out error for
    a validation row; docs/records.md#validation-records), in place."""
    by_id = {r.id: r for r in rows}
    for rec in records:
        row = by_id[rec["row_id"]]
        stack = stack_of(row)
        if row.out_of_scope or by_stack.get(stack) is None or fit_quantity(row) is None:
            continue
        q, e = fitted_error(row, by_stack)
        rec["fit_stack"], rec["fitted_error_pct"] = stack, {q: e}


def fitted_validation(rows: list[Row], by_stack: dict[str, Fit | None] | None = None) -> dict[str, Any] | None:
    """Every in-scope validation row publishing tokens/s, each under its own stack's fitted constants: the signed
    error per row and the |error| summary (n, median, worst; the same at S ≥ LONG_SEQ). A row whose stack has no fit
    is predicted with the a-priori constants and listed under `unfitted`. Validation rows publishing only MFU or the
    iteration time are scored apart (`other_pct`: id → (quantity, signed error)). None without a tokens/s row.
    `by_stack`: `fits(rows)`, when the caller has it already."""
    by_stack = by_stack if by_stack is not None else fits(rows)
    scored = [r for r in rows if r.subset == "validation" and not r.out_of_scope and fit_quantity(r)]
    if not any(fit_quantity(r) == QUANTITY for r in scored):
        return None
    signed: dict[str, float] = {}
    other: dict[str, tuple[str, float]] = {}
    unfitted = [r.id for r in scored if by_stack.get(stack_of(r)) is None]
    for r in scored:
        q, e = fitted_error(r, by_stack)
        if q == QUANTITY:
            signed[r.id] = e
        else:
            other[r.id] = (q, e)
    errs = [abs(v) for v in signed.values()]
    long = [abs(signed[r.id]) for r in scored if r.id in signed and r.seq_len >= LONG_SEQ]
    return {
        "per_row_pct": signed,
        "other_pct": other,
        "n": len(errs),
        "median": statistics.median(errs),
        "worst": max(errs),
        "n_long": len(long),
        "median_long": statistics.median(long) if long else None,
        "unfitted": unfitted,
        "at_bound": sorted(s for s, f in by_stack.items() if f is not None and f.at_bound),
    }


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
