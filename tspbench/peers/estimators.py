"""Our predictions beside the peers' estimators (docs/method.md#peers): for every case of tspbench/peers/cases.py,
tokens/s per GPU, iteration time, peak memory and model states from our cost model (tspbench.predict: the same
calls tspbench/predict/published.py makes for the row), from llm-analysis (tspbench/peers/llm_analysis.py) and from
DeepSpeed's ZeRO-3 model-state estimator (tspbench/peers/zero.py, for layouts that shard parameters over data-parallel
ranks: FSDP rows and FSDP×SP), with the published number where the row has one and a short reason for the gap.

`peer_records()` gives one record per (case, quantity) (kind "peer_estimate"; nothing writes them to disk yet: a new
record kind is not registered in tspbench/record/kinds.py); `render()` prints them: `python -m tspbench.validate`
ends with it, and tspbench/report/trust.py renders the same records when the report is given them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tspbench.config import GIB, GIB_TO_GB
from tspbench.peers import llm_analysis, zero
from tspbench.peers.cases import PeerCase, all_cases
from tspbench.predict.costmodel import Workload, cluster_throughput, memory_breakdown
from tspbench.predict.costmodel.hardware import shared_profile
from tspbench.predict.costmodel.workload import TRAINING, Training
from tspbench.predict.published import predict

KIND = "peer_estimate"
LABELS = {
    "tokens_per_s_per_gpu": ("tokens/s per GPU", 1.0),
    "step_s": ("iteration time (s)", 1.0),
    "peak_mem_gib": ("peak memory (GB)", GIB_TO_GB),
    "model_states_gib": ("model states (GB)", GIB_TO_GB),
}
"""Printed label and factor from the record's unit (GiB for memory, as every record) to the printed one (GB)."""

SHORT = {
    "tokens_per_s_per_gpu": "LA: FLOPs/fixed eff., no comm",
    "step_s": "LA: FLOPs/fixed eff., no comm",
    "peak_mem_gib": "LA: Korthikanti acts; ours: phase peak",
    "model_states_gib": "DS: 18 B/param + largest module",
}
"""The table's "why they differ" column (LA: llm-analysis, DS: DeepSpeed); WHY below says it in full."""

WHY = {
    "tokens_per_s_per_gpu": "llm-analysis: FLOPs at one fixed efficiency, no communication, attention S² not causally "
    "halved, MLP priced as two 4h matrices",
    "step_s": "as tokens/s: llm-analysis prices FLOPs only; ours adds α–β communication and the attention kernel",
    "peak_mem_gib": "llm-analysis: Korthikanti activations, 2-matrix MLP weights; ours: the phase peak (one layer's "
    "backward working set, comm buffers, FSDP's gathered units)",
    "model_states_gib": "DeepSpeed ZeRO-3: 18 B/param (fp32 grads) + the largest module gathered at 4 B/param; ours "
    "16 B/param (bf16 grads; a row's own `training`, e.g. 8 for pure bf16) + FSDP's unit; llm-analysis: no gate "
    "matrix",
}


def model_states_gib(case: PeerCase) -> float | None:
    """Params + grads + optimizer of our memory breakdown at its peak phase (GiB), with a published row's model state
    (`Row.training`, e.g. pure bf16) as `predict` prices it; None where the memory model refuses the layout (e.g. a
    published-only recompute policy it prices for some layouts only)."""
    work = Workload(case.model, case.seq_len, case.micro_batch, mode="train")
    training = Training(**case.row.training) if case.row is not None else TRAINING
    try:
        mem = memory_breakdown(case.mem_par, work, training)
    except ValueError:
        return None
    return (mem["params"] + mem["grads"] + mem["optimizer"]) / GIB


def ours(case: PeerCase) -> dict[str, float | None]:
    """Our cost model on the case: a published row exactly as `tspbench.predict.published.predict` (its overlap
    rule, stack and published memory kind; None where the row's memory is out of scope), the paper's setting as the
    headline prices it (`schedule` overlap, allocated peak)."""
    states = model_states_gib(case)
    if case.row is not None:
        p = predict(case.row)
        return {
            "tokens_per_s_per_gpu": p["tokens_per_s_per_gpu"],
            "step_s": p["step_s"],
            "peak_mem_gib": p["peak_mem_gib"],
            "model_states_gib": states,
        }
    work = Workload(case.model, case.seq_len, case.micro_batch, mode="train")
    ct = cluster_throughput(case.par, work, shared_profile(case.hardware), case.gpus, overlap="schedule")
    return {
        "tokens_per_s_per_gpu": float(ct["tokens_per_s_per_device"]),
        "step_s": float(ct["step_s"]),
        "peak_mem_gib": memory_breakdown(case.mem_par, work)["total"] / GIB,
        "model_states_gib": states,
    }


