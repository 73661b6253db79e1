"""TSP's overlap exists in the issue order of the code, not only in the model (docs/method.md#tsp-attention,
#tsp-mlp, #tsp-backward, #choice-overlap).

Real 4-rank gloo steps of TSP (kv_bucket_heads=1: two K/V buckets per owner; recompute=full, so every layer's
forward is replayed in backward; and the MLP's three weight exchanges) record, in the CommLog, when each
asynchronous collective is posted and waited and when each piece of compute starts. What must hold, per layer:
forward   (and the full-recompute replay) owner r+1's first K/V bucket is all-gathered (posted) before owner r's
          attention runs and waited after it (the K/V pipeline across owners); owner r+2's broadcast is posted before
          owner r's attention and waited after it; K/V bucket b+1's all-gather is posted before bucket b's attention;
          the MLP's next shard (ring: the next hop; biring: the next hop each way; broadcast: the next owner's
          broadcast) is posted before the current shard's GEMMs and waited after them.
backward  owner r+1's first K/V bucket is re-gathered before owner r's attention backward and waited after it;
          owner r+1's re-broadcast is posted before owner r's attention and waited after it; the re-gather's next
          bucket and the MLP exchange as in forward (with the gradients' way back: the gradient hops travel while
          the next partial dW is computed, a broadcast MLP's reduce to the owner completes behind the next shard);
          the reduce of owner r's weight gradient is waited only after owner r+1's attention ran; a bucket's dK/dV
          reduce-scatter is posted before the next bucket's attention and waited after it.
The checker is shown to fail on a synchronous schedule (post, wait, compute), and on the owner loop's order before
the K/V pipeline (each owner's first bucket posted where it is waited), so passing says something.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from overlap_events import index_of, posted_at_wait, record_steps_events, synchronous

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig

# one worker runs this module: its module-scoped fixture (a spawned rank group / a build) then runs once, not per worker
pytestmark = pytest.mark.xdist_group("overlap")

TINY = ModelConfig(name="tiny", vocab_size=128, dim=64, n_layers=2, n_heads=8, n_kv_heads=8, ffn_hidden=128)
D, SEQ = 4, 32
BUCKETS = TINY.n_kv_heads // D  # kv_bucket_heads=1
LAYOUTS = {
    exchange: ParallelConfig(scheme="tsp", degree=D, kv_bucket_heads=1, recompute="full", mlp_exchange=exchange)
    for exchange in ("ring", "biring", "broadcast")
}


def _checker(events: list):
    """(bad, rule, at) over one event list: rule(first, then) records a violation unless `first` precedes `then`."""
    ev = [tuple(e) for e in events]
    bad: list[str] = []

    def at(kind: str, label: str) -> int:
        return index_of(ev, kind, label, bad)

    def rule(first: tuple[str, str], then: tuple[str, str]) -> None:
        i, j = at(*first), at(*then)
        if i >= 0 and j >= 0 and not i < j:
            bad.append(f"{first} not before {then}")

    return bad, rule, at


def _around(rule, post: str, compute: str) -> None:
    """post < compute < wait: the collective is in flight while the compute runs."""
    rule(("post", post), ("compute", compute))
    rule(("compute", compute), ("wait", post))


def attention_violations(events: list, layer: str, ph: str) -> list[str]:
    """The owner loop's rules of one phase (fwd or bwd) of one layer (module docstring)."""
    bad, rule, _ = _checker(events)
    last = BUCKETS - 1
    for r in range(D):
        for b in range(BUCKETS - 1):  # the next bucket in flight while this one computes
            gather = f"all_gather:{layer}:{ph}:owner{r}:bucket{b + 1}"
            _around(rule, gather, f"attention:{layer}:{ph}:owner{r}:bucket{b}")
        if r + 1 < D:  # the K/V pipeline: owner r+1's first bucket in flight during owner r's attention
            first = f"all_gather:{layer}:{ph}:owner{r + 1}:bucket0"
            rule(("post", first), ("compute", f"attention:{layer}:{ph}:owner{r}:bucket0"))
            rule(("compute", f"attention:{layer}:{ph}:owner{r}:bucket{last}"), ("wait", first))
        # the weights in flight while owner r computes: r+2's in forward (r+1's is projected before r's attention),
        # r+1's in backward
        ahead = r + 2 if ph == "fwd" else r + 1
        if ahead < D:
            bcast = f"broadcast:{layer}:{ph}:owner{ahead}"
            rule(("post", bcast), ("compute", f"attention:{layer}:{ph}:owner{r}:bucket0"))
            rule(("compute", f"attention:{layer}:{ph}:owner{r}:bucket{last}"), ("wait", bcast))
    if ph == "bwd":
        for r in range(D - 2):  # the weight-gradient reduce of owner r completes behind owner r+1's attention
            rule(("compute", f"attention:{layer}:bwd:owner{r + 1}:bucket0"), ("wait", f"reduce:{layer}:bwd:owner{r}"))
        for r in range(D):
            for b in range(BUCKETS - 1):
                rs = f"reduce_scatter:{layer}:bwd:owner{r}:bucket{b}"
                _around(rule, rs, f"attention:{layer}:bwd:owner{r}:bucket{b + 1}")
    return bad


