"""One truth for peak FLOP/s: a measured record's MFU peak is the `peak_flops_bf16` of the conf/hardware/ profile
whose `device_names` matches the device (tspbench.measure.flops.peak_flops), the number the time model uses too."""

from __future__ import annotations

import pytest

from tspbench.measure import flops as fl
from tspbench.predict.costmodel.hardware import CONF_DIR, load_hardware

PROFILES = sorted(p.stem for p in CONF_DIR.glob("*.yaml"))


@pytest.mark.parametrize("name", PROFILES)
def test_every_profiles_device_names_resolve_to_it(name):
    hw = load_hardware(name)
    for pattern in (p for p in hw.device_names if not p.startswith(fl.EXCLUDE)):
        for device in (pattern, f"NVIDIA {pattern}", f"AMD Instinct {pattern.lower()} VF"):
            entry = fl.match_profile(device)
            assert entry is not None and entry.profile == name, (device, entry)
            peak, source = fl.peak_flops(device, "cuda")
            assert peak == hw.peak_flops_bf16  # the same number load_hardware reads for the time model
            assert source.startswith(f"conf/hardware/{name}.yaml: ") and source.split(": ", 1)[1] in hw.sources
            assert "bf16" in source.lower()  # the sources line that states the bf16 peak, not a fallback
            peak, source = fl.peak_flops(device, "cuda", dtype="float32")
            assert peak == hw.peak_flops_fp32 and "fp32" in source.lower() and source.split(": ", 1)[1] in hw.sources
            assert entry.mem_bytes == hw.mem_bytes  # the capacity the report draws = the time model's


def test_profiles_name_devices_and_patterns_are_unique():
    patterns = [p.lower() for name in PROFILES for p in load_hardware(name).device_names]
    assert len(patterns) == len(set(patterns))
    assert {e.profile for e in fl.peak_entries() if e.device_names} == set(PROFILES) - {"cpu"}  # every device part
    assert load_hardware("cpu").device_names == []


@pytest.mark.parametrize(
    "device,profile",
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 96GB HBM3", "h100_96gb"),
        ("NVIDIA H200", "h200"),
        ("AMD Instinct MI300X", "mi300x"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100-SXM4-40GB", "a100_40gb"),
        ("NVIDIA H100 PCIe", "h100_pcie"),
        ("AMD Instinct MI325X", "mi325x"),
    ],
)
def test_real_device_names(device, profile):
    assert fl.match_profile(device).profile == profile
    assert fl.peak_flops(device, "cuda")[0] == load_hardware(profile).peak_flops_bf16


@pytest.mark.parametrize(
    "device",
    [
        "NVIDIA B200",
        "NVIDIA H100 NVL",
        "NVIDIA H200 NVL",
        "NVIDIA GH200 480GB",
        "NVIDIA A100-PCIE-40GB",
        "NVIDIA L40S",
        "AMD Instinct MI355X",
        "Some GPU",
        None,
    ],
)
def test_unknown_device_gets_none_and_how_to_add_a_profile(device):
    peak, reason = fl.peak_flops(device, "cuda")
    assert peak is None and "\n" not in reason
    assert repr(device) in reason and "conf/hardware/<name>.yaml" in reason and "device_names" in reason


def test_cpu_gets_none_with_its_reason():
    assert fl.peak_flops("CPU (x86_64)", "cpu") == (None, fl.CPU_REASON)


def test_longest_pattern_wins(tmp_path):
    """A general and a specific profile both match: the more specific (longer) pattern decides."""
    for name, peak, names in (("gen", 1.0e15, ["X1"]), ("big", 2.0e15, ["X1 BIG"])):
        (tmp_path / f"{name}.yaml").write_text(
            f"name: {name}\npeak_flops_bf16: {peak}\ndevice_names: {names}\nsources: ['{name} sheet: BF16 dense']\n"
        )
    where = "conf/" + "hardware/big.yaml"  # split: a made-up profile, not a path of this repository
    assert fl.peak_flops("Vendor X1 BIG", "cuda", tmp_path) == (2.0e15, f"{where}: big sheet: BF16 dense")
    assert fl.peak_flops("Vendor X1", "cuda", tmp_path)[0] == 1.0e15


def test_no_peak_table_left():
    assert not hasattr(fl, "PEAK_FLOPS")


def test_an_exclusion_keeps_a_lower_peak_variant_out(tmp_path):
    """ "H200" occurs in "NVIDIA H200 NVL" (a PCIe part with a lower peak): the profile's "!NVL" keeps it out, while
    the longest pattern still wins among the profiles that do name a device."""
    assert fl.match_profile("NVIDIA H200").profile == "h200"
    assert fl.match_profile("NVIDIA H200 NVL") is None and fl.match_profile("nvidia h200 nvl") is None
    (tmp_path / "x.yaml").write_text("name: x\npeak_flops_bf16: 1.0e+15\ndevice_names: ['X1', '!LITE']\n")
    (tmp_path / "xl.yaml").write_text("name: xl\npeak_flops_bf16: 5.0e+14\ndevice_names: ['X1 LITE']\n")
    assert fl.match_profile("Vendor X1", tmp_path).profile == "x"
    assert fl.match_profile("Vendor X1 LITE", tmp_path).profile == "xl"
    (tmp_path / "xl.yaml").unlink()
    assert fl.match_profile("Vendor X1 LITE", tmp_path) is None


@pytest.mark.parametrize(
    "dtype,key",
    [("bfloat16", "peak_flops_bf16"), ("float16", "peak_flops_bf16"), ("float32", "peak_flops_fp32")],
)
def test_mfu_peak_is_the_runs_dtype(dtype, key):
    """A float32 run divides by the FP32 peak (PyTorch keeps fp32 GEMMs off TF32 by default), never the bf16 one."""
    peak, source = fl.peak_flops("NVIDIA H100 80GB HBM3", "cuda", dtype=dtype)
    assert peak == getattr(load_hardware("h100"), key)
    assert ("fp32" if key == "peak_flops_fp32" else "bf16") in source.lower()


def test_a_dtype_without_a_peak_gets_none_and_the_reason(tmp_path):
    (tmp_path / "x.yaml").write_text("name: x\npeak_flops_bf16: 1.0e+15\ndevice_names: ['X1']\n")
    peak, reason = fl.peak_flops("Vendor X1", "cuda", tmp_path, dtype="float32")
    assert peak is None and "peak_flops_fp32" in reason and "x.yaml" in reason
    peak, reason = fl.peak_flops("NVIDIA H100 80GB HBM3", "cuda", dtype="float64")
    assert peak is None and "float64" in reason and "\n" not in reason
