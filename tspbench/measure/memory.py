"""Peak memory, and where it goes.

Device peaks (CUDA/ROCm only: `torch.cuda.max_memory_allocated` / `max_memory_reserved`
over the measured window (peaks reset at its start), allocator retries and OOMs, and the device-wide used
memory from NVML (amdsmi on AMD), which includes the CUDA context and other processes.

Breakdown (every device): one extra, untimed step under `torch.distributed._tools.mem_tracker.MemTracker`,
which classifies each live tensor as parameter, gradient, optimizer state, activation (saved by a module's
forward), temporary or other, and keeps the split at the moment of the per-rank peak. It works on CPU with
these models and with gloo collectives. Where it fails, the fallback counts parameters, gradients and
optimizer state from the tensors themselves and activations with autograd saved-tensor hooks (as
tspbench.verify does); temporaries are then unknown (None).

Communication buffers are not a MemTracker category: collective outputs are counted as activations or
temporaries. `mem_comm_buffers_gib` is reported beside them (the largest single collective buffer of a
step, from the CommLog), not added to the total.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from tspbench.config import GIB

BREAKDOWN_KEYS = (
    "mem_params_gib",
    "mem_grads_gib",
    "mem_optimizer_gib",
    "mem_activations_gib",
    "mem_temporaries_gib",
    "mem_other_gib",
    "mem_total_gib",
)
CATEGORIES = {
    "Parameter": "params",
    "Gradient": "grads",
    "Optstate": "optimizer",
    "Activation": "activations",
    "Temp": "temporaries",
    "Buffer": "buffers",
    "Other": "other",
}


ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
"""The variables torch's CUDA/HIP caching allocator reads its settings from."""


def alloc_conf(env: Mapping[str, str]) -> str | None:
    """The caching allocator's settings in `env`: `NAME=value` of each of ALLOC_CONF_VARS that is set, joined by
    "; "; None: torch's defaults."""
    return "; ".join(f"{k}={env[k]}" for k in ALLOC_CONF_VARS if env.get(k)) or None


def release_cached(device: torch.device) -> None:
    """Hand the allocator's cached, unused blocks back (empty_cache) before the LAST warm-up step (tspbench.run.loop
    first_steps): that step reserves from an empty cache what one steady-state step needs, so peak_reserved, reset
    to the current reserved at the window's start (`reset_peaks`), is the steady state's and the window's, not what
    step 0 (first-time optimizer state, the CommLog) left reserved. Not at the window's start: its first timed step
    would reserve every block again through cudaMalloc."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reset_peaks(device: torch.device) -> None:
    """The window's peaks start here (reserved: at the current reserved, `release_cached`)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def device_peaks(device: torch.device, local_index: int | None = None) -> dict[str, Any]:
    """Allocator peaks since reset_peaks(); None (with `memory_reason`) where the device has none."""
    if device.type != "cuda":
        return {
            "peak_allocated_gib": None,
            "peak_reserved_gib": None,
            "device_used_gib": None,
            "num_ooms": None,
            "alloc_retries": None,
            "memory_reason": "CPU: no caching-allocator peaks; see the mem_* breakdown",
        }
    stats = torch.cuda.memory_stats(device)
    used, reason = device_used_gib(device.index if local_index is None else local_index)
    return {
        "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
        "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB,
        "device_used_gib": used,
        "num_ooms": stats.get("num_ooms", 0),
        "alloc_retries": stats.get("num_alloc_retries", 0),
        "memory_reason": reason,
    }


def device_used_gib(index: int) -> tuple[float | None, str | None]:
    """Used memory of the whole device (NVML, or amdsmi on ROCm)."""
    if getattr(torch.version, "hip", None):
        try:
            import amdsmi

            amdsmi.amdsmi_init()
            h = amdsmi.amdsmi_get_processor_handles()[index]
            return amdsmi.amdsmi_get_gpu_vram_usage(h)["vram_used"] / 1024, None  # MiB → GiB
        except Exception as e:  # noqa: BLE001 - amdsmi missing or unsupported
            return None, f"amdsmi unavailable: {type(e).__name__}: {e}"
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(index))
        return pynvml.nvmlDeviceGetMemoryInfo(h).used / GIB, None
    except Exception as e:  # noqa: BLE001
        return None, f"NVML unavailable: {type(e).__name__}: {e}"


