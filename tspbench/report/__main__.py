"""`python -m tspbench.report [out=reports/NAME.html] [title=T] PATH ...`: records → one self-contained HTML report.

The command line only; the report is tspbench/report/build.py. It reads the records of the given JSONL files and
directories once (run, plan and validation records alike) and refuses, with one line and exit code 2, inputs
that hold nothing to report.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from tspbench import cli
from tspbench.config import ConfigError, Output
from tspbench.record.store import RecordSet, read_all
from tspbench.report.build import build_report


@dataclass
class ReportConfig:
    """`python -m tspbench.report`: which records, and where the page goes."""

    paths: list[str] = field(default_factory=list)
    """JSONL files or directories (searched for *.jsonl): run, plan and validation records."""
    out: Annotated[str | None, Output()] = None
    """HTML path (default reports/report-<timestamp>.html); the .csv and .md exports of the claims go beside it."""
    title: str | None = None
    """The page's title (default: "tspbench report: TSP claims vs these results")."""


EXAMPLES = [
    "python -m tspbench.report results/                                 # every record under results/",
    "python -m tspbench.report out=reports/run1.html title='llama7b sweep' results/2026-12-04_10-00-00_llama7b",
]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if cli.wants_help(argv):
        intro = "Build the self-contained HTML report from JSONL records."
        print(cli.help_text("tspbench.report", ReportConfig(), intro, EXAMPLES, positional="paths"))
        return 0
    try:
        rc = cli.parse_options(ReportConfig, argv, positional="paths")
        if not rc.paths:
            raise ConfigError("no PATH given; give results.jsonl files or the run dirs holding them")
        missing = [p for p in rc.paths if not Path(p).exists()]
        if missing:
            raise ConfigError(f"no such file or directory: {', '.join(missing)}")
    except ConfigError as e:
        print(f"tspbench.report: {e}", file=sys.stderr)
        return 2
    inputs = read_all(rc.paths)  # the one read of the inputs: checked here, then built from
    refused = check_inputs(rc.paths, inputs)
    if refused:
        print(f"tspbench.report: {refused}", file=sys.stderr)
        return 2
    out = build_report(list(map(Path, rc.paths)), out=Path(rc.out) if rc.out else None, title=rc.title, inputs=inputs)
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
            f"tspbench.report: warning: {f}:{line}: torn last line skipped (a crash mid-write)",
            file=sys.stderr,
        )
    if not any(inputs.by_kind.values()):
        return f"no records in {', '.join(map(str, inputs.files))}; run `python -m tspbench +exp=NAME` first"
    return None


if __name__ == "__main__":
    raise SystemExit(main())
