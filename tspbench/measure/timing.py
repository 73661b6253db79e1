"""Step timing and token accounting.

The device is synchronised only at the window edges. Inside the window:
  CUDA  one `torch.cuda.Event(enable_timing=True)` recorded after each step; read after the closing sync.
  CPU   `time.perf_counter()` after each step; eager CPU ops and gloo collectives are synchronous, so the
        host clock is the device clock.
Nothing inside the window calls `.item()` or otherwise waits on the device.

Tokens. One step consumes dp × B × S *unique* tokens, whatever the scheme: TP ranks see the same tokens,
SP/TSP ranks see disjoint slices of them, so multiplying by the TP or SP degree over-counts
(pytorch/torchtitan#2983, huggingface/trl#7100) and dividing by it under-counts (prime-rl#2424).
"""

from __future__ import annotations

import statistics
import time

import torch

from tspbench.parallel import ParallelConfig


def tokens_per_step(par: ParallelConfig, batch: int, seq_len: int, mode: str = "train") -> int:
    """Unique tokens per step over the whole world: dp × B × S (never × T, × Σ or × D); a decode step
    produces one new token per sequence, dp × B."""
    return par.dp * batch * (1 if mode == "decode" else seq_len)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer:
    """start() … step() per step … stop() → per-step milliseconds of this rank."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.marks: list = []
        self.window_s = 0.0

    def start(self) -> None:
        sync(self.device)  # window edge: device idle, clocks aligned
        self.t0 = time.perf_counter()
        self.marks = [self._mark()]

    def step(self) -> None:
        self.marks.append(self._mark())  # no sync: an event, or the host clock

    def stop(self) -> list[float]:
        sync(self.device)  # window edge
        self.window_s = time.perf_counter() - self.t0
        if self.cuda:
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]

    def _mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def elapsed_s(self) -> float:
        """Host seconds since start() (for progress lines only; on GPU the host may run ahead)."""
        return time.perf_counter() - self.t0


def step_stats(per_rank_ms: list[list[float]]) -> dict[str, float]:
    """min / median / max over every rank's every measured step."""
    flat = [t for ts in per_rank_ms for t in ts]
    return {"step_time_ms_min": min(flat), "step_time_ms_p50": statistics.median(flat), "step_time_ms_max": max(flat)}


def throughput(tokens_step: int, steps: int, window_s_per_rank: list[float], world_size: int) -> dict:
    """Global tokens/s over the slowest rank's window, and the same per device (÷ world size)."""
    window = max(window_s_per_rank)
    tps = tokens_step * steps / window if window > 0 else None
    return {
        "tokens_per_step": tokens_step,
        "window_s": window,
        "tokens_per_s": tps,
        "tokens_per_s_per_device": tps / world_size if tps is not None else None,
    }
