"""Multi-node torchrun on one machine: two torchrun agents as two "nodes" of two CPU ranks each (c10d
rendezvous on localhost, --nnodes 2 --node-rank 0/1) run the worker on a frozen spec; the record equals a
single-node four-rank run of the same spec in loss, per-layer communication and the memory breakdown.

Then the same through the Slurm path (tspbench/run/slurm.py): two `python -m tspbench ... nodes=2` processes, each
with the environment Slurm and submitit give one task of a two-node allocation (SLURM_JOB_ID, SLURM_JOB_NUM_NODES,
SLURM_NODEID, SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_NODELIST of two names for this machine, SLURMD_NODENAME,
SUBMITIT_EXECUTOR=slurm), run the Hydra job a Slurm task runs; the first node drives, the second follows, and the
record names both hosts and equals a four-rank run of `python -m tspbench` on one node."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from proc_util import tspbench_process

from tspbench.record.store import read_records
from tspbench.run.experiment import compose_experiment
from tspbench.run.grid import expand_grid
from tspbench.run.supervise import free_port, worker_command

ROOT = Path(__file__).resolve().parents[2]
SPEC = ["+exp=smoke", "model.n_layers=1", "seq_len=32", "warmup_steps=1", "measured_steps=2", "progress=false"]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def _two_nodes(spec_file: Path, results: Path) -> list[subprocess.Popen]:
    port = free_port()
    agents = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node)]
        cmd += ["--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
        cmd += ["--rdzv-id", "tspbench-two-nodes", "--max-restarts", "0"]
        cmd += ["-m", "tspbench.run.worker", f"spec={spec_file}", f"results={results}"]
        agents.append(subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return agents


def _same_numbers(a: dict, b: dict) -> None:
    """b's record equals a's in loss, per-layer communication and the memory breakdown. Exact: what the step issues
    and holds by construction (collectives, parameters, gradients). The split at the peak (optimizer / activations /
    temporaries / total) is MemTracker's snapshot at the moment of the rank's peak, which on CPU moves with when gloo's
    worker threads release a buffer: two otherwise identical runs under load were seen 64 KiB apart (optimizer, total).
    Those compare within 256 KiB, far below any layout difference."""
    ma, mb = a["metrics"], b["metrics"]
    assert ma["loss"] is not None and mb["loss"] == ma["loss"]
    exact = [k for k in ma if k.startswith("comm_") or k in ("mem_params_gib", "mem_grads_gib")]
    peak = [k for k in ma if k.startswith("mem_") and k not in exact and isinstance(ma[k], float)]
    assert any(k.startswith("comm_") for k in exact) and "mem_total_gib" in peak
    assert {k: mb[k] for k in exact} == {k: ma[k] for k in exact}
    assert {k: mb[k] for k in peak} == pytest.approx({k: ma[k] for k in peak}, abs=256 / 2**20)
    for k in ("comm_bytes_per_layer_fwd", "comm_bytes_per_layer_bwd"):
        if k in a["per_rank"]:
            assert json.dumps(b["per_rank"][k]) == json.dumps(a["per_rank"][k]), k


def test_two_torchrun_nodes_equal_one_node(tmp_path):
    (spec,) = expand_grid(compose_experiment([*SPEC, "schemes=[tsp]", "degree=4"]))
    spec = replace(spec, status_dir=str(tmp_path / "status"))
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec.to_json())

    one = tmp_path / "one_node.jsonl"
    cmd = worker_command(spec_file, 4, free_port()) + [f"results={one}"]
    r = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    two = tmp_path / "two_nodes.jsonl"
    agents = _two_nodes(spec_file, two)
    outs = [a.communicate(timeout=300)[0].decode()[-3000:] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], "\n".join(outs)

    (a,), (b,) = read_records([one]), read_records([two])
    assert a["status"] == b["status"] == "ok"
    assert (a["nodes"], b["nodes"]) == (1, 2)  # the worker saw two nodes of two local ranks
    _same_numbers(a, b)


NODES = ("localhost", "127.0.0.1")
"""Two names of this machine, as SLURM_JOB_NODELIST lists the allocation's nodes (the first drives)."""


