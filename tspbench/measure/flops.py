"""Peak FLOPs by device name, MFU and HFU (docs/method.md#flops). The FLOP formulas themselves are
tspbench.predict.costmodel.flops (one set, shared with the estimate and the cost model).

MFU = FLOPs/token × tokens/s ÷ (peak × world size). The peak is the `peak_flops_bf16` of the hardware profile
(conf/hardware/<name>.yaml, the one place that states it, with its sources) whose `device_names` pattern matches
`torch.cuda.get_device_name()`; every record stores the value and its source. A device that no profile names gets
`None` with a reason, never a guess.

The profiles are read here as plain YAML (name, peak_flops_bf16, device_names, sources), not through
tspbench.predict.costmodel.load_hardware: measure sits below predict in the layers (README.md, "Layout"), and
tests/unit/test_peak_flops.py holds the two readers to the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from tspbench.paths import conf_dir

CPU_REASON = "no peak-FLOPs entry for CPU: MFU is not meaningful for gloo/CPU runs"


@dataclass(frozen=True)
class PeakEntry:
    """One hardware profile as far as MFU needs it."""

    profile: str
    """The profile's file stem (conf/hardware/<profile>.yaml)."""
    peak_flops_bf16: float
    """Its dense bf16 peak, FLOP/s."""
    device_names: tuple[str, ...]
    """Substrings of `torch.cuda.get_device_name()` it describes (matched case-insensitively)."""
    source: str
    """"conf/hardware/<profile>.yaml: <the sources line that states the bf16 peak>"."""


def _bf16_source(path: Path, sources: list[str]) -> str:
    """The profile's sources line that states its bf16 peak (the first naming BF16), with the file it is in."""
    line = next((s for s in sources if "bf16" in s.lower()), None)
    return f"conf/hardware/{path.name}: {line if line else 'peak_flops_bf16 (no sources line names BF16)'}"


def peak_entries(hardware_dir: str | Path | None = None) -> list[PeakEntry]:
    """Every profile of conf/hardware/ (or `hardware_dir`) with its bf16 peak and device-name patterns, by name."""
    out = []
    for path in sorted(Path(hardware_dir or conf_dir() / "hardware").glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        out.append(
            PeakEntry(
                profile=path.stem,
                # float(): YAML 1.1 reads "1e12" (no sign, no dot) as a string, as load_hardware knows
                peak_flops_bf16=float(data["peak_flops_bf16"]),
                device_names=tuple(data.get("device_names") or ()),
                source=_bf16_source(path, list(data.get("sources") or [])),
            )
        )
    return out


def match_profile(device_name: str | None, hardware_dir: str | Path | None = None) -> PeakEntry | None:
    """The profile whose `device_names` pattern occurs in `device_name` (case-insensitive); the longest matching
    pattern wins (e.g. "H100 96GB" over a shorter "H100" pattern); None when no profile names the device."""
    if not device_name:
        return None
    name = device_name.lower()
    hits = [(len(p), e) for e in peak_entries(hardware_dir) for p in e.device_names if p and p.lower() in name]
    return max(hits, key=lambda h: h[0])[1] if hits else None


def peak_flops(
    device_name: str | None, device_type: str, hardware_dir: str | Path | None = None
) -> tuple[float | None, str]:
    """(peak bf16 FLOP/s per device, "conf/hardware/<name>.yaml: <source line>") or (None, reason)."""
    if device_type == "cpu":
        return None, CPU_REASON
    entry = match_profile(device_name, hardware_dir)
    if entry is None:
        return None, (
            f"device {device_name!r} matches no hardware profile's device_names: add a conf/hardware/<name>.yaml "
            "(peak_flops_bf16 with its source, device_names) to get its MFU"
        )
    return entry.peak_flops_bf16, entry.source


def mfu_pct(flops_token: float, tokens_per_s: float | None, peak: float | None, world_size: int) -> float | None:
    if tokens_per_s is None or peak is None:
        return None
    return 100.0 * flops_token * tokens_per_s / (peak * world_size)
