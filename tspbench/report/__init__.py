"""The HTML report: JSONL result records -> one self-contained HTML file (+ CSV and Markdown).

    from tspbench.report import build_report
    html = build_report(["results/"], out=Path("reports/run1.html"), title="llama7b sweep")

or `python -m tspbench.report results/ --out reports/run1.html`. See build.py for the flow.
"""
from tspbench.report.build import build_report

__all__ = ["build_report"]
