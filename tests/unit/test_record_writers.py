"""Every kind of record is written through tspbench/record/ (docs/records.md#record-kinds-writers-and-guards): each
writer replaces its file atomically (a failure mid-write leaves the old file intact, no temporary file behind), each
kind's guard marks a bad record `implausible` with a one-line reason (never drops it, never writes it as fine), and
the entry points (plan out=, validate out=, gpu_check time=true's calibration file) and the run flow's context
records go through them. One pass (`read_all`) reads every kind back."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from tspbench.record import store
from tspbench.record.kinds import guard_kind
from tspbench.record.store import read_all, write_json, write_records

PLAN = {
    "kind": "plan",
    "method": "modelled",
    "model": "llama7b",
    "seq_len": 131072,
    "gpus": 8,
    "hardware": "mi300x",
    "overlap": "schedule",
    "rank": 1,
    "layout": "TSP D=8 rc=full B=1",
    "scheme": "tsp",
    "degree": 8,
    "dp": 1,
    "msp": None,
    "mem_bytes": 3.2e10,
    "step_s": 1.0,
    "compute_s": 0.9,
    "exposed_comm_s": 0.1,
    "tokens_per_s_cluster": 1.0e5,
    "tokens_per_s_per_gpu": 1.25e4,
    "margin_pct": None,
    "pareto": True,
}
VALIDATION = {
    "kind": "validation",
    "row_id": "x",
    "subset": "validation",
    "status": "ok",
    "gpus": 8,
    "published": {"tokens_per_s_per_gpu": 100.0},
    "predicted": {"tokens_per_s_per_gpu": 110.0},
    "error_pct": {"tokens_per_s_per_gpu": 10.0},
}
CALIBRATION = {
    "device": "NVIDIA H200",  # what h200.yaml names: load_hardware refuses another part's calibration
    "source": "python -m tspbench.gpu_check time=true",
    "efficiency": {"gemm": 0.7, "attention_forward": 0.5, "attention_backward": 0.4},
}
RUN = {"run_id": "r", "status": "ok", "scheme": "tp", "metrics": {"mfu_causal_pct": 40.0}}


@pytest.mark.parametrize(
    "kind,rec,bad,needle",
    [
        ("plan", PLAN, {"mem_bytes": 0.0}, "mem_bytes=0.0 must be > 0"),
        ("plan", PLAN, {"exposed_comm_s": -0.1}, "exposed_comm_s=-0.1 < 0"),
        ("plan", PLAN, {"step_s": math.nan}, "step_s=nan is not finite"),
        ("plan", PLAN, {"tokens_per_s_per_gpu": 0}, "tokens_per_s_per_gpu=0 must be > 0"),
        ("plan", PLAN, {"scheme": "zero3"}, "scheme='zero3' is not one of"),
        ("validation", VALIDATION, {"subset": "test"}, "subset='test' is not one of calibration, validation"),
        ("validation", VALIDATION, {"error_pct": {"mfu_pct": math.inf}}, "error_pct.mfu_pct=inf is not finite"),
        ("calibration", CALIBRATION, {"efficiency": {"gemm": 1.5}}, "efficiency.gemm=1.5 is not in (0, 1]"),
        ("calibration", CALIBRATION, {"efficiency": {}}, "efficiency.attention_backward=None is not in (0, 1]"),
        ("run", RUN, {"metrics": {"mfu_causal_pct": 150.0}}, "mfu_causal_pct=150.0 > 100%"),
    ],
)
def test_each_guard_marks_a_bad_record(kind, rec, bad, needle):
    assert guard_kind(rec, kind)["status"] == rec.get("status", "ok")  # the good one passes
    marked = guard_kind({**rec, **bad}, kind)
    assert marked["status"] == "implausible" and needle in marked["reason"], marked.get("reason")
    assert marked["status_before_guards"] == rec.get("status", "ok") and "\n" not in marked["reason"]


def test_a_record_of_another_kind_is_refused():
    with pytest.raises(ValueError, match="kind 'plan' passed as kind 'validation'"):
        guard_kind(PLAN, "validation")
    with pytest.raises(ValueError, match="kind 'validation' passed as kind 'run'"):
        guard_kind(VALIDATION, "run")
    with pytest.raises(ValueError, match="use write_json"):
        write_records("unused.jsonl", [CALIBRATION], kind="calibration")


@pytest.mark.parametrize("kind,rec", [("plan", PLAN), ("validation", VALIDATION), ("run", RUN)])
def test_write_records_is_atomic(kind, rec, tmp_path):
    path = tmp_path / f"{kind}.jsonl"
    written = write_records(path, [rec, {**rec, "rank": 2}], kind=kind)
    assert [json.loads(line) for line in path.read_text().splitlines()] == written
    before = path.read_bytes()
    # a record that cannot be serialised, after two that can: the failure comes mid-write
    with pytest.raises(TypeError, match="not JSON serialisable"):
        write_records(path, [rec, rec, {**rec, "note": object()}], kind=kind)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_failed_rename_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "plan.jsonl"
    write_records(path, [PLAN], kind="plan")
    before = path.read_bytes()

    def no_rename(*a):
        raise OSError("disk gone")

    monkeypatch.setattr(store.os, "replace", no_rename)
    with pytest.raises(OSError, match="disk gone"):
        write_records(path, [PLAN, PLAN], kind="plan")
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_write_json_is_atomic_and_guarded(tmp_path):
    path = tmp_path / "h200.calibration.json"
    assert write_json(path, CALIBRATION)["status"] == "ok"
    before = path.read_bytes()
    with pytest.raises(TypeError):
        write_json(path, {**CALIBRATION, "device": object()})
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [path.name]
    bad = write_json(path, {**CALIBRATION, "efficiency": {**CALIBRATION["efficiency"], "gemm": 2.0}})
    assert json.loads(path.read_text()) == bad and bad["status"] == "implausible"


def test_the_calibration_writer_feeds_load_hardware(tmp_path):
    """`python -m tspbench.gpu_check time=true` writes through write_json (tspbench/gpu_check.py): a plausible file is
    one load_hardware applies, an implausible one is marked and refused by the loader, never used."""
    from tspbench.gpu_check import write_calibration
    from tspbench.predict.costmodel.hardware import CONF_DIR, load_hardware

    shutil.copy(CONF_DIR / "h200.yaml", tmp_path / "h200.yaml")
    path = tmp_path / "h200.calibration.json"
    assert write_calibration(path, CALIBRATION)["status"] == "ok"
    assert load_hardware("h200", tmp_path).matmul_efficiency == pytest.approx(0.7)
    bad = write_calibration(path, {**CALIBRATION, "efficiency": {**CALIBRATION["efficiency"], "gemm": 1.2}})
    assert bad["status"] == "implausible" and json.loads(path.read_text())["status"] == "implausible"
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        load_hardware("h200", tmp_path)


def test_plan_cli_writes_through_the_guarded_writer(tmp_path, monkeypatch, capsys):
    from tspbench import plan

    out = tmp_path / "plan.jsonl"
    out.write_text("old\n")
    real = plan.plan_records

    def one_bad(*a, **k):
        recs = real(*a, **k)
        return [*recs[:-1], {**recs[-1], "mem_bytes": -1.0}]

    monkeypatch.setattr(plan, "plan_records", one_bad)
    argv = ["model=llama7b", "seq_len=32768", "gpus=16", "hardware=h100", "top=1", f"out={out}"]
    assert plan.main(argv) == 0
    recs = read_all([out]).of("plan")
    assert [r["status"] for r in recs] == ["ok"] * (len(recs) - 1) + ["implausible"]
    assert "(1 implausible: mem_bytes=-1 < 0" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


def test_validate_cli_writes_through_the_guarded_writer(tmp_path, monkeypatch, capsys):
    from tspbench import validate

    out = tmp_path / "validation.jsonl"
    calls = []
    real = validate.write_records

    def spy(path, records, kind):
        calls.append(kind)
        return real(path, records, kind)

    monkeypatch.setattr(validate, "write_records", spy)
    assert validate.main([f"out={out}"]) == 0
    assert calls == ["validation", "peer_estimate"]
    assert {r["status"] for r in read_all([out]).of("validation")} <= {"ok", "out_of_scope"}


def test_context_records_for_the_report(tmp_path):
    """The run flow's context records: the validation rows of conf/published and the paper setting's plan
    (PAPER_SETTING, overlap schedule), through the guarded writer; a second call replaces them, never appends."""
    from tspbench.predict.planner import PAPER_SETTING
    from tspbench.predict.published import default_files, load_rows
    from tspbench.run.context import write_context_records

    paths = write_context_records(tmp_path)
    assert [p.name for p in paths] == ["validation.jsonl", "plan.jsonl", "verdict.jsonl", "fit.jsonl", "peers.jsonl"]
    got = read_all([tmp_path])
    assert got.of(None) == [] and len(got.of("validation")) == len(load_rows(default_files()))
    plans = got.of("plan")
    assert plans and all(r["status"] == "ok" and r["overlap"] == "schedule" for r in plans)
    assert all(r[k] == v for r in plans for k, v in PAPER_SETTING.items())
    assert [r["rank"] for r in plans] == list(range(1, len(plans) + 1)) and any(r["pareto"] for r in plans)
    (verdict,) = got.of("verdict")
    assert verdict["status"] == "ok" and verdict["ratio_low"] <= verdict["ratio_central"] <= verdict["ratio_high"]
    fits, crossings, peers = got.of("fit"), got.of("crossover"), got.of("peer_estimate")
    assert fits and crossings and peers  # each guarded as its own kind (record/kinds.py)
    assert all(r["status"] == "ok" for r in fits + crossings + peers)
    write_context_records(tmp_path)
    again = read_all([tmp_path])
    assert len(again.of("plan")) == len(plans) and len(again.of("validation")) == len(got.of("validation"))
    assert len(again.of("fit")) == len(fits) and len(again.of("peer_estimate")) == len(peers)


def test_read_all_reads_every_kind_in_one_pass(tmp_path):
    write_records(tmp_path / "a" / "plan.jsonl", [PLAN], kind="plan")
    write_records(tmp_path / "a" / "validation.jsonl", [VALIDATION], kind="validation")
    run = tmp_path / "results.jsonl"
    store.append_record(run, RUN)
    with run.open("a") as f:
        f.write("not json\n" + '{"run_id": "torn", "sta')
    got = read_all([tmp_path, run, tmp_path / "a" / "plan.jsonl"])  # two files named twice
    want = [tmp_path / "a" / "plan.jsonl", tmp_path / "a" / "validation.jsonl", run]
    assert sorted(got.files) == sorted(want)
    assert [len(got.of(k)) for k in (None, "plan", "validation")] == [1, 1, 1]
    assert [(f.name, n, last) for f, n, last in got.bad] == [("results.jsonl", 2, False), ("results.jsonl", 3, True)]


def test_an_implausible_verdict_is_marked_and_never_answers():
    """A verdict record whose band is inverted or whose answer is not one of the three is written marked; the
    report's first screen then gives no answer, and says why."""
    from tspbench.record.kinds import VERDICTS, guard_kind
    from tspbench.report.build import answer_of

    good = {
        "kind": "verdict",
        "a": "TSP",
        "b": "X",
        "ratio_low": 0.9,
        "ratio_central": 1.0,
        "ratio_high": 1.1,
        "verdict": VERDICTS[2],
        "moves_most": "m",
        "setting": "s",
        "scenarios": 54,
    }
    assert guard_kind(good, "verdict")["status"] == "ok"
    assert answer_of([guard_kind(good, "verdict")])["headline"].startswith("Within the model's error: TSP ÷ X")
    inverted = guard_kind({**good, "ratio_low": 1.2}, "verdict")
    wrong = guard_kind({**good, "verdict": "TSP wins"}, "verdict")
    assert inverted["status"] == wrong["status"] == "implausible"
    assert "does not hold" in inverted["reason"] and "is not one of" in wrong["reason"]
    assert answer_of([inverted])["headline"].startswith("no answer")
    assert answer_of([]) is None


def test_the_report_answers_from_the_verdict_record(tmp_path):
    """The report's first screen says whether TSP wins, against what, by how much and how sure, and its trust
    section names the input that moves the throughput verdict most: both read off the verdict record."""
    from tspbench.report.build import build_report
    from tspbench.run.context import write_context_records

    html = build_report(write_context_records(tmp_path), tmp_path / "r.html").read_text()
    (verdict,) = read_all([tmp_path]).of("verdict")
    first = html.split('id="does-tsp-win"', 1)[1].split("</div>", 1)[0]
    assert "Does TSP win?" in first and f"{verdict['ratio_central']:.2f}×" in first
    assert f"band {verdict['ratio_low']:.2f}–{verdict['ratio_high']:.2f}" in first
    assert 'id="trust-moves"' in html and "moves it most" in html.split('id="trust-moves"', 1)[1][:600]
