"""Report figures about memory: peak memory per device against sequence length (with the paper's values and
the device capacity), its breakdown by category, the serving KV cache, and predicted vs measured (memory and
tokens/s). Each `fig_*` takes build.py's run DataFrame and returns a matplotlib Figure and caption, or a string
saying what data it needs. Records store GiB; every axis says GB (MB for tiny runs)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from tspbench.config import GIB_TO_GB
from tspbench.report.fig_time import fig_serving
from tspbench.report.frame import MEM_PARTS, fmt_seq, num
from tspbench.report.plot import (
    MAX_FACETS,
    METHOD_STYLE,
    NO_DATA,
    cluster_panel,
    facets,
    legend_outside,
    lines,
    mem_unit,
    ok_with,
    panel_title,
    paper_points,
    seq_axis,
)

DODGE = 0.5
"""Octaves the memory figure's series are spread over around each sequence length (plot.lines)."""


SAME_PCT = 1.0


def same_as_node(ok: pd.DataFrame) -> list[str]:
    """Cluster panels (plot.gpu_panels) whose every layout's per-device memory equals the one-node panel's of the
    same model, hardware and mode within SAME_PCT (data parallelism adds replicas, not memory per device)."""
    out = []
    for name in {str(c) for c in ok["ctx"] if cluster_panel(str(c))}:
        node = name.rsplit(" · ", 1)[0] + " · one node"
        node_rows = ok[ok["ctx"].astype(str).str.startswith(node)]
        if node_rows.empty:
            continue
        a = ok[ok["ctx"] == name].groupby(["label", "method", "seq_len"])["mem_gib"].last()
        b = node_rows.groupby(["label", "method", "seq_len"])["mem_gib"].last()
        common = a.index.intersection(b.index)
        if len(common) == len(a) and all(abs(a[k] - b[k]) <= SAME_PCT / 100 * abs(b[k]) for k in common):
            out.append(name)
    return sorted(out)


def fig_memory(df: pd.DataFrame, pal: dict, claims: list[dict] | None = None):
    ok = ok_with(df, "seq_len", "mem_gib")
    oom = df[(df["status"] == "oom") & df["seq_len"].map(lambda v: num(v) is not None)] if not df.empty else df
    if ok.empty and oom.empty:
        return NO_DATA + ": needs peak_reserved/allocated_gib or mem_total_gib, or OOM runs."
    both = pd.concat([ok, oom])
    same = same_as_node(ok)
    both = both[~both["ctx"].isin(same)]
    fig, axes, names, note = facets(both, "ctx", ncols=1)
    if same:
        note = f" {', '.join(same)}: per-device memory as one node's (within {SAME_PCT:g}%), not drawn twice." + note
    for ax, name in zip(axes, names):
        sub, bad = ok[ok["ctx"] == name], oom[oom["ctx"] == name]
        data_top = sub["mem_gib"].max() * GIB_TO_GB if not sub.empty else None
        factor, unit = mem_unit(data_top)
        scale = GIB_TO_GB * factor  # GiB in the records -> GB or MB on the axis
        lines(ax, sub, "mem_gib", pal, scale, dodge=DODGE)
        paper_s = paper_points(ax, claims or [], "GB", name, 1.0, sub=sub) if unit == "GB" else []
        cap = both[both["ctx"] == name]["capacity_gib"].map(num).dropna()
        top = cap.max() if not cap.empty else None
        title = name
        if top:
            cap_text = f"device capacity {top * GIB_TO_GB:.0f} GB"
            if (data_top or 0.0) >= 0.2 * top * GIB_TO_GB or not bad.empty:
                ax.axhline(top * scale, color="crimson", ls="--", lw=1, label=cap_text)
            else:  # a line far above small data would flatten it; say it in the title instead
                title += f"\n({cap_text}: off scale)"
                top = None
        if not bad.empty:
            # An OOM has no peak; draw it on the capacity line (else at the top of the data).
            fallback = top or (sub["mem_gib"].max() if not sub.empty else 1.0)
            ys = [(num(v) or fallback) * scale for v in bad["mem_gib"]]
            ax.scatter(
                bad["seq_len"].astype(float),
                ys,
                marker="X",
                s=90,
                zorder=5,
                c=[pal.get(lb) for lb in bad["label"]],
                edgecolors="black",
                label="OOM",
            )
        seq_axis(ax, list(both[both["ctx"] == name]["seq_len"]) + paper_s)
        ax.set_ylabel(f"peak memory per device ({unit})")
        panel_title(ax, title, False)
        legend_outside(ax)
    return fig, (
        "Measured runs: peak reserved (else allocated); estimated/modelled: predicted peak "
        "(mem_total_gib), in GB (MB for tiny runs). ★ the paper's published value (in the panel of its mode and GPU "
        f"count); × marks OOM runs. The layouts' points are spread over ±{DODGE / 2:g} octave around each sequence "
        "length so that equal values stay visible." + note
    )