def mlp_violations(events: list, layer: str, ph: str, exchange: str) -> list[str]:
    """The MLP exchange's rules of one phase of one layer (module docstring)."""
    bad, rule, _ = _checker(events)
    mlp = f"mlp:{layer}:{ph}"
    step = "step" if ph == "fwd" else "bwd_step"
    if exchange == "broadcast":
        bcast = "bcast" if ph == "fwd" else "bwd_bcast"
        for r in range(D - 1):
            _around(rule, f"{mlp}:{bcast}{r + 1}", f"{mlp}:{step}{r}")
        if ph == "bwd":  # the reduce of shard r's gradient completes behind shard r+1's partial dW
            for r in range(D - 1):
                _around(rule, f"{mlp}:reduce{r}", f"{mlp}:{step}{r + 1}")
        return bad
    hop = "hop" if ph == "fwd" else "bwd_hop"
    directions = ("", "ccw_") if exchange == "biring" else ("",)
    for prefix in directions:
        for t in range(D - 1):  # the next shard (each way round) hops while the current one computes
            _around(rule, f"{mlp}:{prefix}{hop}{t + 1}", f"{mlp}:{step}{t}")
        if ph == "bwd":
            for t in range(1, D - 1):  # the gradient accumulator travels while the next partial dW is computed
                _around(rule, f"{mlp}:{prefix}grad_hop{t}", f"{mlp}:{step}{t + 1}")
    return bad


def replay_of(events: list, layer: str) -> list:
    """The events from the full-recompute replay of `layer` on (its forward's labels, issued again in backward)."""
    start = [i for i, e in enumerate(events) if tuple(e) == ("post", f"broadcast:{layer}:fwd:owner0")]
    assert len(start) == 2, f"{layer}: expected its forward and its replay, found {len(start)} starts"
    return events[start[1] :]


def violations(events: list, exchange: str = "ring", layer: str = "layer0") -> list[str]:
    """Every rule of the module docstring that the event list breaks (empty: the schedule overlaps)."""
    replay = replay_of(events, layer)
    bad = []
    for where, ev, ph in (("forward", events, "fwd"), ("replay", replay, "fwd"), ("backward", events, "bwd")):
        bad += [f"{where}: {v}" for v in attention_violations(ev, layer, ph) + mlp_violations(ev, layer, ph, exchange)]
    return bad


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> dict[str, list]:
    from tspbench.spawn import spawn

    out = tmp_path_factory.mktemp("overlap") / "events.json"
    spawn(record_steps_events, D, TINY, LAYOUTS, SEQ, str(out))
    return json.loads(out.read_text())


@pytest.mark.parametrize("exchange", list(LAYOUTS))
def test_tsp_issue_order_overlaps(events, exchange):
    ev = events[exchange]
    assert [e for e in ev if "layer0" in e[1]], "no layer-0 events recorded"
    assert violations(ev, exchange) == []
    assert violations(ev, exchange, "layer1") == []


@pytest.mark.parametrize("exchange", list(LAYOUTS))
def test_checker_fails_on_a_synchronous_schedule(events, exchange):
    """Rewrite the recorded schedule as a synchronous one (every collective waited right after it is posted,
    before any compute that followed the post): the checker must object, in forward, replay and backward, for the
    attention and for the MLP exchange."""
    bad = violations(synchronous(events[exchange]), exchange)
    assert len(bad) > 10
    for where in ("forward", "replay", "backward"):
        assert any(v.startswith(f"{where}: ") and "all_gather" in v for v in bad), where
        assert any(v.startswith(f"{where}: ") and "mlp:" in v for v in bad), where


def test_checker_fails_on_the_order_before_the_kv_pipeline(events):
    """The owner loop before the K/V pipeline posted each owner's first bucket's all-gather where it waited for it
    (after the previous owner's attention): rewritten so, the pipeline rules fail in forward, replay and backward,
    once per owner after the first."""
    old = posted_at_wait(events["ring"], lambda label: label.startswith("all_gather:") and label.endswith(":bucket0"))
    bad = violations(old)
    assert all("bucket0" in v for v in bad), bad
    for where in ("forward", "replay", "backward"):
        late = [v for v in bad if v.startswith(f"{where}: ") and "('post', 'all_gather:layer0" in v]
        assert len(late) == D - 1, (where, late)


