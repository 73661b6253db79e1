"""tspbench.plan: enumerates every implemented layout, keeps only those that fit, ranks by cluster tokens/s, writes
its records, draws the Pareto front; and its memory is the estimate's on the paper's 8-GPU 128K memory setting
(slow: fake-tensor estimates)."""

from __future__ import annotations

import json

import pytest

from tspbench import plan
from tspbench.config import model_preset
from tspbench.paper.tables import PAPER_MEMORY_SETTING
from tspbench.parallel import ParallelConfig
from tspbench.predict import planner
from tspbench.predict.costmodel import Workload, load_hardware, memory_breakdown
from tspbench.predict.planner import PlanRequest

S128K = 131072
LLAMA7B = model_preset("llama7b")


@pytest.fixture(scope="module")
def ranked64() -> list[planner.Layout]:
    return planner.plan(PlanRequest(LLAMA7B, S128K, 64, "mi300x", max_degree=16))[0]


def test_plan_ranks_fitting_layouts(ranked64):
    hw = load_hardware("mi300x")
    schemes = {lay.par.scheme for lay in ranked64}
    assert {"tsp", "tp", "tp_msp", "sp", "tp_sp", "fsdp_sp"} <= schemes
    assert all(lay.mem_bytes <= hw.mem_bytes for lay in ranked64)
    tps = [lay.tokens_per_s_cluster for lay in ranked64]
    assert tps == sorted(tps, reverse=True)
    assert all(lay.par.dp * lay.par.degree == 64 for lay in ranked64)
    assert all(lay.tokens_per_s_per_gpu == pytest.approx(lay.tokens_per_s_cluster / 64) for lay in ranked64)


def test_enumeration_covers_every_implemented_layout():
    cands = planner.candidates(PlanRequest(LLAMA7B, S128K, 64, "mi300x", max_degree=8))
    pars = [p for p, _ in cands]
    assert {b for _, b in cands} == {1, 2, 4} and {p.recompute for p in pars} == {"none", "selective", "full"}
    assert {p.sp_variant for p in pars if p.scheme == "sp"} == {"allgather", "ring", "ulysses"}
    assert {(p.tp, p.sp_variant, p.msp) for p in pars if p.scheme == "tp_sp" and p.degree == 8} == {
        (t, v, m) for t in (2, 4) for v in ("allgather", "ring", "ulysses") for m in (True, False)
    }
    assert {p.sp_variant for p in pars if p.scheme == "fsdp_sp"} == {"allgather", "ring", "ulysses"}
    assert {p.degree for p in pars} == {1, 2, 4, 8} and all(p.dp * p.degree == 64 for p in pars)


def test_ulysses_msp_off_and_fsdp_sp_fit_somewhere(ranked64):
    names = [lay.name for lay in ranked64]
    assert any(n.startswith("SP ") and "ulysses" in n for n in names)
    assert any(n.startswith("TP×SP ") and "ulysses" in n for n in names)
    assert any("no Megatron-SP" in n for n in names)
    assert {lay.par.sp_variant for lay in ranked64 if lay.par.scheme == "fsdp_sp"} == {"allgather", "ring", "ulysses"}
    assert {lay.batch for lay in ranked64} == {1, 2, 4}


def test_paper_setting_enumerates_1000_layouts():
    ranked, n = planner.plan(PlanRequest(LLAMA7B, S128K, 1024, "mi300x"))
    assert n >= 1000 and ranked


def test_overlap_rules_order_the_step():
    """Adding communication to compute (none) is never faster than the code's schedule, nor that than ideal."""
    steps = {
        o: {
            (lay.name, lay.par.degree): lay.step_s
            for lay in planner.plan(PlanRequest(LLAMA7B, S128K, 16, "h100", overlap=o))[0]
        }
        for o in ("none", "schedule", "ideal")
    }
    assert steps["none"].keys() == steps["schedule"].keys() == steps["ideal"].keys()
    for k, none in steps["none"].items():
        assert none >= steps["schedule"][k] * (1 - 1e-12) and none >= steps["ideal"][k] * (1 - 1e-12)
    assert any(steps["none"][k] > steps["schedule"][k] for k in steps["none"])  # tsp hides some


def test_pareto_front_is_non_dominated_and_dominates_the_rest(ranked64):
    front = planner.pareto_front(ranked64)
    assert front and [f.mem_bytes for f in front] == sorted(f.mem_bytes for f in front)

    def dominates(a, b) -> bool:
        return (
            a.mem_bytes <= b.mem_bytes
            and a.tokens_per_s_cluster >= b.tokens_per_s_cluster
            and (a.mem_bytes < b.mem_bytes or a.tokens_per_s_cluster > b.tokens_per_s_cluster)
        )

    for f in front:
        assert not any(dominates(x, f) for x in ranked64)
    on = {id(f) for f in front}
    for x in ranked64:
        if id(x) not in on:
            assert any(
                dominates(f, x) or (f.mem_bytes, f.tokens_per_s_cluster) == (x.mem_bytes, x.tokens_per_s_cluster)
                for f in front
            )
    assert front[-1].tokens_per_s_cluster == ranked64[0].tokens_per_s_cluster  # the fastest closes the front


