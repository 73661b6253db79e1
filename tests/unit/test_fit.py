"""The fit on calibration rows (tspbench/predict/fit.py, docs/method.md#fit): only calibration rows move the fitted
constants, a validation row never does, and `python -m tspbench.validate` prints the fit's inputs and residuals."""

from __future__ import annotations

from dataclasses import replace

from tspbench.predict.fit import FITTED, QUANTITY, calibration_rows, fit
from tspbench.predict.published import default_files, load_rows

ROWS = load_rows(default_files())


def _scaled(rows, subset: str, factor: float):
    """The rows with every in-scope `subset` row's published tokens/s scaled by `factor`."""
    out = []
    for r in rows:
        if r.subset == subset and not r.out_of_scope and QUANTITY in r.measured:
            r = replace(r, measured={**r.measured, QUANTITY: r.measured[QUANTITY] * factor})
        out.append(r)
    return out


def test_fit_uses_calibration_rows_only():
    f = fit(ROWS)
    assert f is not None and set(f.values) == set(FITTED)
    ids = {r.id: r for r in ROWS}
    assert f.rows and all(ids[i].subset == "calibration" and not ids[i].out_of_scope for i in f.rows)
    assert set(f.rows) == {r.id for r in calibration_rows(ROWS, "eager")}
    assert all(0.05 <= v <= 1.0 for v in f.values.values())


def test_a_validation_row_never_moves_a_fitted_value_and_a_calibration_row_does():
    base = fit(ROWS)
    assert base is not None
    assert fit(_scaled(ROWS, "validation", 3.0)) == base  # validation rows changed threefold: the same fit
    moved = fit(_scaled(ROWS, "calibration", 1.5))
    assert moved is not None and moved.values != base.values  # non-vacuous: the inputs do reach the fit


def test_validate_prints_the_fit_and_its_residuals(capsys, tmp_path):
    from tspbench.validate import main

    assert main([f"out={tmp_path / 'v.jsonl'}"]) == 0
    out = capsys.readouterr().out
    assert "fit on calibration rows only" in out and "fitted residual" in out
    assert "validation rows of stack eager" in out
    assert "(rows at S ≥ 16K only)" in out and "of which at S ≥ 16K" in out  # the long-sequence rows on their own


def test_a_stack_shares_eagers_attention_kernel_and_float8_runs_gemms_at_the_fp8_peak():
    """A non-eager stack fits its GEMM efficiency alone, with eager's attention constant (the same SDPA kernel);
    a float8 row's GEMMs run at the fp8 peak while its attention stays at the bf16 rate."""
    from tspbench.predict.costmodel import load_hardware
    from tspbench.predict.published import stack_hardware

    eager = fit(ROWS, "eager")
    f8 = fit(ROWS, "torch_compile+float8")
    assert eager is not None and f8 is not None
    assert f8.values["attention_efficiency"] == eager.values["attention_efficiency"]
    assert all(r.endswith("64k") for r in f8.rows)  # its one calibration row
    row = next(r for r in ROWS if r.id == "tt_h100_llama31_8b_cp4_128k")
    hw = load_hardware(row.hardware)
    f8hw = stack_hardware(row, hw)
    assert f8hw.peak_flops_bf16 == hw.peak_flops_fp8
    # the attention kernel keeps its bf16 rate (the profile's published SDPA figure): the same FLOP/s
    assert f8hw.attention_forward_efficiency * f8hw.peak_flops_bf16 == __import__("pytest").approx(
        (hw.attention_forward_efficiency or hw.matmul_efficiency) * hw.peak_flops_bf16
    )
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
