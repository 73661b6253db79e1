"""Report figure "what fits": the longest training sequence of each scheme against the device's memory, one panel per
recompute mode, from the "fit" records an experiment writes beside its results (tspbench/run/context.py, or
`python -m tspbench.plan fit=true out=PATH`; tspbench/predict/maxfit.py). Modelled: the closed-form memory model and
the fit rule of the planner (peak × (1 + reserve) + headroom ≤ device memory); nothing here is measured. Records
only: nothing is computed here."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from tspbench.parallel import SCHEMES
from tspbench.parallel import scheme as scheme_entry
from tspbench.report.frame import fmt_seq, num
from tspbench.report.plot import NO_DATA, legend_outside, palette

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<")
STYLES = ("-", "--", "-.", ":")
DODGE_GB = 6.0
"""GB the schemes' points are spread over around each device's memory, so that close lines do not hide each other."""
FIT_COMMAND = "python -m tspbench.plan fit=true out=results/fit.jsonl"
"""A command that writes the records this figure reads (named when the inputs hold none)."""


def _title(name: str) -> str:
    try:
        return scheme_entry(name).title
    except ValueError:
        return name


def fit_frame(records: list[dict]) -> pd.DataFrame:
    """One row per (setting, hardware profile, scheme, recompute): the scheme's longest fit over its option sets."""
    rows = [r for r in records if r.get("kind") == "fit" and r.get("status", "ok") == "ok"]
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows)
    df["max_seq_len"] = df["max_seq_len"].map(num)
    df["mem_gb"] = df["device_mem_bytes"].map(num) / 1e9
    df["setting"] = df.apply(lambda r: f"{r['model']} · {r['gpus']:g} GPUs · {r['mode']} · B={r['batch']:g}", axis=1)
    idx = df.groupby(["setting", "hardware", "scheme", "recompute"])["max_seq_len"].idxmax()
    return df.loc[idx].reset_index(drop=True)


def fig_fit(df: pd.DataFrame, pal: dict, fits: list[dict] | None = None):
    """Longest sequence per scheme (its best option set) against device memory, one panel per recompute mode."""
    best = fit_frame(fits or [])
    if best.empty:
        return NO_DATA + f": needs fit records (`{FIT_COMMAND}`; an experiment writes them beside its results)."
    setting = best["setting"].value_counts().index[0]
    best = best[best["setting"] == setting]
    modes = [m for m in ("none", "selective", "full") if m in set(best["recompute"])]
    fig = Figure(figsize=(12.4, 4.2), layout="constrained")
    axes = fig.subplots(1, len(modes), sharey=True, squeeze=False)[0]
    order = {n: i for i, n in enumerate(SCHEMES)}
    names = sorted(dict.fromkeys(best["scheme"]), key=lambda n: order.get(n, 99))
    colours = palette(pd.DataFrame({"label": names}))
    for ax, mode in zip(axes, modes):
        sub = best[best["recompute"] == mode]
        for i, name in enumerate(names):
            g = sub[sub["scheme"] == name].groupby("mem_gb")["max_seq_len"].max().sort_index()
            if g.empty:
                continue
            ys = [v if v and v > 0 else float("nan") for v in g.to_numpy()]  # nothing fits: no point
            shift = (i - (len(names) - 1) / 2) * DODGE_GB / max(len(names) - 1, 1)  # close lines stay apart
            ax.plot(
                g.index + shift,
                ys,
                marker=MARKERS[i % len(MARKERS)],
                ms=6,
                lw=1.4,
                ls=STYLES[i % len(STYLES)],
                color=colours.get(name),
                label=_title(name),
            )
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_seq(v)))
        ax.set_xlabel("device memory (GB; profiles: conf/hardware)")
        ax.set_title(f"recompute={mode} · modelled", fontsize=9)
    axes[0].set_ylabel("longest training sequence S that fits")
    legend_outside(axes[-1])
    per_gb = sorted({(round(float(m)), h) for m, h in zip(best["mem_gb"], best["hardware"])})
    where = ", ".join(f"{h} {m} GB" for m, h in per_gb)
    reserve, headroom = num(best["reserve"].iloc[0]) or 0.0, (num(best["headroom_bytes"].iloc[0]) or 0.0) / 1e9
    return fig, (
        f"Modelled (closed-form memory model + each profile's memory; not measured): {setting}, the longest S at "
        f"which each scheme's best option set and group size fits, by the planner's rule peak × {1 + reserve:g} + "
        f"{headroom:g} GB ≤ device memory ({where}). A scheme with no point at a memory does not fit at any S "
        f"there. Each scheme has its own marker and line style, and its points are spread over ±{DODGE_GB / 2:g} GB "
        "around each device's memory, so that close lines stay visible. Per layout and the term that breaks first: "
        "`python -m tspbench.plan fit=true hardware=NAME`."
    )