def test_plan_cli(capsys, tmp_path):
    out = tmp_path / "plan.jsonl"
    argv = ["model=llama7b", "seq_len=32768", "gpus=16", "hardware=h100", "top=3", "overlap=ideal", f"out={out}"]
    assert plan.main(argv) == 0
    text = capsys.readouterr().out
    assert "layouts enumerated in" in text and "margin" in text and "tok/s/GPU" in text and "dp" in text
    assert "Validation error that applies" in text and "tokens/s median |error|" in text
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    fits = int(text.split(" fit h100", 1)[0].rsplit(", ", 1)[1])
    assert len(recs) == fits and [r["rank"] for r in recs] == list(range(1, fits + 1))
    r = recs[0]
    assert r["kind"] == "plan" and r["overlap"] == "ideal" and r["gpus"] == 16 and r["hardware"] == "h100"
    for k in ("mem_bytes", "step_s", "exposed_comm_s", "tokens_per_s_cluster", "tokens_per_s_per_gpu", "dp"):
        assert isinstance(r[k], (int, float)) and r[k] >= 0
    assert r["dp"] * r["degree"] == 16 and recs[-1]["margin_pct"] is None and r["margin_pct"] >= 0
    assert any(x["pareto"] for x in recs) and recs[0]["pareto"]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["overlap=full"], "overlap='full' is unknown; allowed: none, ideal, schedule"),
        (["gpus"], "gpus: expected key=value; keys: model, seq_len, gpus"),
        (["gpu=8"], "gpu is not a key: did you mean gpus?"),
        (["schemes=tsp,zig"], "schemes=tsp,zig: each must be one of single, tp"),
        (["batches=1,x"], "batches='1,x' must be comma-separated integers"),
        (["gpus=many"], "gpus='many' must be an integer"),
    ],
)
def test_plan_cli_bad_input_one_line(argv, needle, capsys):
    assert plan.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_report_page_from_plan_records(tmp_path):
    from tspbench.record.store import read_records, write_records
    from tspbench.report.pareto import pareto_section

    ranked = planner.plan(PlanRequest(LLAMA7B, 32768, 16, "h100", max_degree=8))[0]
    recs = planner.plan_records(ranked, model="llama7b", seq_len=32768, gpus=16, hardware="h100", overlap="ideal")
    write_records(tmp_path / "plan.jsonl", recs, kind="plan")
    html = str(pareto_section(read_records([tmp_path], kind="plan")))
    assert 'id="fig-pareto-0-img"' in html and "data:image/svg+xml" in html and "16 × h100" in html
    assert html.count("<tr><td>") == sum(r["pareto"] for r in recs)  # the front's table: one row per front layout


PAPER_8 = {  # the paper's 8-GPU memory setting, every scheme the estimate runs
    "tsp": {"scheme": "tsp"},
    "tp": {"scheme": "tp"},
    "tp_msp": {"scheme": "tp_msp"},
    "sp": {"scheme": "sp"},
    "tp_sp T=2": {"scheme": "tp_sp", "tp": 2},
    "tp_sp T=4": {"scheme": "tp_sp", "tp": 4},
    "fsdp_sp": {"scheme": "fsdp_sp"},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PAPER_8))
def test_plan_memory_equals_estimate_on_paper_setting(name):
    from tspbench.predict.estimate import EstimateOptions, estimate

    par = ParallelConfig(**PAPER_8[name], degree=8, recompute=PAPER_MEMORY_SETTING.recompute)
    ranked, _ = planner.plan(
        PlanRequest(LLAMA7B, S128K, 8, "mi300x", max_degree=8, batches=(PAPER_MEMORY_SETTING.batch,))
    )
    mine = [x for x in ranked if x.par == par]
    want = memory_breakdown(par, Workload(LLAMA7B, S128K, PAPER_MEMORY_SETTING.batch))["total"]
    assert mine and mine[0].mem_bytes == want
    est = estimate(par, Workload(LLAMA7B, S128K, PAPER_MEMORY_SETTING.batch), EstimateOptions(hardware="h100"))
    assert want == pytest.approx(est["mem_bytes"]["total"], rel=0.01)


def test_plan_record_keys_are_documented():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "records.md").read_text().split("## Plan records", 1)[1]
    text = text.split("\n## ", 1)[0]  # this section only
    documented = {
        k for line in text.splitlines() if line.startswith("| `") for k in line.split(" | ")[0].split("`")[1::2]
    }
    ranked = planner.plan(PlanRequest(LLAMA7B, 32768, 8, "h100", max_degree=8, batches=(1,)))[0]
    rec = planner.plan_records(ranked, model="llama7b", seq_len=32768, gpus=8, hardware="h100", overlap="none")[0]
    from tspbench.record.kinds import guard_kind  # the writer's guard adds status (and, when it fails, the reasons)

    assert set(guard_kind(rec, "plan")) == set(rec) | {"status"}
    assert set(guard_kind({**rec, "mem_bytes": -1.0}, "plan")) == documented
