"""Progress you can read (tspbench/run/progress.py): the first line says what happens to the grid points and why,
every finished point gets one line with its place, the elapsed time and an ETA (estimates too, as each of the
parallel processes finishes, not all at the end), and progress=false keeps the lines without a bar."""

from __future__ import annotations

import re

import pytest

from tspbench.run.checks import precheck
from tspbench.run.dispatch import run_all
from tspbench.run.experiment import compose_experiment
from tspbench.run.progress import Progress, clock, plan_line


def test_first_line_counts_the_fates_and_says_why():
    specs = precheck(compose_experiment(["+exp=smoke"]))
    assert plan_line(specs) == "tspbench: smoke: 6 grid points: 6 measured on this machine"
    specs = precheck(compose_experiment(["+exp=smoke", "schemes=[single,tp]", "degree=3"]))
    assert plan_line(specs).startswith(
        "tspbench: smoke: 2 grid points: 1 measured on this machine, 1 refused (recorded invalid: model.n_heads=8"
    )
    specs = precheck(compose_experiment(["+exp=smoke", "scheme=tsp", "execution=estimate", "hardware=h100"]))
    assert plan_line(specs) == (
        "tspbench: smoke: 1 grid points: 0 measured on this machine, 1 estimated (execution=estimate, up to 2 "
        "devices; hardware profile h100)"
    )
    assert plan_line(specs, nodes=2, gpus_per_node=4).split(": ")[3].startswith("0 measured on 2 nodes × 4")


def test_first_line_without_the_devices():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA devices: auto would measure")
    specs = precheck(compose_experiment(["+exp=smoke", "scheme=tsp", "device=cuda", "hardware=h100"]))
    assert plan_line(specs) == (
        "tspbench: smoke: 1 grid points: 0 measured on this machine, 1 estimated and modelled (needs 2 cuda "
        "devices, found 0; hardware profile h100)"
    )


def test_lines_carry_place_elapsed_and_eta(capsys):
    view = Progress(3, "t", enabled=False)
    assert view.where() == "[0/3 0:00 ETA ?]"
    view.finished("ok       a")
    view.finished("ok       b")
    view.close()
    err = capsys.readouterr().err.splitlines()
    assert err == ["[1/3 0:00 ETA 0:00] ok       a", "[2/3 0:00 ETA 0:00] ok       b"]
    assert [clock(7), clock(754), clock(3723)] == ["0:07", "12:34", "1:02:03"]


def test_estimates_are_counted_as_each_finishes(tmp_path, capsys, monkeypatch):
    """Two estimates run in the estimate pool: each gets its line (and moves the bar) when it finishes, once,
    before the records are written in grid order. (The pool is a one-thread pool here: the same callbacks, without
    two spawned interpreters importing torch; `python -m tspbench +exp=llama7b` runs the process pool.)"""
    import concurrent.futures as cf

    monkeypatch.setattr(cf, "ProcessPoolExecutor", lambda max_workers, mp_context: cf.ThreadPoolExecutor(1))
    specs = precheck(compose_experiment(["+exp=smoke", "schemes=[tp,tsp]", "execution=estimate", "seq_len=32"]))
    recs = run_all(specs, tmp_path, progress=False)
    assert [(r["scheme"], r["method"], r["status"]) for r in recs] == [
        ("tp", "estimated", "ok"),
        ("tsp", "estimated", "ok"),
    ]
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert all(
        re.match(r"\[[12]/2 \d+:\d\d ETA [\d:]+\] ok       (tp|tsp) d2 S=32 B=1 train \[estimated\]", x) for x in lines
    )
    assert {x.split()[5] for x in lines} == {"tp", "tsp"}