def case_quantities(case: PeerCase) -> tuple[str, ...]:
    """What is printed for a case: throughput always; iteration time where published; memory (peak, model states)
    where published, for FSDP (ZeRO-3) layouts and for the paper's setting."""
    out = ["tokens_per_s_per_gpu"]
    if "step_s" in case.published:
        out.append("step_s")
    if "peak_mem_gib" in case.published or case.zero3_over or case.row is None:
        out += ["peak_mem_gib", "model_states_gib"]
    return tuple(out)


def peer_records(files: list[Path] | None = None) -> list[dict[str, Any]]:
    """One record per (case, quantity): ours, llm-analysis's, DeepSpeed's (None where it does not apply or is not
    installed, with the reason in `llm_analysis_note` / `deepspeed_note`), the published value (None if none)."""
    la_missing, ds_missing = llm_analysis.available(), zero.available()
    out: list[dict[str, Any]] = []
    for case in all_cases(files):
        mine = ours(case)
        la_note = la_missing or llm_analysis.representable(case)
        la: dict[str, float] = {}
        if la_note is None:
            try:
                la = llm_analysis.quantities(case, llm_analysis.analyse(case))
            except (AssertionError, ValueError, ZeroDivisionError) as e:  # its own checks refuse the configuration
                la_note = f"llm-analysis refused it: {e}"
        ds_note = ds_missing or (None if case.zero3_over else "no ZeRO/FSDP sharding in this layout")
        hw = shared_profile(case.hardware)
        ds = zero.zero3_gpu_gib(case.model, case.zero3_over, hw.gpus_per_node) if ds_note is None else None
        for q in case_quantities(case):
            out.append(
                {
                    "kind": KIND,
                    "case": case.id,
                    "source": "paper setting (tspbench/paper/setting.py)" if case.row is None else case.row.source,
                    "layout": case.par.label(),
                    "quantity": q,
                    "ours": mine[q],
                    "llm_analysis": la.get(q),
                    "llm_analysis_note": la_note,
                    "deepspeed": ds if q == "model_states_gib" else None,
                    "deepspeed_note": ds_note if q == "model_states_gib" else "model states only",
                    "published": case.published.get(q),
                    "why": SHORT[q] if la_note is None or q == "model_states_gib" else f"LA n/a: {la_note}",
                }
            )
    return out


def _num(v: float | None, factor: float) -> str:
    if v is None:
        return "—"
    x = v * factor
    return f"{x:,.3f}" if abs(x) < 10 else f"{x:,.1f}" if abs(x) < 1000 else f"{x:,.0f}"


def render(recs: list[dict[str, Any]]) -> str:
    """The printed section: one line per record, then why the estimators differ and what was missing."""
    lines = [
        "Peer estimators (docs/method.md#peers): ours vs llm-analysis 0.2.2 vs DeepSpeed's ZeRO-3 estimator",
        f"{'row':38s} {'quantity':20s} {'ours':>10s} {'llm-anal.':>10s} {'DeepSpeed':>10s} {'published':>10s}  "
        "why they differ",
    ]
    notes: dict[str, set[str]] = {}
    for r in recs:
        label, f = LABELS[r["quantity"]]
        lines.append(
            f"{r['case']:38s} {label:20s} {_num(r['ours'], f):>10s} {_num(r['llm_analysis'], f):>10s} "
            f"{_num(r['deepspeed'], f):>10s} {_num(r['published'], f):>10s}  {r['why']}"
        )
        if r["llm_analysis"] is None and r["llm_analysis_note"]:
            notes.setdefault(f"llm-analysis n/a, {r['llm_analysis_note']}", set()).add(r["case"])
    lines.append("why they differ, in full (LA: llm-analysis, DS: DeepSpeed):")
    lines += [f"  {LABELS[q][0]}: {why}" for q, why in WHY.items()]
    lines.append("  llm-analysis n/a: it shards sequences only by Megatron-SP (sp_size = tp_size), so context")
    lines.append(
        "    parallelism (FSDP×SP, TP×SP) has no llm-analysis configuration; DeepSpeed's column: ZeRO-3 layouts only"
    )
    for note, cases in notes.items():
        lines.append(f"  {note} ({len(cases)} rows: {', '.join(sorted(cases))})")
    return "\n".join(lines)


def section(files: list[Path] | None = None, records: list[dict[str, Any]] | None = None) -> str:
    """`render(records)` (default: peer_records(files)), or one line saying why the section is empty (neither peer
    installed)."""
    if llm_analysis.available() and zero.available():
        return f"Peer estimators: skipped ({llm_analysis.available()}; {zero.available()})"
    return render(peer_records(files) if records is None else records)
