"""tspbench.predict.published and its command line tspbench.validate: the repo's published rows load (three or more
independent sources), every row keeps its source and subset, in-scope rows get a prediction and an error per
published quantity (FSDP memory included), the FLOPs conventions are the papers' formulas, out-of-scope rows are
kept (never dropped), the records' keys are documented in docs/records.md, bad input gives one actionable line and
a non-zero exit, and the entry point holds the command line only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tspbench import validate
from tspbench.predict import published

DOC = Path(__file__).resolve().parents[2] / "docs" / "records.md"


@pytest.fixture(scope="module")
def rows() -> list[published.Row]:
    return published.load_rows(published.default_files())


def test_published_rows_meet_the_issue_minimums(rows):
    in_scope = [r for r in rows if not r.out_of_scope]
    assert len(in_scope) >= 12
    # independent sources: a repository + file, or an arXiv paper
    assert len({" ".join(r.source.split()[:2]) for r in in_scope}) >= 3
    assert {r.subset for r in rows} == {"calibration", "validation"}
    assert all(r.source and r.measured for r in rows)
    assert len({r.id for r in rows}) == len(rows)


def _publisher(row) -> str:
    """The project a row's source belongs to: a GitHub repository (torchtitan's docs and the Trainy benchmark both sit
    in pytorch/torchtitan, so they count once; torchtune is another code base of the same organisation, which the
    closing note says), or the first word of a paper citation."""
    words = row.source.split()
    return "/".join(words[0].split("/")[1:3]) if words[0].startswith("github.com/") else words[0]


def test_memory_and_long_sequence_rows_come_from_three_publishers(rows):
    """Peak memory: at least six compared rows from at least three publishers; sequences of 16K or more with context
    parallelism or Ulysses: at least eight in-scope rows from at least three publishers (a compared quantity each)."""
    mem = [r for r in rows if not r.out_of_scope and "peak_mem_gib" in published.record(r)["error_pct"]]
    assert len(mem) >= 6 and len({_publisher(r) for r in mem}) >= 3
    long = [
        r
        for r in rows
        if not r.out_of_scope
        and r.seq_len >= published.LONG_SEQ
        and r.layout.get("scheme") in ("fsdp_sp", "sp", "tp_sp")
        and int(r.layout.get("degree", 1)) > 1
        and published.record(r)["error_pct"]
    ]
    assert len(long) >= 8 and len({_publisher(r) for r in long}) >= 3, sorted({_publisher(r) for r in long})


def test_every_in_scope_quantity_is_predicted_or_says_why(rows):
    for row in rows:
        rec = published.record(row)
        if row.out_of_scope:
            assert rec["status"] == "out_of_scope" and rec["out_of_scope"]
            continue
        for q in row.measured:
            assert q in rec["error_pct"] or rec["quantity_out_of_scope"].get(q), (row.id, q)
        pred = rec["predicted"]
        assert pred["tokens_per_s_per_gpu"] > 0 and 0 < pred["mfu_pct"] < 100


def test_fsdp_rows_get_a_memory_prediction_and_a_published_memory_row_is_in_scope(rows):
    fsdp = [r for r in rows if r.layout.get("fsdp") and not r.out_of_scope]
    assert fsdp
    for row in fsdp:
        assert published.memory_parallel(row, None).scheme == "fsdp_sp"
        mem = published.predict(row)["peak_mem_gib"]
        assert (mem is None) == bool(row.memory_out_of_scope)  # None exactly when the row says why
        assert mem is None or mem > 0
    mem_rows = [r for r in rows if "peak_mem_gib" in r.measured and not r.out_of_scope]
    assert len([r for r in mem_rows if not r.memory_out_of_scope]) >= 6
    for row in mem_rows:
        rec = published.record(row)
        if row.memory_out_of_scope:
            assert rec["quantity_out_of_scope"]["peak_mem_gib"] == row.memory_out_of_scope
            assert "peak_mem_gib" not in rec["error_pct"]
        else:
            assert "peak_mem_gib" in rec["error_pct"] and not rec["quantity_out_of_scope"]
            assert row.memory_kind in published.MEMORY_KINDS


def test_megatron_eq3_is_the_papers_formula():
    """Narayanan et al. 2021 Eq. 3 per token: 96·l·h²·(1 + s/6h + V/16lh) for a GPT (MLP 4h = SwiGLU 8h/3)."""
    from tspbench.config import ModelConfig

    m = ModelConfig(vocab_size=51200, dim=2304, n_layers=24, n_heads=24, n_kv_heads=24, ffn_hidden=6144)
    s, h, l, v = 2048, 2304, 24, 51200
    eq3 = 96 * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h))
    assert published.published_flops_per_token(m, s, "megatron_eq3") == pytest.approx(eq3, rel=1e-3)
    palm = 72 * l * h**2 * (1 + s / (6 * h) + v / (12 * h * l))  # Korthikanti et al. Eq. 7 = 6N + 12·L·h·S
    assert published.published_flops_per_token(m, s, "palm") == pytest.approx(palm, rel=1e-3)


def test_error_is_signed_relative_to_published(rows):
    row = next(r for r in rows if "tokens_per_s_per_gpu" in r.measured and not r.out_of_scope)
    rec = published.record(row)
    pub, pred = row.measured["tokens_per_s_per_gpu"], rec["predicted"]["tokens_per_s_per_gpu"]
    assert rec["error_pct"]["tokens_per_s_per_gpu"] == pytest.approx(100 * (pred - pub) / pub)


def test_summary_separates_subsets():
    recs = [
        {"subset": "calibration", "error_pct": {"mfu_pct": -10.0}},
        {"subset": "validation", "error_pct": {"mfu_pct": 30.0}},
        {"subset": "validation", "error_pct": {"mfu_pct": -10.0}},
    ]
    s = published.summary(recs)
    assert s["calibration"]["mfu_pct"]["median_abs_pct"] == 10.0
    assert s["validation"]["mfu_pct"] == {"median_abs_pct": 20.0, "worst_abs_pct": 30.0, "n": 2}


def test_record_keys_are_documented(rows):
    doc = DOC.read_text()
    section = doc[doc.index("## Validation records") :]
    keys = set(re.findall(r"`([a-z0-9_]+)`", section))
    rec = published.record(next(r for r in rows if not r.out_of_scope))
    assert set(rec) <= keys, set(rec) - keys


def test_cli_writes_jsonl_and_rejects_bad_input(tmp_path, capsys):
    out = tmp_path / "v.jsonl"
    assert validate.main([f"out={out}"]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == len(published.load_rows(published.default_files()))
    assert "validation" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("rows:\n  - {id: x, subset: test}\n")
    assert validate.main([str(bad), f"out={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "subset" in err[0] and "calibration" in err[0]
    bad.write_text("rows:\n  - {id: x, subset: validation, flops: hfu}\n")
    assert validate.main([str(bad), f"out={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "flops" in err[0] and "megatron_eq3" in err[0]
    assert validate.main([str(tmp_path / "missing.yaml")]) == 2


def test_the_entry_point_is_only_the_command_line():
    """tspbench/validate.py parses, prints and writes (through tspbench.record); the rows, predictions, errors and
    summary are tspbench/predict/published.py's, which the planner and the README's headline import."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(validate))
    defs = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert defs == {"ValidateConfig", "render", "main"}  # its options, its table, its command line
    assert validate.write_records.__module__ == "tspbench.record.store"


