"""The fit on calibration rows (tspbench/predict/fit.py, docs/method.md#fit): only calibration rows move the fitted
constants, a validation row never does, and `python -m tspbench.validate` prints the fit's inputs and residuals."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tspbench.predict.fit import (
    FITTED,
    QUANTITY,
    THROUGHPUT,
    base_stack,
    calibration_rows,
    efficiencies,
    fit,
    fit_quantity,
    fits,
)
from tspbench.predict.published import default_files, load_rows

ROWS = load_rows(default_files())


def _scaled(rows, subset: str, factor: float):
    """The rows with every in-scope `subset` row's published throughputs (tokens/s, MFU, iteration time) scaled by
    `factor`."""
    out = []
    for r in rows:
        if r.subset == subset and not r.out_of_scope:
            r = replace(r, measured={q: v * factor if q in THROUGHPUT else v for q, v in r.measured.items()})
        out.append(r)
    return out


def test_fit_uses_calibration_rows_only():
    f = fit(ROWS)
    assert f is not None and set(f.values) == set(FITTED) and f.fitted == FITTED
    ids = {r.id: r for r in ROWS}
    assert f.rows and all(ids[i].subset == "calibration" and not ids[i].out_of_scope for i in f.rows)
    assert set(f.rows) == {r.id for r in calibration_rows(ROWS, "eager")}
    assert all(0.1 <= v <= 1.9 for v in f.values.values())


def test_a_validation_row_never_moves_a_fitted_value_and_a_calibration_row_does():
    base = fits(ROWS)
    assert base["eager"] is not None and base["torch_compile+float8"] is not None
    assert fits(_scaled(ROWS, "validation", 3.0)) == base  # validation rows changed threefold: the same fits
    moved = fits(_scaled(ROWS, "calibration", 1.5))
    stacks = ("eager", "eager+triton_attention", "torch_compile+float8", "fused_elementwise", "deepspeed")
    for stack in stacks:  # non-vacuous: the inputs reach each fit
        assert moved[stack] is not None and moved[stack].values != base[stack].values, stack  # type: ignore[union-attr]


def test_validate_prints_the_fit_and_its_residuals(capsys, tmp_path):
    from tspbench.validate import main

    assert main([f"out={tmp_path / 'v.jsonl'}"]) == 0
    out = capsys.readouterr().out
    assert "fit on calibration rows only" in out and "fitted residual" in out
    assert "validation rows of stack eager" in out
    assert "(rows at S ≥ 16K only)" in out and "of which at S ≥ 16K" in out  # the long-sequence rows on their own
    assert "every stack, validation rows under their stack's fitted constants" in out


def test_fitted_validation_covers_every_in_scope_validation_row_under_its_stacks_fit():
    from tspbench.predict.fit import fitted_validation, stack_of
    from tspbench.predict.published import predict

    out = fitted_validation(ROWS)
    assert out is not None
    held = [r for r in ROWS if r.subset == "validation" and not r.out_of_scope and QUANTITY in r.measured]
    assert set(out["per_row_pct"]) == {r.id for r in held} and out["n"] == len(held)
    by_stack = fits(ROWS)
    r = next(r for r in held if stack_of(r) == "torch_compile+float8")
    f = by_stack["torch_compile+float8"]
    assert f is not None
    expected = 100 * (predict(r, f.override())[QUANTITY] / r.measured[QUANTITY] - 1)
    assert out["per_row_pct"][r.id] == expected


def test_a_derived_stack_takes_its_base_stacks_constants_and_fits_only_what_its_rows_determine():
    """torch_compile (no calibration row) takes eager's constants; torch_compile+float8's one calibration row (64K, its
    modelled time mostly attention) fits the attention multiplier and takes eager's GEMM multiplier; llm-foundry's
    Triton-attention stack is built on no other and fits both on its own three rows."""
    by_stack = fits(ROWS)
    eager, comp, f8, lf = (
        by_stack[s] for s in ("eager", "torch_compile", "torch_compile+float8", "eager+triton_attention")
    )
    assert eager is not None and comp is not None and f8 is not None and lf is not None
    assert (
        base_stack("torch_compile+float8") == "eager"
        and base_stack("eager+triton_attention") == "eager+triton_attention"
    )
    assert comp.values == eager.values and comp.fitted == () and comp.taken_from == "eager"
    assert f8.fitted == ("attention_scale",) and f8.taken_from == "eager"
    assert f8.values["gemm_scale"] == eager.values["gemm_scale"]
    assert f8.values["attention_scale"] != eager.values["attention_scale"]
    assert lf.fitted == FITTED and len(lf.rows) == 3


def test_multipliers_keep_the_profiles_per_device_ratio_and_cap_at_the_peak():
    from tspbench.predict.costmodel import load_hardware

    a100, h100 = load_hardware("a100"), load_hardware("h100")
    _, a_a100, _ = efficiencies(a100, 1.0, 0.5)
    _, a_h100, _ = efficiencies(h100, 1.0, 0.5)
    assert a_a100 / a_h100 == pytest.approx(a100.attention_forward_efficiency / h100.attention_forward_efficiency)
    assert efficiencies(h100, 5.0, 5.0) == (1.0, 1.0, 1.0)


def test_float8_runs_gemms_at_the_published_float8_linear_speedup_and_attention_at_bf16():
    """A float8 row's GEMMs take the bf16 GEMM's time ÷ the profile's float8_linear_speedup (torchao's published
    figure), its attention the bf16 time; a profile without the speed-up falls back to the peaks' ratio."""
    from tspbench.predict.costmodel import load_hardware
    from tspbench.predict.published import stack_hardware

    row = next(r for r in ROWS if r.id == "tt_h100_llama31_8b_cp4_128k")
    hw = load_hardware(row.hardware)
    assert hw.float8_linear_speedup == 1.39
    f8hw = stack_hardware(row, hw)
    assert f8hw.peak_flops_bf16 == hw.peak_flops_fp8
    gemm_rate = lambda p: p.matmul_efficiency * p.peak_flops_bf16  # noqa: E731
    assert gemm_rate(f8hw) == pytest.approx(1.39 * gemm_rate(hw))
    assert f8hw.attention_forward_efficiency * f8hw.peak_flops_bf16 == pytest.approx(
        (hw.attention_forward_efficiency or hw.matmul_efficiency) * hw.peak_flops_bf16
    )
    plain = stack_hardware(row, replace(hw, float8_linear_speedup=None))
    assert gemm_rate(plain) == pytest.approx(gemm_rate(hw) * hw.peak_flops_fp8 / hw.peak_flops_bf16)
    eager_row = next(r for r in ROWS if r.id == "tt_h100_llama31_8b_fsdp")
    assert stack_hardware(eager_row, hw) is hw


