"""The measured window's edges (GPU review finding 12) and the allocator settings of a measured CUDA run, on CPU
with the device calls mocked: the ranks meet at a barrier before any rank starts its clock; the last warm-up step
runs from an empty allocator cache, so peak_reserved (reset at the window's start) is the steady state's, with no
cache release inside the window; the supervisor runs device=cuda ranks with expandable segments unless the user
set the allocator's settings, and the record names what ran."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from tspbench.measure import memory as memory_mod
from tspbench.measure import timing
from tspbench.run import loop, supervise
from tspbench.schemes.comm import CommLog

ALLOC_VARS = memory_mod.ALLOC_CONF_VARS


def _run(device: torch.device, events: list[str], warmup: int = 2):
    spec = SimpleNamespace(measured_steps=2, warmup_steps=warmup, power_sample_s=0.1)
    return SimpleNamespace(spec=spec, device=device, log=CommLog(), step=lambda: events.append("step"))


def test_ranks_meet_at_a_barrier_before_the_clock_starts():
    events: list[str] = []
    real_start = timing.StepTimer.start

    def start(self):
        events.append("clock")
        real_start(self)

    with (
        mock.patch.object(loop.dist, "barrier", lambda *a, **k: events.append("barrier")),
        mock.patch.object(timing.StepTimer, "start", start),
    ):
        loop.measured_window(_run(torch.device("cpu"), events), rank=1, n_tokens=64)
    assert events == ["barrier", "clock", "step", "step"]


@pytest.mark.parametrize("warmup,want", [(2, ["step", "empty_cache", "step"]), (1, ["empty_cache", "step"])])
def test_last_warmup_step_runs_from_an_empty_cache(warmup, want):
    events: list[str] = []
    with (
        mock.patch.object(torch.cuda, "empty_cache", lambda: events.append("empty_cache")),
        mock.patch.object(torch.cuda, "reset_peak_memory_stats", lambda d=None: events.append("reset_peaks")),
    ):
        run = _run(torch.device("cuda", 0), events, warmup)
        loop.first_steps(run, loop.Fault({}, 0))  # type: ignore[arg-type]
        memory_mod.reset_peaks(run.device)  # the window's start: no release there (its first step would pay it)
    assert events == [*want, "reset_peaks"]


@pytest.fixture
def no_alloc_conf(monkeypatch):
    for k in ALLOC_VARS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_cuda_ranks_get_expandable_segments(no_alloc_conf):
    env = supervise.worker_env("torchrun", "cuda")
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert memory_mod.alloc_conf(env) == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert not any(k in supervise.worker_env("torchrun", "cpu") for k in ALLOC_VARS)


@pytest.mark.parametrize("var", ALLOC_VARS)
def test_a_users_allocator_settings_are_kept(no_alloc_conf, var):
    no_alloc_conf.setenv(var, "max_split_size_mb:128")
    env = supervise.worker_env("torchrun", "cuda")
    assert env[var] == "max_split_size_mb:128"
    assert [k for k in ALLOC_VARS if k in env] == [var]
    assert memory_mod.alloc_conf(env) == f"{var}=max_split_size_mb:128"


def test_run_measured_starts_ranks_with_the_specs_device(no_alloc_conf, tmp_path: Path):
    from tspbench.record.spec import RunSpec

    base = dict(experiment="t", scheme="tsp", degree=2, tp=0, dp=1, sp_variant="allgather", recompute="none")
    spec = RunSpec(
        **base,
        seq_len=64,
        batch=1,
        mode="train",
        dtype="bfloat16",
        device="cuda",
        execution="measure",
        hardware=None,
        model={},
        results_file=str(tmp_path / "r.jsonl"),
        status_dir=str(tmp_path / "status"),
    )
    seen = {}

    def popen(cmd, env, **kw):
        seen.update(env)
        raise RuntimeError("not started")

    with mock.patch.object(subprocess, "Popen", popen), pytest.raises(RuntimeError, match="not started"):
        supervise.run_measured(spec, tmp_path)
    assert seen["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_record_names_the_allocator_settings():
    from test_records_doc import rank, spec

    from tspbench.record.measured import Gathered, build_record

    conf = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    run = Gathered([rank("train")] * 2, 1.0, 64, "t0", "t1", "nccl", "torchrun", conf)
    assert build_record(spec("train"), run)["provenance"]["alloc_conf"] == conf
