"""Find worker processes left behind by a test (by a marker in their command line)."""

from __future__ import annotations

from pathlib import Path


def worker_pids(marker: str) -> list[int]:
    """PIDs of live `tspbench.run.worker` processes whose command line contains `marker`."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if marker in cmd and "tspbench.run.worker" in cmd:
                out.append(int(d.name))
    return out
