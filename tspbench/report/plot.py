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
import textwrap

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from tspbench.record.schema import CPU_NOTE
from tspbench.report.frame import fmt, fmt_seq, num

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


NODE_GPUS = 8
"""Runs on at most this many GPUs (one node) share a panel; a larger cluster (the modelled 1,024-GPU point) gets its
own, so a cluster's per-device numbers never share a line with a node's."""


def gpu_panels(df: pd.DataFrame) -> pd.DataFrame:
    """`ctx` with the cluster size appended ("· one node (≤ 8 GPUs)" / "· 1,024 GPUs") when the records span more
    than one node; unchanged otherwise."""
    if df.empty or "world_size" not in df:
        return df
    ws = df["world_size"].map(num)
    if not (ws > NODE_GPUS).any():
        return df
    where = ws.map(lambda n: f"{n:,.0f} GPUs" if n and n > NODE_GPUS else f"one node (≤ {NODE_GPUS} GPUs)")
    return df.assign(ctx=df["ctx"].astype(str) + " · " + where)


def cluster_panel(name: str) -> bool:
    """Is this panel (plot.gpu_panels' suffix) a cluster larger than one node (drawn after the node's panels)?"""
    return name.endswith(" GPUs") and "one node" not in name


def facets(df: pd.DataFrame, key: str, ncols: int | None = None) -> tuple[Figure, list, list[str], str]:
    """A figure with one panel per value of `key` (biggest groups first, at most MAX_FACETS); `ncols=1`: one
    full-width panel per row (for panels with many series)."""
    counts = df[key].value_counts()
    names = sorted(counts.index, key=lambda n: (cluster_panel(str(n)), -counts[n]))  # one node's panels first
    shown, dropped = names[:MAX_FACETS], names[MAX_FACETS:]
    explicit = ncols is not None
    ncols = ncols or (1 if len(shown) == 1 else 2)
    nrows = math.ceil(len(shown) / ncols)
    width = 12.4 if ncols == 1 and (len(shown) > 1 or explicit) else 6.2 * ncols
    fig = Figure(figsize=(width, 4.0 * nrows), layout="constrained")
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


def lines(ax, sub: pd.DataFrame, y: str, pal: dict, scale: float = 1.0, dodge: float = 0.0) -> None:
    """One series per (scheme layout, method): colour = layout, line style and marker = method. Measured
    points are markers only (nothing was measured between them); estimated and modelled series that agree
    within AGREE_PCT at every shared point are drawn once, with their largest difference in the legend, and so are
    layouts whose series are equal (within EQUAL_PCT: one line would hide the other), named together. `dodge`:
    the series are spread over ±dodge/2 octaves around each sequence length so that equal values do not overlap
    (the caption must say so)."""
    series = {
        key: g.dropna(subset=["seq_len", y]).groupby("seq_len")[y].last().astype(float)
        for key, g in sub.groupby(["label", "method"], sort=False)
    }
    names: dict[tuple, str] = {}
    for (label, method), g in series.items():
        if g.empty:
            continue
        names[(label, method)] = f"{label} · {method}"
        if method == "estimated" and (label, "modelled") in series:
            diff = _max_diff(g, series[(label, "modelled")])
            if diff is not None and diff <= AGREE_PCT:
                series[(label, "modelled")] = series[(label, "modelled")].iloc[0:0]  # drawn here, once
                names[(label, method)] = f"{label} · estimated = modelled (differ ≤ {diff:.2f}%)"
    drawn = _merge_equal(series, names)
    n = len(drawn)
    for i, ((label, method), g, name) in enumerate(drawn):
        ls, marker = METHOD_STYLE.get(method, ("-.", "d"))
        shift = 2 ** ((i - (n - 1) / 2) * dodge / max(n - 1, 1)) if dodge and n > 1 else 1.0
        ax.plot(
            g.index.astype(float) * shift,
            g.to_numpy() * scale,
            ls="none" if method == "measured" else ls,
            marker=marker,
            ms=5,
            color=pal.get(label),
            label=name,
        )


EQUAL_PCT = 0.1


def _max_diff(a: pd.Series, b: pd.Series) -> float | None:
    """Largest relative difference (%) of two series on the same sequence lengths; None when the lengths differ."""
    common = a.index.intersection(b.index)
    if b.empty or not len(common) == len(a) == len(b):
        return None
    return max(abs(a[s] - b[s]) / abs(b[s]) * 100 if b[s] else (0.0 if not a[s] else math.inf) for s in common)


