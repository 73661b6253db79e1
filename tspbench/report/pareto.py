"""The report's planner page (issue 13 §3): the memory–throughput Pareto front of the fitting layouts.

From the planner's records among the report's inputs (`python -m tspbench.plan ... out=results/plan.jsonl`, kind
"plan", docs/records.md#plan-records), one figure and front table per setting; without any, from the planner run
now on the paper's setting (predict/planner.py PAPER_SETTING: llama7b, 128K, 1,024 MI300X, overlap schedule;
closed form, about a second). Every point is modelled, not measured.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter
from pathlib import Path
from typing import Any

from markupsafe import Markup, escape

from tspbench.config import model_preset
from tspbench.predict.planner import PAPER_SETTING, pareto_front, plan, plan_records
from tspbench.record.store import read_records

SETTING_KEYS = ("model", "seq_len", "gpus", "hardware", "overlap")
GIB = 2**30


def paper_records() -> list[dict[str, Any]]:
    """The planner's records for the paper's setting, planned now."""
    s = PAPER_SETTING
    ranked, _ = plan(model_preset(s["model"]), s["seq_len"], s["gpus"], s["hardware"])
    return plan_records(ranked, **s, overlap="schedule")


def _figure(recs: list[dict[str, Any]], best: list[dict[str, Any]]) -> str:
    import seaborn as sns
    from matplotlib.figure import Figure

    from tspbench.report.figures import encode  # matplotlib only when building

    schemes = list(dict.fromkeys(r["scheme"] for r in sorted(recs, key=lambda r: r["scheme"])))
    colours = dict(zip(schemes, sns.color_palette("tab10", len(schemes)), strict=True))
    fig = Figure(figsize=(7.5, 4.6), layout="constrained")
    ax = fig.add_subplot()
    for s in schemes:
        pts = [r for r in recs if r["scheme"] == s]
        ax.scatter(
            [r["mem_bytes"] / GIB for r in pts],
            [r["tokens_per_s_cluster"] / 1e6 for r in pts],
            s=12,
            alpha=0.55,
            color=colours[s],
            label=s,
        )
    ax.step(
        [r["mem_bytes"] / GIB for r in best],
        [r["tokens_per_s_cluster"] / 1e6 for r in best],
        where="post",
        color="k",
        lw=1.2,
        label="Pareto front",
    )
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel("cluster tokens/s (millions)")
    ax.legend(fontsize=8, ncol=2, loc="lower right")
    return encode(fig)


def _setting(r: dict[str, Any]) -> str:
    return (
        f"{r['model']}, S = {r['seq_len']:,}, {r['gpus']:,} × {r['hardware']}, overlap {r['overlap']}, "
        f"training ({r.get('dtype', 'bfloat16')})"
    )


def pareto_section(paths: Iterable[str | Path]) -> Markup:
    """The section's HTML: a scatter of every fitting layout with the front drawn, and the front as a table."""
    recs = read_records(list(paths), kind="plan")
    source = "the planner's records among the report's inputs"
    if not recs:
        recs, source = paper_records(), "the planner run on the paper's setting while building this report"
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in recs:
        groups.setdefault(tuple(r.get(k) for k in SETTING_KEYS), []).append(r)
    out = [
        '<h2 id="pareto">Planner: memory–throughput Pareto front</h2>',
        f"<p>Every layout the suite implements that fits the device (<code>python -m tspbench.plan</code>; from "
        f"{source}). Modelled, not measured: closed-form memory and α–β + roofline time, whose validation errors "
        'are in <a href="#trust">How far to trust the predictions</a>. A layout is on the front when no other '
        "needs less memory per device and gives at least as many tokens/s.</p>",
    ]
    for i, rs in enumerate(groups.values()):
        best = pareto_front(rs, mem=itemgetter("mem_bytes"), tps=itemgetter("tokens_per_s_cluster"))
        out.append(
            f'<figure id="fig-pareto-{i}"><strong>{escape(_setting(rs[0]))}: {len(rs)} fitting layouts</strong>'
            f'<img id="fig-pareto-{i}-img" src="{_figure(rs, best)}" alt="memory-throughput Pareto front">'
            "<figcaption>Each point one layout (colour: scheme); black: the Pareto front.</figcaption></figure>"
        )
        out.append(
            f'<div class="scroll"><table id="pareto-table-{i}"><thead><tr><th>Layout</th><th>dp</th>'
            "<th>Memory per device (GiB)</th><th>Step (s)</th><th>Exposed comm. (s)</th><th>Tokens/s per GPU</th>"
            "<th>Cluster tokens/s</th></tr></thead><tbody>"
        )
        for r in best:
            out.append(
                f"<tr><td>{escape(r['layout'])}</td><td>{r['dp']}</td><td>{r['mem_bytes'] / GIB:.1f}</td>"
                f"<td>{r['step_s']:.3f}</td><td>{r['exposed_comm_s']:.3f}</td><td>{r['tokens_per_s_per_gpu']:,.0f}"
                f"</td><td>{r['tokens_per_s_cluster']:,.0f}</td></tr>"
            )
        out.append("</tbody></table></div>")
    return Markup("\n".join(out))
