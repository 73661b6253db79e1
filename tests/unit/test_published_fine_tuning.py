"""conf/published/fine_tuning.yaml (ms-swift's DeepSpeed / Megatron rows and torchtune's pure-bf16 rows) and the two
mechanisms it brought to tspbench/predict/published.py: a row's `training` (the model state's format, for memory
only) and MEMORY_ONLY_STACK (a stack whose peak memory is compared and whose time never is). The file loads, its split
is the positional rule its header states, every in-scope row's memory is predicted, broken inputs fail with one
actionable message, and the rows of the other files predict the same memory as before."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from published_rows import write_row

from tspbench.config import GIB, ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.paths import conf_dir
from tspbench.predict import published
from tspbench.predict.costmodel import Workload, memory_breakdown
from tspbench.predict.costmodel.workload import TRAINING, Training
from tspbench.predict.fit import calibration_rows, fit, stack_of

FILE = conf_dir() / "published" / "fine_tuning.yaml"
OTHERS = [f for f in published.default_files() if f.name != FILE.name]
OLDER = [f for f in OTHERS if f.name != "fms_acceleration.yaml"]
"""The files written before `training` existed (fms_acceleration.yaml, later, uses it too)."""


@pytest.fixture(scope="module")
def rows() -> list[published.Row]:
    return published.load_rows([FILE])


def by_id(rows: list[published.Row], rid: str) -> published.Row:
    return next(r for r in rows if r.id == rid)


def test_the_file_loads_with_its_positional_split_and_two_publishers(rows):
    assert len(rows) == 8 and len({r.id for r in rows}) == len(rows)
    assert [r.subset for r in rows] == ["calibration" if i % 3 == 0 else "validation" for i in range(len(rows))]
    assert all(r.source and r.measured for r in rows)
    out = {r.id for r in rows if r.out_of_scope}
    assert out == {"swift_a800_qwen25_14b_tp4_msp_dp2_8k", "tune_4090_llama2_7b_fsdp_2k"}
    compared = [r for r in rows if "peak_mem_gib" in r.measured and not r.out_of_scope and not r.memory_out_of_scope]
    assert {r.source.split()[0] for r in compared} == {"github.com/modelscope/ms-swift", "github.com/pytorch/torchtune"}
    # GB stays GB: never converted into peak_mem_gib
    assert by_id(rows, "swift_a100_qwen25_7b_tp4_msp_32k").measured == {"peak_mem_gb": 50}


def test_every_in_scope_row_gets_its_memory_and_gb_rows_say_why_they_are_not_compared(rows):
    for row in rows:
        rec = published.record(row)
        if row.out_of_scope:
            assert rec["status"] == "out_of_scope" and not rec["predicted"]
            continue
        mem = rec["predicted"]["peak_mem_gib"]
        assert (mem is None) == bool(row.memory_out_of_scope), row.id
        assert mem is None or 10 < mem < 80  # GiB on an 80 GB card
        for q in row.measured:
            assert q in rec["error_pct"] or rec["quantity_out_of_scope"].get(q), (row.id, q)
        assert set(rec["error_pct"]) <= {"peak_mem_gib"}  # memory is all these rows compare
        if "peak_mem_gb" in row.measured:
            assert "recorded as published" in rec["quantity_out_of_scope"]["peak_mem_gb"]


def test_pure_bf16_training_prices_8_bytes_of_state_per_parameter(rows):
    row = by_id(rows, "tune_a100_llama32_3b_packed_4k")
    assert row.training == {"master_fp32": False} and not published.memory_only(row)
    model = ModelConfig(**row.model)
    work = Workload(model, row.seq_len, row.micro_batch, mode="train")
    par = ParallelConfig(recompute=row.recompute)
    bf16 = memory_breakdown(par, work, Training(master_fp32=False))
    mixed = memory_breakdown(par, work, TRAINING)
    assert bf16["optimizer"] == pytest.approx(mixed["optimizer"] / 3)  # 2·2 B of moments vs 12 B (master + m + v)
    assert published.predict(row)["allocated_mem_gib"] == pytest.approx(bf16["total"] / GIB)
    default = published.predict(replace(row, training={}))["allocated_mem_gib"]
    assert default == pytest.approx(mixed["total"] / GIB) and default > published.predict(row)["allocated_mem_gib"]


def test_fp32_gradients_are_taken_from_the_row(rows):
    row = by_id(rows, "swift_a100_qwen25_7b_tp4_msp_32k")
    assert row.training == {"grad_dtype": "float32"}
    model = ModelConfig(**row.model)
    work = Workload(model, row.seq_len, row.micro_batch, mode="train")
    par = ParallelConfig(scheme="tp_msp", degree=4, recompute=row.recompute)
    want = memory_breakdown(par, work, Training(grad_dtype="float32"))["total"] / GIB
    assert published.predict(row)["allocated_mem_gib"] == pytest.approx(want)


def test_memory_only_stacks_publish_no_time_and_never_enter_the_fit(rows):
    """Megatron rows are memory-only; this file's DeepSpeed rows publish no time, so the deepspeed stack's fit comes
    from other files' rows only (xtuner.yaml's tokens/s) and is the same with or without this file."""
    mem_only = [r for r in rows if published.memory_only(r)]
    assert {stack_of(r) for r in mem_only} == {"megatron"}
    for r in rows:
        if stack_of(r) in ("deepspeed", "megatron"):
            assert not set(r.measured) & set(published.TIME_QUANTITIES)
    every = published.load_rows(published.default_files())
    before = published.load_rows(OTHERS)
    for stack in {stack_of(r) for r in every if not r.out_of_scope}:
        assert [r.id for r in calibration_rows(every, stack)] == [r.id for r in calibration_rows(before, stack)]
    assert fit(every, "megatron") is None
    assert fit(every, "deepspeed") == fit(before, "deepspeed")


def _write(tmp_path: Path, **row) -> Path:
    return write_row(tmp_path, **row)


@pytest.mark.parametrize(
    ("row", "said"),
    [
        ({"training": {"master_fp16": False}}, "unknown field"),
        ({"training": {"grad_dtype": "fp32"}}, "grad_dtype"),
        ({"training": {"optimizer": "adam8bit"}}, "optimizer"),
        ({"training": {"master_fp32": "no"}}, "master_fp32"),
        ({"training": ["master_fp32"]}, "not a mapping"),
        ({"stack": "megatron", "measured": {"peak_mem_gib": 10.0, "tokens_per_s_per_gpu": 100.0}}, "memory only"),
        ({"stack": "megatron", "measured": {"step_s": 1.0}}, "memory only"),
    ],
)
def test_a_broken_row_fails_with_one_actionable_message(tmp_path, row, said):
    with pytest.raises(ValueError, match=said) as e:
        published.load_rows([_write(tmp_path, **row)])
    assert "row x" in str(e.value)


def test_the_same_rows_load_when_out_of_scope_or_publishing_memory_only(tmp_path):
    timed = {"peak_mem_gib": 10.0, "tokens_per_s_per_gpu": 100.0}
    (row,) = published.load_rows([_write(tmp_path, stack="deepspeed+cpu_offload", measured=timed, out_of_scope="x")])
    assert published.record(row)["status"] == "out_of_scope"
    (row,) = published.load_rows([_write(tmp_path, stack="deepspeed")])
    assert "peak_mem_gib" in published.record(row)["error_pct"]
    (row,) = published.load_rows([_write(tmp_path, stack="megatron", measured={"peak_mem_gb": 10.0})])
    assert "memory only" in published.record(row)["quantity_out_of_scope"]["peak_mem_gb"]
    (row,) = published.load_rows([_write(tmp_path)])
    assert row.training == {} and row.stack == ""


# The allocated peaks (GiB) the rows of the other files were predicted with before `training` existed.
KNOWN_ALLOCATED_GIB = {
    "tt_h100_llama31_8b_fsdp_128gpu": 57.25360530614853,
    "tt_h100_llama31_8b_cp4_128k": 70.035231590271,
    "kt_a100_gpt22b_present": 48.160552978515625,
    "mlm_a100_gpt_1p7b": 45.69885969161987,
}


def test_the_other_files_predict_the_same_memory_as_before():
    rows = published.load_rows(OLDER)
    for row in rows:
        assert row.training == {}
    by = {r.id: r for r in rows}
    for rid, gib in KNOWN_ALLOCATED_GIB.items():
        assert published.predict(by[rid])["allocated_mem_gib"] == pytest.approx(gib, rel=1e-9), rid
    for row in rows:  # {} is Training(): the memory the default training setting gives
        if row.out_of_scope or row.memory_out_of_scope or row.recompute == published.LAYER_SAC:
            continue  # a layer-SAC row is the mean of the row under full and none (tests/unit/test_validate.py)
        model = ModelConfig(**row.model)
        lay = {k: v for k, v in row.layout.items() if k not in ("fsdp", "overlap")}
        lay.setdefault("dp", max(1, row.gpus // int(lay.get("degree", 1))))
        par = published.memory_parallel(row, ParallelConfig(recompute=row.recompute, **lay))
        want = memory_breakdown(par, Workload(model, row.seq_len, row.micro_batch, mode="train"))["total"] / GIB
        assert published.predict(row)["allocated_mem_gib"] == pytest.approx(want, rel=1e-12), row.id
