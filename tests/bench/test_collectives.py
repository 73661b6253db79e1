"""Micro-benchmarks (pytest-benchmark): collectives, one sharded linear, one attention step.

Skipped by default (pyproject: `-m 'not bench'`); run with `pytest -m bench tests/bench`. Two ranks: this
process (rank 0, timed by pytest-benchmark) and a mirror process (rank 1), see _mirror.py. Each call ends
with an explicit device sync; `extra_info` carries bytes, algbw and busbw (nccl-tests factors). On CPU
these are gloo numbers: they check the harness and calibrate nothing on a GPU (docs/method.md#peak-memory).
"""

from __future__ import annotations

import os
import statistics
import tempfile

import _mirror
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.bench

WORLD = 2
ROUNDS, WARMUP = 10, 2
SIZES = [1 << 10, 1 << 16, 1 << 20]  # float32 elements: 4 KiB, 256 KiB, 4 MiB


@pytest.fixture(scope="module")
def group():
    fd, init_file = tempfile.mkstemp(prefix="tspbench-bench-")
    os.close(fd)
    os.unlink(init_file)
    proc = mp.get_context("spawn").Process(target=_mirror.mirror_main, args=(1, WORLD, init_file), daemon=True)
    proc.start()
    device = _mirror.init(0, WORLD, init_file)
    yield device
    _mirror.command(device, stop=True)
    dist.destroy_process_group()
    proc.join(timeout=30)
    if os.path.exists(init_file):
        os.unlink(init_file)


def run(benchmark, device, op: str, numel: int) -> None:
    count = 1 if benchmark.disabled else WARMUP + ROUNDS
    _mirror.command(device, op, numel, count)
    fn, nbytes = _mirror.make_op(op, numel, device)
    benchmark.pedantic(fn, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)
    benchmark.extra_info.update(
        {"op": op, "world": WORLD, "backend": dist.get_backend(), "bytes": nbytes, "device": device.type}
    )
    if not benchmark.disabled:
        t = statistics.median(benchmark.stats.stats.data)
        algbw = nbytes / t / 1e9
        benchmark.extra_info.update(
            {
                "median_s": t,
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * _mirror.bus_factor(op, WORLD),
                "bus_factor": _mirror.bus_factor(op, WORLD),
            }
        )


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_reduce", "broadcast", "sendrecv"])
def test_collective(benchmark, group, op, numel):
    run(benchmark, group, op, numel)


@pytest.mark.parametrize("tokens", [2048])
def test_sharded_linear(benchmark, group, tokens):
    run(benchmark, group, "sharded_linear", tokens * 256)


@pytest.mark.parametrize("seq", [1024])
def test_attention_step(benchmark, group, seq):
    run(benchmark, group, "attention", seq)
