"""Serving parity (tspbench/verify/serve.py): every scheme's prefill into a KV cache, its first token's logits as the
runner takes them (run/loop.py first_token_logits, on every rank) and four one-token decode steps equal the
single-device model's logits at those positions, in float64 at tspbench.verify.case.TOL (1e-10; a cache only
reorders the same sums, ≈1e-15 observed), at B = 2 and under strict comm (NCCL's rules). The group's KV cache holds
every token of every head exactly once, split 1/degree per rank; broken variants fail the same comparison."""

from __future__ import annotations

import pytest
from parity_cases import DECODE

from tspbench.parallel import SCHEMES, kv_replicas
from tspbench.predict.costmodel import Workload, comm_decode_per_layer, kv_cache_bytes


def _cache_bytes(vc) -> int:
    """The reference's cache: K and V of every layer, token and KV head (one replica)."""
    m = vc.model
    elem = {"float64": 8, "float32": 4, "bfloat16": 2}[vc.dtype]
    return 2 * m.n_layers * vc.batch * (vc.seq_len + vc.decode_steps) * m.n_kv_heads * m.head_dim * elem


@pytest.mark.parametrize("cid", [k for k, v in DECODE.items() if v[2] is None])
def test_decode_matches_single_device(parity_results, cid):
    world, vc, _ = DECODE[cid]
    res = parity_results(world)[cid]
    names = [c["name"] for c in res["checks"]]
    assert names[:2] == ["prefill_logits", "first_token_logits"]
    assert sum(n.startswith("decode_logits/") for n in names) == vc.decode_steps
    assert res["ok"], "\n".join(f"{c['name']}: rel {c['max_rel']:.2e}" for c in res["checks"] if not c["ok"])


def test_every_scheme_serves_at_batch_two_under_strict_comm():
    """GPU finding 1 hid behind B = 1: a strided slice of [B, S, V] logits is contiguous only at B = 1. Every scheme's
    serving parity runs at B ≥ 2 with NCCL's rules enforced (VerifyConfig.strict)."""
    served = {vc.scheme for _w, vc, b in DECODE.values() if b is None and vc.batch >= 2 and vc.strict}
    assert served == set(SCHEMES), set(SCHEMES) - served


@pytest.mark.parametrize("cid", [k for k, v in DECODE.items() if v[2] is None])
def test_kv_cache_is_sharded_not_copied(parity_results, cid):
    world, vc, _ = DECODE[cid]
    kv = parity_results(world)[cid]["kv_cache_bytes"]
    reps = kv_replicas(vc.model.n_kv_heads, vc.parallel().tp_degree)  # T > n_kv: a KV head on T/n_kv ranks
    assert sum(kv) == vc.dp * _cache_bytes(vc) * reps  # every token and head cached once (per replica of a head)
    assert kv == [_cache_bytes(vc) * reps // vc.degree] * world  # 1/degree per rank (tp_sp: 1/(T·Σ))
    # the cost model's per-rank KV cache (used for serving memory at paper scale) is the same number
    work = Workload(vc.model, vc.seq_len + vc.decode_steps, vc.batch, dtype=vc.dtype)
    assert kv_cache_bytes(vc.parallel(), work) == kv[0]


@pytest.mark.parametrize("cid", [k for k, v in DECODE.items() if v[2] is not None])
def test_broken_decode_is_caught(parity_results, cid):
    world, _vc, breakage = DECODE[cid]
    res = parity_results(world)[cid]
    assert not res["ok"], f"the deliberately broken variant {breakage} passed the decode parity check"
    assert max(c["max_rel"] for c in res["checks"]) > 1e3 * res["checks"][0]["tol"]


@pytest.mark.parametrize(
    "cid", [k for k, v in DECODE.items() if v[2] is None and v[1].dp == 1 and v[1].scheme in ("tp", "tsp", "sp")]
)
def test_decode_step_collectives(parity_results, cid):
    """Layer 0 of one decode step. tp: the two all-reduces of B·h (f/g). tsp: one all-gather of q, k, v packed
    over heads, the merge (max all-reduced, numerator and denominator packed and reduce-scattered over heads) and the
    two all-reduces; no broadcast or ring hop: weights never move in decode. sp: only the two merge all-reduces
    (max, then numerator‖denominator)."""
    world, vc, _ = DECODE[cid]
    ops = [o[0] for o in parity_results(world)[cid]["comm_ops_layer0"]]
    if vc.scheme == "tp":
        assert ops == ["all_reduce", "all_reduce"]
    elif vc.scheme == "tsp":
        assert sorted(ops) == sorted(["all_gather"] + ["all_reduce"] * 3 + ["reduce_scatter"])
    else:
        assert ops == ["all_reduce"] * 2


@pytest.mark.parametrize("cid", [k for k, v in DECODE.items() if v[2] is None and v[1].dp == 1])
def test_decode_volume_equals_cost_model(parity_results, cid):
    """Elements received in layer 0 of one decode step, counted by the CommLog, equal the closed form."""
    world, vc, _ = DECODE[cid]
    got = parity_results(world)[cid]["comm_layer0"]
    assert got["bwd"] == 0
    assert got["fwd"] == pytest.approx(comm_decode_per_layer(vc.model, vc.parallel(), vc.batch), rel=1e-12, abs=0)


GREEDY = {k: v for k, v in DECODE.items() if v[1].greedy}


@pytest.mark.parametrize("cid", [k for k, v in GREEDY.items() if v[2] is None])
def test_greedy_generation_matches_single_device(parity_results, cid):
    """16 decode steps fed back their own argmax (no teacher forcing): every rank generates the single-device
    model's 17 greedy tokens exactly (float64 tiny model: no argmax ties at 1e-10), and each step's logits are
    within tolerance of the reference's at that position."""
    world, vc, _ = GREEDY[cid]
    res = parity_results(world)[cid]
    tok = [c for c in res["checks"] if c["name"].startswith("greedy_tokens/")]
    assert len(tok) == world and all(c["ok"] for c in tok), [(c["name"], c["max_rel"]) for c in tok]
    assert sum(c["name"].startswith("decode_logits/") for c in res["checks"]) == vc.decode_steps == 16
    assert res["ok"], "\n".join(f"{c['name']}: rel {c['max_rel']:.2e}" for c in res["checks"] if not c["ok"])


@pytest.mark.parametrize("cid", [k for k, v in GREEDY.items() if v[2] is not None])
def test_greedy_wrong_cache_position_is_caught(parity_results, cid):
    """A decode step that writes its K/V one cache slot early: the generated tokens leave the reference's."""
    world, _vc, _ = GREEDY[cid]
    res = parity_results(world)[cid]
    assert not any(c["ok"] for c in res["checks"] if c["name"].startswith("greedy_tokens/"))
    assert max(c["max_rel"] for c in res["checks"] if c["name"].startswith("decode_logits/")) > 1e-3
