"""Plausibility guards (tspbench/record/guards.py): a plausible modelled record passes, and a record breaking
each guard (MFU > 100 %, tokens/s above the peak-FLOPs bound, an ok run above device capacity, parameter bytes
off the scheme's promise, layer communication off the formula) is written `implausible` with the reason."""

from __future__ import annotations

import copy
import json

import pytest

from tspbench.config import GIB, ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel import Workload, comm_per_layer, params_per_device
from tspbench.record import guards
from tspbench.record.store import append_record

TINY = dict(name="tiny", vocab_size=128, dim=64, n_layers=2, n_heads=8, n_kv_heads=8, ffn_hidden=128)


def good() -> dict:
    """A measured tsp record whose numbers obey every guard (H100 profile, bf16)."""
    model, par = ModelConfig(**TINY), ParallelConfig(scheme="tsp", degree=2)
    return {
        "run_id": "x",
        "method": "measured",
        "status": "ok",
        "reason": None,
        "scheme": "tsp",
        "degree": 2,
        "tp_degree": 2,
        "dp": 1,
        "sp_variant": None,
        "recompute": "none",
        "vocab": "auto",
        "model_cfg": dict(TINY),
        "seq_len": 128,
        "batch": 1,
        "mode": "train",
        "dtype": "bfloat16",
        "device": "cuda",
        "hardware": "h100",
        "metrics": {
            "mfu_causal_pct": 40.0,
            "tokens_per_s_per_device": 1e5,
            "peak_allocated_gib": 1.0,
            "mem_params_gib": params_per_device(model, par) * 2 / GIB,
            "comm_bytes_per_layer_fwd": comm_per_layer(par, Workload(model, 128, 1, mode="train"))["fwd_total"] * 2,
        },
    }


def test_plausible_record_passes():
    assert guards.check(good()) == []
    assert guards.guard(good()) == good()


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("mfu_causal_pct", 230.0, "> 100%"),  # the "2x an H200's peak" kind of result
        ("tokens_per_s_per_device", 1e13, "> peak"),
        ("peak_allocated_gib", 120.0, "device capacity"),
        ("mem_params_gib", 1.0, "promises"),  # e.g. a silently disabled sharding axis: whole model per rank
        ("comm_bytes_per_layer_fwd", 1.0, "formula"),
    ],
)
def test_each_guard_marks_implausible(key, value, needle, tmp_path):
    rec = good()
    rec["metrics"][key] = value
    out = guards.guard(rec)
    assert out["status"] == "implausible" and needle in out["reason"] and key in out["reason"]
    assert out["status_before_guards"] == "ok"
    path = tmp_path / "r.jsonl"
    append_record(path, copy.deepcopy(rec))  # the store applies the guards before writing
    assert json.loads(path.read_text())["status"] == "implausible"


def test_capacity_applies_to_ok_runs_only():
    rec = good()
    rec["metrics"]["peak_allocated_gib"] = 120.0
    rec["status"] = "oom"
    assert not any("capacity" in r for r in guards.check(rec))


def test_failed_records_are_left_alone():
    rec = good()
    rec["status"], rec["metrics"]["mfu_causal_pct"] = "failed", 500.0
    assert guards.guard(rec)["status"] == "failed"