def _merge_equal(series: dict, names: dict) -> list[tuple[tuple, pd.Series, str]]:
    """The series to draw, in order, each once: a series equal (EQUAL_PCT) to an earlier one of the same method is
    not drawn again, its layout named in the earlier one's legend entry ("A = B (equal within 0.1%)")."""
    out: list[list] = []
    for key, g in series.items():
        if g.empty or key not in names:
            continue
        for entry in out:
            diff = _max_diff(g, entry[1])
            if entry[0][1] == key[1] and diff is not None and diff <= EQUAL_PCT:
                entry[3].append(key[0])
                break
        else:
            out.append([key, g, names[key], []])
    return [
        (
            k,
            g,
            f"{name.replace(' · ', ' = ' + ' = '.join(same) + ' · ', 1)} (equal within {EQUAL_PCT:g}%)"
            if same
            else name,
        )
        for k, g, name, same in out
    ]


LEGEND_WIDTH = 56
"""Legend entries longer than this many characters wrap (equal series named together are long)."""


def legend_outside(ax) -> None:
    """The legend to the right of the axes, never over the data (constrained layout makes room for it)."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        labels = [textwrap.fill(t, LEGEND_WIDTH, subsequent_indent="  ") for t in labels]
        ax.legend(
            handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False
        )


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


def paper_points(
    ax, claims: list[dict], unit: str, name: str, scale: float, per_gpu: bool = False, sub: pd.DataFrame | None = None
) -> list[float]:
    """The published values of `unit` for the hardware of this panel, as black stars at their sequence length;
    with the panel's rows `sub`, only claims of a mode and GPU count the panel holds (a forward claim on 1,024
    GPUs is not drawn in an 8-GPU training panel). Returns those sequence lengths (for the axis ticks)."""
    pts = [
        c
        for c in claims
        if c.get("unit") == unit
        and num(c.get("seq_len"))
        and num(c.get("value"))
        and (not c.get("hardware") or str(c["hardware"]) in name)
        and (sub is None or _panel_holds(c, sub))
    ]
    for i, c in enumerate(pts):
        v = float(c["value"]) / ((num(c.get("n_gpus")) or 1) if per_gpu else 1)
        ax.scatter(
            [float(c["seq_len"])],
            [v * scale],
            marker="*",
            s=140,
            color="black",
            zorder=1.5,  # behind the series' markers and lines: a star never hides one of ours
            label=f"paper {c.get('label') or ''}".strip() if i == 0 else None,
        )
    return [float(c["seq_len"]) for c in pts]


def _panel_holds(c: dict, sub: pd.DataFrame) -> bool:
    modes = set(sub["mode"].astype(str)) if "mode" in sub else set()
    gpus = {num(v) for v in sub["world_size"]} if "world_size" in sub else set()
    return (not c.get("mode") or not modes or str(c["mode"]) in modes) and (
        not num(c.get("n_gpus")) or not gpus or num(c["n_gpus"]) in gpus
    )


LOG_SPREAD = 20.0
"""A panel whose values (the paper's included) span more than this factor gets a log axis."""


def log_if_spread(ax, values) -> bool:
    """Log-scale the y axis when the positive values span more than LOG_SPREAD (e.g. the paper's 65K–169K tokens/s
    per device beside modelled 1K–12K); True when it did."""
    vals = [v for v in map(num, values) if v and v > 0]
    if vals and max(vals) / min(vals) > LOG_SPREAD:
        ax.set_yscale("log")
        return True
    return False


def metric_vs_seq(
    ok: pd.DataFrame,
    col: str,
    ylabel: str,
    pal: dict,
    integer_ticks: bool = False,
    paper: list[dict] | None = None,
    scale: float = 1.0,
    dodge: float = 0.0,
):
    """One panel per context: `col` (× scale) against sequence length, a line per scheme."""
    fig, axes, names, note = facets(ok, "ctx", ncols=1 if ok["label"].nunique() > 6 else None)
    logged = []
    for ax, name in zip(axes, names):
        sub = ok[ok["ctx"] == name]
        lines(ax, sub, col, pal, scale, dodge=dodge)
        paper_s = paper_points(ax, paper, "tokens/s", name, 1.0, per_gpu=True, sub=sub) if paper else []
        seq_axis(ax, list(sub["seq_len"]) + paper_s)
        ys = [y for ln in ax.get_lines() for y in ln.get_ydata()]
        ys += [y for c in ax.collections for y in c.get_offsets()[:, 1]]
        if log_if_spread(ax, ys):
            logged.append(name)
        elif integer_ticks:
            ax.set_ylim(bottom=0)
        if integer_ticks:
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v, 0)))
        ax.set_ylabel(ylabel)
        panel_title(ax, name, bool(sub["is_cpu"].any()))
        legend_outside(ax)
    if logged:
        note += f" Log scale in {', '.join(logged)}: the values there span more than {LOG_SPREAD:g}×."
    return fig, note
