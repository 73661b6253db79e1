"""Report figures: the registry (id, title, function) in report order, and `make_figures`, which draws them.

Each `fig_*` (fig_memory.py: memory, breakdown, KV cache, predicted vs measured; fig_time.py: throughput,
communication, step split, power, energy, decode latency) takes build.py's run DataFrame and returns a matplotlib
Figure and its caption, or a string saying what data it needs; plot.py holds the shared drawing helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import seaborn as sns

from tspbench.report.fig_fit import fig_fit
from tspbench.report.fig_memory import fig_breakdown, fig_kv, fig_memory, fig_prediction
from tspbench.report.fig_time import fig_comm, fig_decode, fig_energy, fig_power, fig_step_split, fig_throughput
from tspbench.report.plot import NO_DATA, encode, gpu_panels, palette

__all__ = ["FIGURES", "WITH_CLAIMS", "encode", "make_figures", "palette"]

FIGURES: tuple[tuple[str, str, Callable[..., Any]], ...] = (
    ("fig-memory", "Peak memory per device vs sequence length", fig_memory),  # (df, pal, claims)
    ("fig-breakdown", "Memory breakdown per scheme", fig_breakdown),
    ("fig-throughput", "Tokens/s per device vs sequence length", fig_throughput),
    ("fig-fit", "What fits: longest training sequence per scheme vs GPU memory (modelled)", fig_fit),
    ("fig-comm", "Communication volume per layer vs sequence length", fig_comm),
    ("fig-step", "Step time: compute vs exposed communication", fig_step_split),
    ("fig-power", "Power over time", fig_power),
    ("fig-energy", "Energy per token", fig_energy),
    ("fig-prediction", "Predicted vs measured", fig_prediction),
    ("fig-kv", "Serving: KV cache per device vs context length", fig_kv),
    ("fig-decode", "Serving: decode latency per token vs context length", fig_decode),
)

WITH_CLAIMS = {"fig-memory", "fig-throughput"}  # figures that draw the paper's published values
WITH_RECORDS = {"fig-comm": "crossover", "fig-fit": "fit"}
"""Figures that also draw records of another kind (tspbench/run/context.py writes them): figure id → record kind."""


def make_figures(
    df: pd.DataFrame, claims: list[dict] | None = None, records: dict[str, list[dict]] | None = None
) -> list[dict]:
    """[{id, title, src (data: URI) or None, caption or note}] in report order; `claims` (the paper's
    published numbers) are drawn as markers on the memory and throughput figures; `records` (kind → records: the
    crossover and fit records) on the figures of WITH_RECORDS. Runs of a cluster larger than one node (the
    modelled 1,024-GPU point) get panels of their own (plot.gpu_panels)."""
    df = gpu_panels(df)
    pal = palette(df)
    out = []
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.8):
        for fid, title, fn in FIGURES:
            extra = (records or {}).get(WITH_RECORDS.get(fid, ""), [])
            if fid == "fig-fit":  # drawn from its own records, runs or none
                got: Any = fn(df, pal, extra)
            elif df.empty:
                got = f"{NO_DATA}: no runs in these results."
            elif fid in WITH_RECORDS:
                got = fn(df, pal, extra)
            else:
                got = fn(df, pal, claims or []) if fid in WITH_CLAIMS else fn(df, pal)
            if isinstance(got, str):
                out.append({"id": fid, "title": title, "src": None, "caption": got})
            else:
                fig, caption = got
                out.append({"id": fid, "title": title, "src": encode(fig), "caption": caption})
    return out
