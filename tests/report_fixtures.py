"""Synthetic result records and claims for the report tests (no runs needed).

`write_records(path)` writes a JSONL file that exercises every part of the report:
  * measured CPU (gloo) runs of a tiny model, every scheme, with per-rank lists and comm bytes;
  * measured "H100" runs with power timelines and energy, one OOM;
  * estimated MI300X runs of the 7B reference model (memory breakdown, one predicted OOM);
  * modelled 1,024-GPU throughput; estimated tiny-model memory (for predicted vs measured);
  * a failed run, a timeout, a superseded duplicate run_id, a record with most keys missing, one
    with malformed fields, and a torn last line.
Numbers are chosen so deviations from CLAIMS are known (see the tests). Communication volumes follow
docs/method.md#communication, so the TSP/TP crossover sits at B·S = 8h.

`write_context(dir)` adds the validation and plan records the run flow writes beside them (real ones:
tspbench.run.context), for the trust section and the Pareto page.
"""

from __future__ import annotations

import json
from pathlib import Path

TINY = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "ffn_hidden": 256, "vocab_size": 256}
LLAMA7B = {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 32, "ffn_hidden": 16384, "vocab_size": 32000}


# Claims in the shape tspbench.paper.claims.load_claims() returns (conf/claims.yaml; values from
# docs/method.md#published), plus one claim at 256K that no fixture record answers.
def _claim(cid, kind, value, unit, scheme, seq_len, n_gpus, tp=None, sp=None):
    return {
        "id": cid,
        "kind": kind,
        "value": value,
        "unit": unit,
        "scheme": scheme,
        "degree": 8,
        "tp": tp,
        "sp": sp,
        "seq_len": seq_len,
        "n_gpus": n_gpus,
        "hardware": "mi300x",
        "source": "docs/method.md#published",
        "label": "[secondary]",
        "note": f"fixture {cid}",
    }


CLAIMS = [
    _claim("mem_128k_tsp", "memory", 38.8, "GB", "tsp", 131072, 8),
    _claim("mem_128k_tp", "memory", 70.0, "GB", "tp", 131072, 8, tp=8, sp=1),
    _claim("tput_1024_tsp", "throughput", 173e6, "tokens/s", "tsp", 131072, 1024),
    _claim("ratio_blog", "ratio", 2.01, "x", "tsp", 131072, 1024),
    _claim("mem_256k_tsp", "memory", 50.0, "GB", "tsp", 262144, 8),
]
MEM_TSP_128K_GIB = 36.0  # -> 38.654 GB, -0.38 % vs 38.8
MEM_TP_128K_GIB = 60.0  # -> 64.425 GB, -7.96 % vs 70.0
TOK_TSP_1024 = 160e6  # -7.51 % vs 173M
TOK_TPSP_1024 = (80e6, 70e6)  # T=4×Σ=2 (strongest), T=2×Σ=4 -> speed-up 2.0


def comm_fwd_elems(scheme: str, s: int, b: int, cfg: dict, d: int, t: int = 0) -> float:
    """Forward elements received per layer per device (docs/method.md#communication)."""
    h, g, f = cfg["dim"], cfg["n_heads"] // cfg["n_kv_heads"], cfg["ffn_hidden"] / cfg["dim"]
    if scheme in ("tp", "tp_msp"):
        return 4 * b * s * h * (d - 1) / d
    if scheme == "sp":
        return 2 * b * s * (h / g) * (d - 1) / d
    if scheme == "tp_sp":
        sg = d // t
        return 4 * b * (s / sg) * h * (t - 1) / t + 2 * b * s * (h / (g * t)) * (sg - 1) / sg
    if scheme == "tsp":
        return (2 + 2 / g + 3 * f) * h * h * (d - 1) / d + 2 * b * s * (h / g) * (d - 1) / d
    return 0.0


