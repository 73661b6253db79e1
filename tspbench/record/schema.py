"""The record schema's identity part, shared by every method (measured, estimated, modelled): one JSON object
per run. Field meanings: docs/records.md."""

from __future__ import annotations

import json
from typing import Any

from tspbench.record.spec import RunSpec

STATUSES = ("ok", "oom", "failed", "timeout", "invalid", "implausible")  # implausible: record/guards.py
METHODS = ("measured", "estimated", "modelled")
CPU_NOTE = "CPU (gloo): checks the machinery, not GPU performance"


def base_record(spec: RunSpec, status: str, reason: str | None = None) -> dict[str, Any]:
    """The identity part of a result record (docs/records.md); the worker
    adds metrics, per-rank lists and provenance."""
    par = spec.parallel()
    tp_degree: int | None
    sp_degree: int | None
    try:
        tp_degree, sp_degree = par.tp_degree, par.sp_degree
    except Exception:  # noqa: BLE001 - an invalid layout still gets a record
        tp_degree = sp_degree = None
    return {
        "run_id": spec.run_id,
        "experiment": spec.experiment,
        "method": spec.method,
        "status": status,
        "reason": reason,
        "scheme": spec.scheme,
        "sp_variant": spec.sp_variant if spec.scheme in ("sp", "tp_sp") else None,
        "degree": spec.degree,
        "tp_degree": tp_degree,
        "sp_degree": sp_degree,
        "dp": spec.dp,
        "world_size": spec.world_size,
        "nodes": spec.nodes,
        "model": spec.model.get("name"),
        "model_cfg": dict(spec.model),
        "seq_len": spec.seq_len,
        "batch": spec.batch,
        "mode": spec.mode,
        "dtype": spec.dtype,
        "recompute": spec.recompute,
        "vocab": spec.vocab,
        "device": spec.device,
        "device_name": None,
        "hardware": spec.hardware,
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
