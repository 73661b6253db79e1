"""The grid dispatcher: an experiment's RunSpecs, one by one, each to its record, in grid order.

Each spec arrives with its fate decided by the pre-check (tspbench/run/fate.py; a spec that skipped it is
decided here, once); the dispatcher acts on it and never decides again:
  refused         the reason is printed as one line and recorded `invalid`; nothing is spawned, the grid goes on.
  estimate        an `estimated` record (fake tensors + a fake process group, tspbench.record.offline).
  model           a `modelled` record (the closed-form cost model on the hardware profile).
  estimate+model  execution=auto without the devices: the estimated record and its modelled twin (run_id + "-model").
  measure         the memory check first (tspbench.run.memfit: a run whose predicted per-rank peak exceeds the
                  memory it can get is recorded `oom` with both numbers and never started), then one torchrun
                  rank group (tspbench/run/supervise.py), whose rank 0 writes the `ok` record.
Estimates are independent single-process jobs: `prefetch_estimates` computes them up front on every core (each
counted and printed as it finishes, with the elapsed time and an ETA: tspbench/run/progress.py), and they are
recorded in grid order with the rest. An `oom` decided before anything ran (an estimated or modelled peak above
the device, the memory check) is stamped `oom_kind: predicted`, one a rank hit `measured` (tspbench.run.supervise).
Estimated and modelled records are written by the parent (`recorded_by: parent`); a crash in one is recorded
`failed`, never raised.

Resume: runs whose run_id already has an `ok` record in the run dir are skipped unless force=true; a run's
state is its last record, except that an `ok` is never superseded by an interruption (`current_records`).
Ctrl-C or SIGTERM: the running group is killed and recorded (supervise), and KeyboardInterrupt propagates.

Across a Slurm allocation (`cluster`: tspbench.run.slurm.Driver, on the first node) a measured run whose world
spans the allocation starts its ranks on every node through it; the rest is the same.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tspbench.record.schema import base_record, current_records
from tspbench.record.spec import RunSpec
from tspbench.record.store import RESULTS_FILE, read_records
from tspbench.run.fate import fate_of
from tspbench.run.memfit import memory_refusal
from tspbench.run.progress import Progress
from tspbench.run.supervise import attempted, parent_record, run_measured


# ------------------------------------------------------------------------------------------ the grid
def run_all(
    specs: list[RunSpec],
    run_dir: Path,
    force: bool = False,
    progress: bool = True,
    memory_check: bool = True,
    cluster: Any = None,
) -> list[dict]:
    """Run every spec (skipping recorded `ok` ones); returns the latest record of each spec, in order.
    KeyboardInterrupt propagates after the interrupted run is recorded. `cluster`: the Slurm driver
    (tspbench.run.slurm.Driver) when the grid runs across an allocation's nodes."""
    run_dir = Path(run_dir)
    results = run_dir / RESULTS_FILE
    done = set() if force else ok_run_ids(results)
    view = Progress(len(specs), specs[0].experiment if specs else "tspbench", progress)
    # SIGTERM (a scheduler's time limit, `kill`) is handled like Ctrl-C: kill the group, record, stop.
    main = threading.current_thread() is threading.main_thread()
    prev = signal.signal(signal.SIGTERM, _interrupt) if main else None
    todo = [s for s in specs if s.run_id not in done and fate_of(s).kind in ("estimate", "estimate+model")]
    try:
        shown: dict[str, str] = {}  # run_id → the status its line showed when its estimate finished

        def estimate_done(spec: RunSpec, rec: dict) -> None:
            shown[spec.run_id] = str(rec.get("status"))
            view.finished(one_line(rec))

        estimated = prefetch_estimates(todo, estimate_done) if len(todo) > 1 else {}
        for spec in specs:
            if spec.run_id in done:
                view.finished(f"skip     {spec.run_label()}: already ok in {results}")
                continue
            view.status(spec.run_label())

            def on_step(i: int, n: int, tps: str, spec=spec):
                view.status(f"{spec.run_label()}: step {i}/{n} {tps} tok/s")

            rec = run_one(spec, run_dir, on_step, estimated.get(spec.run_id), memory_check, cluster)
            if spec.run_id not in shown:
                view.finished(one_line(rec))
            elif rec.get("status") != shown[spec.run_id]:  # the guards changed it as it was recorded
                view.say(one_line(rec))
    finally:
        view.close()
        if main:
            signal.signal(signal.SIGTERM, prev)
    from tspbench.record.offline import MODEL_SUFFIX

    return latest_records(results, [i for s in specs for i in (s.run_id, s.run_id + MODEL_SUFFIX)])


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def one_line(rec: dict) -> str:
    """A finished run as the one line the terminal gets (above the progress bar)."""
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
    """Run ids already recorded `ok` in `results_file` (what a resumed invocation skips)."""
    return {r["run_id"] for r in read_records([results_file]) if r.get("status") == "ok"}


