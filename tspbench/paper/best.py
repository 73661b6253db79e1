"""Each side at its best: for TSP and for every baseline scheme, the fastest configuration within the device's memory
from the options that scheme really has, chosen by the planner (tspbench/predict/planner.py), and the options that
won (docs/method.md#choice-overlap, #published).

The options searched are every one the code implements: recompute none / selective / full, micro-batch 1, 2, 4, and
each scheme's own — K/V exchanges (allgather, ring, Ulysses), Megatron-SP on and off, every T × Σ factorisation, the
vocabulary split or the ring, TSP's K/V buckets, MLP exchange and kept K/V, FSDP's shard group. A reading is one
setting (model, sequence length, GPUs, group size, train or forward); every number is modelled (closed form).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tspbench.config import ModelConfig
from tspbench.parallel import MLP_EXCHANGES, RECOMPUTE, SP_VARIANTS, VOCAB, LayoutOptions, scheme
from tspbench.predict.costmodel import PRICING, Pricing
from tspbench.predict.planner import BATCHES, Layout, PlanRequest, plan
from tspbench.predict.verdict import Comparison, Side, compare, side_of

EVERY_OPTION = LayoutOptions(
    sp_variants=SP_VARIANTS,
    msps=(True, False),
    vocabs=VOCAB,
    kv_bucket_heads=(0, 1, 2),
    mlp_exchanges=MLP_EXCHANGES,
    regather_kvs=(True, False),
    dp_shards=(1,),
)
"""Every option the code implements (FSDP's shard group stays the replica: HSDP, as torchtitan runs it)."""
SIDES = ("tsp", "tp", "tp_msp", "sp", "tp_sp", "fsdp_sp")
"""The method first, then every baseline scheme."""


@dataclass(frozen=True)
class Reading:
    """One setting at which the two sides are compared."""

    name: str
    """How the table names it."""
    model: ModelConfig
    """The model."""
    seq_len: int
    """S: tokens per sequence."""
    gpus: int
    """Devices in the cluster."""
    degree: int
    """GPUs per model replica (the group size); dp = gpus / degree."""
    mode: str = "train"
    """train (the step, with its gradients and optimizer state) or forward (one forward pass)."""
    hardware: str = "mi300x"
    """Hardware profile (conf/hardware)."""


def ranked_per_scheme(
    reading: Reading,
    pricing: Pricing = PRICING,
    options: LayoutOptions | Mapping[str, LayoutOptions] = EVERY_OPTION,
    recomputes: Sequence[str] = RECOMPUTE,
    batches: Sequence[int] = BATCHES,
    headroom: bool = True,
) -> dict[str, list[Layout]]:
    """Scheme → its fitting layouts at the reading's group size, fastest first (the planner's ranking), over
    `options` (one LayoutOptions for every scheme, or one per scheme name), `recomputes` and `batches`; a layout
    fits with the planner's allocator reserve and runtime headroom (`headroom`; false: the whole device, the rule
    before them)."""
    out: dict[str, list[Layout]] = {}
    for name in SIDES:
        opts = options.get(name, LayoutOptions()) if isinstance(options, Mapping) else options
        req = PlanRequest(
            reading.model,
            reading.seq_len,
            reading.gpus,
            reading.hardware,
            options=opts,
            schemes=(name,),
            degrees=(reading.degree,),
            mode=reading.mode,
            pricing=pricing,
            recomputes=tuple(recomputes),
            batches=tuple(batches),
        )
        if not headroom:
            req = replace(req, reserve=0.0, headroom=0.0)
        out[name] = plan(req)[0]
    return out


def best_per_scheme(
    reading: Reading, pricing: Pricing = PRICING, options: LayoutOptions = EVERY_OPTION
) -> dict[str, Layout | None]:
    """Scheme → the planner's fastest fitting layout of it at the reading's group size (None: nothing fits)."""
    return {
        name: (ranked[0] if ranked else None) for name, ranked in ranked_per_scheme(reading, pricing, options).items()
    }


def strongest_baseline(best: dict[str, Layout | None]) -> Layout | None:
    """The fastest baseline among the schemes' bests (within 0.5% of it: the one needing less memory)."""
    base = [lay for name, lay in best.items() if lay is not None and scheme(name).role == "baseline"]
    if not base:
        return None
    top = max(lay.tokens_per_s_per_gpu for lay in base)
    near = [lay for lay in base if lay.tokens_per_s_per_gpu >= 0.995 * top]
    return min(near, key=lambda lay: lay.mem_bytes)


def options_won(lay: Layout) -> str:
    """The options a best layout uses, e.g. "kv_bucket_heads=1, full recompute, B=1"."""
    recompute = {"none": "no recompute", "selective": "selective recompute", "full": "full recompute"}
    return f"{recompute[lay.par.recompute]}, B={lay.batch}"


def describe(lay: Layout) -> str:
    """A best layout's label with the recompute and micro-batch that won, e.g. "TSP D=8 (mlp=biring; no recompute,
    B=2)"."""
    label = replace(lay.par, dp=1).label()
    inner = label[label.index("(") + 1 : -1] + "; " if label.endswith(")") else ""
    head = label[: label.index(" (")] if label.endswith(")") else label
    return f"{head} ({inner}{options_won(lay)})"


def sides_of(reading: Reading, *lays: Layout) -> list[Side]:
    """The verdict's Sides of layouts at a reading."""
    r = reading
    return [side_of(x, r.model, r.seq_len, r.mode, r.hardware, r.gpus) for x in lays]


def compare_best(reading: Reading, tsp: Layout, base: Layout) -> Comparison:
    """The verdict (tspbench/predict/verdict.py) of TSP at its best against the strongest baseline at its best."""
    sides = [
        side_of(x, reading.model, reading.seq_len, reading.mode, reading.hardware, reading.gpus) for x in (tsp, base)
    ]
    setting = (
        f"{reading.name}, {reading.model.name}, {reading.gpus:,} {reading.hardware} GPUs; each side's options as "
        f"printed; `schedule` overlap rule at the central value"
    )
    return compare(sides[0], sides[1], describe(tsp), describe(base), setting)
