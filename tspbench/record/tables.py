"""The terminal's end-of-experiment tables: one row per run (summary_table) and, for estimated / modelled
runs, memory by category, predicted throughput and communication per layer (breakdown_table)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from tspbench.config import GB, GIB_TO_GB
from tspbench.parallel import SCHEMES, ParallelConfig
from tspbench.record.schema import STATUSES, current_records


def latest_by_run_id(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per run_id, its current state (a run may be recorded failed, then ok on resume; an ok is
    never superseded by an interruption: tspbench.record.schema.current_records)."""
    return current_records(records)


def summary_table(records: Iterable[dict[str, Any]]) -> str:
    """The end-of-experiment table: one row per run (scheme × seq_len × ...), with tokens/s per device,
    peak memory (GB) and energy per token. Peak is the allocator peak where the device has one (CUDA),
    else the MemTracker total at the rank's peak (marked *)."""
    recs = sorted(
        latest_by_run_id(records),
        key=lambda r: (
            r.get("seq_len") or 0,
            _order(r),
            r.get("degree") or 0,
            r.get("batch") or 0,
            str(r.get("mode")),
            _label(r),
        ),
    )
    head = (
        f"{'layout':<{LABEL_WIDTH}} {'dp':>3} {'S':>7} {'B':>3} {'mode':<7} {'status':<8} "
        f"{'method':<9} {'tok/s/dev':>11} {'step ms':>9} {'peak GB':>10} {'J/token':>9} {'MFU%':>6}"
    )
    lines = [head, "-" * len(head)]
    starred = cpu = offline = False

    def fmt(v, spec):
        return format(v, spec) if isinstance(v, (int, float)) else "-"

    for r in recs:
        m = r.get("metrics") or {}
        peak = m.get("peak_allocated_gib")
        star = ""
        if peak is None and m.get("mem_total_gib") is not None:
            peak, star = m["mem_total_gib"], "*"
            starred = starred or r.get("method", "measured") == "measured"
            if r.get("method") in ("estimated", "modelled"):
                star, offline = "", True
        cpu = cpu or bool(r.get("cpu_note"))
        peak = peak * GIB_TO_GB if isinstance(peak, (int, float)) else peak
        lines.append(
            f"{_label(r):<{LABEL_WIDTH}} {r.get('dp', 1):>3} "
            f"{r.get('seq_len', 0):>7} {r.get('batch', 0):>3} {r.get('mode')!s:<7} {r['status']:<8} "
            f"{r.get('method') or 'measured':<9} {fmt(m.get('tokens_per_s_per_device'), ',.0f'):>11} "
            f"{fmt(m.get('step_time_ms_p50'), '.1f'):>9} "
            f"{fmt(peak, '.3g') + star:>10} {fmt(m.get('energy_j_per_token'), '.3g'):>9} "
            f"{fmt(m.get('mfu_causal_pct'), '.1f'):>6}"
        )
    n_ok = sum(r["status"] == "ok" for r in recs)
    lines.append(
        f"{n_ok}/{len(recs)} runs ok"
        + "".join(
            f", {sum(r['status'] == s for r in recs)} {s}" for s in STATUSES[1:] if any(r["status"] == s for r in recs)
        )
    )
    reasons: dict[tuple[str, str], int] = {}
    for r in recs:
        if r["status"] != "ok":
            key = (r["status"], clean_reason(r.get("reason"))[:150])
            reasons[key] = reasons.get(key, 0) + 1
    for (status, why), n in list(reasons.items())[:6]:
        lines.append(f"  {status} ×{n}: {why}")
    if starred:
        lines.append("* peak GB: MemTracker total at the rank's peak (no allocator peaks on this device)")
    if offline:
        lines.append(
            "estimated: fake tensors running the scheme code; modelled: closed-form formulas. Their peak GB "
            "and tok/s are predictions on the hardware profile, not measurements"
        )
    if cpu:
        lines.append("CPU (gloo): checks the machinery, not GPU performance; J/token and MFU are unavailable on CPU")
    return "\n".join(lines)


GLOO_PATH = re.compile(r"\s*\[?[^\s\[\]]*/(?:gloo|third_party)/[^\s\]]*\]?")


def gb(v: Any) -> Any:
    """GiB -> GB for a number; anything else as is."""
    return v * GIB_TO_GB if isinstance(v, (int, float)) else v


def clean_reason(reason: Any) -> str:
    """A failure reason without gloo's internal source paths ("[/pytorch/third_party/gloo/...pair.cc:534]")."""
    return GLOO_PATH.sub("", str(reason or "")).strip()


LABEL_WIDTH = 44
"""Column width of the layout label ("TP×SP T=2×Σ=4 (allgather, no Megatron-SP)" fits)."""


def _label(r: dict) -> str:
    """The layout's one label (tspbench.parallel), e.g. "TSP D=8", "TP×SP T=2×Σ=4 (ring, no Megatron-SP)"."""
    try:
        return ParallelConfig.from_record(r).label()
    except (KeyError, TypeError, ValueError):
        return f"{r.get('scheme', '?')} d{r.get('degree', '?')}"


def _order(r: dict) -> int:
    return SCHEMES.index(r["scheme"]) if r.get("scheme") in SCHEMES else len(SCHEMES)


def breakdown_table(records: Iterable[dict[str, Any]]) -> str:
    """Estimated / modelled runs: per-device peak GB by category, predicted tok/s per device on the
    hardware profile (modelled rows), and communication GB per layer (forward + backward; a decode step's
    for mode=decode)."""
    cats = ("params", "grads", "optimizer", "activations", "temporaries", "comm_buffers", "kv_cache")
    recs = [r for r in latest_by_run_id(records) if r.get("method") in ("estimated", "modelled")]
    if not recs:
        return ""
    recs.sort(
        key=lambda r: (
            r.get("seq_len") or 0,
            _order(r),
            r.get("tp_degree") or 0,
            _label(r),
            r.get("method"),
        )
    )
    head = (
        f"{'layout':<{LABEL_WIDTH}} {'S':>7} {'method':<9} {'hw':<7} "
        + " ".join(f"{c[:6]:>6}" for c in cats)
        + f" {'total':>7} {'pred tok/s/dev':>14} {'comm GB/layer':>13}"
    )
    lines = [
        "per-device memory (GB) by category, predicted throughput, communication per layer:",
        head,
        "-" * len(head),
    ]
    for r in recs:
        m = r.get("metrics") or {}
        f = lambda v, spec: format(v, spec) if isinstance(v, (int, float)) else "-"  # noqa: E731
        comm = (m.get("comm_bytes_per_layer_fwd") or 0) + (m.get("comm_bytes_per_layer_bwd") or 0)
        tps = m.get("predicted_tokens_per_s_per_device")
        lines.append(
            f"{_label(r):<{LABEL_WIDTH}} {r.get('seq_len', 0):>7} "
            f"{r['method']:<9} {r.get('hardware') or '-'!s:<7} "
            + " ".join(f"{f(gb(m.get(f'mem_{c}_gib')), '6.2f'):>6}" for c in cats)
            + f" {f(gb(m.get('mem_total_gib')), '7.2f'):>7} {f(tps, ',.0f'):>14} "
            + f"{f(comm / GB if comm else None, '.3f'):>13}"
            + ("" if r["status"] == "ok" else f"  {r['status']}")
        )
    return "\n".join(lines)
