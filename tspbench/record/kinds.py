"""The kinds of record this suite writes, and the plausibility guard each passes before it is written
(docs/records.md#record-kinds-writers-and-guards).

    run          one JSON object a line in results.jsonl (no `kind` key): record/guards.py (MFU ≤ 100 %, the FLOPs
                 bound, device capacity, parameter bytes, communication bytes)
    plan         `kind: plan`, tspbench.predict.planner.plan_records: every number finite and ≥ 0, memory > 0,
                 tokens/s > 0, a scheme tspbench.parallel knows
    validation   `kind: validation`, tspbench.predict.published.record: every number finite, `subset` calibration or
                 validation
    verdict      `kind: verdict`, tspbench.predict.verdict.Comparison.record: every number finite, ratios > 0 with
                 low ≤ central ≤ high, `verdict` one of the three answers
    fit          `kind: fit`, tspbench.predict.maxfit (what fits): every number finite, lengths non-negative
                 multiples of their grid step, memory positive (fitrecords.check_fit)
    crossover    `kind: crossover`, the same module (the TSP ≤ TP communication crossover): the same checks
    peer_estimate  `kind: peer_estimate`, tspbench.peers.estimators.peer_records: every number finite
    calibration  one JSON object per file (conf/hardware/<name>.calibration.json, tspbench.predict.gpu_time): the
                 GEMM and attention efficiencies in (0, 1] of the bf16 peak

A record that fails a check is written, never dropped and never silently as fine: `guard_kind` marks it as
record/guards.py marks a run record, `status: implausible`, the status it had in `status_before_guards` (`ok` when
it had none) and the one-line reasons, joined by "; ", in `reason`. A plausible plan or calibration record gets
`status: ok`; a plausible run or validation record keeps its own status.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from tspbench.parallel import SCHEMES
from tspbench.predict.costmodel.hardware import CALIBRATION_KEYS
from tspbench.predict.fitrecords import check_fit as check_fit_lengths
from tspbench.predict.verdict import VERDICTS
from tspbench.record.guards import guard as guard_run
from tspbench.record.schema import STATUSES

KINDS = ("run", "plan", "validation", "calibration", "verdict", "fit", "crossover", "peer_estimate")
KEYED = ("plan", "validation", "verdict", "fit", "crossover", "peer_estimate")
"""The kinds whose records carry their `kind` key (run and calibration records carry none)."""
SUBSETS = ("calibration", "validation")
PLAN_POSITIVE = ("mem_bytes", "tokens_per_s_cluster", "tokens_per_s_per_gpu")


def _numbers(value: Any, where: str = "") -> Iterator[tuple[str, float]]:
    """(dotted key, number) of every int or float in a record, nested dicts and lists included (bools are not
    numbers here)."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield where, float(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _numbers(v, f"{where}[{i}]")


def _not_finite(rec: dict[str, Any]) -> list[str]:
    return [f"{k}={v} is not finite" for k, v in _numbers(rec) if not math.isfinite(v)]


def check_plan(rec: dict[str, Any]) -> list[str]:
    """Reasons a plan record is implausible (empty: plausible)."""
    out = _not_finite(rec)
    out += [f"{k}={v:g} < 0" for k, v in _numbers(rec) if math.isfinite(v) and v < 0]
    for k in PLAN_POSITIVE:
        v = rec.get(k)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
            out.append(f"{k}={v!r} must be > 0")
    if rec.get("scheme") not in SCHEMES:
        out.append(f"scheme={rec.get('scheme')!r} is not one of {', '.join(SCHEMES)}")
    return out


def check_validation(rec: dict[str, Any]) -> list[str]:
    """Reasons a validation record is implausible (empty: plausible)."""
    out = _not_finite(rec)
    if rec.get("subset") not in SUBSETS:
        out.append(f"subset={rec.get('subset')!r} is not one of {', '.join(SUBSETS)}")
    return out


def check_calibration(rec: dict[str, Any]) -> list[str]:
    """Reasons a calibration file is implausible (empty: plausible): each efficiency a number in (0, 1]."""
    eff = rec.get("efficiency")
    eff = eff if isinstance(eff, dict) else {}
    out = []
    for k in CALIBRATION_KEYS:
        v = eff.get(k)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 < v <= 1
        if not ok:
            out.append(f"efficiency.{k}={v!r} is not in (0, 1] of the bf16 peak")
    return out


def check_verdict(rec: dict[str, Any]) -> list[str]:
    """Reasons a verdict record is implausible (empty: plausible): finite ratios > 0 with low ≤ central ≤ high, and
    one of the three answers."""
    out = _not_finite(rec)
    lo, mid, hi = (rec.get(k) for k in ("ratio_low", "ratio_central", "ratio_high"))
    nums = [v for v in (lo, mid, hi) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(nums) != 3 or not all(v > 0 for v in nums):
        out.append(f"ratio_low, ratio_central, ratio_high = {lo!r}, {mid!r}, {hi!r} must be numbers > 0")
    elif not lo <= mid <= hi:  # type: ignore[operator]
        out.append(f"ratio_low {lo:g} ≤ ratio_central {mid:g} ≤ ratio_high {hi:g} does not hold")
    if rec.get("verdict") not in VERDICTS:
        out.append(f"verdict={rec.get('verdict')!r} is not one of {', '.join(VERDICTS)}")
    return out


def check_fit(rec: dict[str, Any]) -> list[str]:
    """Reasons a fit or crossover record is implausible: every number finite, and tspbench.predict.fitrecords.check_fit
    (lengths non-negative multiples of their grid step, memory positive, the peak at the longest length within the
    device)."""
    return _not_finite(rec) + check_fit_lengths(rec)


def check_peer_estimate(rec: dict[str, Any]) -> list[str]:
    """Reasons a peer-estimate record is implausible: every number finite (a peer's missing value is null, with the
    reason in its note)."""
    return _not_finite(rec)


CHECKS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "plan": check_plan,
    "validation": check_validation,
    "calibration": check_calibration,
    "verdict": check_verdict,
    "fit": check_fit,
    "crossover": check_fit,
    "peer_estimate": check_peer_estimate,
}


def mark(rec: dict[str, Any], reasons: list[str]) -> dict[str, Any]:
    """The record marked implausible with `reasons` (a copy), or `rec` with `status: ok` added when it has none."""
    if not reasons:
        return rec if "status" in rec else {**rec, "status": "ok"}
    return {
        **rec,
        "status_before_guards": rec.get("status", "ok"),
        "status": "implausible",
        "reason": "; ".join(reasons),
    }


def guard_kind(rec: dict[str, Any], kind: str) -> dict[str, Any]:
    """`rec` as it is written for its kind: checked, and marked when a check fails. A record whose `kind` key
    says another kind is a programming error (ValueError), not an implausible record."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; allowed: {', '.join(KINDS)}")
    if not isinstance(rec, dict):
        raise ValueError(f"a {kind} record must be a JSON object, got {type(rec).__name__}")
    own = rec.get("kind")
    # run and calibration records carry no `kind`
    expected = kind if kind in KEYED else None
    if own != expected:
        raise ValueError(f"a record of kind {own!r} passed as kind {kind!r}")
    if kind == "run":
        out = guard_run(rec)
        if out.get("status") not in STATUSES:
            raise ValueError(f"run record status={out.get('status')!r}; allowed: {', '.join(STATUSES)}")
        return out
    return mark(rec, CHECKS[kind](rec))
