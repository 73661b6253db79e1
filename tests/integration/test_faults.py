"""Injected faults (conf/faults/) each leave a correct record while the other runs of the grid finish.

Each test runs a two-run grid, the faulty `tp` run first and a healthy `single` run after it, through the
same `run_all` the CLI uses (the configs come from Hydra's Compose API, so conf/faults/ is exercised too).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from proc_util import worker_pids

from tspbench.run.dispatch import run_all
from tspbench.run.experiment import compose_experiment
from tspbench.run.grid import expand_grid

pytestmark = pytest.mark.slow  # each test launches two rank groups; one waits out a timeout

FAST = [
    "+exp=smoke",
    "model.n_layers=1",
    "seq_len=32",
    "warmup_steps=1",
    "measured_steps=2",
    "progress=false",
    "memory_breakdown=false",
    "schemes=[tp,single]",
]


def run(tmp_path: Path, *overrides: str) -> list[dict]:
    specs = expand_grid(compose_experiment([*FAST, *overrides]))
    assert [s.scheme for s in specs] == ["tp", "single"]
    assert specs[0].fault["kind"] != "none" and specs[1].fault["kind"] == "none"
    return run_all(specs, tmp_path, progress=False)


def test_crash_is_recorded_failed_with_log_tail(tmp_path):
    tp, single = run(tmp_path, "faults=crash", "faults.scheme=tp", "faults.rank=1")
    assert tp["status"] == "failed"
    assert tp["reason"].startswith("rank 1: RuntimeError: injected crash")  # root cause first
    assert tp["failed_rank"] == 1
    assert "raise RuntimeError" in tp["log_tail"] and "on rank 1" in tp["log_tail"]  # its traceback
    assert Path(tp["log_file"]).exists() and tp["fault"] == "crash"
    assert single["status"] == "ok" and single["fault"] is None
    assert not worker_pids(str(tmp_path))


def test_oom_is_recorded_with_the_attempted_configuration(tmp_path):
    tp, single = run(tmp_path, "faults=oom", "faults.scheme=tp", "faults.rank=1")
    assert tp["status"] == "oom"
    assert tp["reason"].startswith("rank 1: OutOfMemoryError: injected OOM")
    assert tp["attempted"] == {
        "scheme": "tp",
        "degree": 2,
        "dp": 1,
        "tp": 0,
        "seq_len": 32,
        "batch": 1,
        "mode": "train",
        "dtype": "float32",
        "recompute": "none",
        "model": "tiny",
    }
    assert single["status"] == "ok"


def test_hang_is_killed_after_timeout_and_recorded(tmp_path):
    t0 = time.monotonic()
    tp, single = run(tmp_path, "faults=hang", "faults.scheme=tp", "timeout_s=20")
    assert tp["status"] == "timeout"
    assert "timeout_s=20" in tp["reason"] and "injected hang" in tp["log_tail"]
    assert single["status"] == "ok"
    assert time.monotonic() - t0 >= 20  # killed at its timeout_s, not before (a bound no machine's speed breaks)
    time.sleep(0.5)
    assert not worker_pids(str(tmp_path)), "the hung rank group survived the kill"


def test_log_tail_drops_torchruns_own_report(tmp_path):
    """The ranks' lines survive whatever torchrun prints while it shuts a group down: its agent's log lines,
    a logging error raised inside its signal handler, and tracebacks through the elastic agent."""
    from tspbench.run.supervise import log_tail

    agent = "W1202 15:10:34.302000 10228 site-packages/torch/distributed/elastic/agent/server/api.py:753] "
    noise_a = [agent + "Received 15 death signal, shutting down workers"] + ["  noise"] * 60
    noise_b = [
        "--- Logging error ---",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3.11/logging/__init__.py", line 1113, in emit',
    ] + ["  noise"] * 60
    noise_c = ["Traceback (most recent call last):", '  File "x/torch/distributed/elastic/agent/server/api.py"']
    rank_tb = [
        "Traceback (most recent call last):",
        '  File "tspbench/run/loop.py", line 10, in benchmark',
        "RuntimeError: injected crash (faults.kind=crash) on rank 1",
    ]
    for noise in (noise_a, noise_b, noise_c + ["  noise"] * 60):
        log = tmp_path / "run.log"
        log.write_text("\n".join(["# header", "rank 0: injected hang (faults.kind=hang)", *rank_tb, *noise]))
        tail = log_tail(log)
        assert "injected hang" in tail and "injected crash" in tail and "noise" not in tail
        assert tail.endswith("[torchrun's own report trimmed; full output in the log file]")