def _nvml_index(cuda_index: int) -> int:
    """The NVML index of a CUDA device (differs under CUDA_VISIBLE_DEVICES)."""
    try:
        return torch.cuda._get_nvml_device_index(cuda_index)
    except Exception:  # noqa: BLE001 - private helper; identity is right without CUDA_VISIBLE_DEVICES
        return cuda_index


# ------------------------------------------------------------------------------------------ breakdown
def breakdown(
    step: Callable[[], Any], module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer], device: torch.device
) -> dict[str, Any]:
    """Per-category bytes (GiB) at this rank's peak during one call of `step` (collective: every rank
    calls it). `optimizers`: those whose state is the optimizer's (none for forward and decode). Returns
    mem_{params,grads,optimizer,activations,temporaries,total}_gib and the method."""
    try:
        return _mem_tracker(step, module, optimizers, device)
    except Exception as e:  # noqa: BLE001 - MemTracker is a private, evolving API
        out = _fallback(step, module, optimizers)
        out["mem_breakdown_reason"] = f"MemTracker failed ({type(e).__name__}: {e}); fallback used"
        return out


def _mem_tracker(step, module, optimizers, device) -> dict[str, Any]:
    from torch.distributed._tools.mem_tracker import MemTracker

    mt = MemTracker()
    mt.track_external(module, *optimizers)
    with mt:
        step()
    snap = mt.get_tracker_snapshot("peak")
    dev = next((d for d in snap if torch.device(d).type == device.type), None)
    if dev is None:
        raise RuntimeError(f"no {device.type} entry in MemTracker's snapshot")
    by_cat = {CATEGORIES.get(getattr(k, "value", k), str(k)): v for k, v in snap[dev].items() if k != "Total"}
    out: dict[str, Any] = {
        f"mem_{c}_gib": by_cat.get(c, 0) / GIB for c in ("params", "grads", "optimizer", "activations", "temporaries")
    }
    out["mem_other_gib"] = (by_cat.get("buffers", 0) + by_cat.get("other", 0)) / GIB
    out["mem_total_gib"] = snap[dev]["Total"] / GIB
    out["mem_breakdown_method"] = "MemTracker (at the rank's peak, one untimed step)"
    return out


def _fallback(step, module, optimizers) -> dict[str, Any]:
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    saved = [0]
    with saved_tensor_bytes(params, saved):
        step()
    nbytes = lambda ts: sum(t.untyped_storage().nbytes() for t in ts)  # noqa: E731
    p = nbytes(module.parameters())
    g = nbytes(q.grad for q in module.parameters() if q.grad is not None)
    o = sum(nbytes(v for v in st.values() if torch.is_tensor(v)) for opt in optimizers for st in opt.state.values())
    return {
        "mem_params_gib": p / GIB,
        "mem_grads_gib": g / GIB,
        "mem_optimizer_gib": o / GIB,
        "mem_activations_gib": saved[0] / GIB,
        "mem_temporaries_gib": None,
        "mem_other_gib": None,
        "mem_total_gib": (p + g + o + saved[0]) / GIB,
        "mem_breakdown_method": "tensors + saved-tensor hooks (grads/optimizer after the step)",
    }


@contextlib.contextmanager
def saved_tensor_bytes(param_keys: set[int], total: list[int]):
    """Bytes autograd saves for backward (storage-deduplicated, parameters excluded: those in `param_keys`, and any
    nn.Parameter or view of one, such as FSDP2's gathered weights, whose storage it frees after forward)."""
    seen: set[int] = set()

    def pack(t):
        key = t.untyped_storage().data_ptr()
        base = t if t._base is None else t._base
        if isinstance(base, torch.nn.Parameter):
            return t
        if key not in param_keys and key not in seen:
            seen.add(key)
            total[0] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield
