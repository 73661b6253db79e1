"""`python -m tspbench.gpu_check [key=value ...]`: the estimate against a real allocator on ONE accelerator, or
(`time=true`) rank 0's compute-only step time and the calibration file it yields.

The command line only: the checks are tspbench/predict/gpu_check.py and tspbench/predict/gpu_time.py; the
calibration file is written through tspbench.record (atomic, guarded: docs/records.md#calibration-files). Prints
one JSON line per case. A single GPU measures memory and one rank's compute, never multi-GPU throughput.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from tspbench import cli
from tspbench.config import ConfigError, Output
from tspbench.record.store import write_json


@dataclass
class GpuCheckConfig:
    """`python -m tspbench.gpu_check`: what to check on the one device."""

    device: str = "auto"
    """auto (cuda when present, else cpu) | cuda | cpu (the machinery on a small model; no allocator peaks)."""
    recompute: str = "full"
    """Activation recompute of the cases: full (the paper's memory setting) | none."""
    time: bool = False
    """Instead of memory: rank 0's compute-only forward and training step time (CUDA events) and the achieved
    GEMM / attention efficiencies, written as a calibration file (needs CUDA)."""
    shapes: bool = False
    """Instead of memory: time each distinct kernel call (attention forward/backward, GEMMs) of the headline's
    layouts at llama7b 128K, 8 GPUs (TSP with one and with per-bucket K/V gathers, TP+Megatron-SP, SP Ulysses and
    ring) and print the measured efficiency beside the kernel-shape model's, one JSON line per call (needs CUDA)."""
    hardware: str = "auto"
    """Hardware profile (conf/hardware/NAME.yaml) whose bf16 peak the efficiencies divide; names the file. auto:
    the profile whose device_names match torch.cuda.get_device_name() (refused when none does); an explicit
    profile that does not name the device is refused too, so one part's timings are never filed as another's."""
    calibration_out: Annotated[str, Output(dir=True)] = "."
    """Directory for NAME.calibration.json (commit it beside conf/hardware/NAME.yaml to make the time model use
    it)."""


EXAMPLES = [
    "python -m tspbench.gpu_check                                  # memory: real allocator vs estimate vs model",
    "python -m tspbench.gpu_check time=true calibration_out=results/   # profile named by the device (auto)",
    "python -m tspbench.gpu_check shapes=true                   # each kernel call's shape: measured vs modelled",
]


def device_profile(hardware: str, device_name: str) -> str:
    """The profile that names this device: `auto` resolves through the profiles' device_names; an explicit name
    must be the one that matches (ConfigError naming both otherwise)."""
    from tspbench.measure.flops import match_profile

    entry = match_profile(device_name)
    found = entry.profile if entry is not None else None
    if hardware == "auto":
        if found is None:
            raise ConfigError(
                f"hardware=auto: device {device_name!r} matches no conf/hardware/*.yaml device_names; "
                "add a profile for it or name one with hardware=NAME"
            )
        return found
    if found != hardware:
        allowed = f"auto or {found}" if found else "a profile whose device_names match it (none does)"
        raise ConfigError(f"hardware={hardware!r} does not name this device ({device_name!r}); allowed: {allowed}")
    return hardware


def write_calibration(path: Path, calib: dict) -> dict:
    """conf/hardware/<name>.calibration.json content, written atomically after the calibration guard."""
    return write_json(path, calib, kind="calibration")


def main(argv: list[str] | None = None) -> int:
    import torch

    from tspbench.predict.gpu_check import calibration, memory_checks, timing_checks

    argv = sys.argv[1:] if argv is None else argv
    if cli.wants_help(argv):
        intro = __doc__.split("\n\n")[0].split(": ", 1)[1]
        print(cli.help_text("tspbench.gpu_check", GpuCheckConfig(), intro, EXAMPLES))
        return 0
    try:
        gc = cli.parse_options(GpuCheckConfig, argv)
        device = ("cuda" if torch.cuda.is_available() else "cpu") if gc.device == "auto" else gc.device
        if device not in ("cuda", "cpu") and not device.startswith("cuda:"):
            raise ConfigError(f"device={gc.device!r} is unknown; allowed: auto, cuda, cpu")
        if gc.recompute not in ("full", "none"):
            raise ConfigError(f"recompute={gc.recompute!r} is unknown; allowed: full, none")
        if (gc.time or gc.shapes) and not (device.startswith("cuda") and torch.cuda.is_available()):
            raise ConfigError(
                f"{'time=true' if gc.time else 'shapes=true'} needs a CUDA device (compute-only timing with CUDA "
                "events); "
                f"device={device} and torch.cuda.is_available()={torch.cuda.is_available()}"
            )
        if gc.time or gc.shapes:
            gc.hardware = device_profile(gc.hardware, torch.cuda.get_device_name())
        if gc.time:
            from tspbench.predict.costmodel import load_hardware

            peak = load_hardware(gc.hardware).peak_flops_bf16
    except (ConfigError, ValueError) as e:
        print(f"tspbench.gpu_check: {e}", file=sys.stderr)
        return 2
    if gc.shapes:
        from tspbench.predict.gpu_check import shape_cases

        for rec in shape_cases(gc.hardware, device):
            print(json.dumps(rec), flush=True)
        return 0
    if not gc.time:
        for rec in memory_checks(device, gc.recompute):
            print(json.dumps(rec), flush=True)
        return 0
    calib = calibration(peak)
    out = Path(gc.calibration_out) / f"{gc.hardware}.calibration.json"
    written = write_calibration(out, calib)
    marks = {k: written[k] for k in ("status", "reason") if k in written}
    print(json.dumps({"calibration": str(out), **marks, **calib["efficiency"]}), flush=True)
    for rec in timing_checks(gc.recompute):
        print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
