"""The rank's entry point: `torchrun ... -m tspbench.run.worker spec=FILE [results=PATH]`.

Reads a frozen RunSpec (JSON, written by the parent: tspbench/run/supervise.py), joins the default process group
from the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK; gloo on CPU, NCCL on CUDA), runs the measured loop
(tspbench/run/loop.py) and, on rank 0, appends the one record. Hydra is never involved here, so the same command
runs under a cluster's own `torchrun --nnodes N ...` given a spec file whose dp × degree matches the world size
(tspbench/run/slurm.py starts it so on every node of a Slurm allocation). The record's `hosts` names every node
the ranks ran on (SLURMD_NODENAME under Slurm, else the hostname).

Test runs (TSPBENCH_STRICT=1, or, unset, under CI or pytest) hold every collective to NCCL's rules (strict comm,
docs/method.md#gpu-rules); measured runs do not (its checks sync the host).

Failures: an OOM (torch.OutOfMemoryError) or any other exception writes `<status_dir>/rank<R>.json`
for the parent to turn into an `oom` / `failed` record, and exits non-zero so torchrun tears the group
down.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tspbench import cli
from tspbench.config import ConfigError
from tspbench.record.spec import RunSpec
from tspbench.record.store import append_record
from tspbench.run.loop import benchmark, setup_device


@dataclass
class WorkerConfig:
    """`python -m tspbench.run.worker`, one per rank under torchrun."""

    spec: str = ""
    """The RunSpec JSON the parent wrote (<run dir>/specs/<run_id>.json)."""
    results: str | None = None
    """Override the spec's results file (JSONL); null: the spec's."""


EXAMPLES = ["torchrun --nnodes 2 --nproc-per-node 8 ... -m tspbench.run.worker spec=results/RUN/specs/RUN_ID.json"]


def write_status(spec: RunSpec, rank: int, status: str, reason: str, tb: str = "") -> None:
    """`<status_dir>/rank<R>.json`: how this rank ended, for the parent (time orders root cause first)."""
    if not spec.status_dir:
        return
    d = Path(spec.status_dir)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".rank{rank}.json.tmp"
    tmp.write_text(
        json.dumps({"rank": rank, "status": status, "reason": reason, "time": time.time(), "traceback": tb[-6000:]})
    )
    tmp.replace(d / f"rank{rank}.json")


def strict_requested(environ) -> bool:
    """Strict comm for this run: TSPBENCH_STRICT=1 or 0 says so; unset, on under CI or pytest (CI,
    PYTEST_CURRENT_TEST), off otherwise."""
    flag = environ.get("TSPBENCH_STRICT", "")
    if flag not in ("", "0", "1"):
        raise ConfigError(f"TSPBENCH_STRICT={flag!r} is unknown; allowed: 1 (NCCL's rules on), 0 (off), unset")
    return flag == "1" if flag else bool(environ.get("CI") or environ.get("PYTEST_CURRENT_TEST"))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if cli.wants_help(argv):
        intro = "One rank of a measured run: the spec's model, layout and loop; rank 0 appends the record."
        print(cli.help_text("tspbench.run.worker", WorkerConfig(), intro, EXAMPLES))
        return 0
    try:
        wc = cli.parse_options(WorkerConfig, argv)
        if not wc.spec:
            raise ConfigError("spec= is required: the RunSpec JSON the parent wrote")
        if not Path(wc.spec).is_file():
            raise ConfigError(f"spec={wc.spec} does not exist; give a RunSpec JSON the parent wrote (RUN/specs/)")
        spec = RunSpec.from_json(Path(wc.spec).read_text())
        strict = strict_requested(os.environ)
    except (ConfigError, OSError, ValueError) as e:
        print(f"tspbench.run.worker: {e}", file=sys.stderr)
        return 2
    if wc.results:
        spec.results_file = wc.results
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world != spec.world_size:
        print(
            f"tspbench.run.worker: WORLD_SIZE={world} but the spec needs dp × degree = {spec.world_size}",
            file=sys.stderr,
        )
        return 2
    spec.nodes = max(1, world // max(1, local_world))
    device = setup_device(spec.device, local_rank)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        timeout=timedelta(seconds=max(60.0, spec.timeout_s)),
        device_id=device if device.type == "cuda" else None,
    )
    if strict and rank == 0:
        print("tspbench.run.worker: strict comm on (TSPBENCH_STRICT, CI or pytest): timings include its checks")
    try:
        record = benchmark(spec, device, rank, world, strict=strict)
        hosts = _hosts(world)
        if record is not None:
            record["hosts"] = hosts
            append_record(spec.results_file, record)
    except torch.OutOfMemoryError as e:
        _die(spec, rank, "oom", e)
    except BaseException as e:  # noqa: BLE001 - anything else: tell the parent which rank and why
        _die(spec, rank, "failed", e)
    dist.destroy_process_group()
    return 0


def _hosts(world: int) -> list[str]:
    """Every node the ranks ran on, in rank order, once each (SLURMD_NODENAME under Slurm, else the hostname):
    the record's `hosts`. One all_gather_object after the run, so it cannot disturb what was measured."""
    names: list[str | None] = [None] * world
    dist.all_gather_object(names, os.environ.get("SLURMD_NODENAME") or socket.gethostname())
    return list(dict.fromkeys(str(n) for n in names))


def _die(spec: RunSpec, rank: int, status: str, e: BaseException) -> None:
    """Record this rank's failure and leave at once: peers may be blocked in a collective, so no
    destroy_process_group; torchrun sees the exit code and tears the group down."""
    tb = traceback.format_exc()
    print(tb, file=sys.stderr)
    first = (str(e).strip().splitlines() or [""])[0]
    write_status(spec, rank, status, f"rank {rank}: {type(e).__name__}: {first}"[:500], tb)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
