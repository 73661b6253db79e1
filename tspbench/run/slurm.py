"""Measured runs across the nodes of one Slurm allocation (`nodes` > 1 in the experiment).

The design: **one task per node, each node one torchrun agent per measured run** (as torchtitan's and Megatron's
Slurm scripts do), not one task per GPU joined with env://. A sweep job is one allocation of `nodes` nodes
through hydra-submitit-launcher (conf/hydra/launcher/slurm_8gpu.yaml: `tasks_per_node: 1`), so every node runs
the same Hydra job, `python -m tspbench`'s `main`, once. Why per node: each node keeps the supervisor it has on one
machine (tspbench/run/supervise.py: the rank group in its own session, timeout_s, killing the whole group, the
ranks' status files turned into `oom` / `failed` records, Ctrl-C), torchrun restarts and tears down the node's
ranks as one, and a spec needs no change between one node and N (the worker reads RANK / WORLD_SIZE /
LOCAL_RANK from torchrun either way). One task per GPU would give every rank its own Python parent and leave
nobody on the node to kill a hung rank or classify a failure.

Who does what. The task on the allocation's first node (SLURM_NODEID 0, the first host of SLURM_JOB_NODELIST)
is the *driver*: it runs the grid exactly as on one machine (pre-check, fates, estimates, memory check, records,
summary, exit code). The other tasks are *followers*: they run nothing of their own. For each measured run whose
world is the whole allocation (dp × degree = nodes × gpus_per_node) the driver publishes, on a TCPStore it hosts on
the first host (port `control_port`), the frozen spec and a fresh rendezvous endpoint on its own host; then every
node starts

    torchrun --nnodes N --node-rank $SLURM_NODEID --nproc-per-node G --rdzv-backend static
             --rdzv-endpoint <first host>:<port> --rdzv-id <job>-<n> ... -m tspbench.run.worker spec=FILE

and the ranks rendezvous. The rendezvous is torchrun's `static` one (node K's ranks are K·G … K·G + G − 1, the
store on the first host), not `c10d`: c10d ignores --node-rank (torch warns so) and numbers the nodes by sorted
hostname and process id, so global rank 0, which writes the record, could land on a follower while the driver's
supervisor, seeing its own agent exit, looks for that record. After its agent exits the driver waits (bounded)
for every follower's agent to exit too before it reads the outcome and moves on; a follower whose agent is still
running when the driver publishes the next run kills it. A run whose world fits one node (`single`, a degree-8
point in a 16-GPU allocation) runs on the driver's node alone, as without Slurm. Rank 0 appends the record to the
run's results file, so the run directory must be on a filesystem every node sees (submitit's own folder must be
too); the record's `hosts` names every node the ranks ran on. Each follower logs its agent to
`<run dir>/<run_id>.node<K>.log`; the driver's supervisor writes the failure records, so a run is recorded once.

Environment read (what Slurm sets in every task; submitit's JobEnvironment reads the same): SLURM_JOB_ID,
SLURM_JOB_NUM_NODES (or SLURM_NNODES), SLURM_NODEID, SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_NODELIST (expanded with
`scontrol show hostnames` when scontrol is there, else parsed here); SLURMD_NODENAME names the node in the record
(else the hostname). The experiment's `control_port` sets the control port (default 20000 + job id mod 10000).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from tspbench.config import ConfigError
from tspbench.run.supervise import free_port, worker_tail

CONNECT_TIMEOUT_S = 900.0
"""How long a follower waits for the driver's control store to come up (the driver composes and pre-checks
first), and how long the driver waits for each follower's acknowledgement of the end."""


@dataclass(frozen=True)
class Allocation:
    """This task's place in a Slurm allocation (one task per node)."""

    job_id: str
    nodes: int
    node: int
    hosts: tuple[str, ...]
    tasks: int
    port: int | None = None
    """The experiment's `control_port`, or None: derived from the job id (`control_port`)."""

    @property
    def driver(self) -> bool:
        """The first node's task runs the grid; the others follow it."""
        return self.node == 0

    @property
    def first_host(self) -> str:
        return self.hosts[0]

    @property
    def control_port(self) -> int:
        """The driver's TCPStore port (the same number on every node): the experiment's control_port, else from the
        job id."""
        if self.port is not None:
            return self.port
        digits = re.sub(r"\D", "", self.job_id) or "0"
        return 20000 + int(digits) % 10000


