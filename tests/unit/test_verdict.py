"""The verdict (tspbench/predict/verdict.py, docs/method.md#verdict): a ratio's band comes from shared scenarios, the
answer is one of three, and the planner's fit rule leaves the allocator's reserve and the runtime's headroom."""

from __future__ import annotations

import pytest

from tspbench.config import model_preset
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel import Workload
from tspbench.predict.planner import ALLOCATOR_RESERVE, RUNTIME_HEADROOM, PlanRequest, fits_device, plan
from tspbench.predict.verdict import (
    CENTRAL,
    RANGES,
    VERDICTS,
    Band,
    Side,
    compare,
    ratio_band,
    scenarios,
    side_of,
    verdict,
)

LLAMA7B, S128K = model_preset("llama7b"), 131072


def _side(par: ParallelConfig, batch: int = 1, seq_len: int = S128K) -> Side:
    return Side(par, batch, Workload(LLAMA7B, seq_len, batch), "mi300x", 1024)


TSP = _side(ParallelConfig(scheme="tsp", degree=8, recompute="full"))
FSDP = _side(ParallelConfig(scheme="fsdp_sp", degree=8, sp_variant="ulysses", recompute="full"))


def test_every_combination_of_the_ranges_is_a_scenario():
    s = scenarios()
    assert len(s) == 108 == len(set(s)) and CENTRAL in s
    assert {x.overlap for x in s} == {"schedule", "ideal"} and {x.kernels for x in s} == {"flat", "shape"}
    assert [r.name for r in RANGES][-2:] == ["overlap", "kernel pricing"]


def test_band_prices_both_sides_under_the_same_scenario():
    band = ratio_band(TSP, FSDP)
    ratios = [TSP.tokens_per_s_per_gpu(s) / FSDP.tokens_per_s_per_gpu(s) for s in scenarios()]
    assert (band.low, band.high) == pytest.approx((min(ratios), max(ratios)))
    assert band.low <= band.central <= band.high
    assert band.central == pytest.approx(TSP.tokens_per_s_per_gpu() / FSDP.tokens_per_s_per_gpu())
    # the rule it must not be: the low of one side over the high of the other is a far wider (wrong) band
    a = [TSP.tokens_per_s_per_gpu(s) for s in scenarios()]
    b = [FSDP.tokens_per_s_per_gpu(s) for s in scenarios()]
    assert min(a) / max(b) < band.low - 0.1 and max(a) / min(b) > band.high + 0.1


def test_three_answers_and_the_resolution():
    assert verdict(Band(1.05, 1.10, 1.20)) == "ahead"
    assert verdict(Band(0.80, 0.90, 0.95)) == "behind"
    assert verdict(Band(0.95, 1.00, 1.10)) == "within the model's error"
    assert verdict(Band(1.005, 1.01, 1.015)) == "within the model's error"  # clears 1, not by 2%
    assert set(VERDICTS) == {"ahead", "behind", "within the model's error"}


def test_compare_names_what_moves_it_most_and_records_it():
    c = compare(TSP, FSDP, "TSP", "FSDP×SP", "a test setting")
    assert c.verdict in VERDICTS and any(r.name in c.moves_most for r in RANGES)
    rec = c.record()
    assert rec["kind"] == "verdict" and rec["ratio_low"] <= rec["ratio_central"] <= rec["ratio_high"]
    assert c.sentence().startswith("TSP ÷ FSDP×SP = ") and "a test setting" == rec["setting"]


def test_central_is_the_planners_number():
    req = PlanRequest(LLAMA7B, S128K, 1024, "mi300x", schemes=("tsp",), degrees=(8,), recomputes=("full",))
    lay = plan(req)[0][0]
    side = side_of(lay, LLAMA7B, S128K, "train", "mi300x", 1024)
    assert side.tokens_per_s_per_gpu() == pytest.approx(lay.tokens_per_s_per_gpu)


def test_the_fit_leaves_the_allocators_reserve_and_the_runtimes_headroom():
    cap = 192e9
    assert fits_device(150e9, cap) and not fits_device(180.5e9, cap)  # 180.5 × 1.1 + 2 = 200.6 GB
    assert fits_device(180.5e9, cap, reserve=0.0, headroom=0.0)
    edge = (cap - RUNTIME_HEADROOM) / (1 + ALLOCATOR_RESERVE)
    assert fits_device(edge, cap) and not fits_device(edge * 1.001, cap)


def test_the_record_guard_knows_the_three_answers():
    from tspbench.record.kinds import VERDICTS as GUARDED

    assert GUARDED == VERDICTS


def test_verdict_record_keys_are_documented():
    from pathlib import Path

    from tspbench.record.kinds import guard_kind

    text = (Path(__file__).resolve().parents[2] / "docs" / "records.md").read_text()
    text = text.split("## Verdict records", 1)[1].split("\n## ", 1)[0]
    documented = {
        k for line in text.splitlines() if line.startswith("| `") for k in line.split(" | ")[0].split("`")[1::2]
    }
    rec = compare(TSP, FSDP, "TSP", "FSDP×SP", "s").record()
    assert set(guard_kind(rec, "verdict")) == documented
