"""`python -m tspbench.report PATH... [--out reports/NAME.html] [--title T]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tspbench.record.store import RecordSet, read_all
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
    inputs = read_all(args.paths)  # the one read of the inputs: checked here, then built from
    refused = check_inputs(args.paths, inputs)
    if refused:
        print(f"python -m tspbench.report: {refused}", file=sys.stderr)
        return 2
    out = build_report(args.paths, out=args.out, title=args.title, inputs=inputs)
    print(out)
    return 0


def check_inputs(paths: list[str], inputs: RecordSet | None = None) -> str | None:
    """Never a silent empty report: no JSONL file, no record, or a malformed line that is not the last →
    one line (exit 2); a torn last line (a crash mid-write) → a warning naming the file and line. `inputs`: the
    records of `paths` as read (tspbench.record.store.read_all), else read here."""
    inputs = inputs if inputs is not None else read_all(paths)
    if not inputs.files:
        return f"no *.jsonl files in {', '.join(paths)}; give results.jsonl files or the run dirs holding them"
    for f, line, last in inputs.bad:
        if not last:
            return f"{f}:{line}: not a JSON record; repair or delete that line (records are one JSON object a line)"
        print(
            f"python -m tspbench.report: warning: {f}:{line}: torn last line skipped (a crash mid-write)",
            file=sys.stderr,
        )
    if not any(inputs.by_kind.values()):
        return f"no records in {', '.join(map(str, inputs.files))}; run `python -m tspbench +exp=NAME` first"
    return None


if __name__ == "__main__":
    raise SystemExit(main())
