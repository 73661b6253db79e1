"""Result records: one JSON object per run, appended atomically to a JSONL file; every other kind of record
(plan, validation, calibration) written as a whole file, atomically; and one pass that reads them all back.

Every method (measured, estimated, modelled) writes the same run schema, so pandas and the report never care
how a number was obtained. Field meanings are documented in docs/records.md; each kind, its writer and its
plausibility guard in docs/records.md#record-kinds-writers-and-guards (guards: record/guards.py for run records,
record/kinds.py for the others).

Run record layout (flat keys, units in the names; `None` means "not available", never 0):

    run_id, experiment, method ("measured" | "estimated" | "modelled"), status ("ok" | "oom" | "failed" |
    "timeout" | "invalid" | "implausible"), reason, scheme, sp_variant, degree, tp_degree, sp_degree, dp,
    world_size, nodes, model, model_cfg{...}, seq_len, batch, mode ("train" | "forward" | "decode"), dtype,
    recompute, device ("cpu" | "cuda"), device_name, hardware (profile name for modelled/estimated numbers),
    metrics{...}  (e.g. tokens_per_s, tokens_per_s_per_device, step_time_ms_p50, peak_allocated_gib,
                   mem_params_gib, ..., energy_j_per_token, comm_bytes_per_layer_fwd, mfu_causal_pct),
    per_rank{...} (lists indexed by rank: step_time_ms, peak_allocated_gib, energy_j, ...),
    provenance{git_commit, git_dirty, torch, nccl, driver, hostname, device_names, seed, warmup_steps,
               measured_steps, started_at, finished_at, config{...}}

Writers: `append_record` (one run record, appended), `write_records` (a whole JSONL file of one kind),
`write_json` (one JSON object per file: calibration). Reader: `read_all` (every kind, one pass per file).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tspbench.record.kinds import guard_kind

RESULTS_FILE = "results.jsonl"


def append_record(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append one record as a single line. One `write` of the whole line under an exclusive lock, then
    fsync: a crash or Ctrl-C can lose at most the record being written, never an earlier one. The plausibility
    guards (record/guards.py) run first: a record that breaks one is written `implausible` with the reason."""
    record = guard_kind(record, "run")
    line = (json.dumps(record, default=_jsonable, sort_keys=True) + "\n").encode()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line)
        os.fsync(fd)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _jsonable(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def atomic_write(path: str | os.PathLike, chunks: Iterable[str]) -> Path:
    """Replace `path` by the concatenated `chunks`, atomically: they go to a temporary file in the same directory
    (flushed and fsynced), which is then renamed over the target (and the directory fsynced). A failure at any
    point, while a chunk is being produced included, leaves the old file as it was and no temporary file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return path


def write_records(
    path: str | os.PathLike, records: Iterable[dict[str, Any]], kind: str | tuple[str, ...]
) -> list[dict[str, Any]]:
    """Replace `path` by a JSONL file of `records`, all of one `kind` (record/kinds.py: run, plan, validation, …) or
    of the kinds named (a tuple: each record is guarded as the kind its `kind` key names, which must be one of them),
    atomically (`atomic_write`). Each record passes its kind's guard first and is written marked `implausible`
    when a check fails; returns the records as written."""
    if kind == "calibration":
        raise ValueError("calibration is one JSON object per file: use write_json")
    if isinstance(kind, tuple):
        records = list(records)
        bad = [r.get("kind") for r in records if r.get("kind") not in kind]
        if bad:
            raise ValueError(f"records of kind {bad[0]!r} passed as one of {', '.join(kind)}")
        written = [guard_kind(r, r["kind"]) for r in records]
        atomic_write(path, (json.dumps(r, default=_jsonable) + "\n" for r in written))
        return written
    written = [guard_kind(r, kind) for r in records]
    sort = kind == "run"  # as append_record writes them
    atomic_write(path, (json.dumps(r, default=_jsonable, sort_keys=sort) + "\n" for r in written))
    return written


def write_json(path: str | os.PathLike, record: dict[str, Any], kind: str = "calibration") -> dict[str, Any]:
    """Replace `path` by one indented JSON object (a calibration file), atomically, after its kind's guard;
    returns the record as written."""
    written = guard_kind(record, kind)
    atomic_write(path, [json.dumps(written, indent=2, default=_jsonable) + "\n"])
    return written


@dataclass
class RecordSet:
    """Everything read from a report's inputs in one pass: the records by kind (None: run records, which carry no
    `kind` key; "plan"; "validation"; any other kind as found), the files read, and their lines that are not a
    JSON object (file, 1-based line, is it the file's last non-empty line)."""

    files: list[Path] = field(default_factory=list)
    by_kind: dict[str | None, list[dict[str, Any]]] = field(default_factory=dict)
    bad: list[tuple[Path, int, bool]] = field(default_factory=list)

    def of(self, kind: str | None = None) -> list[dict[str, Any]]:
        return self.by_kind.get(kind, [])


def read_file(path: Path) -> tuple[list[dict[str, Any]], list[tuple[int, bool]]]:
    """One JSONL file, read once: (its JSON-object records in order, (line, is last) of every other line)."""
    lines = path.read_text(errors="replace").splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    recs: list[dict[str, Any]] = []
    bad: list[tuple[int, bool]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        if isinstance(rec, dict):
            recs.append(rec)
        else:
            bad.append((i + 1, i == last))
    return recs, bad


def read_all(paths: Iterable[str | os.PathLike]) -> RecordSet:
    """Every record of every kind from JSONL files or directories (searched recursively for *.jsonl), each file
    read once even when given twice (as a file and inside a directory). A torn last line (a crash mid-write) or
    any other line that is not a JSON object is skipped and listed in `bad`."""
    out = RecordSet()
    seen: set[Path] = set()
    for f in jsonl_files(paths):
        key = f.resolve()
        if key in seen:
            continue
        seen.add(key)
        recs, bad = read_file(f)
        out.files.append(f)
        out.bad += [(f, n, last) for n, last in bad]
        for rec in recs:
            kind = rec.get("kind")
            out.by_kind.setdefault(kind if kind is None or isinstance(kind, str) else repr(kind), []).append(rec)
    return out


def read_records(paths: Iterable[str | os.PathLike], kind: str | None = None) -> list[dict[str, Any]]:
    """The records of one kind from JSONL files or directories (`read_all`): `kind=None`, run records (no `kind`
    key); `"validation"`, `"plan"`: docs/records.md#validation-records, docs/records.md#plan-records, which the
    run tables never see."""
    return read_all(paths).of(kind)


def jsonl_files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """The JSONL files `read_all` reads: files as given, directories searched recursively."""
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.rglob("*.jsonl")) if p.is_dir() else [p] if p.exists() else []
    return out


def load(*paths: str | os.PathLike):
    """Records from JSONL files/directories as a pandas DataFrame; `metrics.*` flattened to columns."""
    import pandas as pd

    recs = read_records(paths)
    if not recs:
        return pd.DataFrame()
    return pd.json_normalize(recs, sep=".", max_level=1)


def provenance() -> dict[str, Any]:
    """Git commit and dirty flag, library and driver versions, host and devices."""
    import platform

    import torch

    from tspbench.paths import package_search_root

    root = package_search_root()

    def git(*args: str) -> str | None:
        try:
            return (
                subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
                or None
            )
        except (OSError, subprocess.SubprocessError):
            return None

    prov: dict[str, Any] = {
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "hostname": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "nccl": None,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "driver": None,
        "device_names": [],
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if torch.cuda.is_available():
        try:
            prov["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - RCCL builds may not expose it
            pass
        prov["device_names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        try:
            import pynvml

            pynvml.nvmlInit()
            prov["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception:  # noqa: BLE001 - no NVML (e.g. ROCm)
            pass
    return prov