# ------------------------------------------------------------------------------------------ the environment
def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM_JOB_NODELIST ("gpu[01-03,07],login2") → hostnames, in Slurm's order: `scontrol show hostnames` when
    available, else parsed here (prefix[ranges] groups, ranges keep their zero padding)."""
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
            ).stdout.split()
            if out:
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    groups, depth, cur = [], 0, ""
    for c in nodelist.strip():  # split at the commas outside brackets
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            groups.append(cur)
            cur = ""
        else:
            cur += c
    hosts: list[str] = []
    for group in [*groups, cur]:
        names = [""]
        for literal, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", group):
            names = [n + literal for n in names]
            if ranges:
                names = [n + s for n in names for s in _expand_ranges(ranges)]
        hosts += [n for n in names if n]
    return hosts


def _expand_ranges(ranges: str) -> list[str]:
    out = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        if not hi:
            out.append(lo)
            continue
        out += [f"{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1)]
    return out


def from_env(env: dict[str, str] | None = None) -> Allocation | None:
    """The allocation this process runs in, or None outside Slurm (no SLURM_JOB_ID)."""
    env = dict(os.environ) if env is None else env
    if "SLURM_JOB_ID" not in env:
        return None

    def num(*keys: str, default: int) -> int:
        for k in keys:
            if env.get(k, "").strip():
                return int(env[k].split("(")[0])
        return default

    nodes = num("SLURM_JOB_NUM_NODES", "SLURM_NNODES", default=1)
    hosts = tuple(expand_nodelist(env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", ""))))
    return Allocation(
        job_id=env["SLURM_JOB_ID"],
        nodes=nodes,
        node=num("SLURM_NODEID", default=0),
        hosts=hosts or (socket.gethostname(),),
        tasks=num("SLURM_NTASKS", default=nodes),
    )


def node_name() -> str:
    """This node's name as Slurm lists it (SLURMD_NODENAME), else the hostname: what a record's `hosts` holds."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def allocation_for(
    nodes: int, gpus_per_node: int, device: str, env: dict[str, str] | None = None, control_port: int | None = None
) -> Allocation:
    """Check, on every node when the job starts, that the allocation is the one the experiment asks for; one line
    (ConfigError) otherwise. `control_port`: the experiment's (None: from the job id)."""
    alloc = from_env(env)
    if alloc is not None and control_port is not None:
        alloc = replace(alloc, port=control_port)
    if alloc is None:
        raise ConfigError(
            f"nodes={nodes} runs inside a Slurm allocation of {nodes} nodes (SLURM_JOB_ID is not set); allowed: "
            f"nodes=1 here, or python -m tspbench -m ... nodes={nodes} hydra/launcher=slurm_8gpu"
        )
    if alloc.nodes != nodes:
        raise ConfigError(
            f"nodes={nodes} but the Slurm allocation has {alloc.nodes} node(s) (SLURM_JOB_NUM_NODES); allowed: "
            f"nodes={alloc.nodes}, or hydra.launcher.nodes={nodes}"
        )
    if alloc.tasks != alloc.nodes:
        raise ConfigError(
            f"the Slurm allocation runs {alloc.tasks} tasks on {alloc.nodes} nodes (SLURM_NTASKS); allowed: one task "
            "per node (hydra.launcher.tasks_per_node=1): each node's task starts that node's ranks with torchrun"
        )
    if len(alloc.hosts) != alloc.nodes:
        raise ConfigError(
            f"SLURM_JOB_NODELIST names {len(alloc.hosts)} host(s) ({','.join(alloc.hosts)}) for {alloc.nodes} nodes"
        )
    if device == "cuda":
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < gpus_per_node:
            raise ConfigError(
                f"gpus_per_node={gpus_per_node} but node {alloc.node} ({node_name()}) sees {have} cuda device(s); "
                f"allowed: gpus_per_node ≤ {have}, or hydra.launcher.gpus_per_node={gpus_per_node}"
            )
    return alloc


