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
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tspbench.config import GB, ConfigError, model_preset
from tspbench.parallel import SCHEMES, SP_VARIANTS, VOCAB, LayoutOptions, scheme
from tspbench.predict.costmodel import OVERLAPS
from tspbench.predict.planner import BATCHES, MAX_DEGREE, PLAN_ORDER, PlanRequest, margin_pct, plan, plan_records
from tspbench.record.store import write_records

HELP = f"""usage: python -m tspbench.plan [key=value ...]
Rank every implemented layout that fits the device's memory by predicted cluster tokens/s (closed-form cost
model; `python -m tspbench.validate` shows how far to trust it).

  model=NAME        model preset, conf/model/NAME.yaml (default llama7b)
  seq_len=N         tokens per sequence (default 131072)
  gpus=N            devices in the cluster; dp = gpus / group size fills it (default 8)
  hardware=NAME     device profile, conf/hardware/NAME.yaml (default mi300x)
  overlap=RULE      {" | ".join(OVERLAPS)}: communication added to compute, hidden ideally, or as the code's
                    issue order allows (default schedule; docs/method.md#choice-overlap)
  batches=B,B,...   micro-batch sizes to try (default {",".join(map(str, BATCHES))})
  max_degree=N      largest group size tried (default {MAX_DEGREE})
  top=N             layouts printed (default 10)
  out=PATH          write one JSONL record per fitting layout (default: none)
layouts enumerated (tspbench.parallel.layouts; each a comma-separated list):
  schemes=S,S,...          schemes (default {",".join(PLAN_ORDER)})
  sp_variants=V,V,...      K/V exchanges of sp, tp_sp, fsdp_sp (default {",".join(SP_VARIANTS)})
  msps=B,B,...             tp_sp with Megatron-SP on T (true) and/or the plain ablation (false) (default true,false)
  vocabs=V,V,...           embedding / LM-head layouts: {" | ".join(VOCAB)} (default auto; ring: tsp only)
  kv_bucket_heads=K,K,...  tsp's KV heads per K/V all-gather, 0 = one per owner (default 0)"""

DEFAULTS = {
    "model": "llama7b",
    "seq_len": "131072",
    "gpus": "8",
    "hardware": "mi300x",
    "overlap": "schedule",
    "batches": ",".join(map(str, BATCHES)),
    "max_degree": str(MAX_DEGREE),
    "top": "10",
    "out": "",
    "schemes": ",".join(PLAN_ORDER),
    "sp_variants": ",".join(SP_VARIANTS),
    "msps": "true,false",
    "vocabs": "auto",
    "kv_bucket_heads": "0",
}
TRUST = {"tokens_per_s_per_gpu": "tokens/s", "step_s": "step time", "peak_mem_gib": "peak memory"}


def _int(kv: dict[str, str], key: str) -> int:
    try:
        return int(kv[key])
    except ValueError:
        raise ConfigError(f"{key}={kv[key]!r} must be an integer") from None


def _list(kv: dict[str, str], key: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    values = tuple(v.strip() for v in kv[key].split(",") if v.strip())
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise ConfigError(f"{key}={kv[key]!r}: each must be one of {', '.join(allowed)}")
    return values


def layout_options(kv: dict[str, str]) -> tuple[tuple[str, ...], LayoutOptions]:
    """(schemes, option axes) of the enumeration from the command line's lists."""
    schemes = _list(kv, "schemes", SCHEMES)
    msps = tuple(v == "true" for v in _list(kv, "msps", ("true", "false")))
    try:
        buckets = tuple(int(v) for v in kv["kv_bucket_heads"].split(","))
    except ValueError:
        raise ConfigError(f"kv_bucket_heads={kv['kv_bucket_heads']!r} must be comma-separated integers ≥ 0") from None
    if any(b < 0 for b in buckets):
        raise ConfigError(f"kv_bucket_heads={kv['kv_bucket_heads']!r} must be comma-separated integers ≥ 0")
    vocabs = _list(kv, "vocabs", VOCAB)
    for v in vocabs:  # a value no enumerated scheme takes would silently enumerate nothing
        if not any(v in scheme(s).vocabs for s in schemes):
            raise ConfigError(f"vocabs={v} is taken by none of schemes={','.join(schemes)}")
    opts = LayoutOptions(
        sp_variants=_list(kv, "sp_variants", SP_VARIANTS), msps=msps, vocabs=vocabs, kv_bucket_heads=buckets
    )
    return schemes, opts


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(HELP)
        return 0
    kv = dict(DEFAULTS)
    for a in argv:
        k, sep, v = a.partition("=")
        if not sep or k not in kv:
            print(f"error: {a!r}: expected key=value with key one of {', '.join(kv)}", file=sys.stderr)
            return 2
        kv[k] = v
    try:
        model = model_preset(kv["model"])
        seq_len, gpus, top, max_degree = (_int(kv, k) for k in ("seq_len", "gpus", "top", "max_degree"))
        try:
            batches = tuple(int(b) for b in kv["batches"].split(","))
        except ValueError:
            raise ConfigError(f"batches={kv['batches']!r} must be comma-separated integers, e.g. 1,2,4") from None
        schemes, options = layout_options(kv)
        t0 = time.perf_counter()
        ranked, n = plan(
            PlanRequest(
                model,
                seq_len,
                gpus,
                kv["hardware"],
                max_degree=max_degree,
                batches=batches,
                overlap=kv["overlap"],
                options=options,
                schemes=schemes,
            )
        )
        dt = time.perf_counter() - t0
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"{n} layouts enumerated in {dt:.2f} s (closed form), {len(ranked)} fit {kv['hardware']} memory; "
        f"{model.name}, S={seq_len}, {gpus} GPUs, overlap={kv['overlap']}"
    )
    head = ("layout", "mem GB", "step s", "exp comm s", "dp", "tok/s/GPU", "cluster tok/s", "margin")
    print(
        f"{head[0]:52s} {head[1]:>8s} {head[2]:>8s} {head[3]:>10s} {head[4]:>5s} {head[5]:>10s} {head[6]:>13s} "
        f"{head[7]:>7s}"
    )
    for i, lay in enumerate(ranked[:top]):
        m = margin_pct(ranked, i)
        print(
            f"{lay.name:52s} {lay.mem_bytes / GB:8.1f} {lay.step_s:8.3f} {lay.exposed_comm_s:10.3f} "
            f"{lay.par.dp:5d} {lay.tokens_per_s_per_gpu:10.1f} {lay.tokens_per_s_cluster:13.4g} "
            + (f"{m:6.1f}%" if m is not None else "      -")
        )
    print(trust_line())
    if kv["out"]:
        out = Path(kv["out"])
        recs = plan_records(
            ranked, model=model.name, seq_len=seq_len, gpus=gpus, hardware=kv["hardware"], overlap=kv["overlap"]
        )
        written = write_records(out, recs, kind="plan")  # atomic, each record guarded (record/kinds.py)
        bad = [r for r in written if r.get("status") == "implausible"]
        print(
            f"wrote {len(written)} records to {out}" + (f" ({len(bad)} implausible: {bad[0]['reason']})" if bad else "")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