OLD_SCHEMA_FILE = """\
models:
  llama3_8b: {vocab_size: 128256, dim: 4096, n_layers: 32, n_heads: 32, n_kv_heads: 8, ffn_hidden: 14336}
rows:
  - id: old_schema_fsdp
    source: "a row written before the optional fields stack and checkpointing existed"
    subset: validation
    hardware: h100_96gb
    gpus: 8
    model: llama3_8b
    layout: {scheme: single, degree: 1, fsdp: true}
    seq_len: 8192
    micro_batch: 2
    recompute: selective
    precision: bf16
    measured: {tokens_per_s_per_gpu: 5762, peak_mem_gib: 82.4}
    memory_kind: "free text, as measurements.yaml writes it"
  - id: old_schema_out_of_scope
    source: "an out-of-scope row in the old schema"
    subset: calibration
    hardware: h100
    gpus: 8
    model: llama3_8b
    layout: {scheme: single, degree: 1}
    seq_len: 8192
    micro_batch: 1
    recompute: full
    precision: fp8
    measured: {tokens_per_s_per_gpu: 8532}
    out_of_scope: "float8"
"""


def test_a_file_in_the_old_schema_still_loads_and_predicts(tmp_path, capsys):
    """stack and checkpointing are optional (default "": the file does not say), so a file without them loads,
    its in-scope rows are predicted and `python -m tspbench.validate FILE` prints and writes them."""
    old = tmp_path / "old.yaml"
    old.write_text(OLD_SCHEMA_FILE)
    loaded = published.load_rows([old])
    assert [r.id for r in loaded] == ["old_schema_fsdp", "old_schema_out_of_scope"]
    assert all(r.stack == "" and r.checkpointing == "" for r in loaded)
    rec = published.record(loaded[0])
    assert set(rec["error_pct"]) == {"tokens_per_s_per_gpu", "peak_mem_gib"} and not rec["quantity_out_of_scope"]
    assert published.record(loaded[1])["status"] == "out_of_scope"
    out = tmp_path / "v.jsonl"
    assert validate.main([str(old), f"out={out}"]) == 0
    printed = capsys.readouterr().out
    assert "old_schema_fsdp" in printed and "out of scope: float8" in printed
    assert len(out.read_text().splitlines()) == 2


