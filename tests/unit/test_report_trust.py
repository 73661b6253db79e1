"""The report's trust section: validation records (and only they) feed the table and the scatter; run tables
never see them; without records the section says, in one line, which command writes them; an implausible record
(the validation guard, record/kinds.py) is listed with its reason and counted in no error; memory is printed in GB."""

from __future__ import annotations

import math
import re

import pytest

from tspbench import validate
from tspbench.config import GIB_TO_GB
from tspbench.record.store import read_records, write_records
from tspbench.report.trust import VALIDATE_COMMAND, trust_section


@pytest.fixture(scope="module")
def recs(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("trust") / "validation.jsonl"
    assert validate.main([f"out={out}"]) == 0
    assert read_records([out]) == []  # run tables never read validation records
    return read_records([out], kind="validation")


def test_trust_section_from_validation_records(recs):
    html = str(trust_section(recs))
    assert 'id="trust-table"' in html and 'id="fig-trust-img"' in html and "data:image/svg+xml" in html
    assert "calibration" in html and "validation" in html and "out of scope" in html
    assert "tt_a100_llama3_8b_sel_op" in html and "llm-foundry" in html


def test_trust_section_without_records():
    html = str(trust_section([]))
    assert f"<code>{VALIDATE_COMMAND}</code>" in html and html.count("<p") == 1 and "<table" not in html


def test_memory_is_printed_in_gb(recs):
    html = str(trust_section(recs))
    assert "GiB" not in html and "peak memory (GB)" in html
    row = next(r for r in recs if "peak_mem_gib" in r["error_pct"])
    cells = re.search(rf"<td>{row['row_id']}</td>.*?<td>peak memory \(GB\)</td><td>([^<]*)</td><td>([^<]*)</td>", html)
    assert cells and cells.groups() == (
        f"{row['published']['peak_mem_gib'] * GIB_TO_GB:.4g}",
        f"{row['predicted']['peak_mem_gib'] * GIB_TO_GB:.4g}",
    )


def test_an_implausible_record_is_listed_and_counted_nowhere(recs, tmp_path):
    row = next(r for r in recs if "tokens_per_s_per_gpu" in r["error_pct"] and r["subset"] == "validation")
    broken = dict(row, predicted=dict(row["predicted"], tokens_per_s_per_gpu=math.inf))
    written = write_records(tmp_path / "v.jsonl", [*[r for r in recs if r is not row], broken], kind="validation")
    assert written[-1]["status"] == "implausible" and "not finite" in written[-1]["reason"]
    html = str(trust_section(read_records([tmp_path / "v.jsonl"], kind="validation")))
    assert f"<td>{row['row_id']}</td>" in html and "implausible: predicted.tokens_per_s_per_gpu=inf" in html
    n_before = len([r for r in recs if r["subset"] == "validation" and "tokens_per_s_per_gpu" in r["error_pct"]])
    assert f"<td>validation</td><td>tokens/s per GPU</td><td>{n_before - 1}</td>" in html


def test_the_last_record_of_a_row_wins(recs):
    first = recs[0]
    html = str(trust_section([*recs, dict(first, source="a later run of the same row")]))
    rows = 1 if first["status"] == "out_of_scope" else len(first["published"])
    assert html.count(f"<td>{first['row_id']}</td>") == rows and "a later run of the same row" in html


def test_the_fitted_table_shows_each_row_under_its_stacks_calibration_fit(recs):
    """validate writes each in-scope row's error under its stack's fit (`fitted_error_pct`); the section summarises
    them beside the a-priori errors, and its validation tokens/s line is fitted_validation's."""
    from tspbench.predict.fit import fitted_validation
    from tspbench.predict.published import default_files, load_rows

    html = str(trust_section(recs))
    assert 'id="trust-summary"' in html and 'id="trust-fitted"' in html
    overall = fitted_validation(load_rows(default_files()))
    assert overall is not None
    fitted = html.split('id="trust-fitted"')[1].split("</table>")[0]
    line = f"<td>validation</td><td>tokens/s per GPU</td><td>{overall['n']}</td><td>{overall['median']:.1f}%</td>"
    assert line + f"<td>{overall['worst']:.1f}%</td>" in fitted
    by_id = {r["row_id"]: r for r in recs}
    for rid, e in overall["per_row_pct"].items():
        assert by_id[rid]["fitted_error_pct"] == {"tokens_per_s_per_gpu": e}
    assert all("fitted_error_pct" not in r for r in recs if r["status"] == "out_of_scope")
