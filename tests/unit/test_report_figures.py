"""The report's figures stay readable with the modelled 1,024-GPU point beside one node: a panel
per cluster size, the paper's points only in the panel of their mode and GPU count, a log axis where the paper's
numbers are far from ours, equal series named together instead of hidden, points spread so that equal values stay
visible, no clipped bar, the communication crossover from the cost model's records (never interpolated), and the
"what fits" figure from fit records, labelled modelled."""

from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from tspbench.config import model_preset
from tspbench.predict import fitrecords
from tspbench.record.offline import modelled_record
from tspbench.report.claims import load_claim_list
from tspbench.report.fig_fit import fig_fit
from tspbench.report.fig_memory import fig_breakdown, fig_memory
from tspbench.report.fig_time import fig_comm, fig_throughput
from tspbench.report.frame import frame_of
from tspbench.report.plot import gpu_panels, lines, palette

pytestmark = pytest.mark.xdist_group("report")


@pytest.fixture(scope="module")
def df() -> pd.DataFrame:
    """Modelled records of llama7b's grid (tp, tsp, tp_sp) on one node and on the 1,024-GPU point."""
    from tspbench.run.experiment import compose_experiment
    from tspbench.run.grid import expand_grid

    cfg = compose_experiment(["+exp=llama7b", "schemes=[tp,tsp,tp_sp]", "execution=model"])
    frame, _ = frame_of([modelled_record(s) for s in expand_grid(cfg)])
    return gpu_panels(frame)


@pytest.fixture(scope="module")
def claims() -> list[dict]:
    return load_claim_list()[0]


def paper_labels(ax) -> list[str]:
    return [t for t in ax.get_legend_handles_labels()[1] if t.startswith("paper")]


def test_a_panel_per_cluster_size(df):
    assert {c.rsplit(" · ", 1)[1] for c in df["ctx"]} == {"one node (≤ 8 GPUs)", "1,024 GPUs"}
    node = df[df["world_size"] <= 8]
    node = node.assign(ctx=node["ctx"].str.rsplit(" · ", n=1).str[0])
    assert gpu_panels(node)["ctx"].equals(node["ctx"])  # one node only: the panels are as before


def test_throughput_paper_points_in_their_own_panel_on_a_log_axis(df, claims):
    fig, caption = fig_throughput(df, palette(df), claims)
    by_title = {ax.get_title(): ax for ax in fig.axes}
    cluster_fwd = next(ax for t, ax in by_title.items() if "forward · 1,024 GPUs" in t)
    assert paper_labels(cluster_fwd) and cluster_fwd.get_yscale() == "log"
    others = [ax for ax in fig.axes if ax is not cluster_fwd]
    assert others and not any(paper_labels(ax) for ax in others)  # no forward 1,024-GPU claim in a train panel
    assert "Log scale in llama7b · mi300x · forward · 1,024 GPUs" in caption


def test_memory_points_spread_and_claims_in_the_node_panel(df, claims):
    fig, caption = fig_memory(df, palette(df), claims)
    node = next(ax for ax in fig.axes if "train · one node" in ax.get_title())
    assert paper_labels(node) and not any(paper_labels(ax) for ax in fig.axes if ax is not node)
    xs = {round(float(ln.get_xdata()[-1])) for ln in node.get_lines() if len(ln.get_xdata()) == 2}
    assert len(xs) > 3  # each series at its own x near 128K: none sits on another
    assert "spread over ±0.25 octave" in caption
    assert "train · 1,024 GPUs: per-device memory as one node's (within 1%), not drawn twice" in caption


def test_equal_series_are_named_together():
    sub = pd.DataFrame(
        {
            "label": ["A", "A", "B", "B", "C", "C"],
            "method": ["modelled"] * 6,
            "seq_len": [1024, 2048] * 3,
            "y": [1.0, 2.0, 1.0, 2.0, 1.0, 3.0],
        }
    )
    from matplotlib.figure import Figure

    ax = Figure().add_subplot()
    lines(ax, sub, "y", {})
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert labels == ["A = B · modelled (equal within 0.1%)", "C · modelled"]


def test_breakdown_bars_are_not_clipped(df):
    fig, _ = fig_breakdown(df, palette(df))
    FigureCanvasAgg(fig).draw()
    for ax in fig.axes:
        right = max(p.get_x() + p.get_width() for p in ax.patches)
        assert ax.get_xlim()[1] >= right


def test_comm_crossover_comes_from_the_cost_model_records(df):
    model = model_preset("llama7b")
    rec = {**fitrecords.comm_crossover(model, 8, 1, "forward"), "status": "ok"}
    fig, caption = fig_comm(df, palette(df), [rec])
    (ax,) = fig.axes
    vlines = [ln for ln in ax.get_lines() if ln.get_label().startswith("TSP D=8 ≤ TP T=8")]
    assert len(vlines) == 1 and float(vlines[0].get_xdata()[0]) == 32768
    assert "cost model" in vlines[0].get_label() and "never from interpolating" in caption
    fig, caption = fig_comm(df, palette(df), [])  # without the record: the analytic formula, said so
    assert "analytic" in caption and not any("cost model" in ln.get_label() for ln in fig.axes[0].get_lines())


def test_what_fits_figure_from_fit_records(df):
    recs = [{**r, "status": "ok"} for r in fitrecords.fit_records(model_preset("llama7b"), 8, ("h100", "mi300x"))]
    fig, caption = fig_fit(df, palette(df), recs)
    assert [ax.get_title() for ax in fig.axes] == [f"recompute={m} · modelled" for m in ("none", "selective", "full")]
    assert caption.startswith("Modelled") and "not measured" in caption and "h100 80 GB" in caption
    tsp = next(ln for ln in fig.axes[-1].get_lines() if ln.get_label() == "TSP")
    assert list(tsp.get_xdata()) == pytest.approx([80.0, 192.0], abs=3.0) and tsp.get_ydata()[1] > tsp.get_ydata()[0]
    assert len({ln.get_marker() for ln in fig.axes[-1].get_lines()}) == len(fig.axes[-1].get_lines())
    assert isinstance(fig_fit(df, palette(df), []), str)
