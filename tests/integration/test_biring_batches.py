"""`mlp_exchange=biring` posts both ring directions of a step in ONE `batch_isend_irecv` (forward: the weight pair;
backward: the weight pair, then the gradient pair). NCCL runs each batch as one group on the communicator's single
stream, so two batches run one after the other: the cost model prices the directions as concurrent
(docs/method.md#gpu-review, finding 4), which only one batch per pair delivers. A real 3-rank gloo training step of
TSP counts the calls and their ops (peer, tag)."""

from __future__ import annotations

import json

import pytest
from overlap_events import record_p2p_batches

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.schemes.ops.ring import CCW, CW

TINY = ModelConfig(name="tiny", vocab_size=96, dim=48, n_layers=2, n_heads=6, n_kv_heads=6, ffn_hidden=96)
D, SEQ = 3, 24


@pytest.fixture(scope="module")
def calls(tmp_path_factory) -> list:
    from tspbench.spawn import spawn

    out = tmp_path_factory.mktemp("biring") / "calls.json"
    par = ParallelConfig(scheme="tsp", degree=D, mlp_exchange="biring")
    spawn(record_p2p_batches, D, TINY, par, SEQ, str(out))
    return json.loads(out.read_text())


def test_each_batch_carries_both_directions(calls):
    weights = sorted([CW.weight_tag, CW.weight_tag, CCW.weight_tag, CCW.weight_tag])
    grads = sorted([CW.grad_tag, CW.grad_tag, CCW.grad_tag, CCW.grad_tag])
    tags = [sorted(tag for _, tag in call) for call in calls]
    assert tags and all(t in (weights, grads) for t in tags), tags  # a636d6c: one direction (2 ops) per batch
    peers = {peer for call in calls for peer, _ in call}
    assert peers == {1, 2}  # rank 0's neighbours both ways


def test_batches_per_layer(calls):
    # per layer: forward D − 1 weight batches; backward D − 1 weight batches and D − 1 gradient batches
    hops = D - 1
    assert len(calls) == TINY.n_layers * (hops + hops + hops)
