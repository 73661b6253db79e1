"""The HTML report: JSONL records -> one self-contained HTML file (+ CSV and Markdown).

    from tspbench.report import build_report
    html = build_report(["results/"], out=Path("reports/run1.html"), title="llama7b sweep")

or `python -m tspbench.report out=reports/run1.html results/`. See build.py for the flow. The report reads
records only: run records, plan records (its Pareto page) and validation records (its trust section), each input
once; tspbench.run.context writes the last two for an experiment.
"""

from pathlib import Path

from tspbench.report.build import build_report, make_report, markdown_lines

__all__ = ["build_report", "finish", "make_report"]


def finish(results: list[str | Path], name: str) -> Path:
    """End of an experiment or sweep: build the report from `results` (files or directories of records), print
    the claims our results reproduce (the claim rows the build computed that have a number in "ours", as the
    Markdown export lists them) and the report's path."""
    import time

    from tspbench.paths import reports_dir

    out = reports_dir() / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.html"
    built = make_report([Path(p) for p in results], out=out, title=f"tspbench: {name}")
    matched = [r for r in built.claim_rows if r["ours"] is not None]
    if matched:
        print("claimed vs reproduced:")
        print("\n".join(markdown_lines(matched)))
    print(f"report: {built.path}")
    return built.path
