"""The memory table: predicted peak memory per device beside every published memory claim, and the scan that chose
its one setting.

Uses only `tspbench.predict.costmodel` (closed-form formulas, no torch.distributed) and `conf/claims.yaml`.

Memory setting. One setting for every scheme, chosen by `memory_setting_scan()` among honest discrete
options (k = 16 or 18 bytes/param, recompute none or full, GB or GiB) and never by adding terms:
    AdamW, bf16 weights and grads, fp32 master + m + v (k = 16), full activation recompute, micro-batch 1,
    published figures read as decimal GB.
The memory model (`costmodel.memory_breakdown`) is the peak of one training step of tspbench's own code,
phase by phase, and agrees with the fake-tensor estimate of that code (tspbench.predict.estimate) to < 1% for every
scheme here. Recompute "none" is ruled out by the data (TSP at 128K would need ~60 GB, TP ~390 GB, against
38.8 and 70.0). Among the four full-recompute variants (k = 16/18 × GB/GiB) the mean |deviation| is 16–20%,
which does not discriminate between them, so we keep the a-priori choice: k = 16 (docs/method.md#memory; bf16
grads) and GB, the unit the claims are quoted in. Under it TP at 128K is within 2% of 70.0 GB, the 85.0 GB
figure is closest to TP×SP T=2×Σ=4 (with Megatron-SP on T, tp_sp's default: 76.7 GB, −9.7%; the plain ablation
77.8 GB, −8.5%) and 140.0 GB to pure SP (T=1×Σ=8: 148.0 GB, +5.7%), as docs/method.md#memory guessed; TP +
Megatron-SP over all 8 (26.7 GB) and T=4×Σ=2 (41.5 GB; plain 58.4) are far from both. The three
other cells (TSP at 16K and 128K, TP at 16K) are all ~9 GB low, a near-constant gap whatever the scheme and
length (TSP's 16K→128K growth matches), which no honest setting removes (see `_explain`).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, replace

import pandas as pd

from tspbench.paper.claims import load_claims
from tspbench.paper.setting import (
    DEGREE,
    LLAMA7B,
    PAPER_MEMORY_SETTING,
    SEQ_16K,
    SEQ_128K,
    UNIT_BYTES,
    MemorySetting,
    paper_layouts,
)
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel import (
    Training,
    Workload,
    grad_sync_bucket_elems,
    load_hardware,
    memory_breakdown,
    peak_phase,
)


def _memory_rows(setting: MemorySetting, hw_name: str = "mi300x") -> pd.DataFrame:
    unit, hw = UNIT_BYTES[setting.unit], load_hardware(hw_name)
    rows = []
    for seq_len, par in itertools.product((SEQ_16K, SEQ_128K), paper_layouts(ablations=True)):
        par = replace(par, recompute=setting.recompute)
        mem = memory_breakdown(
            par,
            Workload(LLAMA7B, seq_len, setting.batch, mode="train", dtype=setting.dtype),
            Training(optimizer=setting.optimizer, master_fp32=setting.master_fp32, grad_dtype=setting.grad_dtype),
        )
        row = {"seq_len": seq_len, "layout": par.label(), "scheme": par.scheme}
        row.update(tp=par.tp_degree, sp=par.sp_degree)
        row["msp"] = par.megatron_sp
        row["plain"] = not par.msp  # the TP×SP ablation without Megatron-SP on T
        row["mesh"] = par.spec.axes == "T×Σ"  # a 2-D mesh (T = 1 is pure SP, Σ = 1 is TP + Megatron-SP)
        row.update({f"{k}_{setting.unit.lower()}": v / unit for k, v in mem.items() if k != "total"})
        row["predicted"] = mem["total"] / unit
        row["fits_device"] = mem["total"] <= hw.mem_bytes
        rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs["layouts"] = [par for _seq, par in itertools.product((SEQ_16K, SEQ_128K), paper_layouts(ablations=True))]
    return df


def _open_claims(claims: list[dict]) -> list[dict]:
    """The memory claims whose layout is not published: they carry `readings`, the schemes they can be."""
    return [c for c in claims if c.get("readings")]


def _attach_claims(df: pd.DataFrame) -> pd.DataFrame:
    """Put each memory claim beside its row; the two unknown TP+SP layouts go to the closest prediction."""
    df = df.assign(claim_id=None, claim=float("nan"), note="")
    claims = [c for c in load_claims() if c["kind"] == "memory"]
    for c in claims:
        if c.get("readings"):
            continue
        mask = (df.seq_len == c["seq_len"]) & (df.scheme == c["scheme"])
        df.loc[mask, ["claim_id", "claim"]] = [c["id"], c["value"]]
    # docs/method.md#choice-tpsp-layouts: the layouts behind 85.0 and 140.0 GB are unknown. Candidates: the layouts
    # users run, T·Σ = 8 with Σ > 1 and Megatron-SP on T (Megatron's TP + CP with --sequence-parallel), and TP +
    # Megatron-SP over all 8 (the other reading of "TP+SP"). Assign the two claims to distinct layouts minimising
    # the summed |relative deviation| (a nearest-prediction match); the plain TP×SP ablation rows are shown
    # beside them, not matched.
    open_claims = _open_claims(claims)
    readings = set(open_claims[0]["readings"]) if open_claims else set()
    cand = df[(df.seq_len == SEQ_128K) & ~df.plain & df.scheme.isin(readings) & ((df.sp > 1) | ~df.mesh)]
    best = min(
        itertools.permutations(cand.index, len(open_claims)),
        key=lambda idx: sum(abs(df.predicted[i] / c["value"] - 1) for i, c in zip(idx, open_claims)),
    )
    for i, c in zip(best, open_claims):
        df.loc[i, ["claim_id", "claim"]] = [c["id"], c["value"]]
        df.loc[i, "note"] = (
            "layout not published (docs/method.md#choice-tpsp-layouts); assigned to the closest predicted "
            "T·Σ = 8 layout. "
        )
        plain = df.plain & (df.scheme == df.scheme[i]) & (df.tp == df.tp[i]) & (df.sp == df.sp[i])
        if plain.any():  # the same layout without Megatron-SP on T, against the same claim
            j = df.index[plain & (df.seq_len == SEQ_128K)][0]
            df.loc[j, "note"] = (
                f"Without Megatron-SP on T: {100 * (df.predicted[j] / c['value'] - 1):+.1f}% of {c['id']} "
                f"({c['value']:.1f} GB), vs {100 * (df.predicted[i] / c['value'] - 1):+.1f}% with it. "
            )
    df["deviation_pct"] = 100 * (df.predicted / df.claim - 1)
    df["within_10pct"] = df.deviation_pct.abs() <= 10
    return df


def _explain_low(row: pd.Series, claimed: pd.DataFrame, low: pd.DataFrame, uname: str) -> str:
    """A cell low by the near-constant gap every low miss shares."""
    gaps = low.claim - low.predicted
    text = (
        f"Low by {row.claim - row.predicted:.1f} {uname}. Every cell that misses is low by a near-constant "
        f"{gaps.min():.1f}–{gaps.max():.1f} {uname} ({', '.join(sorted(set(low.layout)))} at "
        f"{', '.join(f'{s // 1024}K' for s in sorted(set(low.seq_len)))})"
    )
    same = claimed[(claimed.scheme == row.scheme) & (claimed.seq_len != row.seq_len)]
    if len(same):
        o = same.iloc[0]
        lo, hi = sorted([(row.seq_len, row), (o.seq_len, o)], key=lambda x: x[0])
        text += (
            f", and {row.layout}'s growth from {lo[0] // 1024}K to {hi[0] // 1024}K is "
            f"{hi[1].predicted - lo[1].predicted:.1f} {uname} here vs {hi[1].claim - lo[1].claim:.1f} "
            "published"
        )
    return text + (
        ": the published figures hold a fixed term tspbench does not allocate (allocator reserve vs "
        "allocated, RCCL/workspace buffers, runtime context; docs/method.md#choice-peak-memory). No shared "
        "setting produces it, and adding a constant would be fitting the paper, so the cell stays a miss. "
    )


def _explain(row: pd.Series, df: pd.DataFrame) -> str:
    """Why a claimed cell misses ±10%, from the model's own terms (no fitted correction)."""
    if pd.isna(row.claim) or row.within_10pct:
        return ""
    uname = "GiB" if any(k.endswith("_gib") for k in row.index) else "GB"
    claimed = df[df.claim.notna()]
    low = claimed[~claimed.within_10pct & (claimed.predicted < claimed.claim)]
    if row.predicted < row.claim and len(low) >= 2:
        return _explain_low(row, claimed, low, uname)
    par = replace(df.attrs["layouts"][int(str(row.name))], recompute=PAPER_MEMORY_SETTING.recompute)
    if (
        row.predicted > row.claim
        and peak_phase(par, Workload(LLAMA7B, int(row.seq_len), PAPER_MEMORY_SETTING.batch)) == "grad_sync"
    ):
        unit = UNIT_BYTES[uname]
        bucket = grad_sync_bucket_elems(LLAMA7B, par) * 2 / unit
        return (
            f"The peak is finish_grad_sync's all-reduce bucket ({bucket:.1f} {uname}) on top of every "
            "gradient and the optimizer state. "
        )
    return "Outside ±10% under the single shared setting. "


