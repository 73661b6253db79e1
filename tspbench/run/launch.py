"""Run an experiment's RunSpecs one by one: validate, choose a method, spawn, time out, record.

Per run (`run_one`):
  1. `validate_parallel` in the parent: a bad layout is printed as one line and recorded `invalid`
     (nothing is spawned; the rest of the grid continues).
  2. Method: execution=measure runs the ranks; auto measures when the devices exist (CPU always does)
     and otherwise records `invalid` with "needs N cuda devices"; estimate/model go to `run_estimated`.
  3. Measured: the frozen spec is written to `<run dir>/specs/<run_id>.json` and the rank group is started
     as `python -m torch.distributed.run --nproc-per-node N --rdzv-backend c10d ... -m tspbench.run.worker
     --spec FILE` in its own session. Its stdout/stderr are streamed into `<run dir>/<run_id>.log` and
     rank 0's "step i/N tok/s" lines into the progress bar.
     Before that, the memory check (tspbench.run.memfit): a run whose predicted per-rank peak exceeds the
     memory it can get is recorded `oom` with both numbers and never started.
  4. Outcome: the worker's rank 0 appends the `ok` record itself. Otherwise the parent appends one:
     `oom` (a rank's status file says so, with the attempted configuration), `failed` (with the log
     tail), `timeout` (no exit within timeout_s: the whole group is killed), or `failed` / "interrupted"
     on Ctrl-C, after which the experiment stops. A run whose `ok` record is already written when the
     interrupt arrives gets no failure record. Finished records are never touched.

Resume: runs whose run_id already has an `ok` record in the run dir are skipped unless force=true; a run's
state is its last record, except that an `ok` is never superseded by an interruption (`current_records`).
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

from tspbench.config import ConfigError
from tspbench.parallel import validate_parallel
from tspbench.paths import package_search_root
from tspbench.record.schema import base_record, current_records
from tspbench.record.spec import RunSpec
from tspbench.record.store import RESULTS_FILE, append_record, read_records
from tspbench.run.memfit import memory_refusal

STEP_RE = re.compile(r"\[tspbench\] step (\d+)/(\d+) (\S+) tok/s")
LOG_TAIL_LINES = 40


# ------------------------------------------------------------------------------------------ the grid
def run_all(
    specs: list[RunSpec], run_dir: Path, force: bool = False, progress: bool = True, memory_check: bool = True
) -> list[dict]:
    """Run every spec (skipping recorded `ok` ones); returns the latest record of each spec, in order.
    KeyboardInterrupt propagates after the interrupted run is recorded."""
    from tqdm import tqdm

    run_dir = Path(run_dir)
    results = run_dir / RESULTS_FILE
    done = set() if force else ok_run_ids(results)
    bar = tqdm(
        total=len(specs),
        desc=specs[0].experiment if specs else "tspbench",
        unit="run",
        disable=not progress,
        dynamic_ncols=True,
        file=sys.stderr,
    )
    say = (lambda s: tqdm.write(s, file=sys.stderr)) if progress else (lambda s: print(s, file=sys.stderr))
    # SIGTERM (a scheduler's time limit, `kill`) is handled like Ctrl-C: kill the group, record, stop.
    main = threading.current_thread() is threading.main_thread()
    prev = signal.signal(signal.SIGTERM, _interrupt) if main else None
    # Runs that will be estimated (fake tensors) are independent single-process jobs: do them up front on
    # every core, then record them in grid order with the rest.
    todo = [s for s in specs if s.run_id not in done and goes_offline(s) == "estimate"]
    estimated = prefetch_estimates(todo) if len(todo) > 1 else {}
    try:
        for spec in specs:
            if spec.run_id in done:
                say(f"skip     {spec.run_label()}: already ok in {results}")
                bar.update(1)
                continue
            bar.set_postfix_str(spec.run_label())

            def on_step(i: int, n: int, tps: str, spec=spec):
                bar.set_postfix_str(f"{spec.run_label()}: step {i}/{n} {tps} tok/s")

            rec = run_one(spec, run_dir, on_step, estimated.get(spec.run_id), memory_check)
            say(one_line(rec))
            bar.update(1)
    finally:
        bar.close()
        if main:
            signal.signal(signal.SIGTERM, prev)
    from tspbench.record.offline import MODEL_SUFFIX

    return latest_records(results, [i for s in specs for i in (s.run_id, s.run_id + MODEL_SUFFIX)])


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def one_line(rec: dict) -> str:
    m = rec.get("metrics") or {}
    label = f"{rec['scheme']} d{rec['degree']} S={rec['seq_len']} B={rec['batch']} {rec['mode']}"
    if rec["status"] == "ok":
        tps, method = m.get("tokens_per_s_per_device"), rec.get("method", "measured")
        if tps is None:  # estimated: memory and FLOPs, no time
            return f"ok       {label} [{method}]: peak {m.get('mem_total_gib', 0):.2f} GiB/device"
        return f"ok       {label} [{method}]: {tps:,.0f} tok/s/device, step p50 {m.get('step_time_ms_p50') or 0:.1f} ms"
    where = f" (log: {rec['log_file']})" if rec.get("log_file") else ""
    return f"{rec['status']:<8} {label}: {rec.get('reason')}{where}"


def ok_run_ids(results_file: Path) -> set[str]:
    return {r["run_id"] for r in read_records([results_file]) if r.get("status") == "ok"}


def latest_records(results_file: Path, run_ids: list[str]) -> list[dict]:
    """The current record of each run_id (a run may be recorded more than once: failed, then ok)."""
    last = {str(r.get("run_id")): r for r in current_records(read_records([results_file]))}
    return [last[i] for i in run_ids if i in last]


# -------------------------------------------------------------------------------------------- one run
def goes_offline(spec: RunSpec) -> str | None:
    """ "estimate" / "model" when this spec will not be measured (and is valid), else None."""
    try:
        validate_parallel(spec.model_config(), spec.parallel(), spec.seq_len, spec.batch)
    except ConfigError:
        return None
    if spec.execution in ("estimate", "model"):
        return spec.execution
    if spec.execution == "auto" and choose_execution(spec)[0] is None:
        return "model" if spec.mode == "decode" else "estimate"
    return None


def prefetch_estimates(specs: list[RunSpec]) -> dict[str, dict]:
    """Estimated records of `specs`, computed in parallel processes (one per core)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    workers = min(len(specs), os.cpu_count() or 1)
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        recs = list(pool.map(_estimate_safe, specs))
    return {s.run_id: r for s, r in zip(specs, recs)}


