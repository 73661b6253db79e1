"""What the terminal shows while a grid runs: the first line (what will happen to the grid points, and why), one
line per finished point with its place, the elapsed time and an ETA, and a tqdm bar (progress=true only).

    tspbench: llama7b: 24 grid points: 0 measured on this machine, 24 estimated and modelled (needs 8 cuda
        devices, found 0; hardware profile mi300x)
    [ 3/24 0:14 ETA 1:32] ok       tp d8 S=16384 B=1 train [estimated]: peak 40.12 GiB/device
    ...
    tspbench: 24 grid points: 23 ok, 1 oom (predicted; a result) → exit 0        (tspbench.run.checks.outcome)

Estimates run in parallel processes (tspbench.run.dispatch.prefetch_estimates); each is counted here as it
finishes, so the bar and the lines move with them instead of jumping at the end. With progress=false there is no
bar; the lines go to stderr all the same (tests read them).
"""

from __future__ import annotations

import sys
import time

from tspbench.record.spec import RunSpec
from tspbench.run.fate import fate_of


def clock(seconds: float) -> str:
    """0:07, 12:34, 1:02:03."""
    s = round(seconds)
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def plan_line(specs: list[RunSpec], nodes: int = 1, gpus_per_node: int = 8) -> str:
    """The first line of a run: how many grid points, and what happens to them, from their decided fates."""
    kinds: dict[str, list[RunSpec]] = {}
    for s in specs:
        kinds.setdefault(fate_of(s).kind, []).append(s)
    here = f"on {nodes} nodes × {gpus_per_node}" if nodes > 1 else "on this machine"
    parts = [f"{len(kinds.get('measure', []))} measured {here}"]
    for kind, words in (("estimate+model", "estimated and modelled"), ("estimate", "estimated"), ("model", "modelled")):
        group = kinds.get(kind, [])
        if not group:
            continue
        # the reason of the point needing the most devices ("needs 8 cuda devices", not `single`'s 1)
        reasons = [str(fate_of(s).reason) for s in sorted(group, key=lambda s: -s.world_size) if fate_of(s).reason]
        hw = group[0].hardware or "h100"
        most = max(s.world_size for s in group)
        why = (
            f"{reasons[0].split(' (')[0]}; hardware profile {hw}"
            if reasons
            else f"execution={group[0].execution}, up to {most} devices; hardware profile {hw}"
        )
        if kind == "model" and reasons and all(s.mode == "decode" for s in group):
            why = f"decode is modelled only; {why}"
        parts.append(f"{len(group)} {words} ({why})")
    refused = kinds.get("refused", [])
    if refused:
        parts.append(f"{len(refused)} refused (recorded invalid: {fate_of(refused[0]).reason})")
    name = specs[0].experiment if specs else "tspbench"
    return f"tspbench: {name}: {len(specs)} grid points: " + ", ".join(parts)


class Progress:
    """Counts finished grid points; `finished` prints one line with [done/total elapsed ETA] above the bar."""

    def __init__(self, total: int, desc: str, enabled: bool = True):
        from tqdm import tqdm

        self.total, self.done, self.enabled = total, 0, enabled
        self.started = time.monotonic()
        self.bar = tqdm(total=total, desc=desc, unit="point", disable=not enabled, dynamic_ncols=True, file=sys.stderr)

    def say(self, line: str) -> None:
        """A line above the bar (plain stderr without one)."""
        if self.enabled:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def where(self) -> str:
        """[done/total elapsed ETA] (the ETA: the mean time per finished point × the points left)."""
        elapsed = time.monotonic() - self.started
        left = self.total - self.done
        eta = clock(elapsed / self.done * left) if self.done else "?"
        width = len(str(self.total))
        return f"[{self.done:>{width}}/{self.total} {clock(elapsed)} ETA {eta}]"

    def finished(self, line: str) -> None:
        """One grid point is done: count it and print its line."""
        self.done += 1
        self.bar.update(1)
        self.say(f"{self.where()} {line}")

    def status(self, text: str) -> None:
        """The bar's live postfix (the running point, its steps)."""
        self.bar.set_postfix_str(text)

    def close(self) -> None:
        self.bar.close()
