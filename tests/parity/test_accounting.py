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
    if vc.scheme == "fsdp_sp":  # FSDP all-gathers the block unit (W + its 2 norm weights) over N = dp_shard·Σ ranks
        N = vc.dp_shard * n
        W = (2 * m.n_heads * d + 2 * m.n_kv_heads * d) * h + 3 * m.ffn_hidden * h
        if vc.sp_variant == "ulysses":  # sp's Ulysses all-to-alls beside the unit's all-gather
            return (W + 2 * h) * (N - 1) / N + B * S / n * (2 * h + 2 * h / g) * (n - 1) / n
        return (W + 2 * h) * (N - 1) / N + 2 * B * S * (h / g) * (n - 1) / n
    raise AssertionError(vc.scheme)


def _kv_heads_per_rank(vc) -> int:
    t = {"tp_sp": vc.tp, "sp": 1}.get(vc.scheme, vc.degree)
    return max(vc.model.n_kv_heads // t, 1)


def fsdp_unit_volume(vc) -> float:
    """fsdp_sp: one all-gather (or reduce-scatter) of a block unit over its shard group, per rank received."""
    m, N = vc.model, vc.dp_shard * vc.degree
    W = (2 * m.n_heads * m.head_dim + 2 * m.n_kv_heads * m.head_dim) * m.dim + 3 * m.ffn_hidden * m.dim
    return (W + 2 * m.dim) * (N - 1) / N


def hsdp_all_reduce_volume(vc, unit: float) -> float:
    """fsdp_sp with dp_shard < dp (HSDP): the all-reduce of a unit's 1/N gradient shard over the R = dp/dp_shard
    replicas of its shard group, per rank received: 2·(unit/N)·(R−1)/R (docs/method.md#fsdp-sp)."""
    N, R = vc.dp_shard * vc.degree, vc.dp // vc.dp_shard
    return 2 * unit / N * (R - 1) / R


def fsdp_unit_numel(vc) -> int:
    """fsdp_sp: a block unit's elements (its weights and 2 norms)."""
    m = vc.model
    return (2 * m.n_heads * m.head_dim + 2 * m.n_kv_heads * m.head_dim) * m.dim + 3 * m.ffn_hidden * m.dim + 2 * m.dim


def formula_bwd(vc) -> float:
    """No recompute. TP/Megatron-SP mirror their forward collectives, and Megatron-SP re-gathers the column-parallel
    inputs from the saved pieces (`tp_regather`); SP/TP×SP reduce-scatter dK/dV (ring: reverse hops of the same
    size); Ulysses runs the inverse all-to-alls of the gradients (the same); TSP re-broadcasts and re-gathers
    (docs/method.md#choice-backward), reduces dW to owners, reduce-scatters dK/dV and runs a second weight ring plus
    a gradient ring: 2W + 2K. FSDP×SP (docs/method.md#fsdp-sp): the unit all-gathered again and its gradient
    reduce-scattered, dK/dV as sp."""
    f = formula_fwd(vc)
    if vc.scheme == "fsdp_sp":  # + HSDP's all-reduce of the unit's gradient shard over the replicas
        return f + fsdp_unit_volume(vc) + hsdp_all_reduce_volume(vc, fsdp_unit_numel(vc))
    if vc.scheme == "tsp":  # kept K/V (regather_kv=false): no re-gather, 2W + K
        return 2 * f - (0.0 if vc.regather_kv else tsp_kv_volume(vc))
    return f + tp_regather(vc)


def tsp_kv_volume(vc) -> float:
    """TSP's K/V all-gathers of one forward, per rank received: D owners' [K; V] over the whole sequence,
    2·B·S·h/g·(D−1)/D (D KV heads when each owner holds one replicated head)."""
    n = vc.degree
    return 2 * vc.batch * vc.seq_len * n * _kv_heads_per_rank(vc) * vc.model.head_dim * (n - 1) / n


def tp_regather(vc) -> float:
    """Megatron-SP (tp_msp; tp_sp with msp and T > 1): Megatron's column-parallel linear saves its input's piece and
    re-gathers it in backward, for attention's Q, K, V and the MLP's gate and up: 2 all-gathers of B·(S/Σ)·h over T
    (docs/method.md#communication)."""
    t = {"tp_msp": vc.degree, "tp_sp": vc.tp}.get(vc.scheme, 1)
    if t <= 1 or (vc.scheme == "tp_sp" and not vc.msp):
        return 0.0
    return 2 * vc.batch * vc.seq_len * (t / vc.degree) * vc.model.dim * (t - 1) / t


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
    elif vc.scheme == "tsp":  # full: the replay is one forward (the kept K/V are the replay's)
        assert got["bwd"] == pytest.approx(formula_bwd(vc) + formula_fwd(vc), rel=1e-12, abs=0)
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
    "cid",
    [c for c in CASES if ALL[c][1].recompute in ("none", "selective") or ALL[c][1].scheme in ("fsdp_sp", "tsp")],
)
def test_cost_model_predicts_counted_volume(parity_results, cid):
    world, vc, _ = ALL[cid]
    got = parity_results(world)[cid]["comm_layer0"]
    pred = comm_per_layer(
        vc.parallel(),
        Workload(vc.model, vc.seq_len, vc.batch, mode="train"),
        regather_kv=vc.scheme == "tsp" and vc.regather_kv,
    )
    assert pred["fwd_total"] == pytest.approx(got["fwd"], rel=1e-12)
    assert pred["bwd_total"] == pytest.approx(got["bwd"], rel=1e-12)