def _estimate_safe(spec: RunSpec) -> dict:
    return run_offline(spec, "estimate")


def run_one(
    spec: RunSpec,
    run_dir: Path,
    on_step: Callable | None = None,
    estimated: dict | None = None,
    memory_check: bool = True,
) -> dict:
    """Run one spec to a record (appended to `<run_dir>/results.jsonl`) and return it. `estimated`: an
    estimated record computed ahead (prefetch_estimates); `memory_check`: refuse a measured run that the
    cost model says cannot fit (tspbench.run.memfit)."""
    run_dir = Path(run_dir)
    results = run_dir / RESULTS_FILE
    spec.results_file = str(results.resolve())
    spec.status_dir = str((run_dir / "status" / spec.run_id).resolve())
    try:
        validate_parallel(spec.model_config(), spec.parallel(), spec.seq_len, spec.batch)
    except ConfigError as e:
        return _record(results, base_record(spec, "invalid", str(e)))
    execution, why = choose_execution(spec)
    if execution is None and spec.execution == "auto" and spec.mode == "decode":
        return _record(results, run_offline(spec, "model"))  # decode: modelled only (no fake trace)
    if execution is None and spec.execution == "auto":
        # The devices are not here: estimate (fake tensors) and model (formulas) instead; the modelled
        # twin carries the predicted time under its own run_id.
        rec = _record(results, estimated or run_offline(spec, "estimate"))
        _record(results, run_offline(spec, "model"))
        return rec
    if execution is None:
        return _record(results, base_record(spec, "invalid", why))
    if execution == "estimate" and estimated is not None:
        return _record(results, estimated)
    if execution in ("estimate", "model"):
        return _record(results, run_offline(spec, execution))
    refusal = memory_refusal(spec) if memory_check else None
    if refusal is not None:
        rec = base_record(spec, "oom", refusal.pop("reason"))
        rec["attempted"] = {**attempted(spec), **refusal}
        return _record(results, rec)
    return run_measured(spec, run_dir, on_step)


