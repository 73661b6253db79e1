"""The HTML report: JSONL result records -> one self-contained HTML file (+ CSV and Markdown).

    from tspbench.report import build_report
    html = build_report(["results/"], out=Path("reports/run1.html"), title="llama7b sweep")

or `python -m tspbench.report results/ --out reports/run1.html`. See build.py for the flow.
"""

from pathlib import Path

from tspbench.report.build import build_report

__all__ = ["build_report", "finish"]


def finish(results: list[str | Path], name: str) -> Path:
    """End of an experiment or sweep: build the report, print the claims our results reproduce (the
    Markdown export's rows with a number in "ours") and the report's path."""
    import time

    from tspbench.paths import reports_dir

    out = reports_dir() / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.html"
    html = build_report([Path(p) for p in results], out=out, title=f"tspbench: {name}")
    rows = html.with_suffix(".md").read_text().splitlines()
    matched = [r for r in rows[2:] if r.split("|")[3].strip() not in ("—", "")]
    if matched:
        print("claimed vs reproduced:")
        print("\n".join(rows[:2] + matched))
    print(f"report: {html}")
    return html