def record(
    run_id: str,
    scheme: str,
    seq_len: int,
    degree: int,
    *,
    method: str = "measured",
    status: str = "ok",
    model: str = "tiny",
    cfg: dict = TINY,
    tp: int | None = None,
    dp: int = 1,
    device: str = "cpu",
    device_name: str | None = None,
    hardware: str | None = None,
    dtype_bytes: int = 4,
    metrics: dict | None = None,
    per_rank: dict | None = None,
    reason: str | None = None,
    mode: str = "train",
) -> dict:
    tp_deg = tp if scheme == "tp_sp" else degree if scheme in ("tp", "tp_msp") else 1
    sp_deg = degree // tp_deg if scheme in ("tp_sp", "sp") else 1
    comm = comm_fwd_elems(scheme, seq_len, 1, cfg, degree, tp or 0) * dtype_bytes
    # A run that died measured nothing; everything else carries its communication volume.
    died = status != "ok" and method == "measured"
    m = {} if died else {"comm_bytes_per_layer_fwd": comm, "comm_bytes_per_layer_bwd": 2 * comm}
    m.update(metrics or {})
    return {
        "run_id": run_id,
        "experiment": "fixture",
        "method": method,
        "status": status,
        "reason": reason,
        "scheme": scheme,
        "sp_variant": "allgather" if sp_deg > 1 else None,
        "degree": degree,
        "tp_degree": tp_deg,
        "sp_degree": sp_deg,
        "dp": dp,
        "world_size": degree * dp,
        "nodes": max(1, degree * dp // 8),
        "model": model,
        "model_cfg": cfg,
        "seq_len": seq_len,
        "batch": 1,
        "mode": mode,
        "dtype": "float32",
        "recompute": "none",
        "device": device,
        "device_name": device_name,
        "hardware": hardware,
        "metrics": m,
        "per_rank": per_rank or {},
        "provenance": {
            "git_commit": "0123456789abcdef0123",
            "git_dirty": False,
            "torch": "2.13.0",
            "nccl": None,
            "driver": None,
            "hostname": "fixture-host",
            "device_names": [device_name] if device_name else [],
            "seed": 0,
            "warmup_steps": 2,
            "measured_steps": 5,
            "started_at": "2026-05-01T10:00:00",
            "finished_at": "2026-05-01T10:01:00",
            "config": {"scheme": scheme, "degree": degree, "seq_len": seq_len, "model": model},
        },
    }


def cpu_runs() -> list[dict]:
    out = []
    layouts = [
        ("single", 1, None),
        ("tp", 4, None),
        ("tp_msp", 4, None),
        ("sp", 4, None),
        ("tp_sp", 4, 2),
        ("tsp", 4, None),
    ]
    for scheme, d, t in layouts:
        for s in (256, 512, 1024):
            steps = [10.0 + s / 100 + r * 0.3 for r in range(d)]
            alloc = 0.01 + s * 1e-5 / d
            out.append(
                record(
                    f"cpu-{scheme}-{s}",
                    scheme,
                    s,
                    d,
                    tp=t,
                    metrics={
                        "tokens_per_s": s / (steps[-1] / 1000),
                        "tokens_per_s_per_device": s / (steps[-1] / 1000) / d,
                        "step_time_ms_min": min(steps),
                        "step_time_ms_p50": steps[len(steps) // 2],
                        "step_time_ms_max": max(steps),
                        "mfu_causal_pct": 1.2,
                        "mfu_noncausal_pct": 1.9,
                        "peak_allocated_gib": alloc,
                        "mem_params_gib": 0.004,
                        "mem_activations_gib": alloc - 0.004,
                        "energy_j_per_token": None,
                        "energy_reason": "no energy counter on CPU",
                        "compute_ms": steps[0] * 0.7,
                        "exposed_comm_ms": steps[0] * 0.3,
                    },
                    per_rank={"step_time_ms": steps, "peak_allocated_gib": [alloc] * d},
                )
            )
    return out


def gpu_runs() -> list[dict]:
    gpu = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "hardware": "h100"}
    out = []
    for scheme in ("tsp", "tp"):
        timeline = [[[0.1 * i, 300 + 50 * (i % 3) + r] for i in range(20)] for r in range(2)]
        out.append(
            record(
                f"h100-{scheme}-4096",
                scheme,
                4096,
                2,
                **gpu,
                metrics={
                    "tokens_per_s": 2.0e5 if scheme == "tsp" else 1.8e5,
                    "step_time_ms_p50": 20.0,
                    "peak_allocated_gib": 3.0,
                    "peak_reserved_gib": 3.5,
                    "energy_j_per_step": 12.0,
                    "energy_j_per_token": 12.0 / 4096,
                    "avg_power_w": 320.0,
                    "compute_ms": 15.0,
                    "exposed_comm_ms": 5.0,
                    "mfu_causal_pct": 31.0,
                    "mfu_noncausal_pct": 45.0,
                },
                per_rank={"step_time_ms": [19.5, 20.5], "power_timeline": timeline, "energy_j": [6.0, 6.0]},
            )
        )
    out.append(
        record(
            "h100-tp-8192",
            "tp",
            8192,
            2,
            status="oom",
            **gpu,
            metrics={},
            reason="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        )
    )
    out.append(
        record(
            "h100-model-tsp-4096",
            "tsp",
            4096,
            2,
            method="modelled",
            **gpu,
            metrics={"predicted_tokens_per_s": 2.1e5, "mem_total_gib": 3.1},
        )
    )
    return out


def mi300x_estimates() -> list[dict]:
    est = {
        "method": "estimated",
        "model": "llama7b",
        "cfg": LLAMA7B,
        "hardware": "mi300x",
        "device": None,
        "dtype_bytes": 2,
    }
    totals = {
        ("tsp", None): (29.0, 30.5, 32.5, MEM_TSP_128K_GIB),
        ("tp", None): (29.5, 36.0, 47.0, MEM_TP_128K_GIB),
        ("tp_sp", 4): (30.0, 38.0, 52.0, 75.0),
        ("tp_sp", 2): (31.0, 45.0, 80.0, 200.0),
    }
    out = []
    for (scheme, t), mems in totals.items():
        for s, total in zip((16384, 32768, 65536, 131072), mems):
            params = 8.59e9 * 2 / 2**30 / 8  # bf16 weights sharded 8 ways
            parts = {
                "mem_params_gib": params,
                "mem_grads_gib": params,
                "mem_optimizer_gib": 2 * params,
                "mem_comm_buffers_gib": 0.5,
            }
            parts["mem_activations_gib"] = total - sum(parts.values()) - 1.0
            parts["mem_temporaries_gib"] = 1.0
            oom = total > 192 / 1.073741824
            out.append(
                record(
                    f"est-{scheme}{t or ''}-{s}",
                    scheme,
                    s,
                    8,
                    tp=t,
                    **est,
                    status="oom" if oom else "ok",
                    reason=f"predicted peak {total} GiB exceeds mi300x capacity" if oom else None,
                    metrics={"mem_total_gib": total, **parts},
                )
            )
    return out


def modelled_1024() -> list[dict]:
    mod = {
        "method": "modelled",
        "model": "llama7b",
        "cfg": LLAMA7B,
        "hardware": "mi300x",
        "device": None,
        "dp": 128,
        "dtype_bytes": 2,
    }
    return [
        record("mod-tsp-1024", "tsp", 131072, 8, **mod, metrics={"predicted_tokens_per_s": TOK_TSP_1024}),
        record("mod-tpsp4-1024", "tp_sp", 131072, 8, tp=4, **mod, metrics={"predicted_tokens_per_s": TOK_TPSP_1024[0]}),
        record("mod-tpsp2-1024", "tp_sp", 131072, 8, tp=2, **mod, metrics={"predicted_tokens_per_s": TOK_TPSP_1024[1]}),
    ]


def tiny_estimates() -> list[dict]:
    """Estimated memory for the tiny CPU runs: feeds the predicted-vs-measured figure."""
    return [
        record(
            f"est-tiny-{s}-{n}",
            s,
            n,
            d,
            tp=t,
            method="estimated",
            hardware="mi300x",
            device=None,
            metrics={"mem_total_gib": (0.01 + n * 1e-5 / d) * 1.05},
        )
        for s, d, t in (("tsp", 4, None), ("tp", 4, None))
        for n in (256, 512, 1024)
    ]


def failures() -> list[dict]:
    return [
        record(
            "cpu-tsp-2048-failed",
            "tsp",
            2048,
            4,
            status="failed",
            metrics={},
            reason="Traceback (most recent call last):\n  ...\nRuntimeError: gloo connectFullMesh failed on rank 3",
        ),
        record(
            "cpu-sp-4096-timeout",
            "sp",
            4096,
            4,
            status="timeout",
            metrics={},
            reason="killed after 600 s without a step",
        ),
    ]


def decode_runs() -> list[dict]:
    """Serving: measured CPU decode of the tiny model (tp, tsp) at two context lengths."""
    out = []
    for scheme in ("tp", "tsp"):
        for s in (256, 512):
            ms = 5.0 + s / 200 + (3.0 if scheme == "tsp" else 0.0)
            out.append(
                record(
                    f"cpu-decode-{scheme}-{s}",
                    scheme,
                    s,
                    2,
                    mode="decode",
                    metrics={
                        "tokens_per_s": 1000 / ms,
                        "tokens_per_s_per_device": 500 / ms,
                        "step_time_ms_p50": ms,
                        "decode_ms_per_token_p50": ms,
                        "prefill_ms": s / 20,
                        "kv_cache_gib": s * 2 * 64 * 2 * 4 / 2 / 2**30,
                    },
                )
            )
    return out


def write_records(path: Path) -> Path:
    """Write the full fixture set; returns the path."""
    recs = cpu_runs() + gpu_runs() + mi300x_estimates() + modelled_1024() + tiny_estimates() + decode_runs()
    recs += failures()
    # A superseded record: same run_id as the real TSP 128K estimate, written first with a wrong value.
    stale = record(
        "est-tsp-131072",
        "tsp",
        131072,
        8,
        method="estimated",
        model="llama7b",
        cfg=LLAMA7B,
        hardware="mi300x",
        device=None,
        metrics={"mem_total_gib": 99.0},
    )
    recs.insert(0, stale)
    recs.append({"run_id": "bare-1", "scheme": "tp", "status": "ok"})  # most keys missing
    recs.append(
        {
            "run_id": "weird-1",
            "scheme": "tsp",
            "status": "ok",
            "method": "measured",
            "seq_len": "2048",
            "degree": "4",
            "metrics": [],
            "per_rank": None,
        }
    )  # malformed
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
        f.write('{"run_id": "torn", "status": "o')  # a crash mid-write: must be skipped
    return path


def write_minimal(path: Path) -> Path:
    """Only estimated memory records: most figures must fall back to their "no data" note."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in mi300x_estimates()[:4]))
    return path


def write_context(directory: Path) -> list[Path]:
    """The validation and plan records an experiment writes beside its runs (tspbench.run.context: the cost model
    against conf/published, the planner on the paper's setting), for the report's trust section and Pareto page."""
    from tspbench.run.context import write_context_records

    return write_context_records(directory)