def choose_execution(spec: RunSpec) -> tuple[str | None, str | None]:
    """(method, None) or (None, why the run cannot happen here)."""
    if spec.execution in ("estimate", "model"):
        return spec.execution, None
    if spec.device == "cpu":
        return "measure", None
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have >= spec.world_size:
        return "measure", None
    return None, (
        f"needs {spec.world_size} cuda devices, found {have} (execution={spec.execution}; "
        f"use device=cpu, or execution=estimate|model)"
    )


def run_offline(spec: RunSpec, execution: str) -> dict:
    """execution=estimate (fake tensors + fake process group) or model (closed-form cost model): a record
    with method "estimated" / "modelled" (tspbench/offline.py). A crash is recorded, never raised."""
    from tspbench.record.offline import MODEL_SUFFIX, estimated_record, modelled_record

    twin = spec.execution == "auto" and execution == "model" and spec.mode != "decode"
    run_id = spec.run_id + (MODEL_SUFFIX if twin else "")
    try:
        return estimated_record(spec) if execution == "estimate" else modelled_record(spec, run_id)
    except Exception as e:  # noqa: BLE001 - one bad grid point must not stop the sweep
        rec = base_record(spec, "failed", f"{execution}: {type(e).__name__}: {e}")
        rec["method"], rec["run_id"] = ("estimated" if execution == "estimate" else "modelled"), run_id
        return rec


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_command(spec_file: Path, world: int, port: int) -> list[str]:
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
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.2",
        "-m",
        "tspbench.run.worker",
        "--spec",
        str(spec_file),
    ]


def run_measured(spec: RunSpec, run_dir: Path, on_step: Callable | None = None) -> dict:
    results = Path(spec.results_file)
    spec_file = run_dir / "specs" / f"{spec.run_id}.json"
    spec_file.parent.mkdir(parents=True, exist_ok=True)
    spec_file.write_text(spec.to_json())
    log_file = run_dir / f"{spec.run_id}.log"
    shutil.rmtree(spec.status_dir, ignore_errors=True)
    offset = results.stat().st_size if results.exists() else 0

    env = dict(os.environ, PYTHONUNBUFFERED="1", TSPBENCH_LAUNCHER="torchrun (tspbench.run.launch)")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package_search_root()), env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    started = time.monotonic()
    proc = reader = None
    status, reason = None, None
    with open(log_file, "w") as log:
        log.write(
            f"# {spec.run_label()}  run_id={spec.run_id}\n# "
            + " ".join(worker_command(spec_file, spec.world_size, 0))
            + "\n"
        )
        log.flush()
        try:
            proc = subprocess.Popen(
                worker_command(spec_file, spec.world_size, free_port()),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                text=True,
                bufsize=1,
            )
            reader = threading.Thread(target=_pump, args=(proc.stdout, log, on_step), daemon=True)
            reader.start()
            while True:
                try:
                    proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() - started > spec.timeout_s:
                        kill_group(proc)
                        status, reason = (
                            "timeout",
                            (f"no result after timeout_s={spec.timeout_s:g} s; rank group killed"),
                        )
                        break
        except KeyboardInterrupt:
            if proc is not None:
                kill_group(proc)
            if reader is not None:
                reader.join(timeout=5)
            if not any(r.get("run_id") == spec.run_id for r in _records_after(results, offset)):
                # rank 0 may have written the ok record just before the interrupt: then the run finished
                rec = _failure_record(spec, "failed", "interrupted (Ctrl-C); rank group killed", log_file)
                _record(results, rec)
            raise
        reader.join(timeout=10)

    mine = [r for r in _records_after(results, offset) if r.get("run_id") == spec.run_id]
    if mine:
        return mine[-1]  # rank 0 wrote the ok record
    root = None
    if status is None or reason is None:
        status, reason, root = _classify_exit(spec, proc.returncode)
    return _record(results, _failure_record(spec, status, reason, log_file, root))


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


def _record(results: Path, rec: dict) -> dict:
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
