"""Kernels priced by shape (tspbench/predict/costmodel/kernels.py, Pricing.kernels): wave quantisation, the cited
curve points, the kernel-call lists against flops.py, flat pricing unchanged, bad yaml refused. Pure arithmetic."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from tspbench.config import model_preset
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel import Workload
from tspbench.predict.costmodel.flops import flops_per_token
from tspbench.predict.costmodel.hardware import CONF_DIR, load_hardware
from tspbench.predict.costmodel.kernels import (
    attention_calls,
    attention_efficiency,
    gemm_calls,
    gemm_efficiency,
    wave_factor,
)
from tspbench.predict.costmodel.time import step_time
from tspbench.predict.costmodel.workload import Pricing

LLAMA7B, S128K = model_preset("llama7b"), 131072
LAYOUTS = [
    ParallelConfig(scheme="single"),
    ParallelConfig(scheme="tsp", degree=8),
    ParallelConfig(scheme="tsp", degree=8, kv_bucket_heads=1),
    ParallelConfig(scheme="tsp", degree=4, mlp_exchange="biring", kv_bucket_heads=3),
    ParallelConfig(scheme="tp", degree=8),
    ParallelConfig(scheme="tp_msp", degree=8),
    ParallelConfig(scheme="sp", degree=8),
    ParallelConfig(scheme="sp", degree=8, sp_variant="ring"),
    ParallelConfig(scheme="sp", degree=8, sp_variant="ulysses"),
    ParallelConfig(scheme="tp_sp", degree=8, tp=2),
    ParallelConfig(scheme="tp_sp", degree=8, tp=2, sp_variant="ring"),
    ParallelConfig(scheme="tp_sp", degree=8, tp=2, sp_variant="ulysses"),
    ParallelConfig(scheme="fsdp_sp", degree=8),
]


def test_wave_quantisation_lowers_efficiency_below_one_full_wave():
    hw = load_hardware("mi300x")  # 304 CUs
    assert wave_factor(304, hw) == 1.0 and wave_factor(608, hw) == 1.0
    assert wave_factor(305, hw) == pytest.approx(305 / 608)
    assert wave_factor(64, hw) == pytest.approx(64 / 304)
    full = attention_efficiency(128 * 304, 8192, 1, 128, "unmasked", "fwd", 1, hw)  # 304 query tiles: one wave
    assert attention_efficiency(128 * 64, 8192, 1, 128, "unmasked", "fwd", 1, hw) == pytest.approx(full * 64 / 304)
    assert attention_efficiency(128 * 305, 8192, 1, 128, "unmasked", "fwd", 1, hw) < full
    assert gemm_efficiency(128 * 16, 128 * 19, 4096, "bfloat16", hw) == pytest.approx(hw.matmul_efficiency)  # 304
    skinny = gemm_efficiency(16384, 512, 4096, "bfloat16", hw)  # TSP's skinny Q: 128 × 4 tiles of 608
    assert skinny == pytest.approx(hw.matmul_efficiency * 512 / 608)
    cpu = load_hardware("cpu")  # no compute_units: no quantisation, the flat efficiency
    assert attention_efficiency(128, 128, 1, 128, "causal", "bwd", 1, cpu) == cpu.matmul_efficiency


@pytest.mark.parametrize("name", ["mi300x", "h100"])
def test_curves_reproduce_the_cited_points(name):
    hw = load_hardware(name)
    shape = hw.attention_points_shape
    assert shape is not None and hw.attention_fwd_points and hw.attention_bwd_points
    for direction, table in (("fwd", hw.attention_fwd_points), ("bwd", hw.attention_bwd_points)):
        for mask, points in table.items():
            for s, tflops in points:
                eff = attention_efficiency(s, s, shape["heads"], shape["head_dim"], mask, direction, shape["batch"], hw)
                assert eff * hw.peak_flops_bf16 / 1e12 == pytest.approx(tflops, rel=1e-9), (direction, mask, s)
    # the yaml's numbers are the sources' (spot checks against the cited tables)
    if name == "mi300x":
        assert [550.67, 474.02] == [hw.attention_fwd_points["causal"][3][1], hw.attention_bwd_points["causal"][3][1]]
    else:
        assert hw.attention_fwd_points["unmasked"][3] == [8192, 638.572]
        assert hw.attention_bwd_points["unmasked"][3] == [8192, 561.41]
        assert 4 * 4 * 48 * 8192**2 * 128 / 2 / 4817.44e-6 / 1e12 == pytest.approx(684.7, abs=0.05)  # #1267 converted


def test_profiles_without_published_curves_fall_back_to_their_flat_figures():
    """No curve: an attention call takes the profile's flat attention figure for its direction (FlashAttention-2's
    published fraction), else the GEMM ceiling; a GEMM the ceiling (matmul_efficiency), each at whole waves."""
    for name in ("h200", "a100"):
        hw = load_hardware(name)
        assert hw.compute_units and not hw.attention_fwd_points and not hw.gemm_points
        assert hw.attention_forward_efficiency is not None and hw.attention_forward_efficiency < hw.matmul_efficiency
        many = 128 * hw.compute_units * 4  # whole waves: the flat figure
        assert attention_efficiency(many, many, 1, 128, "causal", "fwd", 1, hw) == hw.attention_forward_efficiency
        assert attention_efficiency(many, many, 1, 128, "causal", "bwd", 1, hw) == hw.attention_backward_efficiency
        assert attention_efficiency(many, many, 1, 128, "causal", "fwd", 1, hw, "float32") == hw.matmul_efficiency
        assert gemm_efficiency(many, 128 * hw.compute_units, 4096, "bfloat16", hw) == hw.matmul_efficiency
    h100 = load_hardware("h100")  # another head dim than the source's: no curve
    assert attention_efficiency(128 * 132, 4096, 1, 64, "causal", "fwd", 1, h100) == h100.attention_forward_efficiency
    mi300x = load_hardware("mi300x")  # no flat attention figure either: the GEMM ceiling
    assert mi300x.attention_forward_efficiency is None
    assert attention_efficiency(128 * 304, 4096, 1, 64, "causal", "fwd", 1, mi300x) == mi300x.matmul_efficiency


@pytest.mark.parametrize("par", LAYOUTS, ids=lambda p: f"{p.scheme}-{p.degree}-{p.sp_variant}-{p.kv_bucket_heads}")
def test_kernel_call_flops_equal_the_flops_module(par):
    work = Workload(LLAMA7B, S128K, batch=2)
    listed = sum(c.flops for c in attention_calls(par, work)) + sum(g.flops for g in gemm_calls(par, work))
    per_layer = flops_per_token(LLAMA7B, S128K, mode="forward", layers=1, include_lm_head=False)
    assert listed * par.degree == pytest.approx(per_layer * work.tokens, rel=1e-12)


def test_call_shapes_are_the_codes():
    work = Workload(LLAMA7B, S128K)
    tsp = attention_calls(ParallelConfig(scheme="tsp", degree=8), work)
    assert {(c.q_tokens, c.heads, c.count) for c in tsp} == {(8192, 4, 8)}  # 8 owners × 2 chunks of 4 heads × 8K
    assert sorted(c.mask for c in tsp) == ["causal", "diagonal", "unmasked"]  # rank 0: offset 0, then prefix + diagonal
    assert {c.heads for c in attention_calls(ParallelConfig(scheme="tsp", degree=8, kv_bucket_heads=1), work)} == {1}
    assert [(c.q_tokens, c.heads) for c in attention_calls(ParallelConfig(scheme="tp", degree=8), work)] == [(S128K, 4)]
    uly = attention_calls(ParallelConfig(scheme="sp", degree=8, sp_variant="ulysses"), work)
    assert [(c.q_tokens, c.k_tokens, c.heads, c.mask) for c in uly] == [(S128K, S128K, 4, "causal")]
    ring = attention_calls(ParallelConfig(scheme="sp", degree=8, sp_variant="ring"), work)
    assert len(ring) == 2 * 8 - 1 + 2 and {c.q_tokens for c in ring} == {8192}
    q = gemm_calls(ParallelConfig(scheme="tsp", degree=8), work)[0]
    assert (q.m, q.n, q.k, q.count) == (16384, 512, 4096, 8)  # the per-owner skinny projection


@pytest.mark.parametrize("name", ["mi300x", "h100", "cpu"])
@pytest.mark.parametrize("par", LAYOUTS[1:9:2], ids=lambda p: p.scheme)
def test_flat_pricing_leaves_step_time_unchanged(name, par):
    hw, work = load_hardware(name), Workload(LLAMA7B, S128K)
    for overlap in ("none", "schedule"):
        default = step_time(par, work, hw, overlap=overlap)
        flat = step_time(par, work, hw, overlap=overlap, pricing=Pricing(kernels="flat"))
        assert flat == default
    shape = step_time(par, work, hw, pricing=Pricing(kernels="shape"))
    assert shape["flops_per_device"] == default["flops_per_device"]
    if name == "cpu":  # no compute units, no curves: shape pricing is the flat price
        assert shape["compute_s"] == pytest.approx(default["compute_s"], rel=1e-12)
    else:
        assert shape["compute_s"] != default["compute_s"]
    with pytest.raises(ValueError, match="kernels='wavy'"):
        step_time(par, work, hw, pricing=Pricing(kernels="wavy"))


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("compute_units", -4, "compute_units=-4: needs a positive integer"),
        ("compute_units", 30.5, "compute_units=30.5"),
        ("attention_fwd_points", {"causal": [[1024, 2000.0]]}, "attention_fwd_points.causal"),
        ("attention_fwd_points", {"causal": [[2048, 300.0], [1024, 400.0]]}, "increasing size"),
        ("attention_bwd_points", {"sliding": [[1024, 300.0]]}, "keys among"),
        ("attention_points_shape", {"batch": 8}, "attention_points_shape="),
        ("gemm_points", [[4096]], "gemm_points"),
    ],
)
def test_bad_kernel_keys_are_refused_with_one_line(tmp_path: Path, key, value, needle):
    data = yaml.safe_load((CONF_DIR / "mi300x.yaml").read_text())
    data[key] = value
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("(", r"\(")) as err:
        load_hardware("bad", tmp_path)
    assert "\n" not in str(err.value) and "bad.yaml" in str(err.value)


def test_points_need_compute_units(tmp_path: Path):
    data = yaml.safe_load((CONF_DIR / "mi300x.yaml").read_text())
    del data["compute_units"]
    (tmp_path / "nocu.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="need compute_units"):
        load_hardware("nocu", tmp_path)
    assert math.isfinite(load_hardware("cpu").matmul_efficiency)  # the cpu profile has none of the keys and loads


def test_curves_are_16_bit_only():
    hw = load_hardware("h100")
    many = 128 * 132 * 4
    fp32 = attention_efficiency(many, 8192, 1, 128, "unmasked", "fwd", 1, hw, "float32")
    assert fp32 == hw.matmul_efficiency != attention_efficiency(many, 8192, 1, 128, "unmasked", "fwd", 1, hw)


def test_shape_checks_time_every_distinct_call_beside_the_model(tmp_path):
    """gpu_check shapes=true's machinery on the CPU (times mean nothing here): every distinct attention call (forward
    and backward) and GEMM shape of a layer is timed once and carries the model's efficiency beside the measured
    one; the command refuses to run without CUDA."""
    from tspbench.config import model_preset
    from tspbench.gpu_check import main
    from tspbench.predict.gpu_time import shape_checks

    work = Workload(model_preset("tiny"), 64, 1)
    par = ParallelConfig(scheme="tsp", degree=2, kv_bucket_heads=1)
    recs = shape_checks(par, work, load_hardware("h200"), device="cpu")
    attn = {tuple(r["shape"]) for r in recs if r["call"] == "attention"}
    gemm = {tuple(r["shape"]) for r in recs if r["call"] == "gemm"}
    assert attn == {(a.q_tokens, a.k_tokens, a.heads, a.head_dim, a.mask, a.batch) for a in attention_calls(par, work)}
    shapes = {(c.m, c.n, c.k) for g in gemm_calls(par, work) for c in (g, *g.backward())}
    assert gemm == shapes and len(recs) == 2 * len(attn) + len(gemm)
    assert all(r["time_ms"] > 0 and 0 < r["modelled_efficiency"] <= 1 for r in recs)
    assert main(["device=cpu", "shapes=true"]) == 2  # needs CUDA: one line, exit 2
    # the lines read back as a device's timed calls (the file load_hardware applies), every call found by its key
    import json

    from tspbench.predict.costmodel.hardware import apply_shapes, shape_key

    path = tmp_path / "h200.shapes.jsonl"
    path.write_text("\n".join(json.dumps({"hardware": "h200", **r}) for r in recs if 0 < r["measured_efficiency"] <= 1))
    hw = load_hardware("h200")
    apply_shapes(hw, path)
    assert hw.measured_shapes and all(shape_key(r["call"], r["shape"], r["what"]) in hw.measured_shapes for r in recs)


def test_calls_timed_on_the_device_replace_the_published_curve(tmp_path):
    """conf/hardware/<name>.shapes.jsonl (gpu_check shapes=true's lines): a timed call takes its measured efficiency;
    an untimed call of the same class the model's value × the median measured ÷ modelled ratio; a malformed line is an
    error naming it."""
    import json
    import shutil

    import pytest

    from tspbench.paths import conf_dir
    from tspbench.predict.costmodel.hardware import load_hardware
    from tspbench.predict.costmodel.kernels import attention_efficiency, gemm_efficiency

    shutil.copy(conf_dir() / "hardware" / "h100.yaml", tmp_path / "h100.yaml")
    plain = load_hardware("h100", tmp_path)
    modelled_g = gemm_efficiency(8192, 4096, 4096, "bfloat16", plain)
    modelled_a = attention_efficiency(8192, 8192, 4, 128, "causal", "fwd", 1, plain)
    lines = [
        {"call": "gemm", "what": "q", "shape": [8192, 4096, 4096], "measured_efficiency": 0.3,
         "modelled_efficiency": modelled_g, "device": "NVIDIA H100 80GB HBM3"},
        {"call": "attention", "what": "fwd", "shape": [8192, 8192, 4, 128, "causal", 1], "measured_efficiency": 0.2,
         "modelled_efficiency": modelled_a, "hardware": "h100"},
    ]  # fmt: skip
    (tmp_path / "h100.shapes.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    hw = load_hardware("h100", tmp_path)
    assert hw.shapes == "h100.shapes.jsonl"
    assert gemm_efficiency(8192, 4096, 4096, "bfloat16", hw) == 0.3  # the timed call itself
    assert attention_efficiency(8192, 8192, 4, 128, "causal", "fwd", 1, hw) == 0.2
    other = gemm_efficiency(4096, 1024, 4096, "bfloat16", hw)  # not timed: scaled by 0.3 / modelled
    assert other == pytest.approx(gemm_efficiency(4096, 1024, 4096, "bfloat16", plain) * 0.3 / modelled_g)
    # no backward attention was timed: the backward keeps the model's value
    bwd = attention_efficiency(8192, 8192, 4, 128, "causal", "bwd", 1, hw)
    assert bwd == attention_efficiency(8192, 8192, 4, 128, "causal", "bwd", 1, plain)
    (tmp_path / "h100.shapes.jsonl").write_text('{"call": "gemm", "shape": [1, 2, 3]}\n')
    with pytest.raises(ValueError, match=r"h100.shapes.jsonl:1: needs call, what, shape"):
        load_hardware("h100", tmp_path)
