"""The report's planner page: the memory–throughput Pareto front of the fitting layouts.

From the planner's records among the report's inputs (kind "plan", docs/records.md#plan-records: `python -m
tspbench.plan ... out=results/plan.jsonl`, or the run flow's tspbench.run.context for the paper's setting), one
figure and front table per setting. Records only: the front is the records' own `pareto` flag, nothing is planned
here. Every point is modelled, not measured. Memory is printed in GB (records: bytes).
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup, escape

from tspbench.config import GB
from tspbench.parallel import scheme

SETTING_KEYS = ("model", "seq_len", "gpus", "hardware", "overlap")
PLAN_COMMAND = "python -m tspbench.plan model=llama7b seq_len=131072 gpus=1024 hardware=mi300x out=results/plan.jsonl"
"""The command that writes the paper setting's records (tspbench.predict.planner.PAPER_SETTING, overlap schedule:
the planner's default), named when the inputs hold no plan records."""


def _scheme_title(name: str) -> str:
    try:
        return scheme(name).title
    except ValueError:
        return name


def settings(recs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The plan records grouped by setting (model, S, GPUs, hardware, overlap), one record per layout (the last
    read), best-ranked first; implausible records (record/kinds.py) are left out."""
    groups: dict[tuple, dict[Any, dict[str, Any]]] = {}
    for r in recs:
        if r.get("status") == "implausible":
            continue
        group = groups.setdefault(tuple(r.get(k) for k in SETTING_KEYS), {})
        group.pop(r.get("layout"), None)
        group[r.get("layout")] = r
    return [sorted(g.values(), key=lambda r: r.get("rank") or 0) for g in groups.values()]


def _figure(recs: list[dict[str, Any]], best: list[dict[str, Any]]) -> str:
    import seaborn as sns
    from matplotlib.figure import Figure

    from tspbench.report.plot import encode  # matplotlib only when building

    schemes = list(dict.fromkeys(r["scheme"] for r in sorted(recs, key=lambda r: r["scheme"])))
    colours = dict(zip(schemes, sns.color_palette("tab10", len(schemes)), strict=True))
    fig = Figure(figsize=(7.5, 4.6), layout="constrained")
    ax = fig.add_subplot()
    for s in schemes:
        pts = [r for r in recs if r["scheme"] == s]
        ax.scatter(
            [r["mem_bytes"] / GB for r in pts],
            [r["tokens_per_s_cluster"] / 1e6 for r in pts],
            s=12,
            alpha=0.55,
            color=colours[s],
            label=_scheme_title(s),
        )
    ax.step(
        [r["mem_bytes"] / GB for r in best],
        [r["tokens_per_s_cluster"] / 1e6 for r in best],
        where="post",
        color="k",
        lw=1.2,
        label="Pareto front",
    )
    ax.set_xlabel("peak memory per device (GB)")
    ax.set_ylabel("cluster tokens/s (millions)")
    ax.legend(fontsize=8, ncol=2, loc="lower right")
    return encode(fig)


def _setting(r: dict[str, Any]) -> str:
    return (
        f"{r['model']}, S = {r['seq_len']:,}, {r['gpus']:,} × {r['hardware']}, overlap {r['overlap']}, "
        f"training ({r.get('dtype', 'bfloat16')})"
    )


def _front_table(i: int, best: list[dict[str, Any]]) -> list[str]:
    out = [
        f'<div class="scroll"><table id="pareto-table-{i}"><thead><tr><th>Layout</th><th>dp</th>'
        "<th>Memory per device (GB)</th><th>Step (s)</th><th>Exposed comm. (s)</th><th>Tokens/s per GPU</th>"
        "<th>Cluster tokens/s</th></tr></thead><tbody>"
    ]
    for r in best:
        out.append(
            f"<tr><td>{escape(r['layout'])}</td><td>{r['dp']}</td><td>{r['mem_bytes'] / GB:.1f}</td>"
            f"<td>{r['step_s']:.3f}</td><td>{r['exposed_comm_s']:.3f}</td><td>{r['tokens_per_s_per_gpu']:,.0f}"
            f"</td><td>{r['tokens_per_s_cluster']:,.0f}</td></tr>"
        )
    out.append("</tbody></table></div>")
    return out


def pareto_section(recs: list[dict[str, Any]]) -> Markup:
    """The section's HTML from plan records: per setting, a scatter of every fitting layout with the front drawn,
    and the front as a table; without any record, one line naming the command that writes them."""
    out = ['<h2 id="pareto">Planner: memory–throughput Pareto front</h2>']
    groups = settings(recs)
    if not groups:
        out.append(
            f'<p class="nodata" id="pareto-none">No plan records among the report\'s inputs: <code>{PLAN_COMMAND}'
            "</code> writes them for the paper's setting.</p>"
        )
        return Markup("\n".join(out))
    left_out = sum(r.get("status") == "implausible" for r in recs)
    out.append(
        "<p>Every layout the suite implements that fits the device, from the planner's records among the report's "
        "inputs. Modelled, not measured: closed-form memory and α–β + roofline time, whose validation errors "
        'are in <a href="#trust">How far to trust the predictions</a>. A layout is on the front when no other '
        "needs less memory per device and gives at least as many tokens/s."
        + (f" {left_out} implausible record(s) left out (their <code>reason</code> says why)." if left_out else "")
        + "</p>"
    )
    for i, rs in enumerate(groups):
        best = sorted((r for r in rs if r.get("pareto")), key=lambda r: r["mem_bytes"])
        out.append(
            f'<figure id="fig-pareto-{i}"><strong>{escape(_setting(rs[0]))}: {len(rs)} fitting layouts</strong>'
            f'<img id="fig-pareto-{i}-img" src="{_figure(rs, best)}" alt="memory-throughput Pareto front">'
            "<figcaption>Each point one layout (colour: scheme); black: the Pareto front.</figcaption></figure>"
        )
        out += _front_table(i, best)
    return Markup("\n".join(out))
