"""The torchrun supervisor: one measured run as one rank group, from start to record.

tspbench.run.dispatch hands over each run whose fate is `measure` (tspbench/run/fate.py); `run_measured`:
  1. writes the frozen spec to `<run dir>/specs/<run_id>.json` and starts the rank group as
     `python -m torch.distributed.run --nproc-per-node N --rdzv-backend c10d ... -m tspbench.run.worker
     spec=FILE` (`worker_command`) in its own session;
  2. streams its stdout/stderr into `<run dir>/<run_id>.log`, and rank 0's "step i/N tok/s" lines into the
     dispatcher's progress bar (`_pump`);
  3. ends it: rank 0 appends the `ok` record itself. Otherwise the parent appends one: `oom` (a rank's status
     file says so, with the attempted configuration), `failed` (with the failing rank's traceback or the log's
     tail), `timeout` (no exit within timeout_s: the whole group is killed, `kill_group`), or `failed` /
     "interrupted" on Ctrl-C, which is then re-raised so the grid stops. A run whose `ok` record is already
     written when the interrupt arrives gets no failure record. Finished records are never touched.

Across the nodes of a Slurm allocation the same supervisor runs on the first node with another `RankGroup` (its
command is that node's agent of a multi-node torchrun, tspbench/run/slurm.py); everything else is as above.

Also here, because both the dispatcher and the supervisor write records in the parent: `parent_record` (append,
stamped `recorded_by: parent`) and `attempted` (an `oom` record's configuration).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from tspbench.measure.memory import ALLOC_CONF_VARS
from tspbench.paths import package_search_root
from tspbench.record.schema import base_record
from tspbench.record.spec import RunSpec
from tspbench.record.store import append_record

STEP_RE = re.compile(r"\[tspbench\] step (\d+)/(\d+) (\S+) tok/s")
LOG_TAIL_LINES = 40
LAUNCHER = "torchrun (tspbench.run.supervise)"
"""A measured record's provenance.launcher when this supervisor started the ranks (a cluster's own torchrun
leaves the worker's default, `torchrun`)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port on `host` for a rank group's rendezvous ("": every interface, as a multi-node agent's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def worker_tail(spec_file: Path) -> list[str]:
    """What every torchrun command of a measured run ends with: no restarts, a quick monitor, the worker on the
    spec (`worker_command` here, one node's agent in tspbench/run/slurm.py)."""
    return ["--max-restarts", "0", "--monitor-interval", "0.2", "-m", "tspbench.run.worker", f"spec={spec_file}"]


def worker_command(spec_file: Path, world: int, port: int) -> list[str]:
    """The single-node torchrun command that starts `world` ranks of tspbench.run.worker on `spec_file`."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(world),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        *worker_tail(spec_file),
    ]


class RankGroup(Protocol):
    """How a measured run's ranks are started: the command of this machine's torchrun agent, the launcher a record
    names, and the hosts the ranks run on (failure records name them)."""

    launcher: str

    @property
    def hosts(self) -> list[str]: ...

    def command(self, spec: Any, spec_file: Path) -> list[str]: ...

    def settle(self) -> list[str]:
        """After this machine's agent exited: wait for the other machines' agents; a note per one that failed."""
        ...


class LocalGroup:
    """Every rank on this machine: one single-node torchrun (`worker_command`)."""

    launcher = LAUNCHER

    @property
    def hosts(self) -> list[str]:
        return [os.environ.get("SLURMD_NODENAME") or socket.gethostname()]

    def command(self, spec: Any, spec_file: Path) -> list[str]:
        return worker_command(spec_file, spec.world_size, free_port())

    def settle(self) -> list[str]:
        return []


def run_measured(spec: RunSpec, run_dir: Path, on_step: Callable | None = None, group: RankGroup | None = None) -> dict:
    """Start the run's rank group, wait for it (killing it after timeout_s) and return its record: rank 0's `ok`
    record, or the failure the parent appends. Ctrl-C (KeyboardInterrupt) kills the group, records the run
    `failed` / "interrupted" unless its `ok` record is already written, and propagates. `group`: how the ranks
    start (default: all of them here, `LocalGroup`; across a Slurm allocation, tspbench.run.slurm.Driver)."""
    group = group or LocalGroup()
    results = Path(spec.results_file)
    spec_file = run_dir / "specs" / f"{spec.run_id}.json"
    spec_file.parent.mkdir(parents=True, exist_ok=True)
    spec_file.write_text(spec.to_json())
    log_file = run_dir / f"{spec.run_id}.log"
    shutil.rmtree(spec.status_dir, ignore_errors=True)
    offset = results.stat().st_size if results.exists() else 0
    started = time.monotonic()  # timeout_s counts the launch too
    proc = reader = None
    timed_out = None
    with open(log_file, "w") as log:
        cmd = group.command(spec, spec_file)
        log.write(f"# {spec.run_label()}  run_id={spec.run_id}\n# " + " ".join(cmd) + "\n")
        log.flush()
        try:
            proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=worker_env(group.launcher, spec.device),
                start_new_session=True,  # its own session: kill_group reaches every rank, and Ctrl-C only us
                text=True,
                bufsize=1,
            )
            reader = threading.Thread(target=_pump, args=(proc.stdout, log, on_step), daemon=True)
            reader.start()
            timed_out = _wait(proc, started, spec.timeout_s)
        except KeyboardInterrupt:
            if proc is not None:
                kill_group(proc)
            if reader is not None:
                reader.join(timeout=5)
            if not any(r.get("run_id") == spec.run_id for r in _records_after(results, offset)):
                # rank 0 may have written the ok record just before the interrupt: then the run finished
                rec = _failure_record(spec, "failed", "interrupted (Ctrl-C); rank group killed", log_file)
                rec["hosts"] = group.hosts
                parent_record(results, rec)
            raise
        reader.join(timeout=10)
    elsewhere = group.settle()  # across nodes: the other nodes' agents end too (and say how)

    mine = [r for r in _records_after(results, offset) if r.get("run_id") == spec.run_id]
    if mine:
        return mine[-1]  # rank 0 wrote the ok record
    if timed_out is not None:
        rec = _failure_record(spec, "timeout", timed_out, log_file)
    else:
        status, reason, root = _classify_exit(spec, proc.returncode)
        rec = _failure_record(spec, status, reason, log_file, root)
    if elsewhere:
        rec["reason"] = f"{rec['reason']} ({'; '.join(elsewhere)})"
    rec["hosts"] = group.hosts
    return parent_record(results, rec)


CUDA_ALLOC_CONF = "expandable_segments:True"
"""A measured CUDA run's allocator settings unless the user set any of memory.ALLOC_CONF_VARS: segments that grow
instead of one cudaMalloc per size class, so a long run's reserved memory is not fragmented into blocks too small
to reuse (torchtitan's run_train.sh sets the same)."""


def worker_env(launcher: str = LAUNCHER, device: str = "cpu") -> dict[str, str]:
    """The rank group's environment: unbuffered output (the progress bar reads it live), this tspbench first on
    the path, the launcher the record names, one OpenMP thread per rank unless the user set another, and on
    device=cuda PYTORCH_CUDA_ALLOC_CONF=CUDA_ALLOC_CONF unless the user set the allocator's settings (kept as they
    are; the record names what ran: provenance.alloc_conf)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TSPBENCH_LAUNCHER=launcher)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package_search_root()), env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    if device == "cuda" and not any(env.get(k) for k in ALLOC_CONF_VARS):
        env["PYTORCH_CUDA_ALLOC_CONF"] = CUDA_ALLOC_CONF
    return env


def _wait(proc: subprocess.Popen, started: float, timeout_s: float) -> str | None:
    """Wait for the group to exit; `timeout_s` after `started`, kill it and return the `timeout` record's reason."""
    while True:
        try:
            proc.wait(timeout=0.2)
            return None
        except subprocess.TimeoutExpired:
            if time.monotonic() - started > timeout_s:
                kill_group(proc)
                return f"no result after timeout_s={timeout_s:g} s; rank group killed"


def _pump(stream, log, on_step) -> None:
    """Tee the rank group's output into the log; rank 0's progress lines into the bar."""
    for line in stream:
        log.write(line)
        log.flush()
        m = STEP_RE.search(line)
        if m and on_step is not None:
            on_step(int(m.group(1)), int(m.group(2)), m.group(3))


def _rank_statuses(spec: RunSpec) -> list[dict]:
    """Status files the ranks left, earliest first: the first is the root cause, later ones are usually
    peers failing in a collective because of it ("Connection closed by peer")."""
    out = []
    for f in Path(spec.status_dir).glob("rank*.json"):
        try:
            out.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError):
            pass
    return sorted(out, key=lambda s: s.get("time", 0))


def _classify_exit(spec: RunSpec, rc: int) -> tuple[str, str, dict | None]:
    """(status, reason, root-cause status) from the ranks' status files and the exit code."""
    statuses = _rank_statuses(spec)
    ooms = [s for s in statuses if s.get("status") == "oom"]
    root = ooms[0] if ooms else (statuses[0] if statuses else None)
    if root is not None:
        others = [s for s in statuses if s is not root]
        more = f" (then {len(others)} more rank(s) failed: {others[0]['reason'][:120]} ...)" if others else ""
        return ("oom" if ooms else "failed"), root["reason"] + more, root
    if rc == 0:
        return "failed", "rank group exited 0 without writing a record", None
    return "failed", f"rank group exited with code {rc} (no rank reported why; see the log)", None


def _failure_record(spec: RunSpec, status: str, reason: str, log_file: Path, root: dict | None = None) -> dict:
    """`log_tail` is the failing rank's own traceback when it left one, else the log's tail."""
    rec = base_record(spec, status, reason)
    rec["log_file"] = str(log_file)
    rec["log_tail"] = (root or {}).get("traceback") or log_tail(log_file)
    rec["failed_rank"] = (root or {}).get("rank")
    if status == "oom":
        rec["attempted"] = attempted(spec)
        rec["oom_kind"] = "measured"  # a rank ran out of memory (docs/records.md)
    return rec


def attempted(spec: RunSpec) -> dict:
    """The configuration of a run that did not fit (an `oom` record's `attempted`)."""
    return {
        "scheme": spec.scheme,
        "degree": spec.degree,
        "dp": spec.dp,
        "tp": spec.tp,
        "seq_len": spec.seq_len,
        "batch": spec.batch,
        "mode": spec.mode,
        "dtype": spec.dtype,
        "recompute": spec.recompute,
        "model": spec.model.get("name"),
    }


_AGENT_LOG = re.compile(r"^[WIE]\d{4} .*torch/distributed/elastic/")


def _is_agent_noise(lines: list[str], i: int) -> bool:
    """Does torchrun's own report start at line i? Its agent's log lines ("Received 15 death signal",
    "Sending process … closing signal"), a logging error while it shuts down, or a traceback through the
    elastic agent / run.py (its ChildFailedError report). Ranks' own tracebacks never pass through those."""
    line = lines[i]
    if _AGENT_LOG.match(line) or line.startswith("--- Logging error ---"):
        return True
    if not line.startswith("Traceback (most recent call last)"):
        return False
    frames = []  # this traceback's own frames: indented lines up to the exception
    for x in lines[i + 1 :]:
        if not x.startswith(" "):
            break
        frames.append(x)
    return any("torch/distributed/elastic/" in x or "torch/distributed/run.py" in x for x in frames)


def log_tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    """The last `n` lines of a run's log before torchrun's own report (the agent's shutdown messages and
    tracebacks repeat or bury what the ranks printed above them, and would push the ranks' tracebacks out
    of the tail)."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for i in range(len(lines)):
        if _is_agent_noise(lines, i):
            lines = lines[:i] + ["[torchrun's own report trimmed; full output in the log file]"]
            break
    return "\n".join(lines[-n:])


def _records_after(results: Path, offset: int) -> list[dict]:
    if not results.exists():
        return []
    with open(results, "rb") as f:
        f.seek(offset)
        out = []
        for line in f.read().decode(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out


def parent_record(results: Path, rec: dict) -> dict:
    """Append a record the parent wrote (failures, refusals, estimated and modelled runs), stamped as such."""
    prov = rec.setdefault("provenance", {})
    prov["recorded_by"] = "parent"
    prov.setdefault("recorded_at", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    append_record(results, rec)
    return rec


# ------------------------------------------------------------------------------------- process groups
def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d.name))
    return kids


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts each worker in its own session, so killing the
    launcher's process group alone can orphan them)."""
    if not Path("/proc").exists():
        return []
    kids, out, todo = _children(), [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the launcher's session and every descendant, then SIGKILL what is left after `grace_s`."""
    pids = descendants(proc.pid)
    _signal_all(proc.pid, pids, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    pids = sorted(set(pids) | set(descendants(proc.pid)))
    _signal_all(proc.pid, pids, signal.SIGKILL)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass


def _signal_all(leader: int, pids: list[int], sig: int) -> None:
    for target in (leader, *pids):
        for fn in (os.killpg, os.kill):  # each worker leads its own session: its group, then itself
            try:
                fn(target, sig)
            except (ProcessLookupError, PermissionError):
                pass
