"""What fits (tspbench/predict/maxfit.py, `python -m tspbench.plan fit=true`): the longest sequence is the planner's
fit rule's boundary on the layout's grid, one answer agrees with the fake-tensor estimate, the largest model of a
family, the experiment's fit and crossover records, the cluster point of an experiment, and bad input refused in
one line."""

from __future__ import annotations

import json
import time

import pytest

from tspbench import plan
from tspbench.config import GB, ConfigError, model_preset
from tspbench.parallel import ParallelConfig
from tspbench.predict import fitrecords, maxfit
from tspbench.predict.costmodel import Workload, load_hardware, memory_breakdown
from tspbench.predict.planner import fits_device

LLAMA7B = model_preset("llama7b")
SMALL = model_preset("small")


def peak(model, par, s):
    return memory_breakdown(par, Workload(model, s, 1), kv_cache=False)["total"]


@pytest.mark.parametrize("scheme,degree", [("tsp", 8), ("tp", 8), ("sp", 8), ("fsdp_sp", 8)])
def test_max_seq_len_is_the_fit_rules_boundary(scheme, degree):
    req = maxfit.FitRequest(LLAMA7B, "mi300x", 8)
    cap = load_hardware("mi300x").mem_bytes
    for rc in ("none", "full"):
        par = ParallelConfig(scheme=scheme, degree=degree, recompute=rc)
        f = maxfit.max_seq_len(req, par)
        assert f.max_seq_len > 0 and f.max_seq_len % f.step == 0 and f.step % (2 * par.sp_degree) == 0
        assert fits_device(peak(LLAMA7B, par, f.max_seq_len), cap)
        assert not fits_device(peak(LLAMA7B, par, f.max_seq_len + f.step), cap)
        assert f.at_fail["total"] == peak(LLAMA7B, par, f.max_seq_len + f.step) and f.limit


def test_nothing_fits_names_the_model_state():
    f = maxfit.max_seq_len(maxfit.FitRequest(LLAMA7B, "h100", 8), ParallelConfig(scheme="sp", degree=8))
    assert f.max_seq_len == 0 and f.limit.startswith("model state")


def test_spot_check_against_the_fake_tensor_estimate():
    """The longest length the closed form finds for a small model on a made-up 0.45 GB device: the estimate's peak
    (the scheme code on fake tensors) fits there and not one grid step up, within the documented agreement (a few %
    on small models, costmodel/memory.py; here the model is within 0.5% of the estimate)."""
    from tspbench.predict.estimate import EstimateOptions, estimate

    tol = 0.03
    cap = 0.45 * GB
    par = ParallelConfig(scheme="tsp", degree=4)
    req = maxfit.FitRequest(SMALL, "h100", 4, headroom=0.0, seq_multiple=512)
    f = maxfit.max_seq_len(req, par, cap)
    assert f.max_seq_len > 0
    for s, fits in ((f.max_seq_len, True), (f.max_seq_len + f.step, False)):
        est = estimate(par, Workload(SMALL, s, 1), EstimateOptions(hardware="h100"))["mem_bytes"]["total"]
        assert peak(SMALL, par, s) == pytest.approx(est, rel=tol)
        need = est * (1 + req.reserve) + req.headroom
        assert need <= cap * (1 + tol) if fits else need > cap * (1 - tol), (s, need / cap)


@pytest.mark.parametrize("hardware,gpus", [("mi300x", 8), ("h100", 8), ("h100", 64)])
def test_fit_cli_answers_fast(hardware, gpus, capsys):
    t0 = time.process_time()  # CPU seconds: a shared, loaded machine must not fail the closed form's budget
    assert plan.main(["fit", f"hardware={hardware}", f"gpus={gpus}"]) == 0
    assert time.process_time() - t0 < 10
    out = capsys.readouterr().out
    assert out.startswith("What fits (modelled") and "none   selective        full  limit" in out
    assert "TSP D=" in out and "Fit rule: modelled peak × 1.1" in out


