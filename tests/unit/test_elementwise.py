"""The elementwise term of the time model (tspbench/predict/costmodel/elementwise.py, docs/method.md#elementwise)
against the bytes the model code's own ops move, counted op by op (tspbench/predict/traffic.py)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from tspbench.config import ModelConfig
from tspbench.model import build_model, synthetic_batch, token_loss_sum
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel.elementwise import (
    COMPILED,
    EAGER,
    RERUN_ELEMENTWISE,
    Traffic,
    block_bytes,
    elementwise_time_s,
    head_bytes,
)
from tspbench.predict.costmodel.workload import Workload
from tspbench.predict.traffic import ElementwiseTraffic

CFG = ModelConfig(vocab_size=1000, dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=688)
B, S = 2, 128
TOLERANCE = 0.08
"""The closed form leaves out per-position tables (RoPE's cos/sin, [S, d/2] per layer) and RoPE's strided-slice
backward scatter; on this model they are a few percent of the count, so 8% separates a right table from a wrong rule
(the broken variant below is off by > 20%)."""


def counted(recompute: str) -> dict[str, int]:
    """Bytes the single-device model's elementwise ops move in one forward (loss included) and one backward, bf16."""
    model = build_model(CFG, 0, dtype=torch.bfloat16, recompute=recompute)
    tokens, targets = synthetic_batch(CFG, B, S, 0)
    traffic = ElementwiseTraffic()
    with traffic:
        with traffic.phase("forward"):
            loss = token_loss_sum(model(tokens), targets)
        with traffic.phase("backward"):
            loss.backward()
    return traffic.bytes


def closed_form(recompute: str, table: Traffic = EAGER) -> dict[str, float]:
    par = ParallelConfig(scheme="single", degree=1, recompute=recompute)
    work = Workload(CFG, S, B, mode="train", dtype="bfloat16")
    fwd, bwd = block_bytes(par, work, table, 0), block_bytes(par, work, table, 1)
    rerun = fwd if recompute in RERUN_ELEMENTWISE else 0.0
    return {
        "forward": CFG.n_layers * fwd + head_bytes(par, work, table, 0),
        "backward": CFG.n_layers * (bwd + rerun) + head_bytes(par, work, table, 1),
    }


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_closed_form_matches_the_bytes_the_model_code_moves(recompute):
    count, model = counted(recompute), closed_form(recompute)
    for phase in ("forward", "backward"):
        assert model[phase] == pytest.approx(count[phase], rel=TOLERANCE), (phase, model[phase], count[phase])


def test_a_wrong_backward_rule_fails_the_same_check():
    """Non-vacuous: the first draft's rule (every backward moves twice its forward's bytes) is off by more than the
    tolerance on the same count."""
    eager = EAGER
    twice = Traffic(*((f, 2 * f) for f, _ in (eager.norm, eager.add, eager.rope, eager.swiglu, eager.loss)))
    count, model = counted("none"), closed_form("none", twice)
    assert model["backward"] != pytest.approx(count["backward"], rel=TOLERANCE)


def test_geometry_shards_the_work_as_each_scheme_runs_it():
    """TSP: every rank 1/D of the tokens at full width, so 1/D of single's bytes; TP without Megatron-SP: the
    residual stream replicated (every rank's norms on all tokens), the heads and channels sharded; TP with
    Megatron-SP: the stream sharded too."""
    model = ModelConfig(vocab_size=32000, dim=4096, n_layers=2, n_heads=32, n_kv_heads=8, ffn_hidden=11008)
    work = Workload(model, 8192, 1, mode="train", dtype="bfloat16")
    single = block_bytes(ParallelConfig(scheme="single", degree=1), work, EAGER, 0)
    tsp = block_bytes(ParallelConfig(scheme="tsp", degree=8), work, EAGER, 0)
    tp = block_bytes(ParallelConfig(scheme="tp", degree=8), work, EAGER, 0)
    msp = block_bytes(ParallelConfig(scheme="tp_msp", degree=8), work, EAGER, 0)
    assert tsp == pytest.approx(single / 8)
    stream = 8192 * 2 * 4096 * (36 + 6)
    assert tp == pytest.approx(stream + (single - stream) / 8)
    assert msp == pytest.approx(single / 8)
    assert tsp < tp


def test_compiled_moves_less_none_prices_nothing_and_a_bad_value_is_refused():
    par = ParallelConfig(scheme="single", degree=1, recompute="full")
    work = Workload(CFG, S, B, mode="train", dtype="bfloat16")
    eager = elementwise_time_s(par, work, 1e12, "eager", CFG.n_layers, True)
    compiled = elementwise_time_s(par, work, 1e12, "compiled", CFG.n_layers, True)
    assert 0 < compiled < eager / 3
    assert elementwise_time_s(par, work, 1e12, "none", CFG.n_layers, True) == 0.0
    assert elementwise_time_s(par, replace(work, mode="decode"), 1e12, "eager", CFG.n_layers, True) == 0.0
    assert elementwise_time_s(par, work, 2e12, "eager", CFG.n_layers, True) == pytest.approx(eager / 2)
    assert COMPILED.add == (0, 0)
    with pytest.raises(
        ValueError, match=re.escape("Pricing.elementwise='fused' is unknown; allowed: eager, compiled, none")
    ):
        elementwise_time_s(par, work, 1e12, "fused", CFG.n_layers, True)


def test_a_published_torch_compile_row_is_priced_compiled():
    from tspbench.predict.published import default_files, load_rows, stack_pricing

    rows = {r.id: r for r in load_rows(default_files())}
    assert stack_pricing(rows["tt_h100_llama31_8b_fsdp_compile"]).elementwise == "compiled"
    assert stack_pricing(rows["tt_h100_llama31_8b_cp4_128k"]).elementwise == "compiled"
    assert stack_pricing(rows["tt_h100_llama31_8b_fsdp"]).elementwise == "eager"
