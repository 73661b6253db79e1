"""Collective accounting: what each scheme issues per layer equals the formulas of docs/method.md#communication exactly
(elements received per rank, bandwidth-optimal volume convention in tspbench.schemes.comm), and the
analytic cost model (tspbench.predict.costmodel.comm_per_layer) predicts the same numbers as the code counts."""

from __future__ import annotations

import pytest
from parity_cases import ALL

from tspbench.predict.costmodel import Workload, comm_embed_head, comm_per_layer


def formula_fwd(vc) -> float:
    m, B, S = vc.model, vc.batch, vc.seq_len
    h, g, d = m.dim, m.n_heads // m.n_kv_heads, m.head_dim
    n = vc.degree
    kv = _kv_heads_per_rank(vc)  # n_kv/T, or 1 where a KV head is replicated over T/n_kv ranks
    if vc.scheme in ("tp", "tp_msp"):
        return 4 * B * S * h * (n - 1) / n
    if vc.scheme == "sp" and vc.sp_variant == "ulysses":  # all-to-all of packed [Q; K; V] in, of O out
        return B * S / n * (2 * h + 2 * h / g) * (n - 1) / n
    if vc.scheme == "sp":
        return 2 * B * S * (h / g) * (n - 1) / n
    if vc.scheme == "tp_sp" and vc.sp_variant == "ulysses":  # the T axis's 2 all-reduces + Ulysses on n/T heads
        t = vc.tp
        s = n // t
        return 4 * B * (S / s) * h * (t - 1) / t + B * S / s * (2 * h + 2 * h / g) / t * (s - 1) / s
    if vc.scheme == "tp_sp":
        t = vc.tp
        s = n // t
        return 4 * B * (S / s) * h * (t - 1) / t + 2 * B * S * kv * d * (s - 1) / s  # kv·d = h/(g·T)
    if vc.scheme == "tsp":  # D owner shards of kv KV heads each (n·kv = n_kv, or D replicated heads)
        W = (2 * m.n_heads * d + 2 * n * kv * d) * h + 3 * m.ffn_hidden * h  # (2 + 2/g + 3F)·h²
        K = 2 * B * S * n * kv * d  # 2·B·S·h/g
        return (W + K) * (n - 1) / n
    if vc.scheme == "fsdp_sp":  # FSDP all-gathers the block unit (W + its 2 norm weights) over N = dp·Σ ranks
        N = vc.dp * n
        W = (2 * m.n_heads * d + 2 * m.n_kv_heads * d) * h + 3 * m.ffn_hidden * h
        if vc.sp_variant == "ulysses":  # sp's Ulysses all-to-alls beside the unit's all-gather
            return (W + 2 * h) * (N - 1) / N + B * S / n * (2 * h + 2 * h / g) * (n - 1) / n
        return (W + 2 * h) * (N - 1) / N + 2 * B * S * (h / g) * (n - 1) / n
    raise AssertionError(vc.scheme)