@pytest.mark.parametrize(
    "cid",
    [c for c in CASES if ALL[c][1].recompute == "none" and ALL[c][1].scheme in ("tp", "tp_msp", "tsp", "fsdp_sp")],
)
def test_collective_pattern(parity_results, cid):
    """Not just the volume: the ops. TP: 2 all-reduces forward, 2 backward (the dgrad's, Megatron's f).
    TP + Megatron-SP: 2 all-gathers and 2 reduce-scatters forward; backward the 2 inputs re-gathered, the 2 dgrads
    reduce-scattered and the 2 exits' output gradients all-gathered. TSP: D broadcasts, D·n_b K/V all-gathers (n_b head
    buckets per owner, kv_bucket_heads) and D−1 weight-ring hops forward, and no all-reduce inside a layer.
    FSDP×SP: the unit all-gathered once forward, once backward, its gradient reduce-scattered once over the shard
    group (dp_shard·Σ ranks), and with HSDP (dp_shard < dp) its gradient shard all-reduced once over the replicas."""
    world, vc, _ = ALL[cid]
    ops = parity_results(world)[cid]["comm_ops_layer0"]
    fwd = [o[0] for o in ops if o[1] == "fwd"]
    D = vc.degree
    bwd = [o[0] for o in ops if o[1] == "bwd"]
    if vc.scheme == "tp":
        assert fwd == ["all_reduce", "all_reduce"] and bwd == ["all_reduce", "all_reduce"]
    elif vc.scheme == "tp_msp":  # backward: MLP exit's dual, MLP entry (re-gather, dgrad), attention the same
        assert fwd == ["all_gather", "reduce_scatter"] * 2
        assert bwd == ["all_gather", "all_gather", "reduce_scatter"] * 2
    elif vc.scheme == "fsdp_sp":  # one all-gather of the unit (FSDP) forward, again + a reduce-scatter backward
        unit = [o for o in ops if o[2] == fsdp_unit_numel(vc)]  # (op, phase, numel, recv)
        assert [(o[0], o[1]) for o in unit] == [("all_gather", "fwd"), ("all_gather", "bwd"), ("reduce_scatter", "bwd")]
        shard = fsdp_unit_numel(vc) // (vc.dp_shard * D)  # HSDP: the unit's gradient shard, over the replicas
        want = [("all_reduce", "bwd", shard)] if vc.dp_shard < vc.dp else []
        assert [(o[0], o[1], o[2]) for o in ops if o[0] == "all_reduce"] == want
    else:
        kv_owner = max(vc.model.n_kv_heads // D, 1)  # KV heads of one owner's shard
        n_b = -(-kv_owner // vc.kv_bucket_heads) if vc.kv_bucket_heads else 1
        # the MLP's weight exchange (docs/method.md#tsp-mlp): ring D−1 hops, biring D−1 hops each way (of half a
        # shard), broadcast D broadcasts; backward the same again plus the gradients' way back (hops, or reduces)
        hops, mlp_bcasts = {"ring": (D - 1, 0), "biring": (2 * (D - 1), 0), "broadcast": (0, D)}[vc.mlp_exchange]
        assert fwd.count("broadcast") == D + mlp_bcasts and fwd.count("send_recv") == hops
        assert fwd.count("all_gather") == D * n_b
        assert "all_reduce" not in [o[0] for o in ops]
        assert bwd.count("reduce") == D + mlp_bcasts and bwd.count("reduce_scatter") == D * n_b
        assert bwd.count("broadcast") == D + mlp_bcasts
        assert bwd.count("send_recv") == 2 * hops  # weight hops + gradient hops
        assert bwd.count("all_gather") == (D * n_b if vc.regather_kv else 0)  # kept K/V: no re-gather
        if vc.mlp_exchange == "biring":  # each hop carries one half of a shard (⌈c/2⌉ or ⌊c/2⌋ channels)
            c = vc.model.ffn_hidden // D
            sizes = sorted({o[2] for o in ops if o[0] == "send_recv"})
            assert sizes == sorted({3 * vc.model.dim * (c - c // 2), 3 * vc.model.dim * (c // 2)})


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
    """Ulysses (DeepSpeed's overlapped schedule, docs/method.md#ulysses): four all-to-alls per layer forward (Q, K, V
    to head shards, in projection order, then O back), their inverses backward (O's behind W_O's wgrad, then V's, K's
    and Q's), each receiving (Σ−1)/Σ of its buffer: h·B·S/Σ elements for Q and O, (h/g)·B·S/Σ for K and V."""
    world, vc, _ = ALL[cid]
    m, t = vc.model, vc.tp or 1
    n = vc.degree // t  # Σ
    tokens = vc.batch * vc.seq_len / n
    q, kv = tokens * m.dim / t, tokens * m.dim * m.n_kv_heads / m.n_heads / t  # tp_sp: n/T heads
    ops = parity_results(world)[cid]["comm_ops_layer0"]
    for phase, sizes in (("fwd", [q, kv, kv, q]), ("bwd", [q, kv, kv, q])):
        got = [(op[0], op[2], op[3]) for op in ops if op[1] == phase and op[0] == "all_to_all"]  # tp_sp: + T axis
        assert got == [("all_to_all", size, size * (n - 1) / n) for size in sizes]


EDGE_CASES = [
    k for k, (w, vc, b) in ALL.items() if b is None and vc.scheme != "single" and vc.dp == 1 and vc.recompute == "none"
]


@pytest.mark.parametrize("cid", EDGE_CASES)
def test_embedding_and_head_volume(parity_results, cid):
    """The vocabulary-parallel embedding, LM head and cross-entropy (tp, tp_msp, tp_sp with T > 1) move
    exactly what costmodel.comm_embed_head says; the replicated ones (sp, tsp, T = 1) move nothing."""
    vc = ALL[cid][1]
    got = _edges_equal_formula(parity_results, cid)
    assert (got["head"]["fwd"] > 0) == (vc.parallel().vocab_degree > 1 or vc.scheme == "fsdp_sp")


@pytest.mark.parametrize(
    "cid", [k for k, (w, vc, b) in ALL.items() if b is None and vc.scheme == "fsdp_sp" and vc.dp > 1]
)
def test_hsdp_embedding_and_head_volume(parity_results, cid):
    """fsdp_sp with dp > 1: the embedding and head units' collectives over the shard group (dp_shard·Σ ranks) and,
    with HSDP, their gradient shards' all-reduces over the replicas, as costmodel.comm_embed_head says."""
    _edges_equal_formula(parity_results, cid)


def _edges_equal_formula(parity_results, cid) -> dict:
    """Assert the embedding's and the head's counted volume, each phase, equals costmodel.comm_embed_head; return the
    counted one."""
    world, vc, _ = ALL[cid]
    got = parity_results(world)[cid]["comm_edges"]
    pred = comm_embed_head(vc.parallel(), Workload(vc.model, vc.seq_len, vc.batch, mode="train"))
    for tag in ("embed", "head"):
        for phase in ("fwd", "bwd"):
            assert got[tag][phase] == pytest.approx(pred[tag][phase], rel=1e-12, abs=0), (tag, phase)
    return got


GRAD_SYNC_CASES = [
    k for k, (w, vc, b) in ALL.items() if b is None and vc.dp == 1 and vc.decode_steps == 0 and vc.dtype == "float64"
]


@pytest.mark.parametrize("cid", GRAD_SYNC_CASES)
def test_grad_sync_volume_posted_in_backward(parity_results, cid):
    """The in-group gradient sync (docs/method.md#communication: every weight over Σ for sp, the replicated norms,
    embedding and head over D for tsp, ...) moves exactly costmodel.grad_sync_elems, and all of it was posted
    during backward: the log is read as backward ends, before finish_grad_sync runs."""
    from tspbench.predict.costmodel import grad_sync_elems

    world, vc, _ = ALL[cid]
    got = parity_results(world)[cid]["comm_edges"]["grad_sync"]
    want = grad_sync_elems(vc.model, vc.parallel())
    assert got.get("grad_sync", 0.0) == pytest.approx(want, rel=1e-12, abs=0)
    assert got["fwd"] == got["bwd"] == 0.0


def test_embed_head_formula_by_hand():
    """tp, T = 2, B·S = 64, h = 64: embed 2·64·64·½ = 4096; head 6·64·½ = 192 forward, 4096 backward."""
    from tspbench.config import ModelConfig
    from tspbench.parallel import ParallelConfig

    m = ModelConfig(vocab_size=128, dim=64)
    got = comm_embed_head(ParallelConfig("tp", 2), Workload(m, 32, 2, mode="train"))
    assert got == {"embed": {"fwd": 4096.0, "bwd": 0.0}, "head": {"fwd": 192.0, "bwd": 4096.0}}
