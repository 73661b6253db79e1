"""The measured record: rank 0 reduces every rank's numbers (gathered by tspbench.run.worker) into one record
of the shared schema (docs/records.md): throughput over the slowest rank's window, step-time spread over
every rank's steps, FLOPs and MFU/HFU, allocator peaks (max over ranks), the memory breakdown of the rank
with the largest total, energy summed over ranks, serving metrics, and layer-0 communication."""

from __future__ import annotations

import math

from tspbench.measure import flops as flops_mod
from tspbench.measure import memory as memory_mod
from tspbench.measure import timing
from tspbench.predict.costmodel import Workload
from tspbench.predict.costmodel.flops import flops_per_token, hardware_flops_per_token
from tspbench.record.schema import base_record
from tspbench.record.spec import RunSpec
from tspbench.record.store import provenance


def build_record(
    spec: RunSpec,
    ranks: list[dict],
    loss: float | None,
    n_tokens: int,
    started: str,
    finished: str,
    backend: str,
    launcher: str,
) -> dict:
    """Rank 0: reduce the per-rank numbers into one record (README.md, "Result records")."""
    cfg, world = spec.model_config(), spec.world_size
    dev0 = ranks[0]
    rec = base_record(spec, "ok")
    rec["device_name"] = dev0["device_name"]
    m: dict = {}
    m.update(timing.throughput(n_tokens, spec.measured_steps, [r["window_s"] for r in ranks], world))
    m.update(timing.step_stats([r["step_ms"] for r in ranks]))

    # FLOPs and MFU
    peak, peak_src = flops_mod.peak_flops(dev0["device_name"], spec.device)
    f_causal = flops_per_token(cfg, spec.seq_len, mode=spec.mode, causal_halved=True)
    f_full = flops_per_token(cfg, spec.seq_len, mode=spec.mode, causal_halved=False)
    f_hw = hardware_flops_per_token(spec.parallel(), Workload(cfg, spec.seq_len, mode=spec.mode))
    tps = m["tokens_per_s"]
    m.update(
        {
            "flops_per_token_causal": f_causal,
            "flops_per_token_noncausal": f_full,
            "hardware_flops_per_token": f_hw,
            "peak_flops": peak,
            "peak_flops_source": peak_src if peak is not None else None,
            "mfu_reason": None if peak is not None else peak_src,
            "mfu_causal_pct": flops_mod.mfu_pct(f_causal, tps, peak, world),
            "mfu_noncausal_pct": flops_mod.mfu_pct(f_full, tps, peak, world),
            "hfu_pct": flops_mod.mfu_pct(f_hw, tps, peak, world),
        }
    )

    # Memory: allocator peaks = max over ranks; breakdown = the rank with the largest total.
    def max_over(key, src="peaks"):
        vals = [r[src].get(key) for r in ranks if r[src].get(key) is not None]
        return max(vals) if vals else None

    for k in ("peak_allocated_gib", "peak_reserved_gib", "device_used_gib", "num_ooms", "alloc_retries"):
        m[k] = max_over(k)
    m["memory_reason"] = dev0["peaks"].get("memory_reason")
    for k in memory_mod.BREAKDOWN_KEYS:
        m[k] = None
    m["mem_breakdown_method"] = None if spec.memory_breakdown else "off (memory_breakdown=false)"
    with_mem = [r for r in ranks if r["mem"]]
    if with_mem:
        top = max(with_mem, key=lambda r: r["mem"].get("mem_total_gib") or 0)
        m.update(top["mem"])
    m["mem_comm_buffers_gib"] = max(r["comm"]["max_buffer_bytes"] for r in ranks) / memory_mod.GIB
    opt_bytes = [b for r in ranks if (b := r.get("optimizer_state_bytes")) is not None]
    m["optimizer_state_gib"] = max(opt_bytes) / memory_mod.GIB if len(opt_bytes) == len(ranks) else None
    if spec.mode == "train":
        m["replicas_in_sync"], m["replica_mismatch"] = replicas_in_sync([r.get("replicas") or {} for r in ranks])

    # Energy: summed over ranks; None (with the reason) unless every rank has a value.
    ej = [r["energy"]["energy_j"] for r in ranks]
    steps = spec.measured_steps
    if all(e is not None for e in ej):
        total = sum(ej)
        m.update(
            {
                "energy_j": total,
                "energy_j_per_step": total / steps,
                "energy_j_per_token": total / (n_tokens * steps),
                "avg_power_w": total / m["window_s"] if m["window_s"] else None,
            }
        )
    else:
        m.update({"energy_j": None, "energy_j_per_step": None, "energy_j_per_token": None, "avg_power_w": None})
    m["energy_method"] = dev0["energy"]["method"]
    m["energy_reason"] = dev0["energy"]["reason"]

    if spec.mode == "decode":  # serving: the prompt's prefill and the KV cache each rank ends with
        m["prefill_ms"] = max(r["serving"]["prefill_ms"] for r in ranks)
        m["prefill_tokens_per_s"] = spec.dp * spec.batch * spec.seq_len / (m["prefill_ms"] / 1e3)
        m["kv_cache_gib"] = max(r["serving"]["kv_cache_gib"] for r in ranks)
        m["ttft_ms"] = max(r["serving"]["ttft_ms"] for r in ranks)
        m["decode_ms_per_token_p50"] = m.get("step_time_ms_p50")
        m["decode_ms_per_token_p99"] = percentile([t for r in ranks for t in r["step_ms"]], 99)
        m["kv_cache_allocated_gib"] = max(r["serving"]["kv_cache_allocated_gib"] for r in ranks)
        if m.get("mem_total_gib") is not None:  # the cache predates the tracked step: add it as a category
            m["mem_kv_cache_gib"] = m["kv_cache_allocated_gib"]
            m["mem_total_gib"] += m["kv_cache_allocated_gib"]
    m.update(
        {
            "comm_bytes_per_layer_fwd": dev0["comm"]["fwd"],
            "comm_bytes_per_layer_bwd": dev0["comm"]["bwd"],
            "comm_ops_per_layer": dev0["comm"]["ops"],
            "loss": loss,
            "throughput_note": rec["cpu_note"],
        }
    )
    rec["metrics"] = m
    rec["per_rank"] = {
        "step_time_ms": [r["step_ms"] for r in ranks],
        "window_s": [r["window_s"] for r in ranks],
        "peak_allocated_gib": [r["peaks"].get("peak_allocated_gib") for r in ranks],
        "mem_total_gib": [r["mem"].get("mem_total_gib") for r in ranks],
        "energy_j": [r["energy"]["energy_j"] for r in ranks],
        "power_timeline": [r["energy"]["timeline"] for r in ranks],
        "comm_bytes_per_layer_fwd": [r["comm"]["fwd"] for r in ranks],
        "comm_bytes_per_layer_bwd": [r["comm"]["bwd"] for r in ranks],
    }
    rec["provenance"] = {
        **provenance(),
        **rec["provenance"],
        "started_at": started,
        "finished_at": finished,
        "backend": backend,
        "launcher": launcher,
    }
    return rec


def replicas_in_sync(per_rank: list[dict[str, tuple[int, float, float]]]) -> tuple[bool, list[str]]:
    """Do all ranks that hold the same slice of a parameter hold identical copies (tspbench.run.worker
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
