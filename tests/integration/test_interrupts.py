"""Ctrl-C never loses or corrupts a result, and the exit code tells a script what happened.

Runs the experiment CLI with cwd = tmp_path (nothing goes into the user's results/ or reports/), tiny model,
gloo on CPU.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from proc_util import tspbench_process, worker_pids

from tspbench.record.store import read_records

ROOT = Path(__file__).resolve().parents[2]
FAST = [
    "+exp=smoke",
    "model.n_layers=1",
    "seq_len=32",
    "warmup_steps=1",
    "measured_steps=2",
    "progress=false",
    "memory_breakdown=false",
    "report=false",
]


def cli(args: list[str], cwd: Path) -> subprocess.Popen:
    return tspbench_process(args, cwd, dict(os.environ, PYTHONPATH=str(ROOT)))


def finish(p: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_memory_check_records_oom_before_ranks_start(tmp_path):
    """The issue's example: llama7b at 128K tokens measured on CPU is recorded oom with the numbers in seconds
    (no rank, no log). Predicted before it started, it is a result (`oom_kind: predicted`): exit 0, and the last
    line says so."""
    args = ["+exp=llama7b", "device=cpu", "execution=measure", "seq_len=131072", "scheme=tsp", "report=false"]
    rc, out, err = finish(cli([*args, "progress=false", "hydra.run.dir=run"], tmp_path), timeout=120)
    assert rc == 0, err
    # the measured point (the experiment's modelled cluster points, if any, are beside it)
    (rec,) = [r for r in read_records([tmp_path / "run" / "results.jsonl"]) if r["method"] == "measured"]
    assert rec["status"] == "oom" and "GiB per rank >" in rec["reason"] and "not started" in rec["reason"]
    assert rec["oom_kind"] == "predicted"
    assert rec["attempted"]["estimated_peak_gib_per_rank"] > rec["attempted"]["available_gib_per_rank"]
    assert not list((tmp_path / "run").glob("tsp-*.log")) and not (tmp_path / "run" / "specs").exists()
    last = out.strip().splitlines()[-1]
    assert last.startswith("tspbench: ") and last.endswith(" ok, 1 oom (predicted; a result) → exit 0"), last
    assert err.startswith("tspbench: llama7b: ") and " grid points: 1 measured on this machine" in err  # first line
    assert re.search(r"\[\d+/\d+ 0:\d\d ETA [\d:]+\] oom      tsp d8 S=131072", err), err  # its progress line


@pytest.mark.slow
def test_partly_invalid_grid_runs_the_rest_and_exits_1(tmp_path):
    rc, out, err = finish(cli([*FAST, "schemes=[single,tp]", "degree=3", "hydra.run.dir=run"], tmp_path))
    assert rc == 1, err
    assert "invalid  tp d3" in err  # printed as it is recorded
    statuses = {r["scheme"]: r["status"] for r in read_records([tmp_path / "run" / "results.jsonl"])}
    assert statuses == {"single": "ok", "tp": "invalid"}
    assert out.strip().splitlines()[-1] == "tspbench: 2 grid points: 1 ok, 1 invalid → exit 1"


def test_sigint_anywhere_then_resume_gives_every_run_ok_exactly_once(tmp_path):
    """SIGINT during a run, then right after each ok record is written (the parent is still waiting for the
    rank group to exit), resuming each time; at the end every run is ok exactly once in the file and in the
    summary, no failure follows an ok of the same run, and the resumed invocations left no Hydra dirs.

    Where each interrupt lands is fixed by the test, not by the clock: the first lands while rank 0 hangs in its
    first step (faults=hang, its line in the log); the others while the parent is stopped (SIGSTOP) in the run's
    wait and the run's ok record is already written, delivered when it continues (SIGCONT)."""
    run_dir = tmp_path / "run"
    results = run_dir / "results.jsonl"
    grid = [*FAST, "schemes=[single,tp]"]

    # 1. during the first run: rank 0 of `single` hangs in step 0 until the interrupt
    p = cli([*grid, "faults=hang", "faults.scheme=single", f"hydra.run.dir={run_dir}"], tmp_path)
    wait_for(p, lambda: "injected hang" in "".join(f.read_text() for f in run_dir.glob("*.log")), "the hang")
    p.send_signal(signal.SIGINT)
    rc, _, err = finish(p)
    assert rc == 130 and "resume_dir=" in err, err
    assert [r["status"] for r in read_records([results])] == ["failed"] and not worker_pids(str(run_dir))

    # 2. resume (without the fault), interrupting each run right after its ok record: `single`, then `tp`
    for i in range(2):
        hydra_dir = tmp_path / f"hydra{i}"
        p = cli([*grid, f"resume_dir={run_dir}", f"hydra.run.dir={hydra_dir}"], tmp_path)
        oks = sum(r["status"] == "ok" for r in read_records([results]))
        wait_for(p, lambda: bool(worker_pids(str(run_dir))), "a rank of the next run")
        os.kill(p.pid, signal.SIGSTOP)  # the parent is past starting the group: in run_measured's wait
        try:
            wait_for(None, lambda n=oks: sum(r["status"] == "ok" for r in read_records([results])) > n, "its ok")
            p.send_signal(signal.SIGINT)  # pending until the parent continues, then raised in the wait
        finally:
            os.kill(p.pid, signal.SIGCONT)
        rc, out, err = finish(p)
        assert rc == 130 and "resume_dir=" in err, err
        assert not hydra_dir.exists(), "a resumed invocation left its Hydra dir behind"

    # 3. a last invocation spawns nothing, finds every run ok and exits 0
    rc, out, err = finish(cli([*grid, f"resume_dir={run_dir}", f"hydra.run.dir={tmp_path / 'h'}"], tmp_path))
    assert rc == 0 and err.count("skip") == 2, err
    assert "2/2 runs ok" in out and out.strip().splitlines()[-1] == "tspbench: 2 grid points: 2 ok → exit 0"
    assert not (tmp_path / "h").exists() and not (tmp_path / "results").exists()

    recs = [json.loads(line) for line in results.read_text().splitlines()]
    by_run: dict[str, list[str]] = {}
    for r in recs:
        by_run.setdefault(r["run_id"], []).append(r["status"])
    assert len(by_run) == 2
    for rid, statuses in by_run.items():
        assert statuses.count("ok") == 1, (rid, statuses)  # nothing finished was redone
        assert statuses[-1] == "ok", (rid, statuses)  # and no failure was written after it


def wait_for(p: subprocess.Popen | None, ready: Callable[[], bool], what: str, timeout: float = 300) -> None:
    """Poll until `ready()`; fail naming `what` if `p` exits first or `timeout` passes (a bound, not a verdict)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if p is not None and p.poll() is not None:
            pytest.fail(f"exited {p.returncode} before {what}: {p.communicate()[1][-2000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no sign of {what} after {timeout:g} s")
        time.sleep(0.05)
