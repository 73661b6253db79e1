"""The resource check of one measured run, before its ranks start: the cost model's per-rank peak
(tspbench.predict.costmodel.memory, docs/method.md#memory) against the memory the run can get (free device
memory on GPU, available RAM / ranks on CPU), so a run that cannot fit is recorded `oom` with the numbers
instead of growing until the machine runs out.
"""

from __future__ import annotations

from pathlib import Path

from tspbench.config import GIB
from tspbench.record.spec import RunSpec

GPU_SLACK = 1.25
"""On GPU a run is refused only when the predicted peak exceeds free memory by this factor: a real CUDA OOM is
caught by the worker and recorded anyway, so only clear misfits are worth refusing there (a borderline run is
tried). On CPU there is no slack: running out of RAM takes the machine down with it."""


def available_bytes_per_rank(spec: RunSpec) -> tuple[float, str] | None:
    """(bytes one rank can get, where the number comes from), or None when it cannot be known."""
    if spec.device == "cpu":
        avail = _mem_available()
        if avail is None:
            return None
        return avail / spec.world_size, f"MemAvailable {avail / GIB:.2f} GiB / {spec.world_size} ranks"
    try:  # NVML: no CUDA context in the parent (it would hold memory on every device for the whole grid)
        import pynvml

        pynvml.nvmlInit()
        free = [
            pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).free
            for i in range(min(spec.world_size, pynvml.nvmlDeviceGetCount()))
        ]
    except Exception:  # noqa: BLE001 - no NVML (ROCm, no driver): the check is skipped, not guessed
        return None
    if not free:
        return None
    return float(min(free)), f"free device memory {min(free) / GIB:.2f} GiB (least free of {len(free)} devices)"


def _mem_available() -> float | None:
    try:
        import psutil

        return float(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def estimated_peak_bytes(spec: RunSpec) -> float:
    """The cost model's predicted peak bytes per rank (docs/method.md#memory)."""
    from tspbench.predict.costmodel import Workload, memory_breakdown

    decode = spec.mode == "decode"  # serving: the prefill's forward with its KV cache (room for the decode steps)
    seq = spec.seq_len + (spec.warmup_steps + spec.measured_steps if decode else 0)  # one token per step
    work = Workload(spec.model_config(), seq, spec.batch, mode="forward" if decode else spec.mode, dtype=spec.dtype)
    mem = memory_breakdown(spec.parallel(), work, kv_cache=decode)
    return float(mem["total"])


def memory_refusal(spec: RunSpec, available: tuple[float, str] | None = None) -> dict | None:
    """None if the run may start; else the numbers of why it cannot fit (for an `oom` record)."""
    have = available if available is not None else available_bytes_per_rank(spec)
    if have is None:
        return None
    peak = estimated_peak_bytes(spec)
    if peak <= have[0] * (1.0 if spec.device == "cpu" else GPU_SLACK):
        return None
    return {
        "estimated_peak_gib_per_rank": peak / GIB,
        "available_gib_per_rank": have[0] / GIB,
        "available_source": have[1],
        "reason": (
            f"estimated peak {peak / GIB:.2f} GiB per rank > {have[0] / GIB:.2f} GiB available per rank "
            f"({have[1]}); not started (memory_check=false runs it anyway)"
        ),
    }