def latest_records(results_file: Path, run_ids: list[str]) -> list[dict]:
    """The current record of each run_id (a run may be recorded more than once: failed, then ok)."""
    last = {str(r.get("run_id")): r for r in current_records(read_records([results_file]))}
    return [last[i] for i in run_ids if i in last]


# -------------------------------------------------------------------------------------------- one run
def run_one(
    spec: RunSpec,
    run_dir: Path,
    on_step: Callable | None = None,
    estimated: dict | None = None,
    memory_check: bool = True,
    cluster: Any = None,
) -> dict:
    """Run one spec as its fate says, to a record (appended to `<run_dir>/results.jsonl`), and return it.
    `estimated`: its estimated record computed ahead (prefetch_estimates); `memory_check`: refuse a measured run
    that the cost model says cannot fit (tspbench.run.memfit); `cluster`: the Slurm driver, through which a run
    spanning the allocation starts its ranks on every node."""
    run_dir = Path(run_dir)
    results = run_dir / RESULTS_FILE
    spec.results_file = str(results.resolve())
    spec.status_dir = str((run_dir / "status" / spec.run_id).resolve())
    fate = fate_of(spec)
    if fate.kind == "refused":
        return parent_record(results, base_record(spec, "invalid", fate.reason))
    if fate.kind == "model":
        return parent_record(results, _predicted(run_offline(spec, "model")))
    if fate.kind in ("estimate", "estimate+model"):
        rec = parent_record(results, _predicted(estimated or run_offline(spec, "estimate")))
        if fate.kind == "estimate+model":  # the modelled twin carries the predicted time under its own run_id
            parent_record(results, _predicted(run_offline(spec, "model", twin=True)))
        return rec
    refusal = memory_refusal(spec) if memory_check else None
    if refusal is not None:
        rec = base_record(spec, "oom", refusal.pop("reason"))
        rec["attempted"] = {**attempted(spec), **refusal}
        rec["oom_kind"] = "predicted"  # the cost model's peak, before any rank started
        return parent_record(results, rec)
    if cluster is not None and cluster.spans(spec.world_size):
        return run_measured(spec, run_dir, on_step, cluster)
    return run_measured(spec, run_dir, on_step)


def _predicted(rec: dict) -> dict:
    """An estimated or modelled record: an `oom` there is a prediction (the peak above the device's memory)."""
    if rec.get("status") == "oom":
        rec["oom_kind"] = "predicted"
    return rec


def run_offline(spec: RunSpec, execution: str, twin: bool = False) -> dict:
    """execution=estimate (fake tensors + fake process group) or model (closed-form cost model): a record with
    method "estimated" / "modelled" (tspbench/record/offline.py); `twin`: the modelled twin of an estimated run,
    under run_id + "-model". A crash is recorded, never raised."""
    from tspbench.record.offline import MODEL_SUFFIX, estimated_record, modelled_record

    run_id = spec.run_id + (MODEL_SUFFIX if twin else "")
    try:
        return estimated_record(spec) if execution == "estimate" else modelled_record(spec, run_id)
    except Exception as e:  # noqa: BLE001 - one bad grid point must not stop the sweep
        rec = base_record(spec, "failed", f"{execution}: {type(e).__name__}: {e}")
        rec["method"], rec["run_id"] = ("estimated" if execution == "estimate" else "modelled"), run_id
        return rec


def prefetch_estimates(specs: list[RunSpec], on_done: Callable[[RunSpec, dict], None] | None = None) -> dict[str, dict]:
    """Estimated records of `specs`, computed in parallel processes (one per core); `on_done(spec, record)` as
    each finishes (the progress line), in the order they finish."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    workers = min(len(specs), os.cpu_count() or 1)
    out: dict[str, dict] = {}
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(_estimate_safe, s): s for s in specs}
        for fut in as_completed(futures):
            spec = futures[fut]
            out[spec.run_id] = fut.result()
            if on_done is not None:
                on_done(spec, out[spec.run_id])
    return {s.run_id: out[s.run_id] for s in specs}


def _estimate_safe(spec: RunSpec) -> dict:
    return run_offline(spec, "estimate")
