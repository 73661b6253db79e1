"""The paper's scale without GPUs: cost-model predictions beside the published numbers, printed.

Uses only `tspbench.predict.costmodel` (closed-form formulas, no torch.distributed) and `conf/claims.yaml`. The
tables live beside their subject and are re-exported here:

    setting.py     the reference model LLAMA7B, lengths, cluster, PAPER_MEMORY_SETTING, the layouts compared
    memory.py      paper_memory_table (every memory claim beside its prediction) and memory_setting_scan (how the
                   one setting was chosen)
    throughput.py  paper_throughput_table, throughput_assumptions, plausibility_173m, crossover_table

`print_tables(names)` prints an experiment's `paper_tables` (tspbench.run.experiment.PAPER_TABLES).
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from tspbench.paper.claims import load_claims
from tspbench.paper.memory import memory_setting_scan, paper_memory_table
from tspbench.paper.setting import (
    DEGREE,
    LLAMA7B,
    N_GPUS,
    PAPER_MEMORY_SETTING,
    SEQ_16K,
    SEQ_128K,
    UNIT_BYTES,
    MemorySetting,
    paper_layouts,
)
from tspbench.paper.throughput import (
    crossover_table,
    paper_throughput_table,
    plausibility_173m,
    table_verdict,
    throughput_assumptions,
)

__all__ = [
    "DEGREE",
    "LLAMA7B",
    "N_GPUS",
    "PAPER_MEMORY_SETTING",
    "SEQ_16K",
    "SEQ_128K",
    "UNIT_BYTES",
    "MemorySetting",
    "crossover_table",
    "memory_setting_scan",
    "paper_layouts",
    "paper_memory_table",
    "paper_throughput_table",
    "plausibility_173m",
    "print_tables",
    "throughput_assumptions",
]

THROUGHPUT_COLUMNS = (
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
"""The columns of the printed throughput table."""


def _print_memory() -> None:
    df = paper_memory_table()
    print(f"paper memory (modelled, GB per MI300X; one setting for all schemes: {PAPER_MEMORY_SETTING}):")
    print(df.to_string(index=False))


def _print_throughput() -> None:
    df = paper_throughput_table()
    cols = [c for c in THROUGHPUT_COLUMNS if c in df]
    claims = {c["id"]: c["value"] for c in load_claims()}
    print(
        "paper throughput, 1,024 × MI300X, S = 128K, 8 GPUs per replica, forward (modelled; tokens/s per "
        "replica, per GPU and for the cluster; tsp_speedup = TSP tokens/s ÷ this layout's, beside the "
        f"claimed {claims['tput_1024_tsp'] / 1e6:.0f}M, {claims['ratio_blog']:g}× (blog) and "
        f"{claims['ratio_press']:g}× (press); both readings of the claim: the full model and one layer):"
    )
    print(df[cols].to_string(index=False))
    print("\n".join(throughput_assumptions()))
    print(f"verdict of this table's setting: {table_verdict().sentence()}")
    from tspbench.paper.headline import main_comparison

    main = main_comparison()[1]
    print(f"verdict of the headline's setting ({main.setting}): {main.sentence()}")


def _print_plausibility() -> None:
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


def _print_crossover() -> None:
    print("communication per layer (modelled GB, forward) vs sequence length, TSP vs TP:")
    print(crossover_table().to_string(index=False))


PRINTERS: dict[str, Callable[[], None]] = {
    "memory": _print_memory,
    "throughput": _print_throughput,
    "plausibility": _print_plausibility,
    "crossover": _print_crossover,
}
"""Each paper table's printer, by the name an experiment's `paper_tables` gives."""


def print_tables(names: list[str]) -> None:
    """The `paper_tables` of an experiment, as text (all numbers modelled: tspbench.predict.costmodel on the MI300X
    profile; claims from conf/claims.yaml)."""
    with pd.option_context(
        "display.width", 220, "display.max_columns", 30, "display.float_format", lambda v: f"{v:,.3g}"
    ):
        for name in names:
            if name not in PRINTERS:
                raise ValueError(
                    f"paper_tables: {name!r} is unknown; allowed: memory, throughput, plausibility, crossover"
                )
            PRINTERS[name]()