def test_largest_model_of_a_family(capsys):
    got = maxfit.largest_model(maxfit.family("llama2"), 32768, "h100", 8)
    assert [m.fit for m in got] == [True, True, False]  # 7B and 13B fit 8 × 80 GB at 32K, 70B does not
    assert plan.main(["fit=true", "family=llama2", "seq_len=32768", "hardware=h100"]) == 0
    assert "Largest that fits: llama2_13b." in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["fit", "hardware=b200"], "hardware='b200' has no"),
        (["fit", "recomputes=some"], "recomputes=some: each must be one of none, selective, full"),
        (["fit", "family=gpt"], "family='gpt' is unknown; allowed: llama2, llama3, presets"),
        (["family=llama2"], "family= is a fit=true option"),
        (["fit", "model=gpt"], "model='gpt' is unknown; allowed:"),
        (["fit", "seq_multiple=0"], "seq_multiple=0 must be ≥ 1"),
    ],
)
def test_fit_bad_input_one_line(argv, needle, capsys):
    assert plan.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_fit_and_crossover_records(tmp_path):
    from tspbench.run.context import write_fit_records

    recs = fitrecords.fit_records(LLAMA7B, 8, ("h100", "mi300x"))
    recs.append(fitrecords.comm_crossover(LLAMA7B, 8, 1, "forward"))
    written = write_fit_records(tmp_path / "fit.jsonl", recs)
    assert all(r["status"] == "ok" for r in written)
    back = [json.loads(line) for line in (tmp_path / "fit.jsonl").read_text().splitlines()]
    assert back == written
    tsp = [r for r in back if r["kind"] == "fit" and r["scheme"] == "tsp" and r["recompute"] == "full"]
    assert {r["hardware"] for r in tsp} == {"h100", "mi300x"}
    assert min(r["max_seq_len"] for r in tsp if r["hardware"] == "h100") < max(r["max_seq_len"] for r in tsp)
    cross = back[-1]  # the analytic crossover (costmodel.crossover_tokens) on the zigzag's grid
    assert cross["seq_len"] == 32768 and cross["a"] == "TSP D=8" and cross["b"] == "TP T=8"
    bad = write_fit_records(tmp_path / "bad.jsonl", [{**tsp[0], "max_seq_len": tsp[0]["max_seq_len"] + 1}])
    assert bad[0]["status"] == "implausible" and "multiple of seq_step" in bad[0]["reason"]


def test_experiment_cluster_point():
    from tspbench.run.experiment import compose_experiment
    from tspbench.run.grid import expand_grid

    specs = expand_grid(compose_experiment(["+exp=llama7b"]))
    cluster = [s for s in specs if s.world_size == 1024]
    assert cluster and all(s.execution == "model" for s in cluster)
    assert {s.mode for s in cluster} == {"train", "forward"}
    assert any(s.scheme == "tsp" and s.mode == "forward" and s.seq_len == 131072 for s in cluster)
    assert len({s.run_id for s in specs}) == len(specs)
    with pytest.raises(ConfigError, match="cluster_gpus=1020 must be a positive multiple of every degree"):
        expand_grid(compose_experiment(["+exp=llama7b", "cluster_gpus=1020"]))
    assert not [s for s in expand_grid(compose_experiment(["+exp=llama7b", "cluster_gpus=null"])) if s.dp > 1]


def test_fit_cli_writes_the_records_it_printed(tmp_path, capsys):
    out = tmp_path / "fit.jsonl"
    assert (
        plan.main(["fit", "hardware=h100", "schemes=tsp,tp", "recomputes=full", "seq_multiple=1024", f"out={out}"]) == 0
    )
    text = capsys.readouterr().out
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert recs and all(r["kind"] == "fit" and r["recompute"] == "full" and r["status"] == "ok" for r in recs)
    assert {r["scheme"] for r in recs} == {"tsp", "tp"} and all(r["max_seq_len"] % 1024 == 0 for r in recs)
    tsp = next(r for r in recs if r["scheme"] == "tsp")
    assert f"{tsp['max_seq_len']:,}" in text and f"wrote {len(recs)} fit records" in text
