"""The record schema's identity part, shared by every method (measured, estimated, modelled): one JSON object
per run. Field meanings: docs/records.md."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from tspbench.parallel import layout_fields
from tspbench.record.spec import RunSpec

STATUSES = ("ok", "oom", "failed", "timeout", "invalid", "implausible")  # implausible: record/guards.py
CPU_NOTE = "CPU (gloo): checks the machinery, not GPU performance"
UNNAMED_DEVICE = (
    "no rank named its device: a measured record's hardware is the profile whose device_names match the device "
    "(tspbench.measure.flops.match_profile), never the experiment's modelling profile"
)
"""`hardware_reason` of a measured record written before any rank named its device (refused, failed, out of memory)."""


def supersedes(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Does `new` (written later) replace `old` as the state of the same run? Yes, except that an `ok` is
    never superseded by an interruption of the same run (Ctrl-C right after the result was written)."""
    interrupted = new.get("status") != "ok" and str(new.get("reason") or "").startswith("interrupted")
    return not (old.get("status") == "ok" and interrupted)


def current_records(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per run_id, its current state (`supersedes`), in the order each run was last recorded;
    records without a run_id are kept as they are."""
    last: dict[Any, dict[str, Any]] = {}
    loose: list[tuple[int, dict[str, Any]]] = []
    order: dict[Any, int] = {}
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            continue
        rid = r.get("run_id")
        if rid is None:
            loose.append((i, r))
        elif rid not in last or supersedes(r, last[rid]):
            last[rid], order[rid] = r, i
    return [r for _, r in sorted([*((order[k], v) for k, v in last.items()), *loose], key=lambda x: x[0])]


def base_record(spec: RunSpec, status: str, reason: str | None = None) -> dict[str, Any]:
    """The identity part of a result record (docs/records.md); the worker
    adds metrics, per-rank lists and provenance."""
    return {
        "run_id": spec.run_id,
        "experiment": spec.experiment,
        "method": spec.method,
        "status": status,
        "reason": reason,
        **layout_fields(spec),  # scheme, degree, tp/sp degrees, dp, recompute and every option (None: not taken)
        "world_size": spec.world_size,
        "nodes": spec.nodes,
        "model": spec.model.get("name"),
        "model_cfg": dict(spec.model),
        "seq_len": spec.seq_len,
        "batch": spec.batch,
        "mode": spec.mode,
        "dtype": spec.dtype,
        "device": spec.device,
        "device_name": None,
        # measured: the device's own profile, set from the device name (record/measured.py); never spec.hardware,
        # the experiment's profile for its predictions
        "hardware": None if spec.method == "measured" else spec.hardware,
        "hardware_reason": UNNAMED_DEVICE if spec.method == "measured" else None,
        "cpu_note": CPU_NOTE if spec.device == "cpu" and spec.method == "measured" else None,
        "fault": spec.fault["kind"] if spec.fault["kind"] != "none" else None,
        "metrics": {},
        "per_rank": {},
        "provenance": {
            "seed": spec.seed,
            "warmup_steps": spec.warmup_steps,
            "measured_steps": spec.measured_steps,
            "config": json.loads(spec.to_json()),
        },
    }
