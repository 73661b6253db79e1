"""The report's drawing helpers: seaborn styling + matplotlib -> SVG `data:` URIs, the shared palette, facets,
the sequence-length axis, method-styled series and the paper's published points.

SVG (text as paths) inside a data: URI keeps the HTML self-contained and offline, keeps each figure's ids private
to its own document, and scales cleanly. Figures use `matplotlib.figure.Figure` directly, not pyplot, so building a
report leaves no global pyplot state behind.
"""

from __future__ import annotations

import base64
import io
import math

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from tspbench.report.frame import CPU_NOTE, fmt, fmt_seq, num

METHOD_STYLE = {"measured": ("-", "o"), "estimated": ("--", "s"), "modelled": (":", "^")}
MAX_FACETS = 4  # more panels than this stop being readable at 1280 px; the rest are named in a note
NO_DATA = "no data for this figure"
AGREE_PCT = 1.0  # estimated and modelled within this of each other are drawn as one series


def encode(fig: Figure) -> str:
    buf = io.BytesIO()
    # metadata Date=None keeps the output reproducible for identical data.
    # constrained layout already fits labels, so no bbox_inches="tight" (a second full draw).
    fig.savefig(buf, format="svg", metadata={"Date": None})
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def palette(df: pd.DataFrame) -> dict[str, tuple]:
    """One colour per scheme+layout label, shared by every figure (df is already in scheme order)."""
    labels = list(dict.fromkeys(df["label"])) if not df.empty else []
    name = "tab10" if len(labels) <= 10 else "tab20" if len(labels) <= 20 else "husl"  # distinct hues first
    colours = sns.color_palette(name, max(len(labels), 1))
    return dict(zip(labels, colours))


def facets(df: pd.DataFrame, key: str) -> tuple[Figure, list, list[str], str]:
    """A figure with one panel per value of `key` (biggest groups first, at most MAX_FACETS)."""
    names = list(df[key].value_counts().index)
    shown, dropped = names[:MAX_FACETS], names[MAX_FACETS:]
    ncols = 1 if len(shown) == 1 else 2
    nrows = math.ceil(len(shown) / ncols)
    fig = Figure(figsize=(6.2 * ncols, 4.0 * nrows), layout="constrained")
    axes = [fig.add_subplot(nrows, ncols, i + 1) for i in range(len(shown))]
    note = f" Not shown (more than {MAX_FACETS} panels): {', '.join(dropped)}." if dropped else ""
    return fig, axes, shown, note


def seq_axis(ax, xs) -> None:
    """Log-2 sequence-length axis labelled 16K, 32K, ..."""
    ticks = sorted({int(x) for x in xs if num(x)})
    ax.set_xscale("log", base=2)
    if ticks:
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_seq(v)))
    ax.set_xlabel("sequence length S")


def lines(ax, sub: pd.DataFrame, y: str, pal: dict, scale: float = 1.0) -> None:
    """One series per (scheme layout, method): colour = layout, line style and marker = method. Measured
    points are markers only (nothing was measured between them); estimated and modelled series that agree
    within AGREE_PCT at every shared point are drawn once, with their largest difference in the legend."""
    series = {
        key: g.dropna(subset=["seq_len", y]).groupby("seq_len")[y].last().astype(float)
        for key, g in sub.groupby(["label", "method"], sort=False)
    }
    for (label, method), g in series.items():
        if g.empty:
            continue
        name = f"{label} · {method}"
        if method == "estimated" and (label, "modelled") in series:
            other = series[(label, "modelled")]
            common = g.index.intersection(other.index)
            if len(common) == len(g) == len(other):
                diff = max(abs(g[s] - other[s]) / abs(other[s]) * 100 if other[s] else 0.0 for s in common)
                if diff <= AGREE_PCT:
                    series[(label, "modelled")] = other.iloc[0:0]  # drawn here, once
                    name = f"{label} · estimated = modelled (differ ≤ {diff:.2f}%)"
        ls, marker = METHOD_STYLE.get(method, ("-.", "d"))
        ax.plot(
            g.index.astype(float),
            g.to_numpy() * scale,
            ls="none" if method == "measured" else ls,
            marker=marker,
            color=pal.get(label),
            label=name,
        )


def legend_outside(ax) -> None:
    """The legend to the right of the axes, never over the data (constrained layout makes room for it)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)


def mem_unit(top_gb: float | None) -> tuple[float, str]:
    """(factor from GB, unit) for memory of this magnitude: GB, or MB for tiny runs."""
    return (1.0, "GB") if top_gb is None or top_gb >= 1.0 else (1e3, "MB")


def panel_title(ax, name: str, is_cpu: bool) -> None:
    ax.set_title(name + (f"\n{CPU_NOTE}" if is_cpu else ""), fontsize=9, color="firebrick" if is_cpu else "black")


def ok_with(df: pd.DataFrame, *cols: str) -> pd.DataFrame:
    if df.empty or any(c not in df for c in cols):
        return df.iloc[0:0]
    mask = df["status"] == "ok"
    for c in cols:
        mask &= df[c].map(lambda v: num(v) is not None)
    return df[mask]


def paper_points(ax, claims: list[dict], unit: str, name: str, scale: float, per_gpu: bool = False) -> list[float]:
    """The published values of `unit` for the hardware of this panel, as black stars at their sequence length;
    returns those sequence lengths (for the axis ticks)."""
    pts = [
        c
        for c in claims
        if c.get("unit") == unit
        and num(c.get("seq_len"))
        and num(c.get("value"))
        and (not c.get("hardware") or str(c["hardware"]) in name)
    ]
    for i, c in enumerate(pts):
        v = float(c["value"]) / ((num(c.get("n_gpus")) or 1) if per_gpu else 1)
        ax.scatter(
            [float(c["seq_len"])],
            [v * scale],
            marker="*",
            s=140,
            color="black",
            zorder=6,
            label=f"paper {c.get('label') or ''}".strip() if i == 0 else None,
        )
    return [float(c["seq_len"]) for c in pts]


def metric_vs_seq(
    ok: pd.DataFrame,
    col: str,
    ylabel: str,
    pal: dict,
    integer_ticks: bool = False,
    paper: list[dict] | None = None,
    scale: float = 1.0,
):
    """One panel per context: `col` (× scale) against sequence length, a line per scheme."""
    fig, axes, names, note = facets(ok, "ctx")
    for ax, name in zip(axes, names):
        sub = ok[ok["ctx"] == name]
        lines(ax, sub, col, pal, scale)
        paper_s = paper_points(ax, paper, "tokens/s", name, 1.0, per_gpu=True) if paper else []
        seq_axis(ax, list(sub["seq_len"]) + paper_s)
        if integer_ticks:
            ax.set_ylim(bottom=0)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v, 0)))
        ax.set_ylabel(ylabel)
        panel_title(ax, name, bool(sub["is_cpu"].any()))
        legend_outside(ax)
    return fig, note
