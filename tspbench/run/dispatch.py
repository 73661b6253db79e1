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
Estimates are independent single-process jobs: `prefetch_estimates` computes them up front on every core, and
they are recorded in grid order with the rest. Estimated and modelled records are written by the parent
(`recorded_by: parent`); a crash in one is recorded `failed`, never raised.

Resume: runs whose run_id already has an `ok` record in the run dir are skipped unless force=true; a run's
state is its last record, except that an `ok` is never superseded by an interruption (`current_records`).
Ctrl-C or SIGTERM: the running group is killed and recorded (supervise), and KeyboardInterrupt propagates.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from tspbench.record.schema import base_record, current_records
from tspbench.record.spec import RunSpec
from tspbench.record.store import RESULTS_FILE, read_records
from tspbench.run.fate import fate_of
from tspbench.run.memfit import memory_refusal
from tspbench.run.supervise import attempted, parent_record, run_measured


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
    todo = [s for s in specs if s.run_id not in done and fate_of(s).kind in ("estimate", "estimate+model")]
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
) -> dict:
    """Run one spec as its fate says, to a record (appended to `<run_dir>/results.jsonl`), and return it.
    `estimated`: its estimated record computed ahead (prefetch_estimates); `memory_check`: refuse a measured run
    that the cost model says cannot fit (tspbench.run.memfit)."""
    run_dir = Path(run_dir)
    results = run_dir / RESULTS_FILE
    spec.results_file = str(results.resolve())
    spec.status_dir = str((run_dir / "status" / spec.run_id).resolve())
    fate = fate_of(spec)
    if fate.kind == "refused":
        return parent_record(results, base_record(spec, "invalid", fate.reason))
    if fate.kind == "model":
        return parent_record(results, run_offline(spec, "model"))
    if fate.kind in ("estimate", "estimate+model"):
        rec = parent_record(results, estimated or run_offline(spec, "estimate"))
        if fate.kind == "estimate+model":  # the modelled twin carries the predicted time under its own run_id
            parent_record(results, run_offline(spec, "model", twin=True))
        return rec
    refusal = memory_refusal(spec) if memory_check else None
    if refusal is not None:
        rec = base_record(spec, "oom", refusal.pop("reason"))
        rec["attempted"] = {**attempted(spec), **refusal}
        return parent_record(results, rec)
    return run_measured(spec, run_dir, on_step)


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
