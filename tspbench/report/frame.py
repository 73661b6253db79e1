"""Run records -> one flat pandas frame for the report: de-duplicated by run_id (last wins), metrics
un-nested, scheme / hardware labels, the peak-memory number with its basis; and the number formats the
report uses. Every derived number says what it was derived from. Records store memory in GiB; everything the
report prints is in GB (tspbench.config.GIB_TO_GB)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from tspbench.config import GIB, GIB_TO_GB
from tspbench.measure.flops import match_profile, profile_entry
from tspbench.parallel import SCHEMES, ParallelConfig
from tspbench.record.schema import supersedes
from tspbench.record.store import read_records

WITHIN_PCT = 10.0
NOT_REPRODUCED = "not reproduced by these results"

METHOD_ORDER = ("measured", "estimated", "modelled")
NUMERIC = (
    "seq_len",
    "degree",
    "tp_degree",
    "sp_degree",
    "dp",
    "world_size",
    "nodes",
    "batch",
    "tokens_per_s",
    "tokens_per_s_per_device",
    "predicted_tokens_per_s",
    "mem_total_gib",
    "peak_allocated_gib",
    "peak_reserved_gib",
    "energy_j_per_token",
    "compute_ms",
    "exposed_comm_ms",
    "comm_bytes_per_layer_fwd",
    "comm_bytes_per_layer_bwd",
    "mfu_causal_pct",
    "mfu_noncausal_pct",
    "device_capacity_gib",
)
MEM_PARTS = (
    ("mem_params_gib", "params"),
    ("mem_grads_gib", "grads"),
    ("mem_optimizer_gib", "optimizer"),
    ("mem_activations_gib", "activations"),
    ("mem_temporaries_gib", "temporaries"),
    ("mem_comm_buffers_gib", "comm buffers"),
    ("mem_kv_cache_gib", "KV cache"),
)


# ---------------------------------------------------------------- loading -------------------------


def num(x: Any) -> float | None:
    """A finite float, or None (records use null for "not available"; NaN/strings count as missing)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def dedupe(records: Iterable[dict]) -> list[dict]:
    """Keep the last record per run_id (a re-run or a later file supersedes, except that an interruption never
    supersedes an ok: tspbench.record.schema.supersedes); keep id-less records."""
    by_id: dict[Any, int] = {}
    out: list[dict] = []
    for r in records:
        if not isinstance(r, dict):
            continue
        rid = r.get("run_id")
        if rid is not None and rid in by_id and not supersedes(r, out[by_id[rid]]):
            continue  # an ok is never superseded by an interruption of the same run
        if rid is not None and rid in by_id:
            out[by_id[rid]] = None  # type: ignore[call-overload]  # drop the earlier one, keep order
        if rid is not None:
            by_id[rid] = len(out)
        out.append(r)
    return [r for r in out if r is not None]


def scheme_label(row: dict) -> str:
    """The layout's one label (tspbench.parallel: "TSP D=8", "TP×SP T=2×Σ=4 (ring, no Megatron-SP)"); a record
    naming no known layout keeps its scheme name."""
    try:
        return ParallelConfig.from_record(row).label()
    except (KeyError, TypeError, ValueError):
        return str(row.get("scheme") or "?")


def layout_key(row: dict) -> tuple:
    """The record's full layout (every field of ParallelConfig.key()), to group and compare records by."""
    try:
        return ParallelConfig.from_record(row).key()
    except (KeyError, TypeError, ValueError):
        return tuple(str(row.get(k)) for k in ("scheme", "degree", "tp_degree", "sp_degree", "sp_variant", "msp"))


def hardware_label(row: dict) -> str:
    """Where a number comes from: the device for measured runs, the hardware profile otherwise."""
    if row.get("method") in ("estimated", "modelled"):
        return str(row.get("hardware") or "unknown hardware")
    if row.get("device") == "cpu":
        return "CPU (gloo)"
    return str(row.get("device_name") or row.get("hardware") or row.get("device") or "unknown device")


def capacity_gib(row: dict) -> float | None:
    """The device memory of the capacity line, GiB: the record's device_capacity_gib (estimated / modelled), else
    the `mem_bytes` of the record's own hardware profile (a measured record's is the profile naming its device)."""
    if num(row.get("device_capacity_gib")):
        return num(row.get("device_capacity_gib"))
    entry = profile_entry(str(row["hardware"])) if row.get("hardware") else None
    return entry.mem_bytes / GIB if entry is not None and entry.mem_bytes else None


def peak_memory(row: dict) -> tuple[float | None, str]:
    """Peak memory per device in GiB and what it is. Measured runs: reserved (what the device must
    hold), else allocated, else the MemTracker total (CPU has no allocator peaks); estimated and
    modelled runs: the predicted peak mem_total_gib."""
    order = (
        ("peak_reserved_gib", "peak reserved"),
        ("peak_allocated_gib", "peak allocated"),
        ("mem_total_gib", "tracked total"),
        ("device_used_gib", "device used"),
    )
    if row.get("method") in ("estimated", "modelled"):
        order = (("mem_total_gib", "predicted peak"), order[0], order[1], order[3])
    for key, what in order:
        if num(row.get(key)) is not None:
            return num(row[key]), what
    return None, ""


