"""Sharding is real: each rank holds the parameter bytes its scheme promises, and token-sharded schemes keep
1/D of the activations."""

from __future__ import annotations

import pytest
from parity_cases import ALL

from tspbench.schemes.ops.sharding import meta_model


def expected_param_bytes(vc) -> int:
    """Block weights divided by the tensor degree (tp, tp_msp, tsp: degree; tp_sp: T; sp: 1); embedding and
    LM head split by vocabulary over the tensor axis of tp, tp_msp and tp_sp, replicated in sp and tsp
    (docs/method.md#choice-embedding); norms replicated everywhere. fsdp_sp: every parameter ÷ dp_shard·Σ."""
    m = vc.model
    d = m.head_dim
    shard = {"tp": vc.degree, "tp_msp": vc.degree, "tsp": vc.degree, "sp": 1, "single": 1, "tp_sp": vc.tp or 1}.get(
        vc.scheme, 1
    )
    kv_heads = max(m.n_kv_heads // shard, 1) * shard  # T > n_kv: each rank holds one whole KV head (replicated)
    block = (2 * m.n_heads * d + 2 * kv_heads * d) * m.dim + 3 * m.ffn_hidden * m.dim
    vocab_shard = {"auto": 1 if vc.scheme in ("sp", "tsp") else shard, "replicated": 1, "ring": vc.degree}[vc.vocab]
    replicated = 2 * m.vocab_size * m.dim // vocab_shard + (2 * m.n_layers + 1) * m.dim
    elem = {"float64": 8, "float32": 4, "bfloat16": 2}[vc.dtype]
    if vc.scheme == "fsdp_sp":  # FSDP2: every parameter row-sharded over its shard group, dp_shard × Σ (HSDP)
        total = 2 * m.vocab_size * m.dim + (2 * m.n_layers + 1) * m.dim + m.n_layers * block
        return elem * total // (vc.dp_shard * vc.degree)
    return elem * (replicated + m.n_layers * block // shard)


@pytest.mark.parametrize("cid", [k for k, v in ALL.items() if v[2] is None])
def test_param_bytes_per_rank(parity_results, cid):
    world, vc, _ = ALL[cid]
    got = parity_results(world)[cid]["param_bytes"]
    assert got == [expected_param_bytes(vc)] * world


@pytest.mark.parity_cases("single-D1-dp4-tiny-rc_none", "tsp-D4-dp1-tiny-rc_none", "tp-D4-dp1-tiny-rc_none")
def test_tsp_activations_shrink_with_degree(parity_results):
    """Bytes autograd saves in one training forward (parameters excluded), same model and batch: TSP at
    D = 4 stores at most ~1/D of the single-device model's activations (plus a small fixed part: token
    ids and RoPE tables are per-rank, not per-token, so the bound allows 15% slack on top of 1/D)."""
    r4 = parity_results(4)
    single = r4["single-D1-dp4-tiny-rc_none"]["activation_bytes"][0]
    tsp = r4["tsp-D4-dp1-tiny-rc_none"]["activation_bytes"]
    tp = r4["tp-D4-dp1-tiny-rc_none"]["activation_bytes"]
    assert max(tsp) <= single / 4 * 1.15, (tsp, single)
    assert min(tp) > single / 4 * 1.15  # TP keeps replicated activations: the check discriminates


def test_kv_replica_groups():
    """GQA with T > n_kv: the ranks sharing one KV head are runs of T/n_kv consecutive tensor ranks, taken with the
    token axes the gradient is also summed over (tp_sp: sp) and, for the gradient sync, dp; the broken variant's
    strided groups mix replicas of different heads."""
    import torch

    from tspbench.schemes.ops.sharding import block_rows
    from tspbench.verify.broken import kv_head_wrong_group

    ranks = torch.arange(16).reshape(2, 2, 4)  # dp × sp × tp
    dims = ["dp", "sp", "tp"]
    assert block_rows(ranks, dims, (), "tp", 2) == [
        [0, 1],
        [2, 3],
        [4, 5],
        [6, 7],
        [8, 9],
        [10, 11],
        [12, 13],
        [14, 15],
    ]
    assert block_rows(ranks, dims, ("sp",), "tp", 2) == [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]
    assert block_rows(ranks, dims, ("dp", "sp"), "tp", 4) == [list(range(16))]
    from tspbench.schemes.ops import sharding

    with kv_head_wrong_group():
        assert sharding.block_rows(ranks, dims, (), "tp", 2)[:2] == [[0, 2], [1, 3]]


@pytest.mark.parametrize(
    "cid", [k for k, v in ALL.items() if v[2] is None and v[1].model.name in ("tiny_kv2", "tiny_kv1")]
)
def test_kv_replicated_param_bytes_match_cost_model(parity_results, cid):
    """The cost model's parameters per device count a replicated KV head whole on every rank that holds it."""
    from tspbench.predict.costmodel import params_per_device

    world, vc, _ = ALL[cid]
    elem = {"float64": 8, "float32": 4, "bfloat16": 2}[vc.dtype]
    assert parity_results(world)[cid]["param_bytes"] == [params_per_device(vc.model, vc.parallel()) * elem] * world


@pytest.mark.parametrize("cid", [k for k, v in ALL.items() if v[2] is None and v[1].scheme == "fsdp_sp"])
def test_fsdp_every_parameter_sharded(parity_results, cid):
    """fsdp_sp: each rank holds exactly 1/N of EVERY parameter (norms, embedding and head included), N = dp_shard·Σ
    its shard group (docs/method.md#fsdp-sp), not just 1/N of the total: the per-parameter local sizes, summed over
    a shard group's ranks, are each parameter's size once."""
    world, vc, _ = ALL[cid]
    n = vc.dp_shard * vc.degree
    ref = dict(meta_model(vc.model, "none")[0].named_parameters())
    per_rank = parity_results(world)[cid]["local_numel"]
    assert len(per_rank) == world
    for local in per_rank:
        assert set(local) == set(ref)
        for name, p in ref.items():
            assert local[name] * n == p.numel(), (name, local[name], p.numel(), n)


@pytest.mark.parity_cases("sp-D4-dp1-tiny-rc_selective-allgather", "fsdp_sp-D4-dp1-tiny-rc_selective-allgather")
def test_fsdp_sp_stores_sp_activations(parity_results):
    """FSDP2 changes where the weights live, not what a token shard saves for backward: fsdp_sp saves exactly sp's
    activation bytes (its gathered weights, which FSDP frees after forward, are parameters, not activations)."""
    r4 = parity_results(4)
    sp = r4["sp-D4-dp1-tiny-rc_selective-allgather"]["activation_bytes"]
    fsdp = r4["fsdp_sp-D4-dp1-tiny-rc_selective-allgather"]["activation_bytes"]
    assert fsdp == sp and min(sp) > 0
