"""The report's trust section: validation records (and only they) feed the table and the scatter; run tables
never see them; without records the section says how to make them."""

from __future__ import annotations

from tspbench import validate
from tspbench.record.store import read_records
from tspbench.report.trust import trust_section


def test_trust_section_from_validation_records(tmp_path):
    out = tmp_path / "validation.jsonl"
    assert validate.main(["--out", str(out)]) == 0
    assert read_records([tmp_path]) == []  # run tables never read validation records
    html = str(trust_section([tmp_path]))
    assert 'id="trust-table"' in html and 'id="fig-trust-img"' in html and "data:image/svg+xml" in html
    assert "calibration" in html and "validation" in html and "out of scope" in html
    assert "tt_a100_llama3_8b_sel_op" in html and "llm-foundry" in html


def test_trust_section_without_records(tmp_path, monkeypatch):
    monkeypatch.setattr("tspbench.report.trust.results_dir", lambda: tmp_path / "none")
    html = str(trust_section([tmp_path]))
    assert "python -m tspbench.validate" in html