def _slurm_task(node: int, job_id: str) -> dict:
    """The environment of task `node` of a two-node, one-task-per-node allocation, as Slurm sets it and submitit's
    JobEnvironment reads it."""
    env = {k: v for k, v in _env().items() if not k.startswith(("SLURM", "SUBMITIT_"))}
    env.update(
        SLURM_JOB_ID=job_id,
        SLURM_JOB_NUM_NODES="2",
        SLURM_NNODES="2",
        SLURM_NODEID=str(node),
        SLURM_PROCID=str(node),
        SLURM_LOCALID="0",
        SLURM_NTASKS="2",
        SLURM_NTASKS_PER_NODE="1",
        SLURM_JOB_NODELIST=",".join(NODES),
        SLURM_NODELIST=",".join(NODES),
        SLURMD_NODENAME=NODES[node],
        SUBMITIT_EXECUTOR="slurm",
        HYDRA_FULL_ERROR="0",
    )
    return env


def _allocation(grid: list[str], run_dir: Path, cwd: Path, job_id: str) -> tuple[list[int], list[tuple[str, str]]]:
    """Both tasks of a two-node allocation running `grid` into one (shared) run dir: exit codes, (stdout, stderr)."""
    port = free_port()
    tasks = [
        tspbench_process(
            [*grid, "nodes=2", "gpus_per_node=2", f"control_port={port}", f"hydra.run.dir={run_dir}"],
            cwd,
            _slurm_task(n, job_id),
        )
        for n in (0, 1)
    ]
    outs = [t.communicate(timeout=300) for t in tasks]
    return [t.returncode for t in tasks], outs


# Not slow, so that CI runs it (three `python -m tspbench` processes and two four-rank groups: ~25 s on 2 cores)
def test_slurm_two_node_allocation_equals_one_node(tmp_path):
    grid = [*SPEC, "schemes=[tsp]", "degree=4", "report=false"]
    # the reference: four ranks on one node, the ordinary command
    one = tspbench_process([*grid, f"hydra.run.dir={tmp_path / 'one'}"], tmp_path, _env())
    _, err = one.communicate(timeout=300)
    assert one.returncode == 0, err[-3000:]

    # the allocation: one task per node, both running the Hydra job of a Slurm task into one (shared) run dir
    run_dir = tmp_path / "two"
    job_id = str(4000 + os.getpid() % 1000)
    codes, outs = _allocation(grid, run_dir, tmp_path, job_id)
    assert codes == [0, 0], "\n".join(o[1][-3000:] for o in outs)

    (a,) = read_records([tmp_path / "one" / "results.jsonl"])
    (b,) = read_records([run_dir / "results.jsonl"])  # written once, by global rank 0
    assert a["status"] == b["status"] == "ok" and a["run_id"] == b["run_id"]
    assert (a["nodes"], b["nodes"]) == (1, 2) and b["world_size"] == 4
    assert b["hosts"] == list(NODES) and len(a["hosts"]) == 1  # every node, in rank order (node 0: ranks 0, 1)
    assert "tspbench.run.slurm" in b["provenance"]["launcher"] and f"Slurm job {job_id}" in b["provenance"]["launcher"]
    _same_numbers(a, b)
    # the driver started its node's agent with --nnodes 2; the follower its own, logged beside the run's log
    log = (run_dir / f"{b['run_id']}.log").read_text().splitlines()[1]
    assert "--nnodes 2 --node-rank 0 --nproc-per-node 2 --rdzv-backend static --rdzv-endpoint localhost:" in log
    follower_log = (run_dir / f"{b['run_id']}.node1.log").read_text()
    assert (
        "--nnodes 2 --node-rank 1 --nproc-per-node 2 --rdzv-backend static --rdzv-endpoint localhost:" in follower_log
    )
    driver_err, follower_err = outs[0][1], outs[1][1]
    assert "1 grid points: 1 measured on 2 nodes × 2" in driver_err
    assert outs[0][0].strip().splitlines()[-1] == "tspbench: 1 grid points: 1 ok → exit 0"
    assert "the driver ended the grid (done) after 1 run(s)" in follower_err
    assert not (run_dir / "results.jsonl").read_text().count("\n") > 1  # the follower wrote no record