# ------------------------------------------------------------------ the allocator's reserve (peak memory)
def _mem_scaled(rows, subset: str, factor: float):
    """The rows with every `subset` row's published peak memory scaled by `factor`."""
    return [
        replace(r, measured={**r.measured, "peak_mem_gib": r.measured["peak_mem_gib"] * factor})
        if r.subset == subset and "peak_mem_gib" in r.measured
        else r
        for r in rows
    ]


def test_reserve_fit_uses_reserved_calibration_rows_only_and_a_validation_row_never_moves_it():
    from tspbench.predict.fit import fit_reserve, reserved_rows

    base = fit_reserve(ROWS)
    assert base is not None and base.rows
    ids = {r.id: r for r in ROWS}
    assert all(ids[i].subset == "calibration" and ids[i].memory_kind == "reserved" for i in base.rows)
    assert set(base.rows) == {r.id for r in reserved_rows(ROWS, "calibration")}
    assert fit_reserve(_mem_scaled(ROWS, "validation", 2.0)).value == base.value  # type: ignore[union-attr]
    moved = fit_reserve(_mem_scaled(ROWS, "calibration", 1.3))
    # published × 1.3 on every calibration row: 1 + reserve scales by exactly 1.3 (closed-form log least squares)
    assert moved is not None and abs((1 + moved.value) / (1 + base.value) - 1.3) < 1e-9


def test_validate_prints_the_reserve_fit(capsys, tmp_path):
    from tspbench.validate import main

    assert main([f"out={tmp_path / 'v.jsonl'}"]) == 0
    out = capsys.readouterr().out
    assert "allocator reserve (reserved ÷ allocated − 1) =" in out
    assert "validation rows publishing a reserved peak" in out


def test_a_row_compares_the_memory_it_publishes():
    """Reserved rows are compared with allocated × (1 + reserve); a row whose memory is out of scope is not compared
    and says why."""
    from tspbench.config import GIB
    from tspbench.predict.costmodel.memory import ALLOCATOR_RESERVE
    from tspbench.predict.published import predict, predicted_memory_gib, record

    row = next(r for r in ROWS if r.id == "tt_h100_llama31_8b_fsdp_128gpu")
    assert row.memory_kind == "reserved" and row.recompute == "op_sac"
    pred = predict(row)
    assert pred["peak_mem_gib"] == (pred["allocated_mem_gib"] or 0) * (1 + ALLOCATOR_RESERVE)
    assert predicted_memory_gib(replace(row, memory_kind="allocated"), 3 * GIB) == 3.0
    compiled = next(r for r in ROWS if r.id == "tt_h100_llama31_8b_fsdp_128gpu_compile")
    rec = record(compiled)
    assert "peak_mem_gib" not in rec["error_pct"] and "op-level SAC" in rec["quantity_out_of_scope"]["peak_mem_gib"]


def test_rows_publishing_only_mfu_or_the_iteration_time_are_fitted_on_that_quantity():
    """Megatron's rows (stack fused_elementwise) publish MFU or the iteration time, not tokens/s: the fit scores each on
    the quantity it publishes, so the stack is fitted on its own three calibration rows."""
    f = fits(ROWS)["fused_elementwise"]
    assert f is not None and f.fitted == FITTED and f.taken_from == ""
    ids = {r.id: r for r in ROWS}
    assert {fit_quantity(ids[i]) for i in f.rows} == {"mfu_pct", "step_s"}
    assert all(QUANTITY not in ids[i].measured for i in f.rows)
    assert fit_quantity(ids["kt_a100_gpt22b_full"]) == "step_s"
