"""The planner: `python -m tspbench.plan model=llama7b seq_len=131072 gpus=1024 hardware=mi300x`.

Every layout the suite implements (tspbench/predict/planner.py: tsp, tp, tp_msp, sp and tp_sp with each K/V
exchange, tp_sp at every factorisation with and without Megatron-SP, fsdp_sp; each recompute mode; micro-batches;
dp filling the cluster), minus those that are refused or do not fit the device's memory, ranked by predicted
cluster tokens/s (closed-form cost model). Prints the top layouts with per-device memory, step time, exposed
communication, replicas, tokens/s per GPU and in the cluster, the margin to the next layout, the elapsed time,
and the validation error that applies (tspbench.predict.published's median |error| on its validation subset).
`out=PATH` writes one JSONL record per fitting layout (docs/records.md#plan-records) through
tspbench.record.store.write_records (atomic, each record guarded); the report draws their memory–throughput Pareto
front (tspbench/report/pareto.py).

What fits (`fit=true`, or the subcommand `python -m tspbench.plan fit ...`; tspbench/predict/maxfit.py): for the same
model, device and count, the longest sequence each scheme and option set trains at under each recompute mode (at the
group size where it fits longest), with the memory breakdown of the term that breaks first, by the same fit rule
(predict/planner.py fits_device); with `family=NAME`, the largest model of that family that trains at `seq_len`.
`out=PATH` then writes "fit" records (their keys: tspbench/predict/fitrecords.py fit_records), which the report draws
against GPU memory.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from tspbench import cli
from tspbench.config import GB, ConfigError, Output, Range
from tspbench.parallel import MLP_EXCHANGES, RECOMPUTE, SCHEMES, SP_VARIANTS, VOCAB, LayoutOptions, scheme
from tspbench.predict.maxfit import SEQ_MULTIPLE
from tspbench.predict.planner import (
    BATCHES,
    MAX_DEGREE,
    PLAN_ORDER,
    Layout,
    PlanRequest,
    margin_pct,
    plan,
    plan_records,
)
from tspbench.predict.verdict import compare, side_of
from tspbench.record.store import write_records


@dataclass
class PlanConfig:
    """`python -m tspbench.plan`: one cluster to plan, and the layouts to enumerate on it."""

    model: str = "llama7b"
    """Model preset, conf/model/NAME.yaml."""
    seq_len: Annotated[int, Range(1)] = 131072
    """Tokens per sequence S."""
    gpus: Annotated[int, Range(1)] = 8
    """Devices in the cluster; dp = gpus / group size fills it."""
    hardware: str = "mi300x"
    """Device profile, conf/hardware/NAME.yaml."""
    overlap: str = "schedule"
    """none | ideal | schedule: communication added to compute, hidden ideally, or as the code's issue order
    allows (docs/method.md#choice-overlap)."""
    batches: Annotated[list[int], Range(1)] = field(default_factory=lambda: list(BATCHES))
    """Micro-batch sizes to try (sequences per replica)."""
    max_degree: Annotated[int, Range(1)] = MAX_DEGREE
    """Largest group size tried."""
    top: Annotated[int, Range(1)] = 10
    """Layouts printed."""
    out: Annotated[str | None, Output()] = None
    """Write one JSONL record per fitting layout there (docs/records.md#plan-records), atomically; null: none."""
    schemes: list[str] = field(default_factory=lambda: list(PLAN_ORDER))
    """Schemes enumerated (tspbench.parallel.SCHEMES)."""
    sp_variants: list[str] = field(default_factory=lambda: list(SP_VARIANTS))
    """K/V exchanges of the schemes with one (sp, tp_sp, fsdp_sp): allgather | ring | ulysses."""
    msps: list[bool] = field(default_factory=lambda: [True, False])
    """tp_sp with Megatron-SP on T (true) and/or the plain ablation (false)."""
    vocabs: list[str] = field(default_factory=lambda: ["auto"])
    """Embedding / LM-head layouts: auto | replicated | ring (ring: tsp only)."""
    kv_bucket_heads: Annotated[list[int], Range(0)] = field(default_factory=lambda: [0])
    """tsp's KV heads per K/V all-gather (0: one all-gather per owner)."""
    mlp_exchanges: list[str] = field(default_factory=lambda: ["ring"])
    """tsp's MLP weight exchange: ring | biring | broadcast."""
    regather_kvs: list[bool] = field(default_factory=lambda: [True])
    """tsp: backward re-gathers K/V (true) and/or keeps the ones gathered last (false)."""
    dp_shards: Annotated[list[int], Range(1)] = field(default_factory=lambda: [1])
    """fsdp_sp: replicas one FSDP shard group spans (1: HSDP within the replica; values not dividing dp skipped)."""
    fit: bool = False
    """What fits instead of a ranking: the longest sequence of each scheme and option set per recompute mode, the term
    that breaks first (seq_len is ignored unless family= is given; the micro-batch is the first of `batches`)."""
    family: str | None = None
    """With fit=true: the largest model of this family that trains at seq_len (llama2 | llama3 | presets)."""
    recomputes: list[str] = field(default_factory=lambda: list(RECOMPUTE))
    """With fit=true: activation-recompute modes (none | selective | full)."""
    seq_multiple: Annotated[int, Range(1)] = SEQ_MULTIPLE
    """With fit=true: sequence lengths searched are multiples of this and of the layout's zigzag 2·Σ."""


EXAMPLES = [
    "python -m tspbench.plan                                         # llama7b, 128K, 8 MI300X",
    "python -m tspbench.plan fit hardware=h100 gpus=64               # the longest sequence each layout fits",
    "python -m tspbench.plan fit=true family=llama2 seq_len=32768    # the largest Llama 2 that trains at 32K",
    "python -m tspbench.plan model=llama3_8b seq_len=32768 gpus=64 hardware=h100 top=5",
    "python -m tspbench.plan gpus=1024 schemes=tsp,fsdp_sp kv_bucket_heads=0,1 vocabs=auto,ring out=results/plan.jsonl",
]
TRUST = {"tokens_per_s_per_gpu": "tokens/s", "step_s": "step time", "peak_mem_gib": "peak memory"}


def request(pc: PlanConfig) -> PlanRequest:
    """The planner's request from the command line's options (one line naming the field for a bad value)."""
    for key, values, allowed in (
        ("schemes", pc.schemes, SCHEMES),
        ("sp_variants", pc.sp_variants, SP_VARIANTS),
        ("vocabs", pc.vocabs, VOCAB),
        ("mlp_exchanges", pc.mlp_exchanges, MLP_EXCHANGES),
    ):
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise ConfigError(f"{key}={','.join(values)}: each must be one of {', '.join(allowed)}")
    for v in pc.vocabs:  # a value no enumerated scheme takes would silently enumerate nothing
        if not any(v in scheme(s).vocabs for s in pc.schemes):
            raise ConfigError(f"vocabs={v} is taken by none of schemes={','.join(pc.schemes)}")
    options = LayoutOptions(
        sp_variants=tuple(pc.sp_variants),
        msps=tuple(pc.msps),
        vocabs=tuple(pc.vocabs),
        kv_bucket_heads=tuple(pc.kv_bucket_heads),
        mlp_exchanges=tuple(pc.mlp_exchanges),
        regather_kvs=tuple(pc.regather_kvs),
        dp_shards=tuple(pc.dp_shards),
    )
    return PlanRequest(
        cli.model_from_name(pc.model),
        pc.seq_len,
        pc.gpus,
        pc.hardware,
        max_degree=pc.max_degree,
        batches=tuple(pc.batches),
        overlap=pc.overlap,
        options=options,
        schemes=tuple(pc.schemes),
    )


def trust_line() -> str:
    """The validation error that applies to these predictions (tspbench.predict.published.validation_errors, as the
    README's)."""
    from tspbench.predict.published import validation_errors

    val = validation_errors()
    parts = [
        f"{label} median |error| {val[q]['median_abs_pct']:.0f}% (worst {val[q]['worst_abs_pct']:.0f}%, "
        f"n={val[q]['n']:.0f})"
        for q, label in TRUST.items()
        if q in val
    ]
    if not parts:
        return "Validation error that applies: none (no validation rows in conf/published)."
    return "Validation error that applies (published runs, validation subset): " + "; ".join(parts) + "."


def fit_line(req: PlanRequest) -> str:
    """The fit rule the ranking used (predict/planner.py fits_device)."""
    return (
        f"Fits: modelled peak × {1 + req.reserve:g} (allocator reserve) + {req.headroom / GB:.0f} GB (runtime "
        "headroom) ≤ device memory (stated assumptions, docs/method.md#verdict)."
    )


def verdict_line(ranked: list[Layout], req: PlanRequest, pc: PlanConfig) -> str:
    """The verdict (tspbench/predict/verdict.py) of the fastest TSP layout here against the fastest baseline."""
    tsp = next((x for x in ranked if x.par.scheme == "tsp"), None)
    base = next((x for x in ranked if scheme(x.par.scheme).role == "baseline"), None)
    if tsp is None or base is None:
        return "Verdict: none (TSP or every baseline is absent from the fitting layouts)."
    sides = [side_of(x, req.model, req.seq_len, req.mode, req.hardware, req.gpus) for x in (tsp, base)]
    setting = f"this plan: {req.model.name}, S={req.seq_len}, {req.gpus} {pc.hardware}, the layouts enumerated"
    c = compare(sides[0], sides[1], tsp.name, base.name, setting)
    return f"Verdict ({c.setting}): {c.sentence()}"


def fit_main(pc: PlanConfig, req: PlanRequest) -> int:
    """`fit=true`: the longest sequence per option set and recompute mode (or, with family=, the largest model)."""
    from tspbench.predict import fitrecords, maxfit

    bad = [r for r in pc.recomputes if r not in RECOMPUTE]
    if bad or not pc.recomputes:
        raise ConfigError(f"recomputes={','.join(pc.recomputes)}: each must be one of {', '.join(RECOMPUTE)}")
    batch = pc.batches[0]
    capacity = maxfit.FitRequest(req.model, pc.hardware, pc.gpus).capacity  # an unknown profile: one line here
    rule = fit_line(req).replace("Fits: ", "Fit rule: ").replace("device memory", f"{capacity / GB:.0f} GB")
    t0 = time.perf_counter()
    if pc.family is not None:
        models = maxfit.family(pc.family)
        got = maxfit.largest_model(
            models,
            pc.seq_len,
            pc.hardware,
            pc.gpus,
            schemes=req.schemes,
            options=req.options,
            max_degree=pc.max_degree,
            batch=batch,
        )
        dt = time.perf_counter() - t0
        print(
            f"What fits (modelled, closed form, {dt:.2f} s): the {pc.family} family at S={pc.seq_len:,}, B={batch}, "
            f"training on {pc.gpus} × {pc.hardware}; the leanest layout of each model (any recompute mode)"
        )
        for m in got:
            mem = f"{m.mem_bytes / GB:7.1f} GB" if m.mem_bytes == m.mem_bytes else "      - "
            print(f"  {m.model.name:14s} {'fits' if m.fit else 'does not fit':13s} {mem}  {m.layout}")
        fits = [m for m in got if m.fit]
        print(f"Largest that fits: {fits[-1].model.name if fits else 'none'}.")
        print(rule)
        return 0
    freq = maxfit.FitRequest(req.model, pc.hardware, pc.gpus, batch, pc.seq_multiple)
    pars = maxfit.cluster_layouts(freq, req.schemes, req.options, pc.max_degree, tuple(pc.recomputes))
    found = maxfit.fit_cluster(freq, pars)
    rows = maxfit.best_per_option_set(found)
    dt = time.perf_counter() - t0
    print(
        f"What fits (modelled, closed form: costmodel.memory_breakdown, {len(found)} layouts searched in {dt:.2f} s): "
        f"{req.model.name}, training (bf16, fp32 AdamW), B={batch}, on {pc.gpus} × {pc.hardware} "
        f"({capacity / GB:.0f} GB each); the longest S per recompute mode, each option set at its best group size"
    )
    print("\n".join(maxfit.fit_table(freq, rows, tuple(pc.recomputes))))
    print(rule + f" Lengths: multiples of {pc.seq_multiple} and of the layout's 2·Σ.")
    print(
        "Modelled memory agrees with the fake-tensor estimate within 1.1% on llama7b (costmodel/memory.py); "
        "nothing here is measured."
    )
    if pc.out:
        from tspbench.run.context import write_fit_records

        recs = fitrecords.fit_records(
            req.model,
            pc.gpus,
            (pc.hardware,),
            req.schemes,
            req.options,
            batch=batch,
            seq_multiple=pc.seq_multiple,
            max_degree=pc.max_degree,
            recomputes=pc.recomputes,
        )
        written = write_fit_records(Path(pc.out), recs)
        print(f"wrote {len(written)} fit records to {pc.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["fit"]:  # the subcommand spelling of fit=true
        argv = ["fit=true", *argv[1:]]
    if cli.wants_help(argv):
        intro = (
            "Rank every implemented layout that fits the device's memory by predicted cluster tokens/s (closed-form "
            "cost model; `python -m tspbench.validate` shows how far to trust it)."
        )
        print(cli.help_text("tspbench.plan", PlanConfig(), intro, EXAMPLES))
        return 0
    try:
        pc = cli.parse_options(PlanConfig, argv)
        req = request(pc)
        if pc.family is not None and not pc.fit:
            raise ConfigError("family= is a fit=true option: add fit=true (python -m tspbench.plan fit family=...)")
        if pc.fit:
            return fit_main(pc, req)
        t0 = time.perf_counter()
        ranked, n = plan(req)
        dt = time.perf_counter() - t0
    except (ConfigError, ValueError) as e:
        print(f"tspbench.plan: {e}", file=sys.stderr)
        return 2
    model, seq_len, gpus = req.model, req.seq_len, req.gpus
    print(
        f"{n} layouts enumerated in {dt:.2f} s (closed form), {len(ranked)} fit {pc.hardware} memory; "
        f"{model.name}, S={seq_len}, {gpus} GPUs, overlap={pc.overlap}"
    )
    head = ("layout", "mem GB", "step s", "exp comm s", "dp", "tok/s/GPU", "cluster tok/s", "margin")
    print(
        f"{head[0]:52s} {head[1]:>8s} {head[2]:>8s} {head[3]:>10s} {head[4]:>5s} {head[5]:>10s} {head[6]:>13s} "
        f"{head[7]:>7s}"
    )
    for i, lay in enumerate(ranked[: pc.top]):
        m = margin_pct(ranked, i)
        print(
            f"{lay.name:52s} {lay.mem_bytes / GB:8.1f} {lay.step_s:8.3f} {lay.exposed_comm_s:10.3f} "
            f"{lay.par.dp:5d} {lay.tokens_per_s_per_gpu:10.1f} {lay.tokens_per_s_cluster:13.4g} "
            + (f"{m:6.1f}%" if m is not None else "      -")
        )
    print(fit_line(req))
    print(verdict_line(ranked, req, pc))
    print(trust_line())
    if pc.out:
        out = Path(pc.out)
        recs = plan_records(
            ranked, model=model.name, seq_len=seq_len, gpus=gpus, hardware=pc.hardware, overlap=pc.overlap
        )
        written = write_records(out, recs, kind="plan")  # atomic, each record guarded (record/kinds.py)
        bad = [r for r in written if r.get("status") == "implausible"]
        print(
            f"wrote {len(written)} records to {out}" + (f" ({len(bad)} implausible: {bad[0]['reason']})" if bad else "")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
