"""Report figures: seaborn styling + matplotlib drawing -> SVG `data:` URIs.

Each `fig_*` takes build.py's run DataFrame and returns a matplotlib Figure, or a string saying what
data it needs. SVG (text as paths) inside a data: URI keeps the HTML self-contained and offline, keeps
each figure's ids private to its own document, and scales cleanly. Figures use `matplotlib.figure.Figure`
directly, not pyplot, so building a report leaves no global pyplot state behind.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from tspbench.report.frame import CPU_NOTE, GIB_TO_GB, MEM_PARTS, fmt, fmt_seq, num

METHOD_STYLE = {"measured": ("-", "o"), "estimated": ("--", "s"), "modelled": (":", "^")}
MAX_FACETS = 4  # more panels than this stop being readable at 1280 px; the rest are named in a note
NO_DATA = "no data for this figure"


# ---------------------------------------------------------------- helpers -------------------------


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


AGREE_PCT = 1.0  # estimated and modelled within this of each other are drawn as one series


def panel_title(ax, name: str, is_cpu: bool) -> None:
    ax.set_title(name + (f"\n{CPU_NOTE}" if is_cpu else ""), fontsize=9, color="firebrick" if is_cpu else "black")


def ok_with(df: pd.DataFrame, *cols: str) -> pd.DataFrame:
    if df.empty or any(c not in df for c in cols):
        return df.iloc[0:0]
    mask = df["status"] == "ok"
    for c in cols:
        mask &= df[c].map(lambda v: num(v) is not None)
    return df[mask]


# ---------------------------------------------------------------- figures -------------------------


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


def fig_memory(df: pd.DataFrame, pal: dict, claims: list[dict] | None = None):
    ok = ok_with(df, "seq_len", "mem_gib")
    oom = df[(df["status"] == "oom") & df["seq_len"].map(lambda v: num(v) is not None)] if not df.empty else df
    if ok.empty and oom.empty:
        return NO_DATA + ": needs peak_reserved/allocated_gib or mem_total_gib, or OOM runs."
    both = pd.concat([ok, oom])
    fig, axes, names, note = facets(both, "ctx")
    for ax, name in zip(axes, names):
        sub, bad = ok[ok["ctx"] == name], oom[oom["ctx"] == name]
        data_top = sub["mem_gib"].max() * GIB_TO_GB if not sub.empty else None
        factor, unit = mem_unit(data_top)
        scale = GIB_TO_GB * factor  # GiB in the records -> GB or MB on the axis
        lines(ax, sub, "mem_gib", pal, scale)
        paper_s = paper_points(ax, claims or [], "GB", name, 1.0) if unit == "GB" else []
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
        "(mem_total_gib), in GB (MB for tiny runs). ★ the paper's published value; × marks OOM runs." + note
    )


def fig_breakdown(df: pd.DataFrame, pal: dict):
    keys = [k for k, _ in MEM_PARTS if k in df]
    if not keys:
        return NO_DATA + ": needs mem_params_gib … mem_comm_buffers_gib."
    has = df[(df["status"] == "ok") & df[keys].apply(lambda r: any(num(v) for v in r), axis=1)]
    if has.empty:
        return NO_DATA + ": needs mem_params_gib … mem_comm_buffers_gib."
    has = has.assign(panel=has["ctx"] + " · " + has["method"])
    fig, axes, names, note = facets(has, "panel")
    colours = sns.color_palette("Set2", len(MEM_PARTS))
    for ax, name in zip(axes, names):
        sub = has[has["panel"] == name]
        s_max = sub["seq_len"].map(num).max()  # the longest sequence: where memory matters most
        sub = sub[sub["seq_len"].map(num) == s_max].drop_duplicates("label", keep="last")
        bottom = np.zeros(len(sub))
        for (key, part), colour in zip(MEM_PARTS, colours):
            vals = np.array([(num(v) or 0.0) * GIB_TO_GB for v in sub.get(key, [None] * len(sub))])
            ax.bar(range(len(sub)), vals, bottom=bottom, color=colour, label=part)
            bottom += vals
        ax.set_xticks(range(len(sub)), list(sub["label"]), rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("GB per device")
        panel_title(ax, f"{name} · S={fmt_seq(s_max)}", False)
        legend_outside(ax)
    return fig, "Memory breakdown per device at the longest sequence length of each panel." + note


def metric_vs_seq(
    ok: pd.DataFrame, col: str, ylabel: str, pal: dict, integer_ticks: bool = False, paper: list[dict] | None = None
):
    """One panel per context: `col` against sequence length, a line per scheme."""
    fig, axes, names, note = facets(ok, "ctx")
    for ax, name in zip(axes, names):
        sub = ok[ok["ctx"] == name]
        lines(ax, sub, col, pal)
        paper_s = paper_points(ax, paper, "tokens/s", name, 1.0, per_gpu=True) if paper else []
        seq_axis(ax, list(sub["seq_len"]) + paper_s)
        if integer_ticks:
            ax.set_ylim(bottom=0)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v, 0)))
        ax.set_ylabel(ylabel)
        panel_title(ax, name, bool(sub["is_cpu"].any()))
        legend_outside(ax)
    return fig, note


def fig_throughput(df: pd.DataFrame, pal: dict, claims: list[dict] | None = None):
    ok = ok_with(df, "seq_len", "tok_dev")
    if ok.empty:
        return NO_DATA + ": needs tokens_per_s(_per_device) or predicted_tokens_per_s."
    fig, note = metric_vs_seq(ok, "tok_dev", "tokens/s per device", pal, integer_ticks=True, paper=claims)
    return fig, (
        "Tokens/s per device (global tokens/s ÷ world size where not recorded). ★ the paper's published "
        "cluster throughput ÷ its GPU count." + note
    )


def crossover_bs(row: pd.Series) -> float | None:
    """Analytic forward crossover TSP ≤ TP (docs/method.md#crossover): B·S ≥ (2 + 2/g + 3F)·h / (4 − 2/g)."""
    h, nh, nkv, ffn = (num(row.get(k)) for k in ("cfg_dim", "cfg_n_heads", "cfg_n_kv_heads", "cfg_ffn_hidden"))
    if not (h and nh and nkv and ffn):
        return None
    g, f = nh / nkv, ffn / h
    return (2 + 2 / g + 3 * f) * h / (4 - 2 / g)


def fig_comm(df: pd.DataFrame, pal: dict):
    ok = ok_with(df, "seq_len", "comm_bytes_per_layer_fwd")
    if ok.empty:
        return NO_DATA + ": needs comm_bytes_per_layer_fwd."
    ok = ok.assign(panel=ok["model"].astype(str) + " · B=" + ok["batch"].map(lambda b: f"{num(b) or 1:g}"))
    fig, axes, names, note = facets(ok, "panel")
    for ax, name in zip(axes, names):
        sub = ok[ok["panel"] == name]
        top = sub["comm_bytes_per_layer_fwd"].map(num).max()
        scale, unit = (1e-9, "GB") if top >= 1e9 else (1e-6, "MB") if top >= 1e6 else (1e-3, "kB")
        lines(ax, sub, "comm_bytes_per_layer_fwd", pal, scale)
        mark_crossovers(ax, sub)
        seq_axis(ax, sub["seq_len"])
        ax.set_ylabel(f"forward bytes per layer per device ({unit})")
        panel_title(ax, name, False)
        legend_outside(ax)
    return fig, (
        "Communication volume per layer (forward). Dotted grey: analytic TSP ≤ TP crossover "
        "B·S ≥ (2+2/g+3F)·h/(4−2/g); solid black: where the data cross." + note
    )


def mark_crossovers(ax, sub: pd.DataFrame) -> None:
    """Mark where TSP's per-layer volume drops below TP's at the same degree (D = T)."""
    row = sub.iloc[0]
    bs = crossover_bs(row)
    if bs and sub["scheme"].isin(["tsp", "tp"]).any():
        s = bs / (num(row.get("batch")) or 1)
        ax.axvline(s, color="grey", ls=":", lw=1.2, label=f"analytic crossover S={s:,.0f}")
    found: dict[tuple, list[str]] = {}  # (degree, rounded log2 S) -> methods: one line per crossing
    for (deg, method), g in sub.groupby(["degree", "method"]):
        tsp = g[g["scheme"] == "tsp"].groupby("seq_len")["comm_bytes_per_layer_fwd"].last()
        tp = g[g["scheme"] == "tp"].groupby("seq_len")["comm_bytes_per_layer_fwd"].last()
        common = sorted(set(tsp.index) & set(tp.index))
        diff = [(s, float(tsp[s]) - float(tp[s])) for s in common]
        for (s0, d0), (s1, d1) in zip(diff, diff[1:]):
            if d0 > 0 >= d1:  # interpolate the sign change in log2(S)
                t = d0 / (d0 - d1)
                s = 2 ** (math.log2(s0) + t * (math.log2(s1) - math.log2(s0)))
                found.setdefault((deg, round(math.log2(s), 2)), []).append(method)
    for (deg, log_s), methods in found.items():
        s = 2**log_s
        ax.axvline(s, color="black", lw=1, label=f"TSP ≤ TP from S≈{s:,.0f} (D={deg:g}; {', '.join(methods)})")


def fig_step_split(df: pd.DataFrame, pal: dict):
    ok = ok_with(df, "compute_ms", "exposed_comm_ms")
    ok = ok[ok["method"] == "measured"]
    if ok.empty:
        return NO_DATA + ": needs measured compute_ms and exposed_comm_ms."
    # Horizontal bars so long labels stay readable; the longest sequences of each layout first.
    ok = ok.sort_values("seq_len").groupby("label", sort=False).tail(2).head(24)
    names = [f"{r['label']} · S={fmt_seq(r['seq_len'])} · {r['hw']}" for _, r in ok.iterrows()]
    fig = Figure(figsize=(8.5, 0.32 * len(ok) + 1.4), layout="constrained")
    ax = fig.add_subplot()
    comp = ok["compute_ms"].astype(float).to_numpy()
    comm = ok["exposed_comm_ms"].astype(float).to_numpy()
    ax.barh(range(len(ok)), comp, color="#4c72b0", label="compute")
    ax.barh(range(len(ok)), comm, left=comp, color="#dd8452", label="exposed communication")
    ax.set_yticks(range(len(ok)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step")
    panel_title(ax, "Step time split (measured)", bool(ok["is_cpu"].any()))
    legend_outside(ax)
    return fig, "Compute vs exposed (not overlapped) communication per step, measured runs only."


def fig_power(df: pd.DataFrame, pal: dict):
    if df.empty or "rank_power_timeline" not in df:
        return NO_DATA + ": needs per_rank.power_timeline from a measured run."
    has = df[
        (df["method"] == "measured")
        & df["rank_power_timeline"].map(lambda t: isinstance(t, list) and any(isinstance(r, list) and r for r in t))
    ]
    if has.empty:
        return NO_DATA + ": needs per_rank.power_timeline from a measured run."
    has = has.sort_values("seq_len").groupby("label", sort=False).tail(1).head(6)
    fig = Figure(figsize=(8.5, 3.8), layout="constrained")
    ax = fig.add_subplot()
    for _, r in has.iterrows():
        for rank, tl in enumerate(r["rank_power_timeline"]):
            pts = [(num(p[0]), num(p[1])) for p in (tl or []) if isinstance(p, list) and len(p) == 2]
            pts = [p for p in pts if None not in p]
            if pts:
                t, w = zip(*pts)
                ax.plot(
                    t,
                    w,
                    color=pal.get(r["label"]),
                    alpha=0.8,
                    lw=1,
                    label=f"{r['label']} S={fmt_seq(r['seq_len'])}" if rank == 0 else None,
                )
    ax.set_xlabel("time (s)")
    ax.set_ylabel("power per device (W)")
    legend_outside(ax)
    return fig, "Power over the timed window, one line per rank (longest sequence per layout)."


def fig_energy(df: pd.DataFrame, pal: dict):
    ok = ok_with(df, "seq_len", "energy_j_per_token")
    ok = ok[ok["method"] == "measured"]
    if ok.empty:
        return NO_DATA + ": needs measured energy_j_per_token (energy counters unavailable here?)."
    fig, note = metric_vs_seq(ok, "energy_j_per_token", "J per token (all ranks)", pal)
    return fig, "Energy per token from device energy counters, summed over ranks." + note


PAIR_KEYS = ("scheme", "seq_len", "degree", "model", "tp_degree", "sp_degree", "batch", "mode")


def fig_serving(df: pd.DataFrame, pal: dict, col: str, ylabel: str, caption: str):
    """mode=decode records: `col` against the context (prompt) length, a line per scheme."""
    ok = ok_with(df, "seq_len", col)
    ok = ok[ok["mode"] == "decode"] if not ok.empty else ok
    if ok.empty:
        return NO_DATA + f": needs mode=decode runs with {col}."
    fig, note = metric_vs_seq(ok, col, ylabel, pal)
    return fig, caption + note


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
            mem.append((mm, pm, p["label"], p["method"]))
        # Throughput predictions only mean something for the hardware that was measured.
        if p["tok"] and m["tok"] and p.get("hardware") and p.get("hardware") == m.get("hardware"):
            tok.append((m["tok"], p["tok"], p["label"], p["method"]))
    panels = [(n, d) for n, d in (("peak memory per device (GiB)", mem), ("tokens/s", tok)) if d]
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


FIGURES: tuple[tuple[str, str, Callable[..., Any]], ...] = (
    ("fig-memory", "Peak memory per device vs sequence length", fig_memory),  # (df, pal, claims)
    ("fig-breakdown", "Memory breakdown per scheme", fig_breakdown),
    ("fig-throughput", "Tokens/s per device vs sequence length", fig_throughput),
    ("fig-comm", "Communication volume per layer vs sequence length", fig_comm),
    ("fig-step", "Step time: compute vs exposed communication", fig_step_split),
    ("fig-power", "Power over time", fig_power),
    ("fig-energy", "Energy per token", fig_energy),
    ("fig-prediction", "Predicted vs measured", fig_prediction),
    (
        "fig-kv",
        "Serving: KV cache per device vs context length",
        lambda df, pal: fig_serving(
            df,
            pal,
            "kv_cache_gib",
            "KV cache per device (GiB)",
            "The largest rank's KV cache after prefill + decode (measured) or for the context (modelled).",
        ),
    ),
    (
        "fig-decode",
        "Serving: decode latency per token vs context length",
        lambda df, pal: fig_serving(
            df,
            pal,
            "decode_ms_per_token_p50",
            "ms per decode step",
            "Median decode step (one new token per sequence) at each context length.",
        ),
    ),
)


WITH_CLAIMS = {"fig-memory", "fig-throughput"}  # figures that draw the paper's published values


def make_figures(df: pd.DataFrame, claims: list[dict] | None = None) -> list[dict]:
    """[{id, title, src (data: URI) or None, caption or note}] in report order; `claims` (the paper's
    published numbers) are drawn as markers on the memory and throughput figures."""
    pal = palette(df)
    out = []
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.8):
        for fid, title, fn in FIGURES:
            if df.empty:
                got: Any = f"{NO_DATA}: no runs in these results."
            else:
                got = fn(df, pal, claims or []) if fid in WITH_CLAIMS else fn(df, pal)
            if isinstance(got, str):
                out.append({"id": fid, "title": title, "src": None, "caption": got})
            else:
                fig, caption = got
                out.append({"id": fid, "title": title, "src": encode(fig), "caption": caption})
    return out
