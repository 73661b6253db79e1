"""The paper's scale without GPUs: cost-model predictions beside the published numbers.

Uses only `tspbench.predict.costmodel` (closed-form formulas, no torch.distributed) and `conf/claims.yaml`.

Reference model `LLAMA7B` (docs/method.md#published): h = 4096, L = 32, 32 query and 32 KV heads (MHA), gated MLP
with ffn = 4h = 16384, 8.59B non-embedding parameters. The paper's vocabulary is not stated; we use
Llama-2's V = 32000 with an untied LM head: split by vocabulary over the tensor axis in TP, TP+Megatron-SP and
TP×SP (Megatron's vocabulary parallelism), replicated in SP and TSP (docs/method.md#choice-embedding), as in
tspbench's code.

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
from dataclasses import asdict, dataclass, replace

import pandas as pd

from tspbench.config import ModelConfig, model_preset
from tspbench.paper.claims import load_claims
from tspbench.parallel import LayoutOptions, ParallelConfig, layouts
from tspbench.predict.costmodel import (
    Training,
    Workload,
    cluster_throughput,
    comm_per_layer,
    crossover_tokens,
    flops_per_token,
    grad_sync_bucket_elems,
    load_hardware,
    memory_breakdown,
    non_embedding_params,
    peak_phase,
)

LLAMA7B = model_preset("llama7b")
SEQ_16K, SEQ_128K = 16384, 131072
N_GPUS = 1024
DEGREE = 8
UNIT_BYTES = {"GB": 1e9, "GiB": 2**30}


@dataclass(frozen=True)
class MemorySetting:
    """The one training setting used for every scheme in the memory table."""

    optimizer: str = "adamw"
    dtype: str = "bfloat16"
    grad_dtype: str | None = None  # None = dtype (bf16 grads, k = 16); "float32" gives k = 18
    master_fp32: bool = True
    recompute: str = "full"
    batch: int = 1
    unit: str = "GB"  # how the published figures are read: decimal GB or GiB

    @property
    def bytes_per_param(self) -> int:
        return 2 + (4 if self.grad_dtype == "float32" else 2) + 8 + (4 if self.master_fp32 else 0)


PAPER_MEMORY_SETTING = MemorySetting()


def paper_layouts(degree: int = DEGREE, ablations: bool = False) -> list[ParallelConfig]:
    """TSP (D), TP (T), and every TP×SP factorisation T·Σ = degree (T = 1 is pure SP, T = degree is TP), TP×SP
    with Megatron-SP on its tensor axis (the default, docs/method.md#choice-tp-sp-msp). `ablations`: also TP +
    Megatron-SP over all D (tp_msp) and the plain TP×SP (msp=false) for every 1 < T < degree
    (tspbench.parallel.layouts, as every enumeration)."""
    every_t = LayoutOptions(tps=tuple(t for t in range(1, degree + 1) if degree % t == 0))
    out = layouts(degree, schemes=("tsp", "tp", "tp_sp"), options={"tp_sp": every_t})
    if ablations:
        out += layouts(degree, schemes=("tp_msp", "tp_sp"), options={"tp_sp": LayoutOptions(msps=(False,))})
    return out


def _is_method(par: ParallelConfig) -> bool:
    return par.spec.role == "method"


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


def _attach_claims(df: pd.DataFrame) -> pd.DataFrame:
    """Put each memory claim beside its row; the two unknown TP+SP layouts go to the closest prediction."""
    df = df.assign(claim_id=None, claim=float("nan"), note="")
    claims = [c for c in load_claims() if c["kind"] == "memory"]
    for c in claims:
        if c["tp"] is None and c["scheme"] == "tp_sp":
            continue
        mask = (df.seq_len == c["seq_len"]) & (df.scheme == c["scheme"])
        df.loc[mask, ["claim_id", "claim"]] = [c["id"], c["value"]]
    # docs/method.md#choice-tpsp-layouts: the layouts behind 85.0 and 140.0 GB are unknown. Candidates: the layouts
    # users run, T·Σ = 8 with Σ > 1 and Megatron-SP on T (Megatron's TP + CP with --sequence-parallel), and TP +
    # Megatron-SP over all 8 (the other reading of "TP+SP"). Assign the two claims to distinct layouts minimising
    # the summed |relative deviation| (a nearest-prediction match); the plain TP×SP ablation rows are shown
    # beside them, not matched.
    open_claims = [c for c in claims if c["tp"] is None and c["scheme"] == "tp_sp"]
    readings = set(open_claims[0].get("readings") or [open_claims[0]["scheme"]]) if open_claims else set()
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


def _explain(row: pd.Series, df: pd.DataFrame) -> str:
    """Why a claimed cell misses ±10%, from the model's own terms (no fitted correction)."""
    if pd.isna(row.claim) or row.within_10pct:
        return ""
    uname = "GiB" if any(k.endswith("_gib") for k in row.index) else "GB"
    claimed = df[df.claim.notna()]
    low = claimed[~claimed.within_10pct & (claimed.predicted < claimed.claim)]
    if row.predicted < row.claim and len(low) >= 2:
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
    df.attrs["setting"] = asdict(setting)
    return df


def memory_setting_scan() -> pd.DataFrame:
    """Deviation from every memory claim under each honest setting (k 16/18 × recompute × GB/GiB)."""
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
        row.update({f"layout_{r.claim_id}": r.layout for r in df.itertuples() if "tpsp" in r.claim_id})
        rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------- throughput
def paper_throughput_table(
    hw: str = "mi300x", n_gpus: int = N_GPUS, seq_len: int = SEQ_128K, degree: int = DEGREE, batch: int = 1
) -> pd.DataFrame:
    """Predicted forward tokens/s on n_gpus at 128K: TSP D=8 vs every TP×SP layout, full model and one layer.

    Adds the "matched per-GPU sharding" reading of the baseline (T = Σ = degree, degree² GPUs per replica;
    docs/method.md#published reconciliation b). `tsp_speedup` = TSP tokens/s ÷ the row's, to set beside 2.0× and 2.6×.
    """
    profile = load_hardware(hw)
    every_t = LayoutOptions(tps=tuple(t for t in range(1, degree + 1) if degree % t == 0))
    cfgs = [(p.label(), p) for p in layouts(degree, schemes=("tsp", "tp_sp"), options={"tp_sp": every_t})]
    matched = ParallelConfig(scheme="tp_sp", degree=degree * degree, tp=degree)
    cfgs.append((f"{matched.label()} (matched sharding)", matched))
    claims = {c["id"]: c["value"] for c in load_claims()}
    rows = []
    for layers, overlap in itertools.product((None, 1), ("none", "schedule", "ideal")):
        for name, par in cfgs:
            r = cluster_throughput(
                par, Workload(LLAMA7B, seq_len, batch, mode="forward"), profile, n_gpus, overlap=overlap, layers=layers
            )
            rows.append(
                {
                    "layers": LLAMA7B.n_layers if layers is None else layers,
                    "overlap": overlap,
                    "layout": name,
                    "scheme": par.scheme,
                    "is_tsp": _is_method(par),
                    "tp": par.tp_degree,
                    "sp": par.sp_degree,
                    "gpus_per_replica": par.degree,
                    **r,
                }
            )
    df = pd.DataFrame(rows)
    df["reading"] = df.layers.map(lambda n: f"full model ({n} layers)" if n == LLAMA7B.n_layers else "single layer")
    df["tokens_per_s_per_replica"] = df.tokens_per_s / df.dp_replicas
    df["tokens_per_s_per_gpu"] = df.tokens_per_s_per_device
    tsp = df[df.is_tsp].set_index(["layers", "overlap"]).tokens_per_s
    df["tsp_speedup"] = [tsp[(r.layers, r.overlap)] / r.tokens_per_s for r in df.itertuples()]
    base = df[~df.is_tsp & (df.gpus_per_replica == degree)]
    best = base.loc[base.groupby(["layers", "overlap"]).tokens_per_s.idxmax()].set_index(["layers", "overlap"])
    df["strongest_baseline"] = [best.layout[(r.layers, r.overlap)] for r in df.itertuples()]
    df["tsp_vs_strongest"] = [
        tsp[(r.layers, r.overlap)] / best.tokens_per_s[(r.layers, r.overlap)] for r in df.itertuples()
    ]
    df["claim_tsp_tokens_per_s"] = claims["tput_1024_tsp"]
    df["claim_ratio_blog"] = claims["ratio_blog"]
    df["claim_ratio_press"] = claims["ratio_press"]
    plaus = plausibility_173m(hw, n_gpus=n_gpus, seq_len=seq_len)
    df["reading_consistent_with_173m"] = [_reading_verdict(r, plaus) if r.is_tsp else "" for r in df.itertuples()]
    return df


def _reading_verdict(row, plaus: dict) -> str:
    """Whether a TSP row's reading of the 173M tokens/s claim is physically possible (docs/method.md#plausibility-173m)
    and how the modelled number compares with it; the model is not fitted to the claim."""
    claim, ratio = plaus["tokens_per_s"], row.tokens_per_s / plaus["tokens_per_s"]
    modelled = f"modelled {row.tokens_per_s / 1e6:.1f}M = {ratio:.2f}× {claim / 1e6:.0f}M"
    if row.layers == LLAMA7B.n_layers:
        need = plaus["fraction_of_peak_full_linear_only"]
        if not plaus["full_forward_plausible"]:
            return f"inconsistent: a full forward at the claim needs {need:.1f}× the bf16 peak; {modelled}"
        return f"possible ({need:.0%} of peak); {modelled}"
    need = plaus["fraction_of_peak_layer_causal_halved"]
    return f"possible: one layer at the claim needs {need:.0%} of the bf16 peak; {modelled}"


def throughput_assumptions(
    hw: str = "mi300x", n_gpus: int = N_GPUS, seq_len: int = SEQ_128K, degree: int = DEGREE
) -> list[str]:
    """The assumptions that drive `paper_throughput_table`, as printable lines (profile constants, overlap,
    forward vs training), with the training-mode ratio for contrast: nothing here is fitted to the claims."""
    p = load_hardware(hw)
    every_t = LayoutOptions(tps=tuple(t for t in range(1, degree + 1) if degree % t == 0))
    tsp, ratios = 0.0, []
    for par in layouts(degree, schemes=("tsp", "tp_sp"), options={"tp_sp": every_t}):
        tps = cluster_throughput(replace(par, recompute="full"), Workload(LLAMA7B, seq_len, 1, mode="train"), p, n_gpus)
        if _is_method(par):
            tsp = tps["tokens_per_s"]
        else:
            ratios.append(tps["tokens_per_s"])
    ratios = [tsp / v for v in ratios]
    return [
        f"assumptions ({p.name} profile, conf/hardware/{p.name}.yaml): bf16 peak {p.peak_flops_bf16 / 1e12:,.0f} "
        f"TFLOP/s × matmul efficiency {p.matmul_efficiency:g}; intra-node collectives {p.intra_node_bw / 1e9:,.0f} "
        f"GB/s per GPU, α = {p.intra_node_latency_s * 1e6:g} µs; peer-to-peer link "
        f"{(p.intra_node_p2p_bw or p.intra_node_bw) / 1e9:,.0f} GB/s; "
        f"inter-node {p.inter_node_bw / 1e9:,.0f} GB/s per GPU, "
        f"α = {p.inter_node_latency_s * 1e6:g} µs; collective efficiency {p.comm_efficiency:g}.",
        "overlap: none = compute + communication; schedule = what the code's issue order hides (TSP's "
        "double-buffered broadcasts, K/V buckets, ring hops; the baselines' collectives are synchronous); ideal = "
        f"max of the two. {n_gpus // degree} data-parallel "
        f"replicas of D = {degree}, B = 1, S = {seq_len // 1024}K; forward only (the claim is 'mostly forward "
        "pass'; no DP all-reduce in a forward).",
        f"training instead (forward + backward + AdamW, full recompute, DP all-reduce, no overlap): TSP ÷ TP×SP "
        f"(T·Σ = {degree}) = {min(ratios):.2f}–{max(ratios):.2f}.",
    ]


def plausibility_173m(
    hw: str = "mi300x", tokens_per_s: float | None = None, n_gpus: int = N_GPUS, seq_len: int = SEQ_128K
) -> dict:
    """PFLOP/s per GPU that 173M tok/s on 1,024 GPUs would need (docs/method.md#plausibility-173m), full model vs
    one layer."""
    profile = load_hardware(hw)
    tokens_per_s = tokens_per_s or next(c["value"] for c in load_claims() if c["id"] == "tput_1024_tsp")
    per_gpu = tokens_per_s / n_gpus
    peak = profile.peak_flops_bf16
    f = {
        "full_linear_only": 2 * non_embedding_params(LLAMA7B),
        "full_causal_halved": flops_per_token(LLAMA7B, seq_len, mode="forward", causal_halved=True),
        "full_not_halved": flops_per_token(LLAMA7B, seq_len, mode="forward", causal_halved=False),
        "layer_causal_halved": flops_per_token(LLAMA7B, seq_len, mode="forward", causal_halved=True, layers=1),
        "layer_not_halved": flops_per_token(LLAMA7B, seq_len, mode="forward", causal_halved=False, layers=1),
    }
    out = {
        "tokens_per_s": tokens_per_s,
        "n_gpus": n_gpus,
        "tokens_per_s_per_gpu": per_gpu,
        "peak_pflops_bf16": peak / 1e15,
    }
    for k, v in f.items():
        out[f"gflop_per_token_{k}"] = v / 1e9
        out[f"required_pflops_per_gpu_{k}"] = per_gpu * v / 1e15
        out[f"fraction_of_peak_{k}"] = per_gpu * v / peak
    out["full_forward_plausible"] = out["fraction_of_peak_full_linear_only"] <= 1.0
    return out


def crossover_table(
    seq_lens=(4096, 8192, 16384, 32768, 65536, 131072),
    batch: int = 1,
    degree: int = DEGREE,
    model: ModelConfig = LLAMA7B,
) -> pd.DataFrame:
    """Forward communication per layer per device (GB, bf16): TSP vs TP (and TP×SP) against sequence length."""
    rows = []
    for s in seq_lens:
        work = Workload(model, s, batch, mode="forward")
        tsp = comm_per_layer(ParallelConfig(scheme="tsp", degree=degree), work)
        tp = comm_per_layer(ParallelConfig(scheme="tp", degree=degree), work)
        row = {
            "seq_len": s,
            "tokens": batch * s,
            "tsp_weights_gb": tsp["fwd"]["weights"] * 2 / 1e9,
            "tsp_kv_gb": tsp["fwd"]["kv"] * 2 / 1e9,
            "tsp_gb": tsp["fwd_total"] * 2 / 1e9,
            "tp_gb": tp["fwd_total"] * 2 / 1e9,
        }
        for t in (t for t in range(2, degree) if degree % t == 0):
            c = comm_per_layer(ParallelConfig(scheme="tp_sp", degree=degree, tp=t), work)
            row[f"tp_sp_T{t}_gb"] = c["fwd_total"] * 2 / 1e9
        row["tsp_le_tp"] = row["tsp_gb"] <= row["tp_gb"]
        rows.append(row)
    df = pd.DataFrame(rows)
    df["crossover_tokens"] = crossover_tokens(model, degree)
    df.attrs["crossover_tokens_train"] = crossover_tokens(model, degree, mode="train")
    return df


if __name__ == "__main__":
    pd.set_option("display.width", 200, "display.max_columns", 30)
    print(memory_setting_scan().round(1).to_string())
    print(
        paper_memory_table()[["seq_len", "layout", "predicted", "claim", "deviation_pct", "note"]].round(1).to_string()
    )
    print(
        paper_throughput_table()[
            ["layers", "overlap", "layout", "tokens_per_s", "compute_s", "comm_s", "tsp_speedup"]
        ].to_string()
    )
    print(plausibility_173m())
    print(crossover_table().round(3).to_string())


def print_tables(names: list[str]) -> None:
    """The `paper_tables` of an experiment, as text (all numbers modelled: tspbench.predict.costmodel on the MI300X
    profile; claims from conf/claims.yaml)."""
    import pandas as pd

    with pd.option_context(
        "display.width", 220, "display.max_columns", 30, "display.float_format", lambda v: f"{v:,.3g}"
    ):
        for name in names:
            if name == "memory":
                df = paper_memory_table()
                print(f"paper memory (modelled, GB per MI300X; one setting for all schemes: {PAPER_MEMORY_SETTING}):")
                print(df.to_string(index=False))
            elif name == "throughput":
                df = paper_throughput_table()
                cols = [
                    c
                    for c in (
                        "reading",
                        "overlap",
                        "layout",
                        "dp_replicas",
                        "tokens_per_s_per_replica",
                        "tokens_per_s_per_gpu",
                        "tokens_per_s",
                        "tsp_speedup",
                        "strongest_baseline",
                        "tsp_vs_strongest",
                        "reading_consistent_with_173m",
                    )
                    if c in df
                ]
                claims = {c["id"]: c["value"] for c in load_claims()}
                print(
                    "paper throughput, 1,024 × MI300X, S = 128K, 8 GPUs per replica, forward (modelled; tokens/s per "
                    "replica, per GPU and for the cluster; tsp_speedup = TSP tokens/s ÷ this layout's, beside the "
                    f"claimed {claims['tput_1024_tsp'] / 1e6:.0f}M, {claims['ratio_blog']:g}× (blog) and "
                    f"{claims['ratio_press']:g}× (press); both readings of the claim: the full model and one layer):"
                )
                print(df[cols].to_string(index=False))
                print("\n".join(throughput_assumptions()))
            elif name == "plausibility":
                p = plausibility_173m()
                print(
                    f"173M tokens/s on 1,024 MI300X = {p['tokens_per_s_per_gpu']:,.0f} tok/s per GPU: a full "
                    f"32-layer forward needs ≥ {p['required_pflops_per_gpu_full_linear_only']:.2f} PFLOP/s per GPU "
                    f"for the linear layers alone ({p['fraction_of_peak_full_linear_only']:.1f}× the "
                    f"{p['peak_pflops_bf16']:.2f} PFLOP/s bf16 peak): "
                    f"{'possible' if p['full_forward_plausible'] else 'NOT physically possible'}; one layer "
                    f"needs {p['required_pflops_per_gpu_layer_causal_halved']:.2f} PFLOP/s "
                    f"({p['fraction_of_peak_layer_causal_halved']:.0%} of peak)."
                )
            elif name == "crossover":
                print("communication per layer (modelled GB, forward) vs sequence length, TSP vs TP:")
                print(crossover_table().to_string(index=False))
            else:
                raise ValueError(
                    f"paper_tables: {name!r} is unknown; allowed: memory, throughput, plausibility, crossover"
                )