def flatten(rec: dict) -> dict:
    """One flat row: top-level scalars, metrics un-nested, model_cfg.* -> cfg_*, per_rank.* ->
    rank_*, provenance kept whole; then the derived fields every table and figure uses."""

    def sub(key: str) -> dict:  # a nested block, or {} when missing/null/malformed
        value = rec.get(key)
        return value if isinstance(value, dict) else {}

    row = {k: v for k, v in rec.items() if not isinstance(v, dict)}
    for k, v in sub("metrics").items():
        row.setdefault(k, v)  # a metric never overrides a top-level key of the same name
    row.update({f"cfg_{k}": v for k, v in sub("model_cfg").items()})
    row.update({f"rank_{k}": v for k, v in sub("per_rank").items()})
    row["provenance"] = sub("provenance")
    if row.get("method") == "measured" and "hardware_reason" not in rec and row.get("device") != "cpu":
        # written before a measured record named its device's profile (it carried the experiment's modelling one):
        # the same match record/measured.py makes now
        entry = match_profile(row.get("device_name"))
        row["hardware"] = entry.profile if entry is not None else None
    row["status"] = row.get("status") or "unknown"
    row["method"] = row.get("method") or "unknown"
    row["label"] = scheme_label(row)
    row["hw"] = hardware_label(row)
    row["is_cpu"] = row["hw"] == "CPU (gloo)"
    # Panels group by model, hardware *profile* and mode, so a measured H100 run and a modelled "h100"
    # prediction share one panel even though their labels differ, while a training step, a forward and a
    # decode step (different work per token) never share a line.
    where = row["hw"] if row["is_cpu"] else (row.get("hardware") or row["hw"])
    row["ctx"] = f"{row.get('model') or 'model?'} · {where} · {row.get('mode') or 'mode?'}"
    ws = num(row.get("world_size")) or num(row.get("degree"))
    tok = num(row.get("tokens_per_s"))
    row["tok_basis"] = "tokens_per_s" if tok is not None else ""
    if tok is None and num(row.get("predicted_tokens_per_s")) is not None:
        tok, row["tok_basis"] = num(row["predicted_tokens_per_s"]), "predicted_tokens_per_s"
    row["tok"] = tok
    row["tok_dev"] = num(row.get("tokens_per_s_per_device"))
    if row["tok_dev"] is None and tok is not None and ws:
        row["tok_dev"] = tok / ws
    # Step time over ranks: the record's summary, else computed from the per-rank list.
    ranks = row.get("rank_step_time_ms")
    ranks = [v for v in map(num, ranks if isinstance(ranks, list) else []) if v is not None]
    for key, metric, fn in (
        ("step_min", "step_time_ms_min", min),
        ("step_p50", "step_time_ms_p50", statistics.median),
        ("step_max", "step_time_ms_max", max),
    ):
        v = num(row.get(metric))
        row[key] = v if v is not None else (fn(ranks) if ranks else None)
    row["mem_gib"], row["mem_basis"] = peak_memory(row)
    row["capacity_gib"] = capacity_gib(row)
    return row


def records(df: pd.DataFrame) -> list[dict]:
    """DataFrame rows as dicts with pandas' NaN turned back into None (the records' "missing")."""
    if df.empty:
        return []
    return [
        {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
        for r in df.to_dict("records")
    ]


def load_frame(paths: Iterable[str | Path]) -> tuple[pd.DataFrame, int]:
    """`frame_of` the run records of JSONL files/directories (the report reads its inputs once, with
    tspbench.record.store.read_all, and calls `frame_of` itself)."""
    return frame_of(read_records(paths))


def frame_of(raw: list[dict]) -> tuple[pd.DataFrame, int]:
    """(one row per de-duplicated run record, number of raw records given)."""
    rows = [flatten(r) for r in dedupe(raw)]
    df = pd.DataFrame(rows)
    for col in (
        "run_id",
        "scheme",
        "seq_len",
        "degree",
        "tp_degree",
        "sp_degree",
        "world_size",
        "batch",
        "mode",
        "model",
        "reason",
        "device",
        "device_name",
        "hardware",
    ):
        if col not in df:
            df[col] = None
    # Numbers written as strings (or garbage) by another tool become numbers (or NaN) here, once.
    for col in NUMERIC:
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    if not df.empty:
        # Sort on clean keys: records from other runs may carry strings where numbers are expected.
        keys = pd.DataFrame(
            {
                "scheme": df["scheme"].map({s: i for i, s in enumerate(SCHEMES)}).fillna(99),
                **{c: pd.to_numeric(df[c], errors="coerce") for c in ("degree", "tp_degree")},
                **{c: df[c].astype(str) for c in ("model", "ctx", "method")},
                "seq_len": pd.to_numeric(df["seq_len"], errors="coerce"),
            }
        )
        order = keys.sort_values(list(keys.columns), kind="stable", na_position="last").index
        df = df.loc[order].reset_index(drop=True)
    return df, len(raw)


def fmt(x: Any, digits: int = 2) -> str:
    """Compact number: "—" when missing, SI suffix from 10k up (173M, 12.3k), else `digits` decimals."""
    v = num(x)
    if v is None:
        return "—"
    for div, suf in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= max(div, 1e4):
            return f"{v / div:.3g}{suf}"
    return f"{v:.{digits}f}" if abs(v) < 100 else f"{v:.0f}"


def gb(x: Any) -> float | None:
    """GiB (how records store memory) -> GB (how the paper and this report state it), None when missing."""
    v = num(x)
    return None if v is None else v * GIB_TO_GB


def fmt_seq(x: Any) -> str:
    v = num(x)
    if v is None:
        return "—"
    return f"{int(v) // 1024}K" if v >= 1024 and int(v) % 1024 == 0 else str(int(v))
