"""The HTML report: tables, exports and self-containment, from synthetic records (no runs, no browser); and the
report as a reader only: each input read once, no planner / validator / estimate run inside it, no file it was not
given, no re-reading of its own exports, and every memory figure it prints in GB."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import report_fixtures as rf

from tspbench.record import schema
from tspbench.report import build_report
from tspbench.report import frame as build  # the constants the report prints (NOT_REPRODUCED)
from tspbench.report.figures import FIGURES

# one worker runs this module: its module-scoped fixture (a spawned rank group / a build) then runs once, not per worker
pytestmark = pytest.mark.xdist_group("report")

REPO = Path(__file__).resolve().parents[2]


FORBIDDEN = (  # what the report must never run: it reads records (tspbench/report/build.py)
    "tspbench.predict.planner.plan",
    "tspbench.predict.planner.plan_records",
    "tspbench.predict.planner.pareto_front",
    "tspbench.predict.published.load_rows",
    "tspbench.predict.published.predict",
    "tspbench.predict.published.record",
    "tspbench.predict.published.validation_errors",
    "tspbench.predict.estimate.estimate",
    "tspbench.run.context.write_context_records",
)


def forbid(mp: pytest.MonkeyPatch) -> None:
    """Every planner / validator / estimate entry fails loudly if the report calls it."""
    for target in FORBIDDEN:

        def fail(*a, _t=target, **k):
            raise AssertionError(f"the report called {_t}")

        mp.setattr(target, fail)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, str, pd.DataFrame]:
    tmp = tmp_path_factory.mktemp("report")
    src = rf.write_records(tmp / "results" / "run.jsonl")
    ctx = rf.write_context(tmp / "results")  # validation.jsonl, plan.jsonl: what an experiment writes beside its runs
    with pytest.MonkeyPatch.context() as mp:
        forbid(mp)
        html = build_report([src, *ctx], out=tmp / "out" / "fixture.html", title="fixture report", claims=rf.CLAIMS)
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
    assert schema.CPU_NOTE in text


def test_figures_inline_and_no_external_urls(report):
    text = report[1]
    srcs = re.findall(r'\s(?:src|href)="([^"]*)"', text)
    assert srcs, "expected figure sources and export links"
    assert not [s for s in srcs if re.match(r"(?i)(https?:|//|ftp:)", s)]
    assert "<link" not in text and not re.search(r"<script[^>]*\ssrc=", text)
    imgs = re.findall(r'<img id="(fig-[a-z0-9-]+)-img" src="data:image/svg\+xml;base64,', text)
    # The full fixture has data for every figure, the trust section's scatter and the paper setting's Pareto front.
    assert set(imgs) == {fid for fid, _, _ in FIGURES} | {"fig-trust", "fig-pareto-0"}


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
    # Estimated memory only: throughput, step split, power, energy, prediction, the two serving figures and what
    # fits (no fit records given) have no data.
    assert text.count("no data for this figure") == 8
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
        [sys.executable, "-m", "tspbench.report", str(src), f"out={out}", "title=CLI title"],
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


# ---------------------------------------------------------------- the report reads records, nothing else ----------


def test_trust_and_pareto_sections_from_the_given_records(report):
    text = report[1]
    trust = text[text.index('id="trust"') : text.index('id="pareto"')]
    assert 'id="trust-table"' in trust and 'id="fig-trust-img"' in trust and "tt_a100_llama3_8b_sel_op" in trust
    pareto = text[text.index('id="pareto"') : text.index('id="failures"')]
    assert 'id="fig-pareto-0-img"' in pareto and "llama7b, S = 131,072, 1,024 × mi300x, overlap schedule" in pareto
    assert "No validation records" not in text and "No plan records" not in text


def test_printed_memory_is_in_gb(report):
    """Records store GiB (plan records: bytes); every memory figure the report prints says GB, and the Pareto
    front's memory column is bytes / 1e9."""
    text = report[1]
    for section in ('id="trust"', 'id="pareto"', 'id="summary-table"'):
        part = text[text.index(section) : text.index("</table>", text.index(section))]
        assert "GiB" not in part, section
    assert "peak memory (GB)" in text and "Memory per device (GB)" in text
    from tspbench.record.store import read_records

    plans = read_records([report[0].parents[1] / "results" / "plan.jsonl"], kind="plan")
    front = sorted((r for r in plans if r["pareto"]), key=lambda r: r["mem_bytes"])
    table = text[text.index('id="pareto-table-0"') :]
    cells = re.findall(r"<tr><td>[^<]*</td><td>\d+</td><td>([\d.]+)</td>", table.split("</table>")[0])
    assert cells == [f"{r['mem_bytes'] / 1e9:.1f}" for r in front]


def test_each_input_is_read_once(tmp_path, monkeypatch):
    """One pass over the inputs returns every kind: a file named twice (itself and inside its directory) and the
    plan and validation files are each read exactly once, though three sections use them."""
    from tspbench.record import store

    src = rf.write_minimal(tmp_path / "in" / "run.jsonl")
    ctx = rf.write_context(tmp_path / "in")
    reads: Counter = Counter()
    real = store.read_file

    def counting(path):
        reads[Path(path).resolve()] += 1
        return real(path)

    monkeypatch.setattr(store, "read_file", counting)
    forbid(monkeypatch)
    text = build_report([src, tmp_path / "in", *ctx], out=tmp_path / "out" / "r.html", claims=[]).read_text()
    assert set(reads) == {p.resolve() for p in (src, *ctx)} and set(reads.values()) == {1}, reads
    assert 'id="trust-table"' in text and 'id="fig-pareto-0-img"' in text


