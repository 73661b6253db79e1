"""Runs without the devices: `execution=estimate` (fake tensors) and `execution=model` (closed form).

Both return records with the schema of a measured run (docs/records.md), `method` saying how the numbers
were obtained, so the summary, pandas and the report treat them alike and never confuse them:

    estimated  the scheme code itself on fake tensors + a fake process group (tspbench.predict.estimate): per-rank
               peak memory by category, FLOPs, and the collectives of one layer. No timing.
    modelled   tspbench.predict.costmodel: closed-form memory, per-layer communication, and α–β + roofline time on
               the experiment's hardware profile (conf/hardware/), giving predicted step time and tokens/s.
               Never fitted to the paper's numbers.
"""

from __future__ import annotations

import time

from tspbench.config import GB, GIB
from tspbench.predict.costmodel import BYTES, Workload
from tspbench.record.schema import base_record
from tspbench.record.spec import RunSpec

MODEL_SUFFIX = "-model"  # run_id suffix of the modelled twin of an estimated run (execution=auto fallback)


def estimated_record(spec: RunSpec) -> dict:
    from tspbench.predict.estimate import EstimateOptions, estimate

    est = estimate(
        spec.parallel(),
        Workload(spec.model_config(), spec.seq_len, spec.batch, mode=spec.mode, dtype=spec.dtype),
        EstimateOptions(hardware=spec.hardware),
    )
    rec = base_record(spec, est.get("status", "ok"), est.get("reason"))
    rec["method"] = "estimated"
    rec["metrics"] = dict(est.get("metrics", {}))
    rec["per_rank"] = est.get("per_rank", {})
    rec["provenance"]["estimate"] = {k: est[k] for k in ("attention", "master_fp32", "layers") if k in est}
    return _stamp(rec)


def modelled_record(spec: RunSpec, run_id: str | None = None) -> dict:
    from tspbench.predict.costmodel import Workload, comm_per_layer, flops_per_token, memory_breakdown
    from tspbench.predict.costmodel.time import cluster_throughput, load_hardware

    model, par = spec.model_config(), spec.parallel()
    hw_name = spec.hardware or ("cpu" if spec.device == "cpu" else "h100")
    hw = load_hardware(hw_name)
    if spec.mode == "decode":
        return _modelled_decode(spec, hw, hw_name, run_id)
    work = Workload(model, spec.seq_len, spec.batch, mode=spec.mode, dtype=spec.dtype)
    mem = memory_breakdown(par, work)
    comm = comm_per_layer(par, work)
    elem = BYTES[spec.dtype]
    m = _memory_metrics(mem, hw)
    m["comm_bytes_per_layer_fwd"] = comm["fwd_total"] * elem
    m["comm_bytes_per_layer_bwd"] = comm["bwd_total"] * elem
    m["flops_per_token_causal"] = flops_per_token(model, spec.seq_len, mode=spec.mode, causal_halved=True)
    m["flops_per_token_noncausal"] = flops_per_token(model, spec.seq_len, mode=spec.mode, causal_halved=False)
    for overlap in ("none", "ideal", "schedule"):
        t = cluster_throughput(par, work, hw, spec.world_size, overlap=overlap)
        key = {"none": "", "ideal": "_ideal_overlap", "schedule": "_schedule_overlap"}[overlap]
        m[f"predicted_tokens_per_s{key}"] = t["tokens_per_s"]
        m[f"predicted_tokens_per_s_per_device{key}"] = t["tokens_per_s_per_device"]
        m[f"predicted_step_time_ms{key}"] = t["step_s"] * 1e3
        if overlap == "none":
            m["compute_ms"] = t["compute_s"] * 1e3
            m["exposed_comm_ms"] = t["comm_s"] * 1e3
        if overlap == "schedule":
            m["exposed_comm_ms_schedule_overlap"] = t["exposed_comm_s"] * 1e3
    return _modelled(spec, m, mem["total"], hw, hw_name, run_id)


def _memory_metrics(mem: dict, hw) -> dict:
    m = {f"mem_{k}_gib": v / GIB for k, v in mem.items() if k != "total"}
    m["mem_total_gib"] = mem["total"] / GIB
    m["device_capacity_gib"] = hw.mem_bytes / GIB
    return m


def _modelled(spec: RunSpec, m: dict, mem_total: float, hw, hw_name: str, run_id: str | None) -> dict:
    """The record of a modelled run: the predicted throughput is what the summary and report show as tok/s
    (labelled "modelled"); a predicted peak above the device's memory is `oom`."""
    m["tokens_per_s"] = m["predicted_tokens_per_s"]
    m["tokens_per_s_per_device"] = m["predicted_tokens_per_s_per_device"]
    m["step_time_ms_p50"] = m["predicted_step_time_ms"]
    fits = mem_total <= hw.mem_bytes
    rec = base_record(
        spec,
        "ok" if fits else "oom",
        None if fits else f"predicted {mem_total / GB:.1f} GB > {hw.mem_bytes / GB:.0f} GB of {hw_name}",
    )
    rec["method"], rec["hardware"], rec["metrics"] = "modelled", hw_name, m
    rec["run_id"] = run_id or spec.run_id
    rec["provenance"]["hardware_profile"] = {
        "name": hw_name,
        "sources": list(getattr(hw, "sources", [])),
        "efficiency_source": hw.efficiency_source,
    }
    return _stamp(rec)


def _modelled_decode(spec: RunSpec, hw, hw_name: str, run_id: str | None) -> dict:
    """Serving: memory = the prefill's peak with its KV cache (forward phases + cache of seq_len tokens);
    time = one decode step (costmodel.time.decode_step_time), dp replicas in parallel."""
    from tspbench.predict.costmodel import Workload, comm_decode_per_layer, kv_cache_bytes, memory_breakdown
    from tspbench.predict.costmodel.flops import flops_per_token
    from tspbench.predict.costmodel.time import decode_step_time

    model, par = spec.model_config(), spec.parallel()
    work = Workload(model, spec.seq_len, spec.batch, mode="forward", dtype=spec.dtype)
    mem = memory_breakdown(par, work, kv_cache=True)
    m = _memory_metrics(mem, hw)
    m["kv_cache_gib"] = kv_cache_bytes(par, work) / GIB
    m["comm_bytes_per_layer_fwd"] = comm_decode_per_layer(model, par, spec.batch) * BYTES[spec.dtype]
    m["comm_bytes_per_layer_bwd"] = 0.0
    m["flops_per_token_causal"] = m["flops_per_token_noncausal"] = flops_per_token(
        model, spec.seq_len, mode="decode", causal_halved=False
    )
    for overlap in ("none", "ideal"):
        t = decode_step_time(par, work, hw, overlap=overlap)
        key = "" if overlap == "none" else "_ideal_overlap"
        m[f"predicted_tokens_per_s{key}"] = t["tokens_per_s"] * spec.dp
        m[f"predicted_tokens_per_s_per_device{key}"] = t["tokens_per_s"] / par.degree
        m[f"predicted_step_time_ms{key}"] = t["step_s"] * 1e3
        if overlap == "none":
            m.update(
                {
                    "memory_read_ms": t["memory_s"] * 1e3,
                    "compute_ms": t["compute_s"] * 1e3,
                    "exposed_comm_ms": t["comm_s"] * 1e3,
                }
            )
    m["decode_ms_per_token_p50"] = m["predicted_step_time_ms"]
    return _modelled(spec, m, mem["total"], hw, hw_name, run_id)


def _stamp(rec: dict) -> dict:
    from tspbench.record.store import provenance

    rec["provenance"].update(provenance())
    rec["provenance"]["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return rec
