"""The sweep's combined results.jsonl (tspbench.run.callbacks.combine): every job's file in job order (numeric
job numbers as numbers), a missing final newline repaired, rewritten whole each time, written atomically."""

from __future__ import annotations

from tspbench.run.callbacks import combine


def test_combine_in_job_order_rewritten_whole(tmp_path):
    for job, text in (("10", '{"run_id": "c"}\n'), ("2", '{"run_id": "b"}'), ("0", '{"run_id": "a"}\n')):
        (tmp_path / job).mkdir()
        (tmp_path / job / "results.jsonl").write_text(text)
    extra = tmp_path / "elsewhere.jsonl"
    extra.write_text('{"run_id": "d"}\n')
    want = '{"run_id": "a"}\n{"run_id": "b"}\n{"run_id": "c"}\n{"run_id": "d"}\n'
    for _ in range(2):  # a resumed sweep rewrites the file, never appends to it
        out = combine(tmp_path, [extra])
        assert out == tmp_path / "results.jsonl" and out.read_text() == want
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["elsewhere.jsonl", "results.jsonl"]
