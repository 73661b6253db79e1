"""The HTML report: tables, exports and self-containment, from synthetic records (no runs, no browser)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import report_fixtures as rf

from tspbench.report import build_report
from tspbench.report import frame as build  # the constants the report prints (CPU_NOTE, NOT_REPRODUCED)
from tspbench.report.figures import FIGURES

# one worker runs this module: its module-scoped fixture (a spawned rank group / a build) then runs once, not per worker
pytestmark = pytest.mark.xdist_group("report")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, str, pd.DataFrame]:
    tmp = tmp_path_factory.mktemp("report")
    src = rf.write_records(tmp / "results" / "run.jsonl")
    # Without validation records among the inputs the report falls back to the repo's results/validation.jsonl (a
    # local `python -m tspbench.validate` leaves one): point that at an empty folder so the fixture is hermetic.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("tspbench.report.trust.results_dir", lambda: tmp / "results")
        html = build_report([src], out=tmp / "out" / "fixture.html", title="fixture report", claims=rf.CLAIMS)
    return html, html.read_text(), pd.read_csv(html.with_suffix(".csv"))


def claim_rows(csv: pd.DataFrame, cid: str) -> pd.DataFrame:
    return csv[csv["id"] == cid]


def test_writes_html_csv_md_beside_each_other(report):
    html, text, _ = report
    assert html.name == "fixture.html" and html.exists()
    assert html.with_suffix(".csv").exists() and html.with_suffix(".md").exists()
    assert "<title>fixture report</title>" in text


def test_every_claim_has_a_row(report):
    _, text, csv = report
    assert set(csv["id"]) == {c["id"] for c in rf.CLAIMS}
    for c in rf.CLAIMS:
        assert f'data-claim="{c["id"]}"' in text


def test_memory_deviation_uses_gib_to_gb_and_latest_duplicate(report):
    # The stale record with the same run_id (99 GiB) must lose to the later one (36 GiB).
    row = claim_rows(report[2], "mem_128k_tsp").iloc[0]
    ours = rf.MEM_TSP_128K_GIB * 1.073741824
    assert row["ours"] == pytest.approx(ours)
    assert row["deviation_pct"] == pytest.approx((ours - 38.8) / 38.8 * 100)
    assert row["method"] == "estimated" and row["hardware"] == "mi300x" and bool(row["within"])
    assert "GiB" in row["basis"] and "GB" in row["basis"]


def test_throughput_and_speedup_claims(report):
    csv = report[2]
    tok = claim_rows(csv, "tput_1024_tsp").iloc[0]
    assert tok["ours"] == pytest.approx(rf.TOK_TSP_1024)
    assert tok["deviation_pct"] == pytest.approx((160e6 - 173e6) / 173e6 * 100)
    assert tok["method"] == "modelled"
    # The speed-up's baseline layout is not stated: one row per TP×SP layout, strongest first.
    sp = claim_rows(csv, "ratio_blog")
    assert list(sp["ours"]) == pytest.approx([rf.TOK_TSP_1024 / t for t in rf.TOK_TPSP_1024])
    assert "T=4×Σ=2" in sp.iloc[0]["basis"] and "T=2×Σ=4" in sp.iloc[1]["basis"]


def test_unmatched_claim_says_not_reproduced(report):
    _, text, csv = report
    row = claim_rows(csv, "mem_256k_tsp").iloc[0]
    assert pd.isna(row["ours"]) and row["basis"] == build.NOT_REPRODUCED
    assert build.NOT_REPRODUCED in text


def test_verdict_counts_commands_and_caveat(report):
    text = report[1]
    verdict = text[text.index('<section id="verdict">') : text.index("</section>")]
    # 4 of 5 claims answered, all within ±10%, none by a GPU measurement; the 256K one names its command.
    assert "Of 5 published numbers, 4 hold within ±10%, 0 do not, and 1 have no number" in verdict
    assert "python -m tspbench +exp=paper_memory" in verdict
    assert "Nothing here is measured on real GPU hardware" in verdict
    assert "estimated for mi300x" in verdict and "modelled for mi300x" in verdict


def test_one_row_per_claim_others_folded(report):
    text = report[1]
    body = text[text.index('id="claims-table"') : text.index("</table>", text.index('id="claims-table"'))]
    for c in rf.CLAIMS:
        assert body.count(f'data-claim="{c["id"]}"') == 1
    # The speed-up's best-matching baseline is the row; the other TP×SP layout folds below it.
    row = body[body.index('data-claim="ratio_blog"') :].split("</tr>")[0]
    assert "vs TP×SP T=4×Σ=2" in row and "<details" in row and "T=2×Σ=4" in row.split("<details")[1]
    assert 'id="claims-legend"' in text and "[secondary]:" in text


def test_claims_table_is_first(report):
    text = report[1]
    assert text.index('id="verdict"') < text.index('id="claims-table"') < text.index('id="summary-table"')
    assert text.index('id="summary-table"') < text.index('id="figures"')


def test_failed_oom_timeout_listed_with_reasons(report):
    text = report[1]
    section = text[text.index('id="failures-table"') :]
    for run_id, reason in (
        ("cpu-tsp-2048-failed", "gloo connectFullMesh failed on rank 3"),
        ("cpu-sp-4096-timeout", "killed after 600 s"),
        ("h100-tp-8192", "CUDA out of memory"),
        ("est-tp_sp2-131072", "exceeds mi300x capacity"),
    ):
        assert run_id in section and reason in section


def test_labels_and_cpu_caveat(report):
    text = report[1]
    # the one label per layout (tspbench.parallel) and the legend that spells out the paper's "SP"
    assert "SP Σ=" in text and "TP+Megatron-SP T=" in text and "token sharding (context parallelism)" in text
    assert build.CPU_NOTE in text


def test_figures_inline_and_no_external_urls(report):
    text = report[1]
    srcs = re.findall(r'\s(?:src|href)="([^"]*)"', text)
    assert srcs, "expected figure sources and export links"
    assert not [s for s in srcs if re.match(r"(?i)(https?:|//|ftp:)", s)]
    assert "<link" not in text and not re.search(r"<script[^>]*\ssrc=", text)
    imgs = re.findall(r'<img id="(fig-[a-z-]+)-img" src="data:image/svg\+xml;base64,', text)
    # The full fixture has data for every figure.
    assert set(imgs) == {fid for fid, _, _ in FIGURES}


def test_provenance_collapsible(report):
    text = report[1]
    block = text[text.index('<details id="provenance-details">') :]
    assert "0123456789ab" in block and "torch 2.13.0" in block and "Resolved config" in block


def test_markdown_export(report):
    md = report[0].with_suffix(".md").read_text().splitlines()
    assert md[0].startswith("| claim | paper | ours | deviation |") and md[1].startswith("|---")
    assert len(md) == 2 + len(report[2])
    assert any("TSP D=8 memory, S=128K, 8 GPUs (mi300x)" in line and "-0.4%" in line for line in md)


def test_missing_data_gives_notes_not_errors(tmp_path):
    src = rf.write_minimal(tmp_path / "min.jsonl")
    text = build_report([src], out=tmp_path / "min.html", claims=[]).read_text()
    # Estimated memory only: throughput, step split, power, energy, prediction and the two serving figures
    # have no data.
    assert text.count("no data for this figure") == 7
    assert "No paper claims to compare" in text


def test_empty_input(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    text = build_report([empty], out=tmp_path / "e.html", claims=rf.CLAIMS).read_text()
    assert text.count(build.NOT_REPRODUCED) >= len(rf.CLAIMS)
    assert "No runs in these results" in text


def test_default_out_and_claims_fallback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # reports go under the working directory
    src = rf.write_minimal(tmp_path / "min.jsonl")
    html = build_report([src])  # claims from tspbench.paper.claims, or [] while it does not exist
    assert html.parent == tmp_path / "reports" and re.fullmatch(r"report-\d{8}-\d{6}\.html", html.name)


def test_cli(tmp_path):
    src = rf.write_minimal(tmp_path / "min.jsonl")
    out = tmp_path / "cli.html"
    proc = subprocess.run(
        [sys.executable, "-m", "tspbench.report", str(src), "--out", str(out), "--title", "CLI title"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.exists() and out.with_suffix(".csv").exists() and "CLI title" in out.read_text()


def test_other_model_is_flagged_not_counted(tmp_path):
    # A tiny model that happens to hit the paper's number exactly must not count as agreement.
    rec = rf.record(
        "tiny-128k",
        "tsp",
        131072,
        8,
        method="estimated",
        hardware="mi300x",
        device=None,
        metrics={"mem_total_gib": 38.8 / 1.073741824},
    )
    src = tmp_path / "tiny.jsonl"
    src.write_text(json.dumps(rec) + "\n")
    html = build_report([src], out=tmp_path / "t.html", claims=rf.CLAIMS[:1])
    row = pd.read_csv(html.with_suffix(".csv")).iloc[0]
    assert row["deviation_pct"] == pytest.approx(0.0, abs=1e-9)
    assert not row["within"] and "not the paper's 4096" in row["basis"]
    assert "0 hold within" in html.read_text()


def test_figure_legends_sit_outside_the_data(tmp_path):
    """Every legend's box lies outside every axes' box of its figure (rendered with the Agg canvas); and the
    paper's values are drawn on the memory and throughput figures."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from tspbench.report.figures import WITH_CLAIMS, palette
    from tspbench.report.frame import load_frame

    df, _ = load_frame([rf.write_records(tmp_path / "run.jsonl")])
    pal, checked = palette(df), 0
    for fid, _, fn in FIGURES:
        got = fn(df, pal, rf.CLAIMS) if fid in WITH_CLAIMS else fn(df, pal)
        if isinstance(got, str):
            continue
        fig = got[0]
        FigureCanvasAgg(fig).draw()
        renderer = fig.canvas.get_renderer()
        boxes = [ax.get_window_extent(renderer) for ax in fig.axes]
        for ax in fig.axes:
            leg = ax.get_legend()
            if leg is None:
                continue
            lb = leg.get_window_extent(renderer)
            checked += 1
            for box in boxes:
                overlap_w = min(lb.x1, box.x1) - max(lb.x0, box.x0)
                overlap_h = min(lb.y1, box.y1) - max(lb.y0, box.y0)
                assert overlap_w <= 1 or overlap_h <= 1, f"{fid}: legend overlaps an axes"
        if fid in WITH_CLAIMS:
            labels = [t for ax in fig.axes for t in ax.get_legend_handles_labels()[1]]
            assert any(t.startswith("paper") for t in labels), f"{fid}: no published value drawn"
    assert checked >= 5
