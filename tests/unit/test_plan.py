"""tspbench.plan: enumerates the implemented layouts, keeps only those that fit, ranks by cluster tokens/s,
and its memory is the estimate's on the paper's 8-GPU 128K memory setting (slow: fake-tensor estimates)."""

from __future__ import annotations

import pytest

from tspbench import plan
from tspbench.config import ParallelConfig, model_preset
from tspbench.paper.tables import PAPER_MEMORY_SETTING
from tspbench.predict.costmodel import load_hardware, memory_breakdown

S128K = 131072


def test_plan_ranks_fitting_layouts():
    model, hw = model_preset("llama7b"), load_hardware("mi300x")
    ranked, n = plan.plan(model, S128K, 64, "mi300x", max_degree=16)
    schemes = {lay.par.scheme for lay in ranked}
    assert n > len(ranked) > 0 and {"tsp", "tp", "sp", "tp_sp"} <= schemes
    assert all(lay.mem_bytes <= hw.mem_bytes for lay in ranked)
    assert [lay.tokens_per_s for lay in ranked] == sorted((lay.tokens_per_s for lay in ranked), reverse=True)
    assert all(lay.par.dp * lay.par.degree == 64 for lay in ranked)


def test_plan_cli(capsys):
    assert plan.main(["model=llama7b", "seq_len=32768", "gpus=16", "hardware=h100", "top=3"]) == 0
    out = capsys.readouterr().out
    assert "layouts enumerated" in out and "margin" in out
    assert plan.main(["gpus"]) == 2
    assert "key=value" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["tsp", "tp", "sp"])
def test_plan_memory_equals_estimate_on_paper_setting(scheme):
    from tspbench.predict.estimate import estimate

    model = model_preset("llama7b")
    par = ParallelConfig(scheme=scheme, degree=8, recompute=PAPER_MEMORY_SETTING.recompute)
    ranked, _ = plan.plan(model, S128K, 8, "mi300x", max_degree=8, batches=(PAPER_MEMORY_SETTING.batch,))
    mine = [x for x in ranked if x.par == par]
    want = memory_breakdown(model, par, S128K, PAPER_MEMORY_SETTING.batch)["total"]
    assert mine and mine[0].mem_bytes == want
    est = estimate(model, par, S128K, PAPER_MEMORY_SETTING.batch, hardware="h100")
    assert want == pytest.approx(est["mem_bytes"]["total"], rel=0.01)
