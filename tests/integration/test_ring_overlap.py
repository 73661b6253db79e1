"""Ring attention (`sp_variant=ring`) overlaps its K/V hops with the flash kernels in the issue order of the code
(tspbench/schemes/ops/ring_attention.py, docs/method.md#choice-sp-variant).

A real 4-rank gloo training step of `sp` with the ring records when each hop is posted and waited and when each
step's kernels start. Per layer:
forward   the hop that brings step t+1's [K; V] block is posted before step t's kernels and waited after them;
backward  the [dK; dV] accumulator of step s travels back while step s−1's kernel backward runs.
The checker is shown to fail on a synchronous schedule (post, wait, compute).
"""

from __future__ import annotations

import json

import pytest
from overlap_events import index_of, record_step_events, synchronous

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig

pytestmark = pytest.mark.xdist_group("ring_overlap")  # one worker: the module fixture spawns the ranks once

TINY = ModelConfig(name="tiny", vocab_size=128, dim=64, n_layers=2, n_heads=8, n_kv_heads=2, ffn_hidden=128)
SIGMA, SEQ = 4, 32


def violations(events: list, layer: str = "layer0") -> list[str]:
    """Every rule of the module docstring that the event list breaks (empty: the schedule overlaps)."""
    ev = [tuple(e) for e in events]
    bad: list[str] = []

    def at(kind: str, label: str) -> int:
        return index_of(ev, kind, label, bad)

    def around(hop: str, step: str) -> None:  # post hop < compute step < wait hop
        p, c, w = at("post", hop), at("compute", step), at("wait", hop)
        if min(p, c, w) >= 0 and not p < c < w:
            bad.append(f"{hop} does not surround {step}")

    fwd, bwd = f"ring_attn:{layer}:fwd", f"ring_attn:{layer}:bwd"
    for t in range(SIGMA - 1):
        around(f"{fwd}:hop{t + 1}", f"{fwd}:step{t}")
    for s in range(1, SIGMA):
        around(f"{bwd}:hop{s}", f"{bwd}:step{s - 1}")
    return bad


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> list:
    from tspbench.spawn import spawn

    out = tmp_path_factory.mktemp("ring_overlap") / "events.json"
    spawn(record_step_events, SIGMA, TINY, ParallelConfig(scheme="sp", degree=SIGMA, sp_variant="ring"), SEQ, str(out))
    return json.loads(out.read_text())


def test_ring_attention_hops_overlap_the_kernels(events):
    assert [e for e in events if e[1].startswith("ring_attn:layer0")], "no ring-attention events recorded"
    assert violations(events) == []
    assert violations(events, "layer1") == []


def test_checker_fails_on_a_synchronous_schedule(events):
    assert len(violations(synchronous(events))) == 2 * (SIGMA - 1)  # every forward and backward hop of layer 0
