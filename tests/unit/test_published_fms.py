"""conf/published/fms_acceleration.yaml (IBM fms-acceleration's full fine-tuning of Mistral-7B on A100, peak memory in
bytes) and the mechanism it brought to tspbench/predict/published.py: a number in an exact unit (EXACT_UNITS,
peak_mem_bytes) is compared as its quantity after the exact unit change, the printed number kept in `published_as`.
The file loads with the positional split its header states, its in-scope rows' memory is compared, a broken row fails
with one actionable message, and the other files' rows are unchanged by the rule."""

from __future__ import annotations

import pytest
from published_rows import write_row

from tspbench.config import GIB
from tspbench.paths import conf_dir
from tspbench.predict import published

FILE = conf_dir() / "published" / "fms_acceleration.yaml"


@pytest.fixture(scope="module")
def rows() -> list[published.Row]:
    return published.load_rows([FILE])


def test_the_file_loads_with_its_positional_split_and_its_bytes_become_gib_exactly(rows):
    assert len(rows) == 8 and len({r.id for r in rows}) == len(rows)
    assert [r.subset for r in rows] == ["calibration" if i % 3 == 0 else "validation" for i in range(len(rows))]
    assert {r.source.split()[0] for r in rows} == {"github.com/foundation-model-stack/fms-acceleration"}
    row = next(r for r in rows if r.id == "fms_a100_mistral7b_1gpu_b4_4k")
    assert row.published_as == {"peak_mem_gib": "peak_mem_bytes: 72434837504"}
    assert row.measured == {"peak_mem_gib": 72434837504 / GIB}  # ÷ 2³⁰, nothing else
    assert "72434837504" in row.source  # the number is the source line's, digit for digit
    assert row.memory_kind == "allocated" and row.training == {"master_fp32": False}


def test_every_in_scope_row_compares_its_memory_and_the_record_keeps_the_printed_bytes(rows):
    compared = 0
    for row in rows:
        rec = published.record(row)
        if row.out_of_scope:
            assert rec["status"] == "out_of_scope" and "foak-fast-kernels" in row.out_of_scope
            continue
        assert set(rec["error_pct"]) == {"peak_mem_gib"} and not rec["quantity_out_of_scope"]
        assert rec["published_as"]["peak_mem_gib"].startswith("peak_mem_bytes: ")
        printed = int(rec["published_as"]["peak_mem_gib"].split(": ")[1])
        assert rec["published"]["peak_mem_gib"] * GIB == pytest.approx(printed, rel=1e-15)
        compared += 1
    assert compared == 4


def test_only_exact_units_are_changed_gb_stays_recorded(tmp_path):
    gb = published.load_rows([write_row(tmp_path, measured={"peak_mem_gb": 50})])[0]
    assert gb.measured == {"peak_mem_gb": 50} and gb.published_as == {}
    assert "recorded as published" in published.record(gb)["quantity_out_of_scope"]["peak_mem_gb"]
    as_bytes = published.load_rows([write_row(tmp_path, measured={"peak_mem_bytes": 2 * GIB})])[0]
    assert as_bytes.measured == {"peak_mem_gib": 2.0}


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"measured": {"peak_mem_bytes": GIB, "peak_mem_gib": 1.0}}, "measured gives both peak_mem_bytes and"),
        ({"published_as": {"peak_mem_gib": "x"}}, "published_as is set by the loader"),
    ],
)
def test_a_broken_row_fails_with_one_actionable_line(tmp_path, fields, said):
    with pytest.raises(ValueError, match=said):
        published.load_rows([write_row(tmp_path, **fields)])


def test_the_other_files_rows_carry_no_published_as():
    others = [f for f in published.default_files() if f.name != FILE.name]
    assert all(r.published_as == {} for r in published.load_rows(others))
