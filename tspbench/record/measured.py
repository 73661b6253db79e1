"""The measured record: rank 0 reduces every rank's numbers (gathered by tspbench.run.loop) into one record
of the shared schema (docs/records.md): throughput over the slowest rank's window, step-time spread over
every rank's steps, FLOPs and MFU/HFU, allocator peaks (max over ranks), the memory breakdown of the rank
with the largest total, energy summed over ranks, serving metrics, and layer-0 communication."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tspbench.config import GIB
from tspbench.measure import flops as flops_mod
from tspbench.measure import memory as memory_mod
from tspbench.measure import timing
from tspbench.predict.costmodel import Workload
from tspbench.predict.costmodel.flops import flops_per_token, hardware_flops_per_token
from tspbench.record.schema import base_record
from tspbench.record.spec import RunSpec
from tspbench.record.store import provenance

RankNumbers = dict[str, Any]
"""What one rank measured (tspbench.run.loop `after_window`, gathered to rank 0 with all_gather_object): step_ms
(the window's per-step ms), window_s, peaks (memory.device_peaks), mem (memory.breakdown, {} when off), serving
(decode: prefill_ms, ttft_ms, kv_cache_gib, kv_cache_allocated_gib; else {}), energy (EnergyResult's fields), comm
(layer 0's fwd / bwd bytes, ops, max_buffer_bytes), device_name, optimizer_state_bytes (None without an optimizer)
and replicas (replica checksums, {} without an optimizer)."""

PEAK_KEYS = ("peak_allocated_gib", "peak_reserved_gib", "device_used_gib", "num_ooms", "alloc_retries")


@dataclass
class Gathered:
    """Everything rank 0 builds the record from: every rank's numbers and the run's context."""

    ranks: list[RankNumbers]
    """Indexed by global rank."""
    loss: float | None
    """The replica-mean loss of the last measured step; None for decode."""
    tokens_per_step: int
    """Unique tokens per step over the whole world (timing.tokens_per_step)."""
    started: str
    """When the rank group started the run (worker `now()`)."""
    finished: str
    """When the numbers were gathered."""
    backend: str
    """torch.distributed backend (gloo, nccl)."""
    launcher: str
    """What started the ranks (TSPBENCH_LAUNCHER, else torchrun)."""
    alloc_conf: str | None = None
    """The CUDA caching allocator's settings rank 0 ran with (memory.alloc_conf); None: torch's defaults, or CPU."""


def build_record(spec: RunSpec, run: Gathered) -> dict:
    """Rank 0: reduce the per-rank numbers into one record (README.md, "Result records")."""
    ranks, dev0 = run.ranks, run.ranks[0]
    rec = base_record(spec, "ok")
    rec["device_name"] = dev0["device_name"]
    rec["hardware"], rec["hardware_reason"] = device_hardware(spec.device, dev0["device_name"])
    m = timing_metrics(spec, run)
    m.update(flops_metrics(spec, dev0["device_name"], m["tokens_per_s"]))
    m.update(memory_metrics(spec, ranks))
    m.update(replica_metrics(spec, ranks))
    m.update(energy_metrics(spec, run, m["window_s"]))
    if spec.mode == "decode":
        m.update(serving_metrics(spec, ranks, m))
    m.update(
        {
            "comm_bytes_per_layer_fwd": dev0["comm"]["fwd"],
            "comm_bytes_per_layer_bwd": dev0["comm"]["bwd"],
            "comm_ops_per_layer": dev0["comm"]["ops"],
            "loss": run.loss,
            "throughput_note": rec["cpu_note"],
        }
    )
    rec["metrics"] = m
    rec["per_rank"] = per_rank_lists(ranks)
    rec["provenance"] = {
        **provenance(),
        **rec["provenance"],
        "started_at": run.started,
        "finished_at": run.finished,
        "backend": run.backend,
        "launcher": run.launcher,
        "alloc_conf": run.alloc_conf,
    }
    return rec


CPU_HARDWARE_REASON = "CPU run (gloo): no hardware profile describes the host (conf/hardware/cpu.yaml is a nominal one)"


def device_hardware(device: str, device_name: str | None) -> tuple[str | None, str | None]:
    """(the profile naming the device, None) or (None, why none does): the record's `hardware`, so its report panel,
    capacity line and guards are the device's own, never the experiment's modelling profile."""
    if device == "cpu":
        return None, CPU_HARDWARE_REASON
    entry = flops_mod.match_profile(device_name)
    return (entry.profile, None) if entry is not None else (None, flops_mod.no_profile_reason(device_name))


def timing_metrics(spec: RunSpec, run: Gathered) -> dict[str, Any]:
    """Throughput over the slowest rank's window; step-time spread over every rank's every step."""
    m = timing.throughput(run.tokens_per_step, spec.measured_steps, [r["window_s"] for r in run.ranks], spec.world_size)
    m.update(timing.step_stats([r["step_ms"] for r in run.ranks]))
    return m


def flops_metrics(spec: RunSpec, device_name: str, tokens_per_s: float | None) -> dict[str, Any]:
    """Model FLOPs per token (both causal conventions), hardware FLOPs, and MFU / HFU against the device's peak in
    the run's dtype (the hardware profile that names the device; None with the reason otherwise)."""
    cfg, world = spec.model_config(), spec.world_size
    peak, peak_src = flops_mod.peak_flops(device_name, spec.device, dtype=spec.dtype)
    f_causal = flops_per_token(cfg, spec.seq_len, mode=spec.mode, causal_halved=True)
    f_full = flops_per_token(cfg, spec.seq_len, mode=spec.mode, causal_halved=False)
    f_hw = hardware_flops_per_token(spec.parallel(), Workload(cfg, spec.seq_len, mode=spec.mode))
    return {
        "flops_per_token_causal": f_causal,
        "flops_per_token_noncausal": f_full,
        "hardware_flops_per_token": f_hw,
        "peak_flops": peak,
        "peak_flops_source": peak_src if peak is not None else None,
        "mfu_reason": None if peak is not None else peak_src,
        "mfu_causal_pct": flops_mod.mfu_pct(f_causal, tokens_per_s, peak, world),
        "mfu_noncausal_pct": flops_mod.mfu_pct(f_full, tokens_per_s, peak, world),
        "hfu_pct": flops_mod.mfu_pct(f_hw, tokens_per_s, peak, world),
    }


def memory_metrics(spec: RunSpec, ranks: list[RankNumbers]) -> dict[str, Any]:
    """Allocator peaks = max over ranks; the breakdown = the rank with the largest total; the largest collective
    buffer; the optimizer's state (only when every rank counted it)."""
    m: dict[str, Any] = {}
    for k in PEAK_KEYS:
        vals = [r["peaks"].get(k) for r in ranks if r["peaks"].get(k) is not None]
        m[k] = max(vals) if vals else None
    m["memory_reason"] = ranks[0]["peaks"].get("memory_reason")
    for k in memory_mod.BREAKDOWN_KEYS:
        m[k] = None
    m["mem_breakdown_method"] = None if spec.memory_breakdown else "off (memory_breakdown=false)"
    with_mem = [r for r in ranks if r["mem"]]
    if with_mem:
        top = max(with_mem, key=lambda r: r["mem"].get("mem_total_gib") or 0)
        m.update(top["mem"])
    m["mem_comm_buffers_gib"] = max(r["comm"]["max_buffer_bytes"] for r in ranks) / GIB
    opt_bytes = [b for r in ranks if (b := r.get("optimizer_state_bytes")) is not None]
    m["optimizer_state_gib"] = max(opt_bytes) / GIB if len(opt_bytes) == len(ranks) else None
    return m


def replica_metrics(spec: RunSpec, ranks: list[RankNumbers]) -> dict[str, Any]:
    """train: do the replicated parameter copies still agree (replicas_in_sync)? Nothing in other modes."""
    if spec.mode != "train":
        return {}
    in_sync, mismatch = replicas_in_sync([r.get("replicas") or {} for r in ranks])
    return {"replicas_in_sync": in_sync, "replica_mismatch": mismatch}


def energy_metrics(spec: RunSpec, run: Gathered, window_s: float) -> dict[str, Any]:
    """Energy summed over ranks; None (with the reason) unless every rank has a value."""
    ej = [r["energy"]["energy_j"] for r in run.ranks]
    steps = spec.measured_steps
    m: dict[str, Any]
    if all(e is not None for e in ej):
        total = sum(ej)
        m = {
            "energy_j": total,
            "energy_j_per_step": total / steps,
            "energy_j_per_token": total / (run.tokens_per_step * steps),
            "avg_power_w": total / window_s if window_s else None,
        }
    else:
        m = {"energy_j": None, "energy_j_per_step": None, "energy_j_per_token": None, "avg_power_w": None}
    m["energy_method"] = run.ranks[0]["energy"]["method"]
    m["energy_reason"] = run.ranks[0]["energy"]["reason"]
    return m


def serving_metrics(spec: RunSpec, ranks: list[RankNumbers], m: dict[str, Any]) -> dict[str, Any]:
    """decode: the prompt's prefill and time to first token (slowest rank), the decode-step percentiles, and the
    KV cache each rank ends with. `m` holds the timing and memory metrics so far; the returned updates add the
    cache to the breakdown total, since it predates the tracked step."""
    out: dict[str, Any] = {}
    out["prefill_ms"] = max(r["serving"]["prefill_ms"] for r in ranks)
    out["prefill_tokens_per_s"] = spec.dp * spec.batch * spec.seq_len / (out["prefill_ms"] / 1e3)
    out["kv_cache_gib"] = max(r["serving"]["kv_cache_gib"] for r in ranks)
    out["ttft_ms"] = max(r["serving"]["ttft_ms"] for r in ranks)
    out["decode_ms_per_token_p50"] = m.get("step_time_ms_p50")
    out["decode_ms_per_token_p99"] = percentile([t for r in ranks for t in r["step_ms"]], 99)
    out["kv_cache_allocated_gib"] = max(r["serving"]["kv_cache_allocated_gib"] for r in ranks)
    if m.get("mem_total_gib") is not None:  # the cache predates the tracked step: add it as a category
        out["mem_kv_cache_gib"] = out["kv_cache_allocated_gib"]
        out["mem_total_gib"] = m["mem_total_gib"] + out["kv_cache_allocated_gib"]
    return out


def per_rank_lists(ranks: list[RankNumbers]) -> dict[str, list]:
    """The `per_rank` block: lists indexed by global rank."""
    return {
        "step_time_ms": [r["step_ms"] for r in ranks],
        "window_s": [r["window_s"] for r in ranks],
        "peak_allocated_gib": [r["peaks"].get("peak_allocated_gib") for r in ranks],
        "mem_total_gib": [r["mem"].get("mem_total_gib") for r in ranks],
        "energy_j": [r["energy"]["energy_j"] for r in ranks],
        "power_timeline": [r["energy"]["timeline"] for r in ranks],
        "comm_bytes_per_layer_fwd": [r["comm"]["fwd"] for r in ranks],
        "comm_bytes_per_layer_bwd": [r["comm"]["bwd"] for r in ranks],
    }


def replicas_in_sync(per_rank: list[dict[str, tuple[int, float, float]]]) -> tuple[bool, list[str]]:
    """Do all ranks that hold the same slice of a parameter hold identical copies (tspbench.run.loop
    `replica_checksums`)? Returns (in sync, the parameters that are not, with their slice)."""
    seen: dict[tuple[str, int], tuple[float, float]] = {}
    bad: list[str] = []
    for sums in per_rank:
        for name, (slice_index, total, squares) in sums.items():
            first = seen.setdefault((name, slice_index), (total, squares))
            if first != (total, squares) and f"{name}[{slice_index}]" not in bad:
                bad.append(f"{name}[{slice_index}]")
    return not bad, bad[:10]


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (no interpolation: a value that was measured); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    return xs[max(0, math.ceil(q / 100 * len(xs)) - 1)]