def fig_breakdown(df: pd.DataFrame, pal: dict):
    keys = [k for k, _ in MEM_PARTS if k in df]
    if not keys:
        return NO_DATA + ": needs mem_params_gib … mem_comm_buffers_gib."
    has = df[(df["status"] == "ok") & df[keys].apply(lambda r: any(num(v) for v in r), axis=1)]
    if has.empty:
        return NO_DATA + ": needs mem_params_gib … mem_comm_buffers_gib."
    same = same_as_node(ok_with(df, "seq_len", "mem_gib"))  # a cluster's bars equal to one node's: drawn once
    has = has[~has["ctx"].isin(same)]
    has = has.assign(panel=has["ctx"] + " · " + has["method"])
    counts = has["panel"].value_counts()
    names = sorted(counts.index, key=lambda n: (cluster_panel(str(n).rsplit(" · ", 1)[0]), -counts[n]))
    shown, dropped = names[:MAX_FACETS], names[MAX_FACETS:]
    subs = []
    for name in shown:  # the longest sequence of each panel: where memory matters most
        sub = has[has["panel"] == name]
        s_max = sub["seq_len"].map(num).max()
        subs.append((name, s_max, sub[sub["seq_len"].map(num) == s_max].drop_duplicates("label", keep="last")))
    # horizontal bars, one row per layout: every label readable, the figure as tall as its bars need
    heights = [0.28 * len(sub) + 0.9 for _, _, sub in subs]
    fig = Figure(figsize=(12.4, sum(heights) + 0.4), layout="constrained")
    grid = fig.add_gridspec(len(subs), 1, height_ratios=heights)
    colours = sns.color_palette("Set2", len(MEM_PARTS))
    for i, (name, s_max, sub) in enumerate(subs):
        ax = fig.add_subplot(grid[i])
        left = np.zeros(len(sub))
        for (key, part), colour in zip(MEM_PARTS, colours):
            vals = np.array([(num(v) or 0.0) * GIB_TO_GB for v in sub.get(key, [None] * len(sub))])
            ax.barh(range(len(sub)), vals, left=left, color=colour, label=part)
            left += vals
        ax.set_yticks(range(len(sub)), list(sub["label"]), fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(left.max(), 1e-9) * 1.05)  # no bar clipped
        ax.set_xlabel("GB per device")
        panel_title(ax, f"{name} · S={fmt_seq(s_max)}", False)
        legend_outside(ax)
    note = f" Not shown (more than {MAX_FACETS} panels): {', '.join(dropped)}." if dropped else ""
    if same:
        note = f" {', '.join(same)}: as one node's, not drawn twice." + note
    return fig, "Memory breakdown per device at the longest sequence length of each panel." + note


def fig_kv(df: pd.DataFrame, pal: dict):
    """mode=decode records: the KV cache per device against the context length, in GB."""
    return fig_serving(
        df,
        pal,
        "kv_cache_gib",
        "KV cache per device (GB)",
        "The largest rank's KV cache after prefill + decode (measured) or for the context (modelled).",
        scale=GIB_TO_GB,
    )


PAIR_KEYS = ("scheme", "seq_len", "degree", "model", "tp_degree", "sp_degree", "batch", "mode")


def prediction_pairs(df: pd.DataFrame) -> list[tuple[pd.Series, pd.Series]]:
    """(measured, predicted) rows for the same scheme, sequence, layout, model, batch and mode."""
    if df.empty:
        return []

    def key(r) -> tuple:
        return tuple(str(num(r.get(k)) if num(r.get(k)) is not None else r.get(k)) for k in PAIR_KEYS)

    ok = df[df["status"] == "ok"]
    meas = {key(r): r for _, r in ok[ok["method"] == "measured"].iterrows()}
    return [(meas[key(p)], p) for _, p in ok[ok["method"].isin(["estimated", "modelled"])].iterrows() if key(p) in meas]


def fig_prediction(df: pd.DataFrame, pal: dict):
    pairs = prediction_pairs(df)
    mem, tok = [], []
    for m, p in pairs:
        pm = num(p.get("mem_total_gib")) or num(p.get("peak_allocated_gib"))
        # Fake-tensor estimates predict allocated (not cached) bytes, so compare with allocated.
        mm = num(m.get("peak_allocated_gib")) or num(m.get("peak_reserved_gib"))
        if pm and mm:
            mem.append((mm * GIB_TO_GB, pm * GIB_TO_GB, p["label"], p["method"]))
        # Throughput predictions only mean something for the hardware that was measured.
        if p["tok"] and m["tok"] and p.get("hardware") and p.get("hardware") == m.get("hardware"):
            tok.append((m["tok"], p["tok"], p["label"], p["method"]))
    panels = [(n, d) for n, d in (("peak memory per device (GB)", mem), ("tokens/s", tok)) if d]
    if not panels:
        return (
            NO_DATA + ": needs a measured and an estimated/modelled run of the same (scheme, seq_len, degree, model)."
        )
    fig = Figure(figsize=(5.2 * len(panels), 4.4), layout="constrained")
    for i, (what, data) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        lo = min(min(d[0], d[1]) for d in data) * 0.8
        hi = max(max(d[0], d[1]) for d in data) * 1.2
        xs = np.geomspace(lo, hi, 20)
        ax.plot(xs, xs, color="black", lw=1, label="predicted = measured")
        ax.fill_between(xs, xs * 0.9, xs * 1.1, color="grey", alpha=0.2, label="±10%")
        for label, method in sorted({(d[2], d[3]) for d in data}):
            pts = [d for d in data if d[2] == label and d[3] == method]
            ax.scatter(
                [d[0] for d in pts],
                [d[1] for d in pts],
                color=pal.get(label),
                marker=METHOD_STYLE.get(method, ("", "d"))[1],
                label=f"{label} · {method}",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {what}")
        ax.set_ylabel(f"predicted {what}")
        legend_outside(ax)
    return fig, (
        "Model accuracy: predicted (estimated/modelled) vs measured for the same scheme, "
        "sequence, layout and model. Memory: predicted peak vs measured peak allocated."
    )