def _kv_heads_per_rank(vc) -> int:
    t = {"tp_sp": vc.tp, "sp": 1}.get(vc.scheme, vc.degree)
    return max(vc.model.n_kv_heads // t, 1)


def fsdp_unit_volume(vc) -> float:
    """fsdp_sp: one all-gather (or reduce-scatter) of a block unit, per rank received."""
    m, N = vc.model, vc.dp * vc.degree
    W = (2 * m.n_heads * m.head_dim + 2 * m.n_kv_heads * m.head_dim) * m.dim + 3 * m.ffn_hidden * m.dim
    return (W + 2 * m.dim) * (N - 1) / N


def formula_bwd(vc) -> float:
    """No recompute. TP/Megatron-SP mirror their forward collectives; SP/TP×SP reduce-scatter dK/dV (ring:
    reverse hops of the same size); Ulysses runs the inverse all-to-alls of the gradients (the same); TSP
    re-broadcasts and re-gathers (docs/method.md#choice-backward), reduces dW to owners, reduce-scatters dK/dV and
    runs a second weight ring plus a gradient ring: 2W + 2K. FSDP×SP (docs/method.md#fsdp-sp): the unit all-gathered
    again and its gradient reduce-scattered, dK/dV as sp."""
    f = formula_fwd(vc)
    if vc.scheme == "fsdp_sp":
        return f + fsdp_unit_volume(vc)
    return 2 * f if vc.scheme == "tsp" else f


CASES = [
    k for k, (w, vc, b) in ALL.items() if b is None and vc.scheme != "single" and (vc.dp == 1 or vc.scheme == "fsdp_sp")
]


@pytest.mark.parametrize("cid", CASES)
def test_layer_volume_equals_formula(parity_results, cid):
    world, vc, _ = ALL[cid]
    got = parity_results(world)[cid]["comm_layer0"]
    assert got["fwd"] == pytest.approx(formula_fwd(vc), rel=1e-12, abs=0)
    if vc.recompute == "none":
        assert got["bwd"] == pytest.approx(formula_bwd(vc), rel=1e-12, abs=0)
    elif vc.recompute == "selective":  # only the attention kernel is replayed: the ring's hops are its part
        assert got["bwd"] == pytest.approx(formula_bwd(vc) + selective_replay(vc), rel=1e-12, abs=0)
    elif vc.scheme == "fsdp_sp":  # full: the unit stays gathered for backward; only the sequence exchange replays
        replay = formula_fwd(vc) - fsdp_unit_volume(vc) if vc.sp_variant == "ulysses" else selective_replay(vc)
        assert got["bwd"] == pytest.approx(formula_bwd(vc) + replay, rel=1e-12, abs=0)
    else:  # full recompute replays the block's forward collectives during backward, never fewer
        assert got["bwd"] > formula_bwd(vc)


def selective_replay(vc) -> float:
    """recompute=selective re-runs the core attention in backward, and for token-sharded schemes the core
    includes the K/V exchange (TransformerEngine's context-parallel attention): one more forward K/V volume."""
    if vc.scheme not in ("sp", "tp_sp", "fsdp_sp") or (vc.scheme == "tp_sp" and vc.degree == vc.tp):
        return 0.0
    if vc.sp_variant == "ulysses":  # the all-to-alls stay outside the recomputed kernel (docs/method.md#ulysses)
        return 0.0
    m, n = vc.model, vc.degree
    t = vc.tp if vc.scheme == "tp_sp" else 1
    s = n // t
    return 2 * vc.batch * vc.seq_len * m.head_dim * max(m.n_kv_heads // t, 1) * (s - 1) / s


@pytest.mark.parametrize(
    "cid", [c for c in CASES if ALL[c][1].recompute in ("none", "selective") or ALL[c][1].scheme == "fsdp_sp"]
)
def test_cost_model_predicts_counted_volume(parity_results, cid):
    world, vc, _ = ALL[cid]
    got = parity_results(world)[cid]["comm_layer0"]
    pred = comm_per_layer(
        vc.parallel(), Workload(vc.model, vc.seq_len, vc.batch, mode="train"), regather_kv=vc.scheme == "tsp"
    )
    assert pred["fwd_total"] == pytest.approx(got["fwd"], rel=1e-12)
    assert pred["bwd_total"] == pytest.approx(got["bwd"], rel=1e-12)


@pytest.mark.parametrize(
    "cid", [c for c in CASES if ALL[c][1].recompute == "none" and ALL[c][1].scheme in ("tp", "tsp", "fsdp_sp")]
)
def test_collective_pattern(parity_results, cid):
    """Not just the volume: the ops. TP: 2 all-reduces forward. TSP: D broadcasts, D·n_b K/V all-gathers (n_b head
    buckets per owner, kv_bucket_heads) and D−1 weight-ring hops forward, and no all-reduce inside a layer.
    FSDP×SP: the unit all-gathered once forward, once backward, its gradient reduce-scattered once."""
    world, vc, _ = ALL[cid]
    ops = parity_results(world)[cid]["comm_ops_layer0"]
    fwd = [o[0] for o in ops if o[1] == "fwd"]
    D = vc.degree
    if vc.scheme == "tp":
        assert fwd == ["all_reduce", "all_reduce"]
    elif vc.scheme == "fsdp_sp":  # one all-gather of the unit (FSDP) forward, again + a reduce-scatter backward
        n = vc.dp * vc.degree
        unit = [o for o in ops if o[2] == round(fsdp_unit_volume(vc) * n / (n - 1))]  # (op, phase, numel, recv)
        assert [(o[0], o[1]) for o in unit] == [("all_gather", "fwd"), ("all_gather", "bwd"), ("reduce_scatter", "bwd")]
        assert "all_reduce" not in [o[0] for o in ops]
    else:
        kv_owner = max(vc.model.n_kv_heads // D, 1)  # KV heads of one owner's shard
        n_b = -(-kv_owner // vc.kv_bucket_heads) if vc.kv_bucket_heads else 1
        assert fwd.count("broadcast") == D and fwd.count("all_gather") == D * n_b and fwd.count("send_recv") == D - 1
        assert "all_reduce" not in [o[0] for o in ops]
        bwd = [o[0] for o in ops if o[1] == "bwd"]
        assert bwd.count("reduce") == D and bwd.count("reduce_scatter") == D * n_b
        assert bwd.count("send_recv") == 2 * (D - 1)  # weight ring + gradient ring


@pytest.mark.parametrize(
    "cid",
    [
        c
        for c in CASES
        if ALL[c][1].scheme == "tp_sp" and ALL[c][1].recompute == "none" and 1 < ALL[c][1].tp < ALL[c][1].degree
    ],
)
def test_tp_sp_tensor_axis_pattern(parity_results, cid):
    """Megatron-SP on T (default): forward, per layer, 2 reduce-scatters over T (beside the all-gathers, which the
    K/V exchange over Σ also issues) and no all-reduce; the plain ablation: 2 all-reduces over T, no reduce-scatter."""
    world, vc, _ = ALL[cid]
    fwd = [o[0] for o in parity_results(world)[cid]["comm_ops_layer0"] if o[1] == "fwd"]
    if vc.msp:
        assert fwd.count("reduce_scatter") == 2 and "all_reduce" not in fwd
        assert fwd.count("all_gather") == 2 + (vc.sp_variant == "allgather")
    else:
        assert fwd.count("all_reduce") == 2 and "reduce_scatter" not in fwd


@pytest.mark.parametrize(
    "cid", [c for c in CASES if ALL[c][1].recompute == "none" and ALL[c][1].sp_variant == "ulysses"]
)
def test_ulysses_collective_pattern(parity_results, cid):
    """Ulysses: exactly two all-to-alls per layer forward (packed [Q; K; V] to head shards, O back), their inverses
    backward, each receiving (Σ−1)/Σ of its buffer: (h + 2h/g)·B·S/Σ elements in, h·B·S/Σ out."""
    world, vc, _ = ALL[cid]
    m, t = vc.model, vc.tp or 1
    n = vc.degree // t  # Σ
    tokens = vc.batch * vc.seq_len / n
    qkv, o = tokens * (m.dim + 2 * m.dim * m.n_kv_heads / m.n_heads) / t, tokens * m.dim / t  # tp_sp: n/T heads
    ops = parity_results(world)[cid]["comm_ops_layer0"]
    for phase, sizes in (("fwd", [qkv, o]), ("bwd", [o, qkv])):
        got = [(op[0], op[2], op[3]) for op in ops if op[1] == phase and op[0] == "all_to_all"]  # tp_sp: + T axis
        assert got == [("all_to_all", size, size * (n - 1) / n) for size in sizes]


EDGE_CASES = [
    k for k, (w, vc, b) in ALL.items() if b is None and vc.scheme != "single" and vc.dp == 1 and vc.recompute == "none"
]


@pytest.mark.parametrize("cid", EDGE_CASES)
def test_embedding_and_head_volume(parity_results, cid):
    """The vocabulary-parallel embedding, LM head and cross-entropy (tp, tp_msp, tp_sp with T > 1) move
    exactly what costmodel.comm_embed_head says; the replicated ones (sp, tsp, T = 1) move nothing."""
    world, vc, _ = ALL[cid]
    got = parity_results(world)[cid]["comm_edges"]
    pred = comm_embed_head(vc.parallel(), Workload(vc.model, vc.seq_len, vc.batch, mode="train"))
    for tag in ("embed", "head"):
        for phase in ("fwd", "bwd"):
            assert got[tag][phase] == pytest.approx(pred[tag][phase], rel=1e-12, abs=0), (tag, phase)
    assert (got["head"]["fwd"] > 0) == (vc.parallel().vocab_degree > 1 or vc.scheme == "fsdp_sp")


def test_embed_head_formula_by_hand():
    """tp, T = 2, B·S = 64, h = 64: embed 2·64·64·½ = 4096; head 6·64·½ = 192 forward, 4096 backward."""
    from tspbench.config import ModelConfig
    from tspbench.parallel import ParallelConfig

    m = ModelConfig(vocab_size=128, dim=64)
    got = comm_embed_head(ParallelConfig("tp", 2), Workload(m, 32, 2, mode="train"))
    assert got == {"embed": {"fwd": 4096.0, "bwd": 0.0}, "head": {"fwd": 192.0, "bwd": 4096.0}}