def refused_in_multi_task_job(nodes: int, env: dict[str, str] | None = None) -> str | None:
    """A submitit Slurm job of several tasks with nodes=1 would run the grid once per task (duplicate records):
    the one line refusing it, or None."""
    env = dict(os.environ) if env is None else env
    alloc = from_env(env)
    if nodes == 1 and env.get("SUBMITIT_EXECUTOR") == "slurm" and alloc is not None and alloc.tasks > 1:
        return (
            f"nodes=1 but this Slurm job runs {alloc.tasks} tasks; allowed: nodes={alloc.nodes} with "
            "hydra.launcher.tasks_per_node=1, or hydra.launcher.nodes=1 hydra.launcher.tasks_per_node=1"
        )
    return None


def refused_launcher(argv: list[str], multirun: bool, which=shutil.which) -> str | None:
    """A `hydra/launcher=NAME` on the command line that cannot do what it says, as one line (else None): any launcher
    but `basic` without -m (Hydra would ignore it and run here), a Slurm one (submitit_slurm or a conf/hydra/launcher
    file built on it, e.g. slurm_8gpu) where Slurm's `srun` is not on PATH (submitit would fail with a traceback)."""
    from tspbench.paths import conf_dir

    names = [a.split("=", 1)[1] for a in argv if "=" in a and a.split("=", 1)[0].lstrip("+~") == "hydra/launcher"]
    if not names or names[-1] == "basic":
        return None
    name = names[-1]
    if not multirun:
        return (
            f"hydra/launcher={name} launches only a sweep; allowed: add -m (python -m tspbench -m ...), or no "
            "hydra/launcher to run here"
        )
    own = conf_dir() / "hydra" / "launcher" / f"{name}.yaml"
    slurm = name == "submitit_slurm" or (own.is_file() and "submitit_slurm" in own.read_text())
    if slurm and which("srun") is None:
        return (
            f"hydra/launcher={name} submits each job to Slurm, but srun is not on PATH here (not a Slurm cluster's "
            "node); allowed: run it on the cluster's login node, or hydra/launcher=submitit_local to run the jobs here"
        )
    return None


# ------------------------------------------------------------------------------------------ the commands
def agent_command(
    spec_file: Path, alloc: Allocation, per_node: int, endpoint: str, rdzv_id: str, timeout_s: float
) -> list[str]:
    """One node's torchrun agent of a run across the allocation."""
    join = int(max(60.0, min(timeout_s, 900.0)))  # how long an agent waits for the others at the rendezvous
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(alloc.nodes),
        "--node-rank",
        str(alloc.node),
        "--nproc-per-node",
        str(per_node),
        "--rdzv-backend",
        "static",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        rdzv_id,
        "--rdzv-conf",
        f"timeout={join}",
        *worker_tail(spec_file),
    ]


def _store(alloc: Allocation, timeout_s: float):
    from torch.distributed import TCPStore

    return TCPStore(
        alloc.first_host,
        alloc.control_port,
        is_master=alloc.driver,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
    )


# ------------------------------------------------------------------------------------------------ driver
class Driver:
    """The first node's side: a supervise.RankGroup whose command is this node's agent of a run across every node
    (published to the followers first), and the end of the job for them (`close`)."""

    def __init__(self, alloc: Allocation, per_node: int):
        self.alloc = alloc
        self.per_node = per_node
        self.store = _store(alloc, CONNECT_TIMEOUT_S)
        self.n = 0
        self.launcher = f"torchrun --nnodes {alloc.nodes} (tspbench.run.slurm, Slurm job {alloc.job_id})"

    @property
    def hosts(self) -> list[str]:
        return list(self.alloc.hosts)

    def spans(self, world_size: int) -> bool:
        """Does a run of this world size span the allocation (else it runs on this node alone)?"""
        return world_size == self.alloc.nodes * self.per_node

    def command(self, spec: Any, spec_file: Path) -> list[str]:
        """Publish the run to the followers, then this node's agent command."""
        endpoint = f"{self.alloc.first_host}:{free_port('')}"
        rdzv_id = f"tspbench-{self.alloc.job_id}-{self.n}"
        run_dir = str(spec_file.parent.parent)
        msg = {"spec": spec.to_json(), "endpoint": endpoint, "rdzv_id": rdzv_id, "run_dir": run_dir}
        self.store.set(f"run/{self.n}", json.dumps(msg))
        self.n += 1
        return agent_command(spec_file, self.alloc, self.per_node, endpoint, rdzv_id, spec.timeout_s)

    def settle(self, timeout_s: float = 60.0) -> list[str]:
        """After this node's agent exited: wait (at most `timeout_s`) until every follower's agent has exited too;
        what went wrong there, one note per node (a failure record's reason carries them)."""
        n = self.n - 1
        deadline = time.monotonic() + timeout_s
        notes, waiting = [], list(range(1, self.alloc.nodes))
        while waiting and time.monotonic() < deadline:
            for k in [k for k in waiting if self.store.check([f"exit/{n}/{k}"])]:
                waiting.remove(k)
                rc = self.store.get(f"exit/{n}/{k}").decode()
                if rc != "0":
                    notes.append(f"node {k} ({self.alloc.hosts[k]}): agent exited {rc}")
            time.sleep(0.1)
        notes += [f"node {k} ({self.alloc.hosts[k]}): agent still running after {timeout_s:g} s" for k in waiting]
        return notes

    def close(self, why: str = "done") -> None:
        """Tell the followers the grid is over and wait (bounded) until each has read it: the store lives in this
        process, so leaving at once could cut them off before they know."""
        self.store.set(f"run/{self.n}", json.dumps({"end": why}))
        deadline = time.monotonic() + 60.0
        waiting = [k for k in range(1, self.alloc.nodes)]
        while waiting and time.monotonic() < deadline:
            waiting = [k for k in waiting if not self.store.check([f"ack/{k}"])]
            time.sleep(0.2)


