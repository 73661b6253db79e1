"""The Slurm environment as tspbench/run/slurm.py maps it, on a task whose node id, task id and host all differ from
the first node's: the node id (not the task id) numbers the torchrun node and decides the driver, the first host of
SLURM_JOB_NODELIST in Slurm's order (not this node's name, not the sorted first) hosts the control store and the
rendezvous. The integration tests (test_multinode.py) run a task with node id = task id on one machine only."""

from __future__ import annotations

from pathlib import Path

import pytest

from tspbench.run import slurm

TASK = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NUM_NODES": "3",
    "SLURM_NTASKS": "3",
    "SLURM_JOB_NODELIST": "gpu[07-08],gpu03",  # Slurm's order: gpu07 first, although gpu03 sorts first
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "2",
    "SLURMD_NODENAME": "gpu08",
}
"""The second node's task (node 1, host gpu08) that Slurm numbered task 2."""


@pytest.fixture(autouse=True)
def no_scontrol(monkeypatch):
    """The nodelist parsed here, not by a `scontrol` that this machine may have."""
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)


def test_node_id_not_task_id_numbers_the_node_and_the_first_listed_host_leads(monkeypatch):
    alloc = slurm.from_env(TASK)
    assert alloc is not None
    assert (alloc.job_id, alloc.nodes, alloc.tasks, alloc.node) == ("4242", 3, 3, 1)
    assert alloc.hosts == ("gpu07", "gpu08", "gpu03") and alloc.first_host == "gpu07"
    assert not alloc.driver and alloc.control_port == 20000 + 4242
    monkeypatch.setenv("SLURMD_NODENAME", TASK["SLURMD_NODENAME"])
    assert slurm.node_name() == "gpu08"  # the record's host for this node, not the store's host

    cmd = slurm.agent_command(Path("spec.json"), alloc, 8, f"{alloc.first_host}:29500", "rdzv", 600)
    flag = {k: cmd[cmd.index(k) + 1] for k in ("--nnodes", "--node-rank", "--nproc-per-node", "--rdzv-backend")}
    assert flag == {"--nnodes": "3", "--node-rank": "1", "--nproc-per-node": "8", "--rdzv-backend": "static"}
    assert cmd[cmd.index("--rdzv-endpoint") + 1] == "gpu07:29500"


def test_the_driver_is_node_0_whatever_its_task_id():
    first = slurm.from_env({**TASK, "SLURM_NODEID": "0", "SLURM_PROCID": "1", "SLURMD_NODENAME": "gpu07"})
    assert first is not None and first.driver and first.node == 0 and first.first_host == "gpu07"
    assert not slurm.from_env({**TASK, "SLURM_NODEID": "2", "SLURM_PROCID": "0"}).driver  # type: ignore[union-attr]


def test_allocation_for_keeps_the_mapping_and_the_experiments_port():
    alloc = slurm.allocation_for(3, 8, "cpu", env=TASK, control_port=21000)
    assert (alloc.node, alloc.first_host, alloc.control_port) == (1, "gpu07", 21000)
