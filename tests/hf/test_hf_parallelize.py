"""`tspbench.parallelize` on a Hugging Face model equals the unparallelized Hugging Face model in float64 (gloo
ranks on CPU): the loss, the logits, every gradient and every parameter after one AdamW step, on every rank (a
replicated weight is checked in each rank's copy), TSP at D = 2, 3, 4 (MHA, GQA, MQA with a KV head replicated over
ranks, llama3 RoPE scaling, tied embeddings, Mistral, data parallel), and the other token- and tensor-parallel schemes
at D = 2. Two broken variants must fail: the converter without the RoPE permutation, a backward without the
gradient sync. Tolerance: hf_cases.TOL_F64 (the rank side: hf_ranks.py)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the hf extra (pip install -e '.[hf]') is not installed")

from hf_cases import LLAMA3_SCALING, TOL_F64, tiny

from tspbench.spawn import spawn

GQA = tiny()
MHA = tiny(num_key_value_heads=4)
MQA_SCALED_TIED = tiny(
    num_key_value_heads=1, rope_theta=500000.0, rope_scaling=LLAMA3_SCALING, tie_word_embeddings=True
)
MISTRAL = tiny(model_type="mistral", rope_theta=1e6, sliding_window=64)
WIDE = tiny(num_attention_heads=6, num_key_value_heads=3, hidden_size=48)  # heads divisible by 3

# world → [(case id, config, scheme, degree, options, broken)]; a broken case runs last in its group
CASES = {
    2: [
        ("tsp-D2-gqa", GQA, "tsp", 2, {}, None),
        ("tsp-D2-mistral", MISTRAL, "tsp", 2, {}, None),
        ("tsp-D2-biring-bucket", MQA_SCALED_TIED, "tsp", 2, {"mlp_exchange": "biring", "kv_bucket_heads": 1}, None),
        ("sp-D2-ring", GQA, "sp", 2, {"sp_variant": "ring"}, None),
        ("tp-D2", GQA, "tp", 2, {}, None),
        ("tp_msp-D2", MHA, "tp_msp", 2, {}, None),
        ("fsdp_sp-D2", GQA, "fsdp_sp", 2, {}, None),
        ("tsp-D2-no_grad_sync", GQA, "tsp", 2, {}, "no_grad_sync"),
    ],
    3: [("tsp-D3-mha", WIDE, "tsp", 3, {}, None)],
    4: [
        ("tsp-D4-mqa-llama3-tied", MQA_SCALED_TIED, "tsp", 4, {}, None),
        ("tsp-D2-dp2", GQA, "tsp", 2, {}, None),
        ("tsp-D4-no_rope_permutation", GQA, "tsp", 4, {}, "no_rope_permutation"),
    ],
}
BROKEN = {"tsp-D2-no_grad_sync": "grad/model.norm.weight", "tsp-D4-no_rope_permutation": "logits"}
"""Broken case → a tensor it must get wrong (replicated norm: partial gradient; unpermuted q/k: logits)."""

_RESULTS: dict[int, dict] = {}


def results(world: int) -> dict:
    """The world size's cases, run once per session in one spawned rank group."""
    if world not in _RESULTS:
        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp) / "out.json")
            spawn(_worker(), world, CASES[world], out)
            _RESULTS[world] = json.loads(Path(out).read_text())
    return _RESULTS[world]


def _worker():
    from hf_ranks import worker

    return worker


SLOW_WORLDS: tuple[int, ...] = ()
"""World sizes kept out of the quick loop: none. Each rank group costs ~5 s of imports per rank (torch, transformers)
before its first case; D = 3 (6 heads, one KV head per rank) runs in CI too, so the parity at D = 2, 3 and 4 is
checked on every change."""


def _params(broken: bool) -> list:
    return [
        # one xdist worker per world size (`-n 2 --dist loadgroup`), so each rank group is spawned once
        pytest.param(w, c[0], marks=[pytest.mark.xdist_group(f"hf-w{w}"), *([pytest.mark.slow] * (w in SLOW_WORLDS))])
        for w, cases in CASES.items()
        for c in cases
        if (c[5] is not None) == broken
    ]


@pytest.mark.parametrize("world,cid", _params(broken=False))
def test_parallelized_equals_hugging_face(world, cid):
    per_rank = results(world)[cid]
    assert len(per_rank) == world
    for rank, err in enumerate(per_rank):
        bad = {k: v for k, v in err.items() if not v <= TOL_F64}
        assert not bad, f"{cid} rank {rank}: beyond {TOL_F64}: {bad}"
    assert any(k.startswith("param/") for k in per_rank[0]) and any(k.startswith("grad/") for k in per_rank[0])


@pytest.mark.parametrize("world,cid", _params(broken=True))
def test_broken_variant_is_caught(world, cid):
    per_rank = results(world)[cid]
    worst = max(err[BROKEN[cid]] for err in per_rank)
    assert worst > 1e-3, f"{cid}: {BROKEN[cid]} off by only {worst:.1e}; the comparison would not catch it"
