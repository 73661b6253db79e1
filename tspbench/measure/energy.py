"""Energy over the measured window (docs/method.md#energy).

Counter first: NVIDIA's `nvmlDeviceGetTotalEnergyConsumption` (mJ since driver load, Volta+) read at the
window edges, after the device sync, as Megatron's EnergyMonitor and Zeus do. AMD: amdsmi's energy
accumulator × counter resolution, trusted only after a Zeus-style check at start-up (counter delta vs
power × time over 0.5 s must agree within 0.1–10×; the counter is wrong, backward or frozen on some parts,
ROCm/amdsmi#38, #115). Without a trusted counter, energy is the integral of the sampled power timeline
(`energy_method` says which). A background thread samples power every `sample_s` for the timeline.

Where nothing exists (CPU runs), energy is `None` with `energy_reason`, never 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class EnergyResult:
    energy_j: float | None = None
    avg_power_w: float | None = None
    method: str | None = None  # "counter" | "sampled"
    reason: str | None = None  # why energy is None, or a caveat
    timeline: list | None = None  # [[seconds since window start, watts], ...]


class _PowerSampler(threading.Thread):
    def __init__(self, read_w: Callable[[], float], period_s: float):
        super().__init__(daemon=True)
        self.read_w, self.period_s = read_w, period_s
        self.samples: list[list[float]] = []
        self._stop_evt = threading.Event()

    def run(self):
        t0 = time.perf_counter()
        while not self._stop_evt.is_set():
            try:
                self.samples.append([round(time.perf_counter() - t0, 4), float(self.read_w())])
            except Exception:  # noqa: BLE001 - a failed read leaves a gap, not a crash
                pass
            self._stop_evt.wait(self.period_s)

    def stop(self) -> list[list[float]]:
        self._stop_evt.set()
        self.join(timeout=5)
        return self.samples


def _integrate(samples: list[list[float]], duration_s: float) -> float | None:
    """Trapezoidal integral of the power samples, held flat to the window edges."""
    if not samples:
        return None
    pts = [[0.0, samples[0][1]], *samples, [duration_s, samples[-1][1]]]
    return sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(pts, pts[1:]) if b[0] >= a[0])


class EnergyMeter:
    """start() and stop() at the window edges (after the device sync) → EnergyResult for this rank."""

    def __init__(self, device: torch.device, sample_s: float = 0.1):
        self.device, self.sample_s = device, sample_s
        self.read_mj: Callable[[], float] | None = None  # cumulative energy, millijoules
        self.read_w: Callable[[], float] | None = None  # instantaneous power, watts
        self.reason: str | None = None
        if device.type != "cuda":
            self.reason = "no energy counter on CPU (NVML/amdsmi measure GPUs only)"
        elif getattr(torch.version, "hip", None):
            self._open_amdsmi(device.index or 0)
        else:
            self._open_nvml(device.index or 0)

    # ---- backends --------------------------------------------------------------------------------
    def _open_nvml(self, index: int) -> None:
        try:
            import pynvml

            from tspbench.measure.memory import _nvml_index

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(index))
        except Exception as e:  # noqa: BLE001
            self.reason = f"NVML unavailable: {type(e).__name__}: {e}"
            return
        self.read_w = lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1e3  # mW → W
        try:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
            self.read_mj = lambda: float(pynvml.nvmlDeviceGetTotalEnergyConsumption(h))
        except Exception as e:  # noqa: BLE001 - pre-Volta: no counter, sample power instead
            self.reason = f"NVML energy counter unsupported ({e}); energy integrated from power samples"

    def _open_amdsmi(self, index: int) -> None:
        try:
            import amdsmi

            amdsmi.amdsmi_init()
            h = amdsmi.amdsmi_get_processor_handles()[index]
        except Exception as e:  # noqa: BLE001
            self.reason = f"amdsmi unavailable: {type(e).__name__}: {e}"
            return

        def read_w() -> float:
            info = amdsmi.amdsmi_get_power_info(h)
            for key in ("current_socket_power", "average_socket_power"):
                v = info.get(key)
                if isinstance(v, (int, float)):
                    return float(v)
            raise RuntimeError("amdsmi reports no socket power")

        def read_mj() -> float:
            e = amdsmi.amdsmi_get_energy_count(h)
            ticks = e.get("energy_accumulator", e.get("power"))
            return float(ticks) * float(e["counter_resolution"]) / 1e3  # µJ → mJ

        self.read_w = read_w
        try:
            ok, why = validate_counter(read_mj, read_w)
        except Exception as e:  # noqa: BLE001
            ok, why = False, f"{type(e).__name__}: {e}"
        if ok:
            self.read_mj = read_mj
        else:
            self.reason = f"amdsmi energy counter not trusted ({why}); energy integrated from power samples"

    # ---- window ----------------------------------------------------------------------------------
    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.mj0 = self.read_mj() if self.read_mj else None
        self.sampler = _PowerSampler(self.read_w, self.sample_s) if self.read_w else None
        if self.sampler:
            self.sampler.start()

    def stop(self) -> EnergyResult:
        dt = time.perf_counter() - self.t0
        mj1 = self.read_mj() if self.read_mj else None
        timeline = self.sampler.stop() if self.sampler else None
        if self.mj0 is not None and mj1 is not None and mj1 >= self.mj0:
            j = (mj1 - self.mj0) / 1e3
            return EnergyResult(j, j / dt if dt > 0 else None, "counter", self.reason, timeline)
        if timeline:
            sampled = _integrate(timeline, dt)
            why = self.reason or "energy counter went backwards; integrated from power samples"
            power = sampled / dt if sampled is not None and dt > 0 else None
            return EnergyResult(sampled, power, "sampled", why, timeline)
        return EnergyResult(None, None, None, self.reason or "no power readings", None)


def validate_counter(
    read_mj: Callable[[], float], read_w: Callable[[], float], wait_s: float = 0.5
) -> tuple[bool, str]:
    """Zeus's check (zeus/device/gpu/amd.py): counter delta over `wait_s` vs power × time within 0.1–10×."""
    e0, w0 = read_mj(), read_w()
    time.sleep(wait_s)
    e1, w1 = read_mj(), read_w()
    expected_mj = (w0 + w1) / 2 * wait_s * 1e3
    got_mj = e1 - e0
    if expected_mj <= 0:
        return False, "power reads 0 W"
    ratio = got_mj / expected_mj
    return 0.1 <= ratio <= 10.0, f"counter/power ratio {ratio:.3g}"
