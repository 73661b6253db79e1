"""`python -m tspbench.report PATH... [--out reports/NAME.html] [--title T]`."""

from __future__ import annotations

import argparse
from pathlib import Path

from tspbench.report.build import build_report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tspbench.report", description="Build the self-contained HTML report from JSONL results."
    )
    ap.add_argument("paths", nargs="+", help="JSONL files or directories (searched for *.jsonl)")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="HTML path (default reports/report-<timestamp>.html); .csv/.md go beside it",
    )
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        ap.error(f"no such file or directory: {', '.join(missing)}")
    out = build_report(args.paths, out=args.out, title=args.title)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
