"""Result records: one JSON object per run, appended atomically to a JSONL file.

Every method (measured, estimated, modelled) writes the same schema, so pandas and the report never care
how a number was obtained. Field meanings are documented in README.md ("Result records").

Record layout (flat keys, units in the names; `None` means "not available", never 0):

    run_id, experiment, method ("measured" | "estimated" | "modelled"), status ("ok" | "oom" | "failed" |
    "timeout" | "invalid"), reason, scheme, sp_variant, degree, tp_degree, sp_degree, dp, world_size,
    nodes, model, model_cfg{...}, seq_len, batch, mode ("train" | "forward"), dtype, recompute,
    device ("cpu" | "cuda"), device_name, hardware (profile name for modelled/estimated numbers),
    metrics{...}  (e.g. tokens_per_s, tokens_per_s_per_device, step_time_ms_p50, peak_allocated_gib,
                   mem_params_gib, ..., energy_j_per_token, comm_bytes_per_layer_fwd, mfu_causal_pct),
    per_rank{...} (lists indexed by rank: step_time_ms, peak_allocated_gib, energy_j, ...),
    provenance{git_commit, git_dirty, torch, nccl, driver, hostname, device_names, seed, warmup_steps,
               measured_steps, started_at, finished_at, config{...}}
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tspbench.record.guards import guard
from tspbench.record.schema import STATUSES

RESULTS_FILE = "results.jsonl"


def append_record(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append one record as a single line. One `write` of the whole line under an exclusive lock, then
    fsync: a crash or Ctrl-C can lose at most the record being written, never an earlier one. The plausibility
    guards (record/guards.py) run first: a record that breaks one is written `implausible` with the reason."""
    record = guard(record)
    assert record.get("status") in STATUSES, record.get("status")
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


def read_records(paths: Iterable[str | os.PathLike], kind: str | None = None) -> list[dict[str, Any]]:
    """All records from JSONL files or directories (searched recursively for *.jsonl). A torn last
    line (a crash mid-write) is skipped, not fatal. `kind=None`: run records (no `kind` key); `kind="validation"`:
    tspbench.validate's records (docs/records.md#validation-records), which the run tables never see."""
    out: list[dict[str, Any]] = []
    for p in paths:
        p = Path(p)
        files = sorted(p.rglob("*.jsonl")) if p.is_dir() else [p]
        for f in files:
            if not f.exists():
                continue
            for line in f.read_text().splitlines():
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict) and rec.get("kind") == kind:
                    out.append(rec)
    return out


def jsonl_files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """The JSONL files `read_records` reads: files as given, directories searched recursively."""
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.rglob("*.jsonl")) if p.is_dir() else [p] if p.exists() else []
    return out


def bad_lines(path: Path) -> list[tuple[int, bool]]:
    """(1-based line number, is it the file's last non-empty line) of every line that is not a JSON object
    (`read_records` skips them: a torn last line is a crash mid-write, anything else a damaged file)."""
    lines = path.read_text(errors="replace").splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            ok = isinstance(json.loads(line), dict)
        except json.JSONDecodeError:
            ok = False
        if not ok:
            out.append((i + 1, i == last))
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
