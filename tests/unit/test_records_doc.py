"""docs/records.md documents every key a record can carry: the identity part, every metric of a measured,
estimated and modelled record (train, forward and decode), the per-rank lists, the provenance block, and the
fields of a failure. The records are built here by the real builders (the measured one from synthetic per-rank
numbers, the estimated one on fake tensors, the modelled one from the formulas), so a new metric that nobody
documented fails this test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tspbench.measure import memory as memory_mod
from tspbench.measure.energy import EnergyResult
from tspbench.record.measured import Gathered, build_record
from tspbench.record.offline import estimated_record, modelled_record
from tspbench.record.spec import RunSpec
from tspbench.run.supervise import _failure_record

DOC = Path(__file__).resolve().parents[2] / "docs" / "records.md"
TINY = dict(name="tiny", vocab_size=128, dim=64, n_layers=2, n_heads=8, n_kv_heads=8, ffn_hidden=128)


def spec(mode: str = "train", execution: str = "measure", **kw) -> RunSpec:
    base = dict(
        experiment="doc",
        scheme="tsp",
        degree=2,
        tp=0,
        dp=1,
        sp_variant="allgather",
        recompute="none",
        seq_len=64,
        batch=1,
        mode=mode,
        dtype="float32",
        device="cpu",
        execution=execution,
        hardware="h100",
        model=TINY,
    )
    return RunSpec(**{**base, **kw})


def rank(mode: str) -> dict:
    """What tspbench.run.loop gathers from one rank (here made up, the keys are what matter)."""
    mem = {k: 0.1 for k in memory_mod.BREAKDOWN_KEYS}
    mem.update(mem_breakdown_method="MemTracker", mem_breakdown_reason=None)
    serving = {"prefill_ms": 1.0, "ttft_ms": 1.5, "kv_cache_gib": 0.1, "kv_cache_allocated_gib": 0.1}
    serving = serving if mode == "decode" else {}
    return {
        "step_ms": [1.0, 2.0],
        "window_s": 0.01,
        "peaks": memory_mod.device_peaks(torch.device("cpu")),
        "mem": mem,
        "serving": serving,
        "energy": EnergyResult(reason="CPU").__dict__,
        "comm": {"fwd": 1.0, "bwd": 2.0, "ops": 3, "max_buffer_bytes": 4},
        "device_name": "CPU (x86_64)",
    }


def records() -> list[tuple[str, dict]]:
    out = []
    for mode in ("train", "forward", "decode"):
        s = spec(mode)
        out.append(
            (
                f"measured {mode}",
                build_record(
                    s, Gathered([rank(mode)] * 2, 1.0 if mode != "decode" else None, 64, "t0", "t1", "gloo", "torchrun")
                ),
            )
        )
        out.append((f"modelled {mode}", modelled_record(spec(mode, "model"))))
    for mode in ("train", "forward"):
        out.append((f"estimated {mode}", estimated_record(spec(mode, "estimate"))))
    out.append(("failed", _failure_record(spec(), "failed", "rank 1: RuntimeError", Path("x.log"), {"rank": 1})))
    out.append(("oom", _failure_record(spec(), "oom", "rank 0: OutOfMemoryError", Path("x.log"))))
    return out


def documented() -> set[str]:
    """Every `key` written in backticks in the first column of a table in docs/records.md."""
    keys: set[str] = set()
    for line in DOC.read_text().splitlines():
        m = re.match(r"\|\s*(.+?)\s*\|", line)
        if m:
            keys.update(re.findall(r"`([a-z0-9_.]+)`", m.group(1)))
    return keys


def keys_of(rec: dict) -> set[str]:
    out = {
        k
        for k in rec
        if not isinstance(rec[k], dict) or k in ("model_cfg", "attempted", "mem_bytes", "phase_peak_bytes")
    }
    for block in ("metrics", "per_rank", "provenance"):
        out.update(f"{block}.{k}" for k in (rec.get(block) or {}))
    return out


@pytest.fixture(scope="module")
def built() -> list[tuple[str, dict]]:
    return records()


def test_every_key_is_documented(built):
    doc = documented()
    missing = sorted(
        {
            f"{k} ({what})"
            for what, rec in built
            for k in keys_of(rec)
            if k not in doc and k.rpartition(".")[2] not in doc
        }
    )
    assert not missing, "keys records carry that docs/records.md does not document:\n" + "\n".join(missing)


def test_the_check_sees_real_keys(built):
    """Non-vacuity: the builders produced the keys the check walks, and an unknown key would be reported."""
    keys = set().union(*(keys_of(r) for _, r in built))
    assert {
        "metrics.tokens_per_s",
        "metrics.mem_total_gib",
        "metrics.predicted_tokens_per_s",
        "metrics.kv_cache_gib",
        "per_rank.step_time_ms",
        "provenance.git_commit",
        "log_tail",
    } <= keys
    assert "metrics.not_a_metric_xyz" not in documented()