def test_builds_without_plan_or_validation_records_and_names_the_commands(tmp_path, monkeypatch):
    """Without plan or validation records among its inputs the report says so, with the command that writes them,
    and reads no file it was not given (not results/validation.jsonl or results/plan.jsonl of the working
    directory), plans nothing and predicts nothing."""
    from tspbench.report.pareto import PLAN_COMMAND
    from tspbench.report.trust import VALIDATE_COMMAND

    ctx = rf.write_context(tmp_path / "results")  # present in the working directory, not given
    monkeypatch.chdir(tmp_path)
    src = rf.write_minimal(tmp_path / "runs" / "run.jsonl")
    opened: list[Path] = []
    real = Path.read_text

    def read_text(self, *a, **k):
        opened.append(self.resolve())
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", read_text)
    forbid(monkeypatch)
    text = build_report([src], out=tmp_path / "out" / "r.html", claims=[]).read_text()
    assert not {p.resolve() for p in ctx} & set(opened)
    trust = text[text.index('id="trust"') : text.index('id="pareto"')]
    pareto = text[text.index('id="pareto"') : text.index('id="failures"')]
    assert f"<code>{VALIDATE_COMMAND}</code>" in trust and 'id="trust-table"' not in trust
    assert f"<code>{PLAN_COMMAND}</code>" in pareto and "<figure" not in pareto
    assert len(re.findall(r'<p class="nodata" id="(?:trust|pareto)-none">', text)) == 2


def test_named_commands_write_what_the_sections_read():
    """The plan command the Pareto page names is the paper's setting (predict/planner.py PAPER_SETTING) under the
    planner's default overlap, the one the run flow writes (tspbench.run.context)."""
    from tspbench import plan
    from tspbench.predict.planner import PAPER_SETTING
    from tspbench.report.pareto import PLAN_COMMAND
    from tspbench.report.trust import VALIDATE_COMMAND
    from tspbench.run.context import PLAN_OVERLAP

    args = dict(a.split("=", 1) for a in PLAN_COMMAND.split()[3:])
    assert {k: args[k] for k in PAPER_SETTING} == {k: str(v) for k, v in PAPER_SETTING.items()}
    assert "overlap" not in args and plan.PlanConfig().overlap == PLAN_OVERLAP and args["out"].endswith(".jsonl")
    assert VALIDATE_COMMAND.startswith("python -m tspbench.validate out=")


def test_report_imports_no_planner_validator_or_estimate():
    """No module of tspbench/report imports the planner, the published-run predictions, the estimate, the run
    flow's context writer or an entry point (ast, function-level imports included)."""
    banned = (
        "tspbench.predict.planner",
        "tspbench.predict.published",
        "tspbench.predict.estimate",
        "tspbench.predict.costmodel",
        "tspbench.run",
        "tspbench.validate",
        "tspbench.plan",
        "tspbench.estimate",
    )
    bad = []
    for path in (REPO / "tspbench" / "report").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            bad += [f"{path.name}: {n}" for n in names if any(n == b or n.startswith(b + ".") for b in banned)]
    assert not bad, bad


def test_finish_prints_the_claim_rows_it_built_without_reading_its_exports(tmp_path, monkeypatch, capsys):
    import tspbench.report as report_pkg

    monkeypatch.setattr("tspbench.paths.reports_dir", lambda: tmp_path / "reports")
    monkeypatch.setattr("tspbench.report.build.load_claim_list", lambda: (rf.CLAIMS, "fixture"))
    src = rf.write_records(tmp_path / "results" / "run.jsonl")
    real = Path.read_text

    def read_text(self, *a, **k):
        assert self.suffix not in (".md", ".csv", ".html"), f"finish re-read its own output {self}"
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", read_text)
    html = report_pkg.finish([src], "fixture")
    out = capsys.readouterr().out.splitlines()
    monkeypatch.setattr(Path, "read_text", real)
    md = html.with_suffix(".md").read_text().splitlines()
    matched = [line for line in md[2:] if line.split("|")[3].strip() != "—"]
    assert out[0] == "claimed vs reproduced:" and out[1:3] == md[:2] and out[3:-1] == matched and matched
    assert out[-1] == f"report: {html}"


def test_pareto_page_leaves_implausible_plan_records_out(tmp_path):
    """A plan record the writer's guard marked implausible is named in a count, never drawn or tabled."""
    from tspbench.record.store import read_records, write_records
    from tspbench.report.pareto import pareto_section

    ctx = rf.write_context(tmp_path)
    plans = read_records([ctx[1]], kind="plan")
    lean = min((r for r in plans if r["pareto"]), key=lambda r: r["mem_bytes"])
    written = write_records(tmp_path / "bad.jsonl", [{**lean, "tokens_per_s_cluster": -1.0}], kind="plan")
    assert written[0]["status"] == "implausible"
    others = [r for r in plans if r is not lean]
    html = str(pareto_section([*others, *written]))
    assert "1 implausible record(s) left out" in html and f"<td>{lean['layout']}</td>" not in html


def test_report_modules_stay_small():
    """Every module of tspbench/report is at most 400 lines and every function at most 80."""
    for path in (REPO / "tspbench" / "report").glob("*.py"):
        text = path.read_text()
        assert len(text.splitlines()) <= 400, path.name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef):
                assert node.end_lineno - node.lineno + 1 <= 80, f"{path.name}: {node.name}"
