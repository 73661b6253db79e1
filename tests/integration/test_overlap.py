"""TSP's overlap exists in the issue order of the code, not only in the model (docs/method.md#tsp-attention,
#tsp-mlp, #tsp-backward).

A real 4-rank gloo step of TSP (kv_bucket_heads=1: two K/V buckets per owner) records, in the CommLog, when each
asynchronous collective is posted and waited and when each piece of compute starts. What must hold, per layer:
forward   owner r+1's broadcast is posted before owner r's attention runs and waited after it; K/V bucket b+1's
          all-gather is posted before bucket b's attention; the ring's next hop is posted before the current
          shard's GEMMs and waited after them.
backward  the same for the re-broadcast, the re-gather and both rings (weights and gradients); the reduce of owner
          r's weight gradient is waited only after owner r+1's attention ran; a bucket's dK/dV reduce-scatter is
          posted before the next bucket's attention and waited after it.
The checker is shown to fail on a synchronous schedule (post, wait, compute), so passing says something.
"""

from __future__ import annotations

import json

import pytest
from overlap_events import index_of, record_step_events, synchronous

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig

# one worker runs this module: its module-scoped fixture (a spawned rank group / a build) then runs once, not per worker
pytestmark = pytest.mark.xdist_group("overlap")

TINY = ModelConfig(name="tiny", vocab_size=128, dim=64, n_layers=2, n_heads=8, n_kv_heads=8, ffn_hidden=128)
D, SEQ = 4, 32
BUCKETS = TINY.n_kv_heads // D  # kv_bucket_heads=1


def violations(events: list, layer: str = "layer0") -> list[str]:
    """Every rule of the module docstring that the event list breaks (empty: the schedule overlaps)."""
    ev = [tuple(e) for e in events]
    bad: list[str] = []

    def at(kind: str, label: str) -> int:
        return index_of(ev, kind, label, bad)

    def rule(first: tuple[str, str], then: tuple[str, str]) -> None:
        i, j = at(*first), at(*then)
        if i >= 0 and j >= 0 and not i < j:
            bad.append(f"{first} not before {then}")

    for ph in ("fwd", "bwd"):
        for r in range(D):
            for b in range(BUCKETS - 1):  # the next bucket in flight while this one computes
                gather = f"all_gather:{layer}:{ph}:owner{r}:bucket{b + 1}"
                rule(("post", gather), ("compute", f"attention:{layer}:{ph}:owner{r}:bucket{b}"))
                rule(("compute", f"attention:{layer}:{ph}:owner{r}:bucket{b}"), ("wait", gather))
            if r + 1 < D:  # the next owner's shard in flight while this one computes
                bcast = f"broadcast:{layer}:{ph}:owner{r + 1}"
                rule(("post", bcast), ("compute", f"attention:{layer}:{ph}:owner{r}:bucket0"))
                rule(("compute", f"attention:{layer}:{ph}:owner{r}:bucket{BUCKETS - 1}"), ("wait", bcast))
        step, hop = ("step", "hop") if ph == "fwd" else ("bwd_step", "bwd_hop")
        for t in range(D - 1):  # the MLP ring: the next shard's hop around the current GEMMs
            label = f"mlp:{layer}:{ph}:{hop}{t + 1}"
            rule(("post", label), ("compute", f"mlp:{layer}:{ph}:{step}{t}"))
            rule(("compute", f"mlp:{layer}:{ph}:{step}{t}"), ("wait", label))
    for r in range(D - 2):  # the weight-gradient reduce of owner r completes behind owner r+1's attention
        rule(("compute", f"attention:{layer}:bwd:owner{r + 1}:bucket0"), ("wait", f"reduce:{layer}:bwd:owner{r}"))
    for r in range(D):
        for b in range(BUCKETS - 1):
            rs = f"reduce_scatter:{layer}:bwd:owner{r}:bucket{b}"
            rule(("post", rs), ("compute", f"attention:{layer}:bwd:owner{r}:bucket{b + 1}"))
            rule(("compute", f"attention:{layer}:bwd:owner{r}:bucket{b + 1}"), ("wait", rs))
    for t in range(1, D - 1):  # the gradient accumulator travels while the next partial dW is computed
        g = f"mlp:{layer}:bwd:grad_hop{t}"
        rule(("post", g), ("compute", f"mlp:{layer}:bwd:bwd_step{t + 1}"))
        rule(("compute", f"mlp:{layer}:bwd:bwd_step{t + 1}"), ("wait", g))
    return bad


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> list:
    from tspbench.spawn import spawn

    out = tmp_path_factory.mktemp("overlap") / "events.json"
    spawn(record_step_events, D, TINY, ParallelConfig(scheme="tsp", degree=D, kv_bucket_heads=1), SEQ, str(out))
    return json.loads(out.read_text())


def test_tsp_issue_order_overlaps(events):
    assert [e for e in events if "layer0" in e[1]], "no layer-0 events recorded"
    assert violations(events) == []
    assert violations(events, "layer1") == []


def test_checker_fails_on_a_synchronous_schedule(events):
    """Rewrite the recorded schedule as a synchronous one (every collective waited right after it is posted,
    before any compute that followed the post): the checker must object."""
    assert len(violations(synchronous(events))) > 10
