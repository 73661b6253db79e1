"""Report figures about time: tokens/s per device against sequence length, communication volume per layer (with
the TSP-vs-TP crossover), the step's compute vs exposed communication, power, energy per token, and serving
(decode latency, KV cache). Each `fig_*` takes build.py's run DataFrame and returns a matplotlib Figure and
caption, or a string saying what data it needs."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from tspbench.report.frame import fmt_seq, num
from tspbench.report.plot import NO_DATA, facets, legend_outside, lines, metric_vs_seq, ok_with, panel_title, seq_axis

DODGE = 0.3
"""Octaves the throughput figure's series are spread over around each sequence length (plot.lines)."""


def fig_throughput(df: pd.DataFrame, pal: dict, claims: list[dict] | None = None):
    ok = ok_with(df, "seq_len", "tok_dev")
    if ok.empty:
        return NO_DATA + ": needs tokens_per_s(_per_device) or predicted_tokens_per_s."
    fig, note = metric_vs_seq(ok, "tok_dev", "tokens/s per device", pal, integer_ticks=True, paper=claims, dodge=DODGE)
    return fig, (
        "Tokens/s per device (global tokens/s ÷ world size where not recorded); a panel per model, hardware, mode "
        "and cluster size. ★ the paper's published cluster throughput ÷ its GPU count, in the panel of its mode and "
        f"GPU count only. The layouts' points are spread over ±{DODGE / 2:g} octave around each sequence length so "
        "that equal values stay visible." + note
    )


def crossover_bs(row: pd.Series) -> float | None:
    """Analytic forward crossover TSP ≤ TP (docs/method.md#crossover): B·S ≥ (2 + 2/g + 3F)·h / (4 − 2/g)."""
    h, nh, nkv, ffn = (num(row.get(k)) for k in ("cfg_dim", "cfg_n_heads", "cfg_n_kv_heads", "cfg_ffn_hidden"))
    if not (h and nh and nkv and ffn):
        return None
    g, f = nh / nkv, ffn / h
    return (2 + 2 / g + 3 * f) * h / (4 - 2 / g)


def fig_comm(df: pd.DataFrame, pal: dict, crossovers: list[dict] | None = None):
    ok = ok_with(df, "seq_len", "comm_bytes_per_layer_fwd")
    if ok.empty:
        return NO_DATA + ": needs comm_bytes_per_layer_fwd."
    ok = ok.assign(panel=ok["model"].astype(str) + " · B=" + ok["batch"].map(lambda b: f"{num(b) or 1:g}"))
    fig, axes, names, note = facets(ok, "panel", ncols=1)
    shown: list[str] = []
    for ax, name in zip(axes, names):
        sub = ok[ok["panel"] == name]
        top = sub["comm_bytes_per_layer_fwd"].map(num).max()
        scale, unit = (1e-9, "GB") if top >= 1e9 else (1e-6, "MB") if top >= 1e6 else (1e-3, "kB")
        lines(ax, sub, "comm_bytes_per_layer_fwd", pal, scale)
        shown += mark_crossovers(ax, sub, crossovers or [])
        seq_axis(ax, sub["seq_len"])
        ax.set_ylabel(f"forward bytes per layer per device ({unit})")
        panel_title(ax, name, False)
        legend_outside(ax)
    return fig, (
        "Communication volume per layer (forward). Vertical line: the crossover it shows, "
        + (
            "; ".join(shown)
            if shown
            else "none (no crossover record of this model and micro-batch, nor TSP and TP here)"
        )
        + ". Crossovers come from the cost model (tspbench.run.context's crossover records), never from "
        "interpolating between the points drawn." + note
    )


def mark_crossovers(ax, sub: pd.DataFrame, crossovers: list[dict]) -> list[str]:
    """Mark where TSP's forward per-layer volume drops to TP's or below at D = T (docs/method.md#crossover), as the
    crossover records of this panel's model and micro-batch give it (the cost model on every multiple of the
    zigzag's grid, tspbench/predict/fitrecords.py comm_crossover); without one, the analytic formula
    B·S ≥ (2 + 2/g + 3F)·h / (4 − 2/g) from the records' model shape, when TSP and TP are both drawn. Returns what
    each line shows, for the caption.

    The one place the report names schemes instead of asking tspbench.parallel: the crossover is TSP against plain
    TP by definition (docs/method.md#crossover compares exactly these two layouts' per-layer volumes), so the two
    scheme names are the figure's subject, not a stand-in for a role."""
    row = sub.iloc[0]
    batch = num(row.get("batch")) or 1
    mine = [
        c
        for c in crossovers
        if c.get("status", "ok") == "ok"
        and c.get("mode") == "forward"
        and str(c.get("model")) == str(row.get("model"))
        and num(c.get("batch")) == batch
        and num(c.get("seq_len"))
    ]
    out = []
    for c in mine:
        s = float(c["seq_len"])
        text = f"{c['a']} ≤ {c['b']} from S={s:,.0f} (cost model, every {c.get('seq_step')} tokens)"
        ax.axvline(s, color="black", lw=1, label=text)
        out.append(f"{text}: {c.get('quantity')}, {c.get('model')}, B={batch:g}")
    bs = crossover_bs(row)
    if not mine and bs and sub["scheme"].isin(["tsp"]).any() and sub["scheme"].isin(["tp"]).any():
        s = bs / batch
        ax.axvline(s, color="grey", ls=":", lw=1.2, label=f"analytic TSP ≤ TP crossover S={s:,.0f}")
        out.append(f"analytic TSP ≤ TP forward crossover B·S ≥ (2+2/g+3F)·h/(4−2/g) = {bs:,.0f} tokens")
    return out


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


def fig_serving(df: pd.DataFrame, pal: dict, col: str, ylabel: str, caption: str, scale: float = 1.0):
    """mode=decode records: `col` (× scale) against the context (prompt) length, a line per scheme."""
    ok = ok_with(df, "seq_len", col)
    ok = ok[ok["mode"] == "decode"] if not ok.empty else ok
    if ok.empty:
        return NO_DATA + f": needs mode=decode runs with {col}."
    fig, note = metric_vs_seq(ok, col, ylabel, pal, scale=scale)
    return fig, caption + note


def fig_decode(df: pd.DataFrame, pal: dict):
    return fig_serving(
        df,
        pal,
        "decode_ms_per_token_p50",
        "ms per decode step",
        "Median decode step (one new token per sequence) at each context length.",
    )
