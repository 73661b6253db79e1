"""Peak FLOPs by device name, MFU and HFU (docs/method.md#flops). The FLOP formulas themselves are
tspbench.predict.costmodel.flops (one set, shared with the estimate and the cost model).

MFU = FLOPs/token × tokens/s ÷ (peak × world size). The peak is that of the run's dtype (`peak_for`) in the hardware
profile (conf/hardware/<name>.yaml, with its sources) that names `torch.cuda.get_device_name()` (`match_profile`);
the same match is a measured record's `hardware`. A device no profile names gets `None` with a reason, never a guess.
Profiles are read here as plain YAML, not through costmodel.load_hardware: measure sits below predict (README.md,
"Layout"); tests/unit/test_peak_flops.py holds the two readers to the same numbers.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from tspbench.paths import conf_dir

CPU_REASON = "no peak-FLOPs entry for CPU: MFU is not meaningful for gloo/CPU runs"
EXCLUDE = "!"
"""A `device_names` entry starting with it excludes: the profile never names a device containing the rest
(h200.yaml: "!NVL" keeps "NVIDIA H200 NVL", a lower-peak part, out of the SXM profile)."""
PEAK_KEYS = {"bfloat16": "peak_flops_bf16", "float16": "peak_flops_bf16", "float32": "peak_flops_fp32"}
"""The profile key holding a dtype's dense peak. float16 shares the bf16 tensor peak (equal on every profiled part);
float32 is the non-tensor FP32 peak, since PyTorch's default (torch.backends.cuda.matmul.allow_tf32 = False, which
tspbench keeps) runs fp32 GEMMs without TF32 (docs/records.md, `peak_flops`)."""


@dataclass(frozen=True)
class PeakEntry:
    """One hardware profile as far as measured records need it: the peaks of MFU, the memory of the capacity line."""

    profile: str
    """The profile's file stem (conf/hardware/<profile>.yaml)."""
    peak_flops_bf16: float
    """Its dense bf16 peak, FLOP/s."""
    device_names: tuple[str, ...]
    """Substrings of `torch.cuda.get_device_name()` it describes (matched case-insensitively); EXCLUDE-prefixed
    entries name what it never describes."""
    source: str
    """"conf/hardware/<profile>.yaml: <the sources line that states the bf16 peak>"."""
    peak_flops_fp32: float | None = None
    """Its FP32 (non-tensor) peak, FLOP/s; None: the profile states none."""
    fp32_source: str | None = None
    """The same as `source` for the FP32 peak."""
    mem_bytes: float | None = None
    """Device memory, bytes (decimal, as the datasheet states it); None: the profile states none."""

    def peak_for(self, dtype: str) -> tuple[float | None, str]:
        """(dense peak FLOP/s of `dtype`, its source) or (None, why there is none)."""
        key = PEAK_KEYS.get(dtype)
        peak = {"peak_flops_bf16": self.peak_flops_bf16, "peak_flops_fp32": self.peak_flops_fp32}.get(key or "")
        if peak is None:
            what = f"no {key}" if key else f"no peak for dtype {dtype!r} (known: {', '.join(PEAK_KEYS)})"
            return None, f"conf/hardware/{self.profile}.yaml has {what}: MFU needs the peak of the run's dtype"
        return peak, self.source if key == "peak_flops_bf16" else str(self.fp32_source)


def _source(path: Path, sources: list[str], token: str, key: str) -> str:
    """The profile's sources line that states a peak: the first datasheet line naming `token` (BF16, FP32), else the
    first line naming it, with the file it is in."""
    named = [s for s in sources if token in s.lower()]
    line = next((s for s in named if "datasheet" in s.lower() or "data sheet" in s.lower()), None) or next(
        iter(named), None
    )
    return f"conf/hardware/{path.name}: {line if line else f'{key} (no sources line names {token.upper()})'}"


def _float(x: object) -> float | None:
    # float(): YAML 1.1 reads "1e12" (no sign, no dot) as a string, as load_hardware knows
    return None if x is None else float(x)  # type: ignore[arg-type]


def peak_entries(hardware_dir: str | Path | None = None) -> list[PeakEntry]:
    """Every profile of conf/hardware/ (or `hardware_dir`) with its peaks, memory and device-name patterns, by name."""
    out = []
    for path in sorted(Path(hardware_dir or conf_dir() / "hardware").glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        sources = [str(s) for s in data.get("sources") or []]
        out.append(
            PeakEntry(
                profile=path.stem,
                peak_flops_bf16=float(data["peak_flops_bf16"]),
                device_names=tuple(str(s) for s in data.get("device_names") or ()),
                source=_source(path, sources, "bf16", "peak_flops_bf16"),
                peak_flops_fp32=_float(data.get("peak_flops_fp32")),
                fp32_source=_source(path, sources, "fp32", "peak_flops_fp32"),
                mem_bytes=_float(data.get("mem_bytes")),
            )
        )
    return out


@functools.cache
def _default_entries() -> tuple[PeakEntry, ...]:
    """conf/hardware/'s entries, read once per process (the report asks for one per row)."""
    return tuple(peak_entries())


def profile_entry(profile: str | None) -> PeakEntry | None:
    """The entry of conf/hardware/<profile>.yaml, or None (no such profile, or no name)."""
    return next((e for e in _default_entries() if e.profile == profile), None) if profile else None


def pattern_length(device_names: Iterable[str], device_name: str) -> int:
    """The length of the longest of `device_names` occurring in `device_name` (case-insensitive); 0 when none does
    or one of its EXCLUDE entries does."""
    name, pats = device_name.lower(), [p.lower() for p in device_names if p]
    if any(p[len(EXCLUDE) :] in name for p in pats if p.startswith(EXCLUDE)):
        return 0
    return max((len(p) for p in pats if not p.startswith(EXCLUDE) and p in name), default=0)


def match_profile(device_name: str | None, hardware_dir: str | Path | None = None) -> PeakEntry | None:
    """The profile whose `device_names` pattern occurs in `device_name` (case-insensitive) and none of whose
    exclusions (EXCLUDE) does; the longest matching pattern wins (e.g. "H100 96GB" over a shorter "H100" pattern);
    None when no profile names the device."""
    if not device_name:
        return None
    entries = peak_entries(hardware_dir) if hardware_dir else _default_entries()
    hits = [(n, e) for e in entries if (n := pattern_length(e.device_names, device_name))]
    return max(hits, key=lambda h: h[0])[1] if hits else None


def no_profile_reason(device_name: str | None) -> str:
    """Why a device has no profile (hence no MFU, no `hardware`): how to add one."""
    return (
        f"device {device_name!r} matches no hardware profile's device_names: add a conf/hardware/<name>.yaml "
        "(peak_flops_bf16 / peak_flops_fp32 with their sources, mem_bytes, device_names) to get its MFU"
    )


def peak_flops(
    device_name: str | None, device_type: str, hardware_dir: str | Path | None = None, dtype: str = "bfloat16"
) -> tuple[float | None, str]:
    """(peak FLOP/s of `dtype` per device, "conf/hardware/<name>.yaml: <source line>") or (None, reason)."""
    if device_type == "cpu":
        return None, CPU_REASON
    entry = match_profile(device_name, hardware_dir)
    if entry is None:
        return None, no_profile_reason(device_name)
    return entry.peak_for(dtype)


def mfu_pct(flops_token: float, tokens_per_s: float | None, peak: float | None, world_size: int) -> float | None:
    if tokens_per_s is None or peak is None:
        return None
    return 100.0 * flops_token * tokens_per_s / (peak * world_size)
