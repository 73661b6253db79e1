"""The baselines' overlap exists in the issue order of the code, not only in the time model
(docs/method.md#choice-overlap, #ulysses): the TP family's backward as Megatron's default schedule, and
DeepSpeed-Ulysses' overlapped exchanges.

One spawned group of 2 gloo ranks runs a training step of each layout below and records rank 0's CommLog events
(post / wait / compute, in order; tests/overlap_events.py).

TP family (schemes/ops/tensor_parallel.py, after Megatron's LinearWithGradAccumulationAndAsyncCommunication without
--tp-comm-overlap), per layer and per column-parallel entry (attention's Q, K, V; the MLP's gate and up): with
Megatron-SP the saved input piece's re-gather is posted before the dgrad GEMMs and waited after them, the dgrad's
reduce-scatter posted before the wgrad GEMMs and waited after them; without it (tp, tp_sp msp=false) the dgrad's
all-reduce is posted before the wgrad GEMMs and waited after them.

Ulysses (schemes/ops/ulysses.py, DeepSpeed ≥ 0.14.5's DistributedAttention with sp_stream), per layer: forward, Q's
exchange posted before K's projection and waited after it, K's before V's projection; backward, O's gradient exchange
posted after W_O's dgrad GEMM, before its wgrad GEMM and waited after it, dK's exchange posted before V's projection
backward and waited after it, dQ's before K's.

Each checker is shown to fail on the same record rewritten as a synchronous schedule (every collective waited right
after its post), so passing says something.
"""

from __future__ import annotations

import json

import pytest
from overlap_events import index_of, record_steps_events, synchronous

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig

pytestmark = pytest.mark.xdist_group("tp_overlap")  # one worker: the module fixture spawns the ranks once

TINY = ModelConfig(name="tiny", vocab_size=128, dim=64, n_layers=2, n_heads=8, n_kv_heads=8, ffn_hidden=128)
WORLD, SEQ = 2, 32
TP_RUNS = {
    "tp": ParallelConfig(scheme="tp", degree=WORLD),
    "tp_msp": ParallelConfig(scheme="tp_msp", degree=WORLD),
    "tp_sp_plain": ParallelConfig(scheme="tp_sp", degree=WORLD, tp=WORLD, msp=False),
}
ULYSSES = ParallelConfig(scheme="sp", degree=WORLD, sp_variant="ulysses")


def _in_order(ev: list, bad: list[str], *steps: tuple[str, str]) -> None:
    at = [index_of(ev, kind, label, bad) for kind, label in steps]
    if min(at) >= 0 and at != sorted(at):
        bad.append(" < ".join(f"{kind} {label}" for kind, label in steps) + " broken")


def tp_violations(events: list, sequence_parallel: bool, layer: str = "layer0") -> list[str]:
    """Every TP rule of the module docstring that the event list breaks (empty: the backward overlaps)."""
    ev, bad = [tuple(e) for e in events], []
    for name in ("attention", "mlp"):
        lab = f"tp:{layer}:{name}"
        if sequence_parallel:
            ag, rs = f"{lab}:all_gather", f"{lab}:reduce_scatter"
            _in_order(ev, bad, ("post", ag), ("compute", f"{lab}:dgrad"), ("wait", ag))
            _in_order(ev, bad, ("post", rs), ("compute", f"{lab}:wgrad"), ("wait", rs))
        else:
            _in_order(ev, bad, ("compute", f"{lab}:dgrad"), ("post", f"{lab}:all_reduce"))
            ar = f"{lab}:all_reduce"
            _in_order(ev, bad, ("post", ar), ("compute", f"{lab}:wgrad"), ("wait", ar))
    return bad


def ulysses_violations(events: list, layer: str = "layer0") -> list[str]:
    """Every Ulysses rule of the module docstring that the event list breaks (empty: the exchanges overlap)."""
    ev, bad = [tuple(e) for e in events], []
    u = f"ulysses:{layer}"
    _in_order(ev, bad, ("post", f"{u}:fwd:q"), ("compute", f"{u}:fwd:proj_k"), ("wait", f"{u}:fwd:q"))
    _in_order(ev, bad, ("post", f"{u}:fwd:k"), ("compute", f"{u}:fwd:proj_v"), ("wait", f"{u}:fwd:k"))
    do = f"{u}:bwd:do"
    _in_order(ev, bad, ("compute", f"{u}:bwd:wo_dgrad"), ("post", do), ("compute", f"{u}:bwd:wo_wgrad"), ("wait", do))
    _in_order(ev, bad, ("post", f"{u}:bwd:dk"), ("compute", f"{u}:bwd:proj_v"), ("wait", f"{u}:bwd:dk"))
    _in_order(ev, bad, ("post", f"{u}:bwd:dq"), ("compute", f"{u}:bwd:proj_k"), ("wait", f"{u}:bwd:dq"))
    return bad


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> dict:
    from tspbench.spawn import spawn

    out = tmp_path_factory.mktemp("tp_overlap") / "events.json"
    spawn(record_steps_events, WORLD, TINY, {**TP_RUNS, "ulysses": ULYSSES}, SEQ, str(out))
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", list(TP_RUNS))
def test_tp_backward_overlaps_like_megatron(events, name):
    sp = TP_RUNS[name].megatron_sp
    assert [e for e in events[name] if e[1].startswith("tp:layer0:")], "no layer-0 TP events recorded"
    assert tp_violations(events[name], sp) == []
    assert tp_violations(events[name], sp, "layer1") == []


@pytest.mark.parametrize("name", list(TP_RUNS))
def test_tp_checker_fails_on_a_synchronous_schedule(events, name):
    """The re-gather waited before the dgrad GEMMs, the dgrad reduction before the wgrad GEMMs: every rule on
    the two entries' reductions (and re-gathers) breaks."""
    sp = TP_RUNS[name].megatron_sp
    assert len(tp_violations(synchronous(events[name]), sp)) == (4 if sp else 2)


def test_ulysses_exchanges_overlap_like_deepspeed(events):
    assert [e for e in events["ulysses"] if e[1].startswith("ulysses:layer0:")], "no layer-0 Ulysses events"
    assert ulysses_violations(events["ulysses"]) == []
    assert ulysses_violations(events["ulysses"], "layer1") == []


def test_ulysses_checker_fails_on_a_synchronous_schedule(events):
    assert len(ulysses_violations(synchronous(events["ulysses"]))) == 5