def paper_memory_table(setting: MemorySetting = PAPER_MEMORY_SETTING, hw: str = "mi300x") -> pd.DataFrame:
    """Predicted peak memory per device (llama7b, one node of 8 MI300X) beside every memory claim
    (docs/method.md#published).

    Rows: 16K and 128K × (TSP D=8, TP T=8, TP×SP T×Σ = 1×8 (pure SP), 2×4, 4×2, 8×1 with Megatron-SP on T, TP +
    Megatron-SP T=8, and the plain TP×SP ablation 2×4, 4×2). Columns: the
    breakdown in the setting's unit, `predicted`, `claim`, `deviation_pct`, `within_10pct`, `note`.
    """
    df = _attach_claims(_memory_rows(setting, hw))
    df["note"] = df.note + df.apply(lambda r: _explain(r, df), axis=1)
    tp_msp = ParallelConfig(scheme="tp_msp", degree=DEGREE).label()
    df.loc[df.mesh & (df.tp == DEGREE), "note"] += f"Σ = 1: TP + Megatron-SP, as {tp_msp}. "
    df.loc[df.mesh & (df.tp == 1), "note"] += f"Pure SP (token sharding / CP, Σ = {DEGREE}). "
    layouts = df.attrs["layouts"]
    df = df.drop(columns=["plain", "mesh"])  # the matching's helpers (the layout label says both)
    df.attrs.update(layouts=layouts, setting=asdict(setting))
    return df


def memory_setting_scan() -> pd.DataFrame:
    """Deviation from every memory claim under each honest setting (k 16/18 × recompute × GB/GiB)."""
    open_ids = {c["id"] for c in _open_claims(load_claims()) if c["kind"] == "memory"}
    rows = []
    for grad, recompute, unit in itertools.product((None, "float32"), ("none", "full"), ("GB", "GiB")):
        s = MemorySetting(grad_dtype=grad, recompute=recompute, unit=unit)
        df = _attach_claims(_memory_rows(s)).dropna(subset=["claim"])
        row = {
            "bytes_per_param": s.bytes_per_param,
            "recompute": recompute,
            "unit": unit,
            "chosen": s == PAPER_MEMORY_SETTING,
            "mean_abs_dev_pct": df.deviation_pct.abs().mean(),
            "n_within_10pct": int(df.within_10pct.sum()),
        }
        row.update({f"dev_{r.claim_id}": r.deviation_pct for r in df.itertuples()})
        row.update({f"layout_{r.claim_id}": r.layout for r in df.itertuples() if r.claim_id in open_ids})
        rows.append(row)
    return pd.DataFrame(rows)
