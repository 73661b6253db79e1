"""The device names its own profile (docs/records.md, `hardware`): a measured record's `hardware` is the conf/hardware
profile matched from its device name, never the experiment's modelling profile, so its report panel, capacity line,
guards and MFU peak (in the run's dtype) are the device's own; a calibration or shapes file measured on another part
is refused by the profile it is filed under."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tspbench.config import GIB
from tspbench.measure.energy import EnergyResult
from tspbench.paths import conf_dir
from tspbench.predict.costmodel.hardware import load_hardware
from tspbench.record.guards import guard
from tspbench.record.measured import CPU_HARDWARE_REASON, Gathered, build_record
from tspbench.record.schema import UNNAMED_DEVICE
from tspbench.record.spec import RunSpec
from tspbench.report.fig_memory import fig_memory
from tspbench.report.frame import flatten, frame_of
from tspbench.report.plot import palette
from tspbench.run import loop
from tspbench.run.supervise import _failure_record

H100 = "NVIDIA H100 80GB HBM3"
H100_RUN = Path(__file__).resolve().parents[2] / "results" / "measured" / "h100-2026-12-06"
TINY = dict(name="tiny", vocab_size=128, dim=64, n_layers=2, n_heads=8, n_kv_heads=8, ffn_hidden=128)


def spec(**kw) -> RunSpec:
    """A measured grid point of an experiment whose predictions use mi300x (as +exp=llama7b's do)."""
    base = dict(
        experiment="llama7b",
        scheme="single",  # no collectives: the guard's comm check has nothing to hold the made-up numbers to
        degree=1,
        tp=0,
        dp=1,
        sp_variant="allgather",
        recompute="none",
        seq_len=64,
        batch=1,
        mode="train",
        dtype="bfloat16",
        device="cuda",
        execution="measure",
        hardware="mi300x",
        model=TINY,
    )
    return RunSpec(**{**base, **kw})


def rank(device_name: str, reserved_gib: float = 32.0) -> dict:
    """One rank's numbers (tspbench.run.loop.after_window's keys), the device name as the loop reads it."""
    peaks = {"peak_allocated_gib": reserved_gib - 2.0, "peak_reserved_gib": reserved_gib}
    peaks.update(device_used_gib=None, num_ooms=0, alloc_retries=0, memory_reason=None)
    return {
        "step_ms": [10.0, 11.0],
        "window_s": 0.021,
        "peaks": peaks,
        "mem": {},
        "serving": {},
        "energy": EnergyResult(reason="mocked").__dict__,
        "comm": {"fwd": 0.0, "bwd": 0.0, "ops": 0, "max_buffer_bytes": 0},
        "device_name": device_name,
    }


def measured(s: RunSpec, device_name: str, reserved_gib: float = 32.0) -> dict:
    return build_record(s, Gathered([rank(device_name, reserved_gib)], 1.0, 64, "t0", "t1", "nccl", "torchrun"))


@pytest.fixture
def h100_name(monkeypatch) -> str:
    """The device name tspbench.run.loop reads on a CUDA device, with torch.cuda.get_device_name mocked (CPU host)."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: H100)
    return loop.device_name(torch.device("cuda", 0))


def test_a_measured_h100_record_says_h100_and_the_report_draws_it_there(h100_name):
    """An H100 run of an mi300x-modelled experiment is an h100 record, drawn in the
    h100 panel with an 80 GB capacity line (the old code stamped mi300x and drew 192 GB)."""
    assert h100_name == H100
    rec = measured(spec(), h100_name)
    assert rec["hardware"] == "h100" and rec["hardware_reason"] is None and rec["device_name"] == H100
    assert guard(rec)["status"] == "ok"
    row = flatten(rec)
    assert row["ctx"] == "tiny · h100 · train"
    assert row["capacity_gib"] == pytest.approx(80e9 / GIB)  # conf/hardware/h100.yaml mem_bytes, not a table
    df, _ = frame_of([rec])
    fig, _ = fig_memory(df, palette(df))
    (ax,) = [a for a in fig.axes if a.get_title()]
    assert ax.get_title() == "tiny · h100 · train"
    assert "device capacity 80 GB" in [line.get_label() for line in ax.get_lines()]


def test_the_guard_judges_a_measured_run_by_its_own_devices_memory(h100_name):
    """100 GiB reserved fits an MI300X (178.8 GiB) but not an H100 (74.5 GiB): implausible in an ok H100 run."""
    rec = guard(measured(spec(), h100_name, reserved_gib=100.0))
    assert rec["status"] == "implausible" and "device capacity 74.51 GiB" in rec["reason"]


def test_mfu_of_a_float32_run_divides_by_the_fp32_peak(h100_name):
    m = measured(spec(dtype="float32"), h100_name)["metrics"]
    assert m["peak_flops"] == load_hardware("h100").peak_flops_fp32 == 67.0e12
    assert "FP32" in m["peak_flops_source"] and m["mfu_reason"] is None
    assert measured(spec(), h100_name)["metrics"]["peak_flops"] == 989.4e12  # bf16: the tensor peak


def test_no_profile_no_hardware_and_the_reason():
    rec = measured(spec(), "NVIDIA H200 NVL")  # lower peak than the H200 SXM: no profile names it
    assert rec["hardware"] is None and "'NVIDIA H200 NVL'" in rec["hardware_reason"]
    assert flatten(rec)["capacity_gib"] is None and "mi300x" not in flatten(rec)["ctx"]
    cpu = measured(spec(device="cpu"), "CPU (x86_64)")
    assert cpu["hardware"] is None and cpu["hardware_reason"] == CPU_HARDWARE_REASON
    failed = _failure_record(spec(), "oom", "rank 0: OutOfMemoryError", Path("x.log"))  # before a rank named it
    assert failed["hardware"] is None and failed["hardware_reason"] == UNNAMED_DEVICE
    assert _failure_record(spec(execution="model"), "failed", "x", Path("x.log"))["hardware"] == "mi300x"


# ------------------------------------------------------------------ calibration and shapes files name their device
def _profile(tmp_path: Path, name: str) -> Path:
    shutil.copy(conf_dir() / "hardware" / f"{name}.yaml", tmp_path / f"{name}.yaml")
    return tmp_path


def test_the_h100_calibration_is_refused_as_h200s(tmp_path):
    """The real H100 run's calibration (results/measured/h100-2026-12-06) filed as h200's: one line naming the file,
    its device and h200's device_names; beside h100.yaml it is applied."""
    _profile(tmp_path, "h200")
    shutil.copy(H100_RUN / "h100.calibration.json", tmp_path / "h200.calibration.json")
    with pytest.raises(ValueError) as e:
        load_hardware("h200", tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "h200.calibration.json" in msg and repr(H100) in msg and "'!NVL'" in msg
    _profile(tmp_path, "h100")
    shutil.copy(H100_RUN / "h100.calibration.json", tmp_path / "h100.calibration.json")
    assert load_hardware("h100", tmp_path).calibration == "h100.calibration.json"


def test_the_h100_shapes_are_refused_as_h200s(tmp_path):
    """The real shapes lines carry `hardware` (no device): filed under another profile they are refused by it."""
    lines = (H100_RUN / "h100.shapes.jsonl").read_text()
    assert all("device" not in json.loads(x) and json.loads(x)["hardware"] == "h100" for x in lines.splitlines())
    _profile(tmp_path, "h200")
    (tmp_path / "h200.shapes.jsonl").write_text(lines)
    with pytest.raises(ValueError, match=r"h200.shapes.jsonl:1: no device and hardware 'h100' is not h200's"):
        load_hardware("h200", tmp_path)
    _profile(tmp_path, "h100")
    (tmp_path / "h100.shapes.jsonl").write_text(lines)
    assert load_hardware("h100", tmp_path).shapes == "h100.shapes.jsonl"


@pytest.mark.parametrize(
    "extra,ok",
    [
        ({"device": H100}, True),
        ({"device": H100, "hardware": "h200"}, True),  # the device decides where it is given
        ({"device": "NVIDIA H200"}, False),
        ({"device": "NVIDIA H100 PCIe", "hardware": "h100"}, False),
        ({"hardware": "h100"}, True),
        ({}, False),
    ],
)
def test_a_shapes_line_is_checked_by_its_device_else_its_hardware(tmp_path, extra, ok):
    _profile(tmp_path, "h100")
    line = {"call": "gemm", "what": "q", "shape": [8192, 4096, 4096], "measured_efficiency": 0.3}
    (tmp_path / "h100.shapes.jsonl").write_text(json.dumps({**line, "modelled_efficiency": 0.5, **extra}) + "\n")
    if ok:
        assert load_hardware("h100", tmp_path).measured_shapes
    else:
        with pytest.raises(ValueError, match=r"h100.shapes.jsonl:1: .* is not h100's \(conf/hardware/h100.yaml"):
            load_hardware("h100", tmp_path)


def test_a_record_from_before_takes_its_devices_profile_in_the_report():
    """The H100 run's smoke records predate `hardware_reason` (hardware null); a record of that age stamped with the
    experiment's profile is read the same way: by its device name."""
    smoke = [json.loads(x) for x in (H100_RUN / "smoke_results.jsonl").read_text().splitlines() if x.strip()]
    named = [r for r in smoke if r.get("device_name") == H100 and r.get("method") == "measured"]
    assert named and all("hardware_reason" not in r for r in named)
    for rec in (named[0], {**named[0], "hardware": "mi300x"}):
        row = flatten(rec)
        assert row["hardware"] == "h100" and " · h100 · " in row["ctx"]
        assert row["capacity_gib"] == pytest.approx(80e9 / GIB)
