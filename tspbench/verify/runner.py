"""Run verification cases in a spawned rank group (gloo on CPU, NCCL on CUDA) and format their results."""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, fields
from pathlib import Path

import torch.distributed as dist

from tspbench.parallel import ParallelConfig
from tspbench.verify.case import CaseResult, VerifyConfig
from tspbench.verify.parity import run_case
from tspbench.verify.serve import run_decode_case


def _worker(rank: int, world: int, cases: list[tuple[VerifyConfig, str | None]], out_file: str) -> None:
    results = []
    for vc, breakage in cases:
        res = (run_decode_case if vc.decode_steps else run_case)(vc, breakage)
        if res is not None:
            results.append(res)
        dist.barrier()
    if rank == 0:
        Path(out_file).write_text(json.dumps([_to_json(r) for r in results]))


def _to_json(r: CaseResult) -> dict:
    d = asdict(r)
    d["ok"] = r.ok
    return d


def run_cases(cases: list[tuple[VerifyConfig, str | None]], world: int, device: str = "cpu") -> list[dict]:
    """Spawn one rank group of size `world` and run every case in it (all cases share the world size)."""
    from tspbench.spawn import spawn

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "results.json")
        spawn(_worker, world, cases, out, device=device)
        return json.loads(Path(out).read_text())


LAYOUT_FIELDS = tuple(f.name for f in fields(ParallelConfig))


def format_result(r: dict) -> str:
    c = r["case"]
    par = ParallelConfig(**{k: c[k] for k in LAYOUT_FIELDS if k in c})
    options = " ".join(f"{k}={str(v).lower()}" for k, v in par.options().items())
    head = (
        f"{par.label()}: scheme={c['scheme']} degree={c['degree']} dp={c['dp']} {options} "
        f"recompute={c['recompute']} dtype={c['dtype']} S={c['seq_len']} B={c['batch']} "
        f"n_heads={c['model']['n_heads']} n_kv_heads={c['model']['n_kv_heads']} strict={str(c['strict']).lower()}"
    )
    lines = [head, f"{'tensor':44s} {'max_abs':>11s} {'max_rel':>11s} {'tol':>8s}"]
    for t in r["checks"]:
        flag = "ok" if t["ok"] else "MISMATCH"
        lines.append(f"{t['name']:44s} {t['max_abs']:11.3e} {t['max_rel']:11.3e} {t['tol']:8.0e}  {flag}")
    n_bad = sum(not t["ok"] for t in r["checks"])
    lines.append(
        f"{'PASS' if r['ok'] else 'FAIL'}: {len(r['checks']) - n_bad}/{len(r['checks'])} tensors "
        f"within tolerance; param bytes per rank {r['param_bytes']}"
        + (f"; KV-cache bytes per rank {r['kv_cache_bytes']}" if r.get("kv_cache_bytes") else "")
    )
    return "\n".join(lines)