# ---------------------------------------------------------------------------------------------- follower
def follow(alloc: Allocation, say=print) -> int:
    """A follower node's whole job: for each run the driver publishes, start this node's torchrun agent and wait
    for it (killing it after the run's timeout_s); stop when the driver says the grid is over. 0, or 1 when the
    driver went away without saying so."""
    from tspbench.record.spec import RunSpec
    from tspbench.run.supervise import kill_group, worker_env

    say(f"tspbench: node {alloc.node} of {alloc.nodes} ({node_name()}): following the driver on {alloc.first_host}")
    try:
        store = _store(alloc, CONNECT_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - one line, not a traceback
        say(f"tspbench: node {alloc.node}: no driver at {alloc.first_host}:{alloc.control_port}: {e}")
        return 1
    n = 0
    while True:
        key = f"run/{n}"
        try:
            while not store.check([key]):
                time.sleep(0.2)
            msg = json.loads(store.get(key))
        except Exception as e:  # noqa: BLE001 - the driver's store is gone: it died or was killed
            say(f"tspbench: node {alloc.node}: lost the driver ({type(e).__name__}); stopping")
            return 1
        if "end" in msg:
            store.set(f"ack/{alloc.node}", msg["end"])
            say(f"tspbench: node {alloc.node}: the driver ended the grid ({msg['end']}) after {n} run(s)")
            return 0
        spec = RunSpec.from_json(msg["spec"])
        here = Path(msg["run_dir"])
        spec_file = here / "specs" / f"{spec.run_id}.node{alloc.node}.json"
        spec_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = spec_file.with_suffix(".tmp")
        tmp.write_text(msg["spec"])
        tmp.replace(spec_file)
        per_node = spec.world_size // alloc.nodes
        cmd = agent_command(spec_file, alloc, per_node, msg["endpoint"], msg["rdzv_id"], spec.timeout_s)
        log_file = here / f"{spec.run_id}.node{alloc.node}.log"
        started = time.monotonic()
        with open(log_file, "w") as log:
            log.write(f"# {spec.run_label()}  run_id={spec.run_id}  node {alloc.node}\n# {' '.join(cmd)}\n")
            log.flush()
            launcher = f"torchrun --nnodes {alloc.nodes} (tspbench.run.slurm, Slurm job {alloc.job_id})"
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=worker_env(launcher, spec.device),
                start_new_session=True,
            )
            try:
                while proc.poll() is None:
                    # past timeout_s, or the driver has moved on (its agent ended the run): end ours too
                    if time.monotonic() - started > spec.timeout_s or store.check([f"run/{n + 1}"]):
                        kill_group(proc)
                        break
                    time.sleep(0.2)
            except KeyboardInterrupt:
                kill_group(proc)
                raise
        rc = proc.returncode
        say(f"tspbench: node {alloc.node}: {spec.run_label()}: agent exited {rc} (log: {log_file})")
        try:
            store.set(f"exit/{n}/{alloc.node}", str(rc))
        except Exception:  # noqa: BLE001 - the driver is gone; the next read says so
            pass
        n += 1