def test_slurm_allocation_is_checked_before_any_rank_starts(tmp_path):
    """nodes=2 outside an allocation, or in one of another shape, is refused with one line (exit 2 from the
    command, before any rank starts and leaving no run dir)."""
    from tspbench.config import ConfigError
    from tspbench.run.slurm import allocation_for, refused_in_multi_task_job

    grid = [*SPEC, "schemes=[tsp]", "degree=4", "report=false", "nodes=2", "gpus_per_node=2"]
    p = tspbench_process([*grid, "hydra.run.dir=x"], tmp_path, _env())
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2 and err.count("\n") == 1, err
    assert err.startswith("tspbench: nodes=2 runs inside a Slurm allocation of 2 nodes (SLURM_JOB_ID is not set)")
    assert not (tmp_path / "x").exists()

    task = _slurm_task(0, "77")
    assert allocation_for(2, 2, "cpu", task).hosts == NODES
    for env, needle in (
        ({**task, "SLURM_NTASKS": "4"}, "allowed: one task per node (hydra.launcher.tasks_per_node=1)"),
        ({**task, "SLURM_JOB_NUM_NODES": "3"}, "nodes=2 but the Slurm allocation has 3 node(s)"),
        ({**task, "SLURM_JOB_NODELIST": "localhost"}, "SLURM_JOB_NODELIST names 1 host(s) (localhost) for 2 nodes"),
    ):
        with pytest.raises(ConfigError, match=re.escape(needle)):
            allocation_for(2, 2, "cpu", env)
    line = refused_in_multi_task_job(1, task)
    assert line is not None and line.startswith("nodes=1 but this Slurm job runs 2 tasks")
    assert refused_in_multi_task_job(1, {**task, "SUBMITIT_EXECUTOR": "local"}) is None


def test_nodelist_expansion_matches_slurm():
    from tspbench.run.slurm import expand_nodelist

    assert expand_nodelist("gpu[01-03,07],login2") == ["gpu01", "gpu02", "gpu03", "gpu07", "login2"]
    assert expand_nodelist("n[1-2]x[3-4]") == ["n1x3", "n1x4", "n2x3", "n2x4"]
    assert expand_nodelist("node-a,node[10-11]-ib") == ["node-a", "node10-ib", "node11-ib"]
    assert expand_nodelist(",".join(NODES)) == list(NODES)


@pytest.mark.slow  # two `python -m tspbench` processes, one four-rank group: ~30 s on 2 cores
def test_slurm_rank_failure_on_the_second_node_is_recorded_once(tmp_path):
    """A crash on rank 3 (the second node's second rank): the first node's supervisor records the run `failed` with
    that rank's traceback, once, and exits 1; the second node's task ends when the first says the grid is over."""
    grid = [*SPEC, "schemes=[tsp]", "degree=4", "report=false", "faults=crash", "faults.rank=3"]
    run_dir = tmp_path / "two"
    codes, outs = _allocation(grid, run_dir, tmp_path, str(5000 + os.getpid() % 1000))
    assert codes == [1, 0], "\n".join(o[1][-3000:] for o in outs)
    (rec,) = read_records([run_dir / "results.jsonl"])
    assert rec["status"] == "failed" and rec["failed_rank"] == 3 and rec["reason"].startswith("rank 3:")
    assert rec["hosts"] == list(NODES) and rec["provenance"]["recorded_by"] == "parent"
    assert outs[0][0].strip().splitlines()[-1] == "tspbench: 1 grid points: 0 ok, 1 failed → exit 1"
