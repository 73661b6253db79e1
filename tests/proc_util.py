"""Processes of the tests: start `python -m tspbench` as a user would (`tspbench_process`), and find worker processes
left behind by a test (by a marker in their command line)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def tspbench_process(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """`python -m tspbench ARGS` in `cwd` with `env`, stdout and stderr captured as text."""
    return subprocess.Popen(
        [sys.executable, "-m", "tspbench", *args],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


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