def test_a_published_number_in_another_form_is_kept_and_not_compared(rows):
    """A key outside the four quantities (model_tflops_per_gpu, tokens_per_s_job, peak_mem_gb) is recorded as
    published and, on an in-scope row, says why it has no error."""
    row = next(r for r in rows if not r.out_of_scope and "tokens_per_s_per_gpu" in r.measured)
    extra = published.Row(**{**row.__dict__, "measured": {**row.measured, "model_tflops_per_gpu": 500.0}})
    rec = published.record(extra)
    assert rec["published"]["model_tflops_per_gpu"] == 500.0
    assert "model_tflops_per_gpu" not in rec["error_pct"] and rec["quantity_out_of_scope"]["model_tflops_per_gpu"]
    long_rows = [r for r in rows if r.file.endswith("long_context.yaml")]
    assert all(r.stack for r in long_rows)  # the new file names every row's implementation


def test_a_layer_sac_row_is_half_its_blocks_full_and_half_none(rows):
    """torchtitan's per-layer SAC (every second block checkpointed): time per token the mean of the row under full
    and under none, so tokens/s their harmonic mean; strictly between the two."""
    from dataclasses import replace

    row = next(r for r in rows if r.recompute == published.LAYER_SAC)
    full, none = (published.predict(replace(row, recompute=r)) for r in ("full", "none"))
    got = published.predict(row)
    tps = 2 / (1 / full["tokens_per_s_per_gpu"] + 1 / none["tokens_per_s_per_gpu"])
    assert got["tokens_per_s_per_gpu"] == pytest.approx(tps)
    assert full["tokens_per_s_per_gpu"] < got["tokens_per_s_per_gpu"] < none["tokens_per_s_per_gpu"]
    assert got["step_s"] == pytest.approx((full["step_s"] + none["step_s"]) / 2)


def test_a_row_with_an_unknown_recompute_is_refused(tmp_path):
    from published_rows import write_row

    path = write_row(tmp_path, recompute="every_other", measured={"tokens_per_s_per_gpu": 100.0})
    with pytest.raises(ValueError, match=r"row x: recompute='every_other'; allowed: .*layer_sac"):
        published.load_rows([path])
    path = write_row(tmp_path, recompute="every_other", out_of_scope="the source's policy")
    assert published.load_rows([path])[0].out_of_scope  # an out-of-scope row keeps what its source said
