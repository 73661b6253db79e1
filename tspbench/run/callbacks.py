"""Hydra callbacks: after a multirun, one combined result set for the whole sweep.

`python -m tspbench -m +exp=smoke seq_len=64,128` runs one job per override combination, each writing
`<sweep dir>/<job>/results.jsonl`. `CombineResults.on_multirun_end` concatenates them (in job order) into
`<sweep dir>/results.jsonl`, rewritten whole each time so a resumed sweep never duplicates lines, and
prints the summary table and the path, then the sweep's counts line; its exit code follows the rule of one
experiment (tspbench.run.checks.EXIT_RULE: 1 when some grid point crashed, hung, was invalid or implausible, or ran
out of memory while measured; a predicted `oom` is a result). Registered in conf/config.yaml under `hydra.callbacks`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


def combine(sweep_dir: Path, extra: Sequence[Path] = ()) -> Path:
    """Concatenate every job's results.jsonl under `sweep_dir` (in job order, plus `extra` files) into
    `<sweep_dir>/results.jsonl`, rewritten whole each time (record.store.atomic_write: the old file stays as it was
    if anything fails). Returns its path."""
    from tspbench.record.store import RESULTS_FILE, atomic_write

    out = sweep_dir / RESULTS_FILE
    jobs = sorted(
        (p for p in sweep_dir.rglob(RESULTS_FILE) if p != out),
        key=lambda p: [int(s) if s.isdigit() else s for s in p.relative_to(sweep_dir).parts],
    )

    def chunks() -> Iterator[str]:
        for p in [*jobs, *extra]:
            text = p.read_text()
            yield text if not text or text.endswith("\n") else text + "\n"

    return atomic_write(out, chunks())


class CombineResults(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from tspbench.record.store import read_records
        from tspbench.record.tables import summary_table

        sweep_dir = Path(config.hydra.sweep.dir).resolve()
        if not sweep_dir.exists():
            return
        resume = config.get("resume_dir")
        extra = []
        if resume:  # jobs wrote into resume_dir instead of their own job dirs
            f = (Path(resume) / "results.jsonl").resolve()
            if f.exists() and f != sweep_dir / "results.jsonl":
                extra = [f]
        out = combine(sweep_dir, extra)
        print(summary_table(read_records([out])))
        print(f"results (combined): {out}")
        if config.get("report", True):
            from tspbench.report import finish
            from tspbench.run.context import write_context_records

            finish([out, *write_context_records(sweep_dir)], f"{config.get('exp_name', 'sweep')}-multirun")
        code, line = sweep_outcome(read_records([out]), bool(config.get("allow_failures", False)))
        print(line, flush=True)
        if code:
            raise SystemExit(code)


def sweep_outcome(records: list[dict], allow_failures: bool) -> tuple[int, str]:
    """The whole sweep's exit code and counts line, by the rule of one experiment (tspbench.run.checks.EXIT_RULE):
    each grid point (a run and its modelled twin count once) by its current records."""
    from tspbench.record.offline import MODEL_SUFFIX
    from tspbench.record.schema import current_records
    from tspbench.run.checks import outcome, point_status

    points: dict[str, list[dict]] = {}
    for r in current_records(records):
        rid = str(r.get("run_id"))
        points.setdefault(rid.removesuffix(MODEL_SUFFIX), []).append(r)
    code, line = outcome((point_status(rs) for rs in points.values()), allow_failures)
    return code, line.replace("tspbench: ", "tspbench: sweep: ", 1)
