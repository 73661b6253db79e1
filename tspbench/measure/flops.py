"""Peak FLOPs by device name, MFU and HFU (docs/method.md#flops). The FLOP formulas themselves are
tspbench.predict.costmodel.flops (one set, shared with the estimate and the cost model).

MFU = FLOPs/token × tokens/s ÷ (peak × world size). The peak comes from a table keyed by device name
(torchtitan `get_peak_flops`, bf16 dense) and every record stores the value and its source; a device not in the
table gets `None` with a reason, never a guess.
"""

from __future__ import annotations

# (substring of the device name, bf16 dense peak FLOP/s, source). Order matters: first match wins.
PEAK_FLOPS: list[tuple[str, float, str]] = [
    ("GB300", 2.5e15, "torchtitan get_peak_flops (GB300, bf16 dense)"),
    ("GB200", 2.5e15, "torchtitan get_peak_flops (GB200, bf16 dense)"),
    ("B300", 2.25e15, "torchtitan get_peak_flops (B300, bf16 dense)"),
    ("B200", 2.25e15, "torchtitan get_peak_flops (B200, bf16 dense)"),
    ("H200", 989e12, "torchtitan get_peak_flops (H200, bf16 dense)"),
    ("H100 NVL", 835e12, "torchtitan get_peak_flops (H100 NVL, bf16 dense)"),
    ("H100 PCIe", 756e12, "torchtitan get_peak_flops (H100 PCIe, bf16 dense)"),
    ("H100", 989e12, "torchtitan get_peak_flops (H100 SXM, bf16 dense)"),
    ("A100", 312e12, "torchtitan get_peak_flops (A100, bf16 dense)"),
    ("L40S", 362e12, "torchtitan get_peak_flops (L40S, bf16 dense)"),
    ("MI355X", 2500e12, "torchtitan get_peak_flops (MI355X, bf16 dense)"),
    ("MI325X", 1300e12, "torchtitan get_peak_flops (MI325X, bf16 dense)"),
    ("MI300X", 1300e12, "torchtitan get_peak_flops (MI300X, bf16 dense)"),
    ("MI250X", 191.5e12, "torchtitan get_peak_flops (MI250X per GCD, bf16 dense)"),
]


def peak_flops(device_name: str | None, device_type: str) -> tuple[float | None, str]:
    """(peak FLOP/s per device, source) or (None, reason)."""
    if device_type == "cpu":
        return None, "no peak-FLOPs entry for CPU: MFU is not meaningful for gloo/CPU runs"
    for key, value, source in PEAK_FLOPS:
        if device_name and key.lower() in device_name.lower():
            return value, source
    return None, f"device {device_name!r} is not in the peak-FLOPs table (tspbench.measure.flops.PEAK_FLOPS)"


def mfu_pct(flops_token: float, tokens_per_s: float | None, peak: float | None, world_size: int) -> float | None:
    if tokens_per_s is None or peak is None:
        return None
    return 100.0 * flops_token * tokens_per_s / (peak * world_size)
