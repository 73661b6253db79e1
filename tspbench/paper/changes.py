"""What each fair-fight change did to the headline: the before → after table (`python -m tspbench.headline
changes=true`).

"Before" is the first headline's pricing and selection: every TP collective synchronous, the data-parallel gradient
reduction exposed after the backward, Ulysses' one packed all-to-all, TSP's K/V gathers waited owner by owner, every
intra-node collective on the whole node's bandwidth, FSDP×SP's memory from an 8-way shard but its time from unit
collectives over all 1,024 ranks, and one fixed setting (full recompute, B = 1) with each scheme's default options
(TSP with none of its own; every K/V exchange; Megatron-SP on and off). Each change is then applied alone to that
state, and all of them together (the headline as it is now: tspbench/paper/headline.py). Every number is modelled
(closed form, MI300X profile, `schedule` overlap rule): this table says how much each modelling or code change moved
the verdict, not how fast anything runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from tspbench.paper.best import EVERY_OPTION, SIDES, Reading, describe, ranked_per_scheme, strongest_baseline
from tspbench.paper.headline import GPUS_PER_REPLICA
from tspbench.paper.setting import LLAMA7B, N_GPUS, SEQ_16K, SEQ_128K
from tspbench.parallel import SP_VARIANTS, LayoutOptions
from tspbench.predict.costmodel import Pricing, Workload, load_hardware, memory_breakdown
from tspbench.predict.planner import Layout, fits_device

FIRST_OPTIONS: Mapping[str, LayoutOptions] = {
    "sp": LayoutOptions(sp_variants=SP_VARIANTS),
    "tp_sp": LayoutOptions(sp_variants=SP_VARIANTS, msps=(True, False)),
    "fsdp_sp": LayoutOptions(sp_variants=SP_VARIANTS),
}
"""The first headline's candidates: TSP, TP and TP+Megatron-SP with their defaults, every K/V exchange, tp_sp at
every factorisation with Megatron-SP on and off (an absent scheme runs its defaults)."""
FIRST_PRICING = Pricing(
    links="node", dp_overlap=False, tp_async=False, ulysses_overlap=False, tsp_kv_pipeline=False, elementwise="none"
)
"""The first headline's time model: none of the priced mechanisms added since."""


@dataclass(frozen=True)
class State:
    """How the headline is priced and selected."""

    pricing: Pricing = FIRST_PRICING
    """The time model's priced mechanisms."""
    options: Mapping[str, LayoutOptions] = field(default_factory=lambda: dict(FIRST_OPTIONS))
    """Each scheme's option axes searched."""
    fixed: bool = True
    """Full recompute and B = 1 for every side (the first headline's setting); false: recompute and micro-batch are
    among each side's options."""
    headroom: bool = False
    """Layouts fit with the planner's allocator reserve and runtime headroom (planner.fits_device); false: the whole
    device (the first headline's rule)."""
    hsdp: bool = False
    """FSDP×SP's memory and time from one layout (HSDP, the shard group within the replica); false: memory from the
    replica's 8-way shard, time from unit collectives over every rank (the first headline's mismatch)."""


def _price(field_name: str) -> Callable[[State], State]:
    """The change that turns one of Pricing's overlaps on."""
    return lambda s: replace(s, pricing=replace(s.pricing, **{field_name: True}))  # type: ignore[arg-type]


def _links(s: State) -> State:
    return replace(s, pricing=replace(s.pricing, links="topology"))


def _elementwise(s: State) -> State:
    return replace(s, pricing=replace(s.pricing, elementwise="eager"))


def _tsp_options(s: State) -> State:
    return replace(s, options={**s.options, "tsp": EVERY_OPTION})


def _best_of_each(s: State) -> State:
    return replace(s, fixed=False, options={name: EVERY_OPTION for name in SIDES})


CHANGES: tuple[tuple[str, Callable[[State], State]], ...] = (
    ("TSP: K/V gathers pipelined across owners", _price("tsp_kv_pipeline")),
    ("TSP: its own options searched (K/V buckets, vocabulary, kept K/V, MLP exchange)", _tsp_options),
    ("every scheme: DP gradient reduction behind the backward", _price("dp_overlap")),
    ("TP family: Megatron's asynchronous backward overlap", _price("tp_async")),
    ("Ulysses: DeepSpeed's all-to-all overlap", _price("ulysses_overlap")),
    ("links as the hardware has them (p − 1 xGMI links per p-GPU group)", _links),
    ("every scheme: the elementwise work (norms, RoPE, SwiGLU, loss) at the memory bandwidth", _elementwise),
    ("FSDP×SP as HSDP (memory and time of one layout)", lambda s: replace(s, hsdp=True)),
    ("each side's best: recompute, micro-batch and every option searched", _best_of_each),
    ("fits with the allocator's reserve and the runtime's headroom", lambda s: replace(s, headroom=True)),
)
"""Each change since the first headline, as what it does to the state."""


def after() -> State:
    """Every change applied: the headline as it is."""
    s = State()
    for _, apply in CHANGES:
        s = apply(s)
    return s


def sides(state: State, reading: Reading) -> tuple[Layout | None, Layout | None]:
    """(TSP at its best, the strongest baseline at its best) under the state."""
    fixed = {"recomputes": ("full",), "batches": (1,)} if state.fixed else {}
    options = dict(state.options)
    if not state.hsdp:  # time from unit collectives over every rank: shard over all dp replicas
        options["fsdp_sp"] = replace(
            options.get("fsdp_sp", LayoutOptions()), dp_shards=(reading.gpus // reading.degree,)
        )
    ranked = ranked_per_scheme(reading, state.pricing, options, headroom=state.headroom, **fixed)  # type: ignore[arg-type]
    if not state.hsdp:  # ... and memory from the replica's shard, refitted
        hw = load_hardware(reading.hardware)
        refit = []
        for lay in ranked["fsdp_sp"]:
            work = Workload(reading.model, reading.seq_len, lay.batch, mode=reading.mode)
            mem = memory_breakdown(replace(lay.par, dp_shard=1), work, kv_cache=False)["total"]
            if fits_device(mem, hw.mem_bytes) if state.headroom else mem <= hw.mem_bytes:
                refit.append(replace(lay, mem_bytes=mem))
        ranked["fsdp_sp"] = refit
    best = {name: (r[0] if r else None) for name, r in ranked.items()}
    return best["tsp"], strongest_baseline(best)


def _cells(lay: Layout | None) -> str:
    if lay is None:
        return "nothing fits | — | —"
    return f"{describe(lay)} | {lay.mem_bytes / 1e9:.1f} | {lay.tokens_per_s_per_gpu:,.0f}"


def changes_markdown(seqs: tuple[int, ...] = (SEQ_16K, SEQ_128K)) -> str:
    """The before → after table: the first headline, each change alone, all together; at each sequence length."""
    first = State()
    rows = [("before (the first headline)", first)]
    rows += [(f"+ {name} (alone)", apply(first)) for name, apply in CHANGES]
    rows.append(("all together (the headline now)", after()))
    lines = [
        f"Modelled (closed form, MI300X profile, `schedule` overlap rule), llama7b training on {N_GPUS:,} GPUs in "
        f"replicas of {GPUS_PER_REPLICA}; each row applies one change to the first headline, the last all of them.",
        "",
        "| state | S | TSP | GB | tokens/s per GPU | strongest baseline | GB | tokens/s per GPU | TSP ÷ it |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, state in rows:
        for s in seqs:
            reading = Reading(f"{s // 1024}K", LLAMA7B, s, N_GPUS, GPUS_PER_REPLICA)
            t, b = sides(state, reading)
            r = f"{t.tokens_per_s_per_gpu / b.tokens_per_s_per_gpu:.2f}×" if t and b else "—"
            lines.append(f"| {label} | {s // 1024}K | {_cells(t)} | {_cells(b)} | {r} |")
    return "\n".join(lines)
