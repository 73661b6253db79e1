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
    for pattern in hw.device_names:
        for device in (pattern, f"NVIDIA {pattern}", f"AMD Instinct {pattern.lower()} VF"):
            entry = fl.match_profile(device)
            assert entry is not None and entry.profile == name, (device, entry)
            peak, source = fl.peak_flops(device, "cuda")
            assert peak == hw.peak_flops_bf16  # the same number load_hardware reads for the time model
            assert source.startswith(f"conf/hardware/{name}.yaml: ") and source.split(": ", 1)[1] in hw.sources
            assert "bf16" in source.lower()  # the sources line that states the bf16 peak, not a fallback


def test_profiles_name_devices_and_patterns_are_unique():
    patterns = [p.lower() for name in PROFILES for p in load_hardware(name).device_names]
    assert len(patterns) == len(set(patterns))
    assert {e.profile for e in fl.peak_entries() if e.device_names} == {"a100", "h100", "h100_96gb", "h200", "mi300x"}
    assert load_hardware("cpu").device_names == []


@pytest.mark.parametrize(
    "device,profile",
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 96GB HBM3", "h100_96gb"),
        ("NVIDIA H200", "h200"),
        ("AMD Instinct MI300X", "mi300x"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
    ],
)
def test_real_device_names(device, profile):
    assert fl.match_profile(device).profile == profile
    assert fl.peak_flops(device, "cuda")[0] == load_hardware(profile).peak_flops_bf16


@pytest.mark.parametrize(
    "device",
    ["NVIDIA B200", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA L40S", "AMD Instinct MI355X", "Some GPU", None],
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
