"""The headline: TSP against the strongest baseline, each side at its best, in one sentence and two small tables.

`python -m tspbench.headline` prints the Markdown block the README carries between its `headline` markers
(tests/unit/test_headline.py keeps the two equal). Every number is modelled (tspbench.predict.costmodel on the
MI300X profile; memory checked against the fake-tensor estimate, time not validated on hardware: see
`python -m tspbench.validate`) for llama7b, bf16, AdamW with fp32 master, m, v, under the `schedule` overlap rule
(what each scheme's issue order hides, docs/method.md#choice-overlap) with every priced mechanism the code has
(costmodel.workload.Pricing). Each side is at its best: for TSP and for every baseline scheme, the planner's fastest
configuration that fits the device, over every option the code implements (tspbench/paper/best.py: recompute,
micro-batch, exchanges, Megatron-SP, buckets, vocabulary, MLP exchange, kept K/V); the table says which options won.
The strongest baseline is the fastest baseline at its best (within 0.5% of it: the one needing less memory). The
readings: the paper's setting (128K, 1,024 GPUs in replicas of 8, training), the same as a forward pass (the paper's
1,024-GPU figure is a forward number), 16K, and replicas of 16 across two nodes.
"""

from __future__ import annotations

from tspbench.paper.best import Reading, best_per_scheme, describe, strongest_baseline
from tspbench.paper.setting import LLAMA7B, N_GPUS, SEQ_16K, SEQ_128K
from tspbench.parallel import scheme
from tspbench.predict.planner import Layout

GPUS_PER_REPLICA = 8
MAIN = Reading("training, 128K, replicas of 8", LLAMA7B, SEQ_128K, N_GPUS, GPUS_PER_REPLICA)
"""The headline's setting: the paper's (llama7b, 128K tokens, 1,024 MI300X in replicas of 8), a training step."""
READINGS = (
    MAIN,
    Reading("forward only, 128K, replicas of 8", LLAMA7B, SEQ_128K, N_GPUS, GPUS_PER_REPLICA, mode="forward"),
    Reading("training, 16K, replicas of 8", LLAMA7B, SEQ_16K, N_GPUS, GPUS_PER_REPLICA),
    Reading("training, 128K, replicas of 16 (two nodes)", LLAMA7B, SEQ_128K, N_GPUS, 16),
)
"""The settings of the second table."""


def _row(lay: Layout | None) -> str:
    if lay is None:
        return "nothing fits | — | —"
    return f"{describe(lay)} | {lay.mem_bytes / 1e9:.1f} | {lay.tokens_per_s_per_gpu:,.0f}"


def verdict(ratio: float, val: dict) -> str:
    """A modelled ratio closer to 1 than the model's own median error on published tokens/s is within that error,
    never a win or a loss."""
    err = val.get("tokens_per_s_per_gpu", {}).get("median_abs_pct")
    if err is None:
        return "the model has no validated error to weigh it against"
    if abs(ratio - 1) * 100 < err:
        return f"within the model's error (median |error| {err:.0f}% on published tokens/s)"
    side = "ahead" if ratio > 1 else "behind"
    return f"TSP {side}, by more than the model's median |error| of {err:.0f}% on published tokens/s"


def headline_markdown() -> str:
    best = best_per_scheme(MAIN)
    tsp, base = best["tsp"], strongest_baseline(best)
    assert tsp is not None and base is not None, "the headline needs TSP and a baseline that fit"
    ratio = tsp.tokens_per_s_per_gpu / base.tokens_per_s_per_gpu
    dp = N_GPUS // GPUS_PER_REPLICA
    from tspbench.predict.published import validation_errors

    val = validation_errors()
    sentence = (
        f"**Modelled, not measured:** training llama7b at 128K tokens on 1,024 MI300X in replicas of "
        f"{GPUS_PER_REPLICA}, each side at its best (the planner's fastest options that fit), TSP — {describe(tsp)} — "
        f"needs {tsp.mem_bytes / 1e9:.1f} GB per GPU and runs at {tsp.tokens_per_s_per_gpu:,.0f} tokens/s per GPU; "
        f"the strongest baseline, {describe(base)}, needs {base.mem_bytes / 1e9:.1f} GB and runs at "
        f"{base.tokens_per_s_per_gpu:,.0f} (TSP ÷ it = {ratio:.2f}×: {verdict(ratio, val)})."
    )
    lines = [
        sentence,
        "",
        f"| each scheme at its best ({GPUS_PER_REPLICA} GPUs per replica, 128K, training) | memory per GPU (GB) "
        f"| tokens/s per GPU | cluster ({dp} replicas) |",
        "|---|---|---|---|",
    ]
    for name, lay in best.items():
        if lay is None:
            lines.append(f"| {scheme(name).title}: nothing fits | — | — | — |")
            continue
        lines.append(f"| {_row(lay)} | {lay.tokens_per_s_cluster / 1e6:.2f}M |")
    lines += [
        "",
        "| reading | TSP at its best | GB | tokens/s per GPU | strongest baseline at its best | GB "
        "| tokens/s per GPU | TSP ÷ it |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for reading in READINGS:
        b = best if reading is MAIN else best_per_scheme(reading)
        t, s = b["tsp"], strongest_baseline(b)
        r = f"{t.tokens_per_s_per_gpu / s.tokens_per_s_per_gpu:.2f}×" if t and s else "—"
        lines.append(f"| {reading.name} | {_row(t)} | {_row(s)} | {r} |")

    names = {
        "tokens_per_s_per_gpu": "tokens/s",
        "mfu_pct": "MFU",
        "step_s": "iteration time",
        "peak_mem_gib": "peak memory",
    }
    parts = [
        f"{label} median {val[q]['median_abs_pct']:.0f}%, worst {val[q]['worst_abs_pct']:.0f}% ({val[q]['n']:.0f} "
        f"row{'s' if val[q]['n'] != 1 else ''})"
        for q, label in names.items()
        if q in val
    ]
    trust = (
        "How far to trust the predictions: on the validation subset of published runs (conf/published/) the absolute "
        "errors are: " + "; ".join(parts) + " (per row: `python -m tspbench.validate`, the report's trust section)."
        if parts
        else "The cost model has no validation rows."
    )
    lines += [
        "",
        trust,
        "",
        "Setting: bf16, AdamW with fp32 master/m/v; recompute and micro-batch (1, 2 or 4) are among each side's "
        "options; memory from the cost model (agrees with the fake-tensor estimate of the scheme code), with no "
        "headroom beyond the device's capacity; throughput from the α–β + roofline model with the `schedule` overlap "
        "rule and every overlap the code issues, not validated on these GPUs (`python -m tspbench.validate` shows how "
        "far the model is from published runs). What each change since the first headline did: `python -m "
        "tspbench.headline changes=true`. Regenerate: `python -m tspbench.headline readme=README.md`.",
    ]
    return "\n".join(lines)