# ---------------------------------------------------------------------------------------------- the schedule rule
def test_schedule_rule_credits_what_the_order_issues():
    """costmodel/time.py prices TSP's overlap as the issue order above has it (docs/method.md#choice-overlap):
    Pricing.tsp_kv_pipeline hides each owner's first K/V bucket behind the previous owner's step (off: the
    formula of the code before the pipeline, each owner's first bucket exposed, re-typed here); regather_kv=false
    drops the backward's gathers; the biring's halves cross concurrent links; the broadcast MLP is priced as
    attention's broadcasts."""
    from tspbench.config import model_preset
    from tspbench.predict.costmodel import Workload
    from tspbench.predict.costmodel.collectives import collective_cost_s, tsp_collectives
    from tspbench.predict.costmodel.hardware import load_hardware
    from tspbench.predict.costmodel.params import layer_weight_params_per_rank
    from tspbench.predict.costmodel.time import schedule_exposed_comm_s
    from tspbench.predict.costmodel.workload import Pricing

    hw, llama = load_hardware("mi300x"), model_preset("llama7b")
    on, off = Pricing(), Pricing(tsp_kv_pipeline=False)

    def before(par, work):  # the rule before the K/V pipeline (git history: time.py schedule_exposed_comm_s)
        colls = tsp_collectives(par, work)
        m, b, d = work.model, work.elem_bytes, par.degree
        eff = hw.peak_flops(work.dtype) * hw.matmul_efficiency
        tokens = work.tokens / d
        kernel = tokens * 4 * work.seq_len * m.n_heads * m.head_dim * 0.5 / eff / d
        c_a = tokens * 2 * (layer_weight_params_per_rank(m, par) - 3 * m.ffn_hidden * m.dim / d) / eff + kernel
        c_m = tokens * 2 * 3 * m.ffn_hidden * m.dim / d / eff
        n_b = -(-max(m.n_kv_heads // d, 1) // par.kv_bucket_heads) if par.kv_bucket_heads else 1
        t_b, t_g, t_h, t_r, t_rs = (
            collective_cost_s(c[0], c[1], c[2] * b, c[3], hw, pricing=off)
            for c in (colls[k][0] for k in ("broadcast", "kv", "mlp", "reduce", "kv_rs"))
        )
        gathers = d * (t_g / n_b + (n_b - 1) * max(0.0, t_g / n_b - kernel / n_b))
        fwd = t_b + (d - 1) * max(0.0, t_b - c_a) + gathers + (d - 1) * max(0.0, t_h - c_m)
        back_gathers = d * (t_g / n_b + (n_b - 1) * max(0.0, t_g / n_b - 2 * kernel / n_b))
        bwd = t_b + (d - 1) * max(0.0, t_b - 2 * c_a) + back_gathers + (d - 1) * max(0.0, 2 * t_h - 2 * c_m)
        return fwd + bwd + d * max(0.0, t_r + t_rs - 2 * c_a) + (fwd if par.recompute == "full" else 0.0)

    for seq, d, buckets, rc in ((131072, 8, 0, "full"), (16384, 8, 1, "none"), (32768, 4, 0, "full")):
        work = Workload(llama, seq, 1, mode="train")
        par = ParallelConfig(scheme="tsp", degree=d, kv_bucket_heads=buckets, recompute=rc)
        assert schedule_exposed_comm_s(par, work, hw, pricing=off) == pytest.approx(before(par, work), rel=1e-12)
        assert schedule_exposed_comm_s(par, work, hw, pricing=on) < schedule_exposed_comm_s(par, work, hw, pricing=off)
    work = Workload(llama, 131072, 1, mode="train")
    par = ParallelConfig(scheme="tsp", degree=8, recompute="full")
    op, p, n, span, _count = tsp_collectives(par, work)["kv"][0]
    t_g = collective_cost_s(op, p, n * work.elem_bytes, span, hw)  # one owner's K/V all-gather
    pipelined, kept = (schedule_exposed_comm_s(x, work, hw) for x in (par, replace(par, regather_kv=False)))
    assert pipelined - kept == pytest.approx(t_g)  # kept K/V: the backward's one exposed gather (owner 0's) is gone
    work = Workload(llama, 16384, 1, mode="train")  # hops outlast the shard GEMMs: the exchange shows
    ring, biring, bcast = (
        schedule_exposed_comm_s(ParallelConfig(scheme="tsp", degree=8, mlp_exchange=x), work, hw)
        for x in ("ring", "biring", "broadcast")
    )
    assert bcast < biring < ring


# ---- the gradient sync (docs/method.md#choice-overlap): buckets posted from backward's gradient hooks ------------
# A real step of the single-device model on dp = 2 replicas (each bucket's all-reduce is the DP average: what the time
# model's Pricing.dp_overlap credits; the in-group sums share the code path and are held to being posted in backward by
# tests/parity/test_accounting.py) with buckets of at most 512 elements (several per layer: lone and packed). Rank 0's
# CommLog must show the first
# bucket (the LM head's) posted before the backward of layer 0 (the last block to run) begins, a bucket of layer 1
# posted there too, and every bucket waited only after layer 0's backward has ended (finish_grad_sync); the same
# record rewritten as a synchronous sync (every all-reduce after the backward) must fail the check.
SYNC = ParallelConfig(scheme="single", degree=1, dp=2)


def grad_sync_violations(events: list) -> list[str]:
    """Every rule of the block comment above that the event list breaks (empty: the sync overlaps backward)."""
    ev = [tuple(e) for e in events]
    bad: list[str] = []
    posts = [i for i, (kind, label) in enumerate(ev) if kind == "post" and label.startswith("grad_sync:")]
    waits = [i for i, (kind, label) in enumerate(ev) if kind == "wait" and label.startswith("grad_sync:")]
    layer0 = index_of(ev, "compute", "backward:layer0", bad)
    last_block = index_of(ev, "compute", f"backward:layer{TINY.n_layers - 1}", bad)
    end = index_of(ev, "compute", "backward:embed", bad)
    if bad:
        return bad
    if not 0 <= last_block < layer0 < end:
        bad.append("backward's marks out of order")
    first = index_of(ev, "post", "grad_sync:bucket0", bad)
    if first >= 0 and not first < layer0:
        bad.append("bucket 0 not posted before layer 0's backward began")
    if sum(last_block < i < layer0 for i in posts) < 1:
        bad.append("no bucket posted during layer 1's backward")
    if len(posts) != len(waits) or len(posts) < 4:
        bad.append(f"{len(posts)} posts, {len(waits)} waits")
    if any(i < end for i in waits):
        bad.append("a bucket waited before backward ended")
    return bad


@pytest.fixture(scope="module")
def sync_events(tmp_path_factory) -> list:
    from overlap_events import record_grad_sync_events

    from tspbench.spawn import spawn

    out = tmp_path_factory.mktemp("grad_sync") / "events.json"
    spawn(record_grad_sync_events, SYNC.world_size, TINY, SYNC, SEQ, 512, str(out))
    return json.loads(out.read_text())


def test_grad_sync_overlaps_backward(sync_events):
    assert grad_sync_violations(sync_events) == []


def test_grad_sync_checker_fails_after_backward(sync_events):
    """The synchronous rewrite (every bucket posted and waited after the backward, as the sync was before the overlap)
    breaks the rules."""
    from overlap_events import after_backward

    assert len(grad_sync_violations(after_backward(sync_events, "grad_sync:"))) >= 2


def test_dp_overlap_credits_what_the_hooks_issue():
    """The time model's credit for it (Pricing.dp_overlap, costmodel.time.grad_sync_time_s): under "schedule" the DP
    all-reduce of llama7b at 128K over 128 replicas mostly runs behind the backward, but never less than the last
    bucket's (the embedding's, which nothing follows) stays exposed; switched off, all of it follows the step."""
    from tspbench.config import model_preset
    from tspbench.predict.costmodel import Workload, cluster_throughput, load_hardware
    from tspbench.predict.costmodel.time import grad_sync_time_s
    from tspbench.predict.costmodel.workload import Pricing

    hw, work = load_hardware("mi300x"), Workload(model_preset("llama7b"), 131072, 1, mode="train")
    for scheme in ("tsp", "tp_msp"):
        par = ParallelConfig(scheme=scheme, degree=8, dp=128, recompute="full")
        on, off = (grad_sync_time_s(par, work, hw, 128, pricing=Pricing(dp_overlap=x)) for x in (True, False))
        assert off["exposed_s"] == off["in_group_s"] + off["dp_s"] > 0
        assert 0 < on["exposed_s"] < 0.5 * off["exposed_s"]
        ct_on, ct_off = (
            cluster_throughput(par, work, hw, 1024, overlap="schedule", pricing=Pricing(dp_overlap=x))
            for x in (True, False)
        )
        assert ct_off["step_s"] - ct_on["step_s"] == pytest.approx(off["exposed_s"] - on["exposed_s"], rel=1e-9)
        none = [cluster_throughput(par, work, hw, 1024, overlap="none", pricing=Pricing(dp_overlap=x)) for x in (1, 0)]
        assert none[0]["step_s"] == none[1]["step_s"]  # no overlap rule, no credit
