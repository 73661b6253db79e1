"""The parity matrix: every scheme × D ∈ {2, 3, 4} × {MHA, GQA} × recompute {none, selective, full} in
float64, D = 8 for tsp and sp, data-parallel replicas (dp = 2, with small gradient buckets so every bucketing
path runs), the K/V-exchange variants, the embedding / head options, and deliberately broken variants.

Cases are grouped by world size so each group runs in ONE spawned rank group (spawning is the slow part
on a 2-core machine).
"""

from __future__ import annotations

from dataclasses import replace

from tspbench.config import ModelConfig
from tspbench.verify.case import VerifyConfig

MHA = ModelConfig(name="tiny", vocab_size=128, dim=64, n_layers=2, n_heads=8, n_kv_heads=8, ffn_hidden=128)
GQA = replace(MHA, name="tiny_gqa", n_kv_heads=4)  # g = 2, n_kv divisible by D ≤ 4
GQA8 = replace(MHA, name="tiny_gqa8", n_heads=16, n_kv_heads=8)  # g = 2 at D = 8
# D = 3: heads, KV heads, channels and vocabulary divisible by 3; S = 36 (zigzag: 2·3 | S; tp_msp: 3 | S)
MHA3 = ModelConfig(name="tiny3", vocab_size=132, dim=96, n_layers=2, n_heads=6, n_kv_heads=6, ffn_hidden=192)
GQA3 = replace(MHA3, name="tiny3_gqa", n_kv_heads=3)
RECOMPUTE = ("none", "selective", "full")
GREEDY_TOKENS = 16  # decode steps of the greedy-generation cases (a multiple of D ∈ {2, 4}: a balanced cache)
SMALL_BUCKET = 512  # elements: gradient buckets of one lone gradient and of several packed ones both occur

# (scheme, sp_variant, tp) for a group of `degree` ranks
VARIANTS = {
    2: [
        ("tp", "allgather", 0),
        ("tp_msp", "allgather", 0),
        ("sp", "allgather", 0),
        ("sp", "ring", 0),
        ("tsp", "allgather", 0),
        ("tp_sp", "allgather", 1),
        ("tp_sp", "allgather", 2),
    ],
    4: [
        ("tp", "allgather", 0),
        ("tp_msp", "allgather", 0),
        ("sp", "allgather", 0),
        ("sp", "ring", 0),
        ("tsp", "allgather", 0),
        ("tp_sp", "allgather", 2),
        ("tp_sp", "ring", 2),
    ],
    3: [
        ("tp", "allgather", 0),
        ("tp_msp", "allgather", 0),
        ("sp", "allgather", 0),
        ("sp", "ring", 0),
        ("tsp", "allgather", 0),
        ("tp_sp", "allgather", 1),
        ("tp_sp", "allgather", 3),
    ],
}


def case_id(vc: VerifyConfig, breakage: str | None) -> str:
    s = f"{vc.scheme}-D{vc.degree}-dp{vc.dp}-{vc.model.name}-rc_{vc.recompute}"
    if vc.dtype != "float64":
        s += f"-{vc.dtype}"
    if vc.scheme in ("sp", "tp_sp"):
        s += f"-{vc.sp_variant}"
    if vc.scheme == "tp_sp":
        s += f"-T{vc.tp}"
    if vc.vocab != "auto":
        s += f"-vocab_{vc.vocab}"
    if vc.grad_bucket_elems:
        s += f"-bucket{vc.grad_bucket_elems}"
    if vc.decode_steps:
        s += f"-decode{vc.decode_steps}"
    if vc.greedy:
        s += "-greedy"
    return s + (f"-BROKEN_{breakage}" if breakage else "")


def _vc(model, scheme, degree, variant="allgather", tp=0, dp=1, recompute="none") -> VerifyConfig:
    return VerifyConfig(
        model=model,
        scheme=scheme,
        degree=degree,
        tp=tp,
        dp=dp,
        sp_variant=variant,
        recompute=recompute,
        seq_len=36 if model.n_heads % 3 == 0 else 32,
        batch=2,
        dtype="float64",
    )


def cases_for_world(world: int) -> list[tuple[VerifyConfig, str | None]]:
    out: list[tuple[VerifyConfig, str | None]] = []
    if world in VARIANTS:
        models = (MHA3, GQA3) if world == 3 else (MHA, GQA)
        for scheme, variant, tp in VARIANTS[world]:
            for model in models:
                for rc in RECOMPUTE:
                    out.append((_vc(model, scheme, world, variant, tp, recompute=rc), None))
    if world == 4:  # data parallel: 2 replicas of a 2-rank group, one gradient all-reduce over dp × group
        for scheme, variant, tp in VARIANTS[2]:
            out.append((_vc(GQA, scheme, 2, variant, tp, dp=2), None))
            out.append((replace(_vc(MHA, scheme, 2, variant, tp, dp=2), grad_bucket_elems=SMALL_BUCKET), None))
        out.append((_vc(MHA, "single", 1, dp=4), None))
        out.append((replace(_vc(MHA, "single", 1, dp=4), grad_bucket_elems=SMALL_BUCKET), None))
    if world == 8:
        for scheme in ("tsp", "sp"):
            for model in (MHA, GQA8):
                out.append((_vc(model, scheme, 8), None))
    if world in (2, 4):  # the embedding / head options: TSP's vocabulary ring, the TP family replicated
        for model in (MHA, GQA):
            for rc in ("none", "full"):
                out.append((replace(_vc(model, "tsp", world, recompute=rc), vocab="ring"), None))
        for scheme, tp in (("tp", 0), ("tp_msp", 0), ("tp_sp", 2 if world == 4 else 1)):
            out.append((replace(_vc(MHA, scheme, world, tp=tp), vocab="replicated"), None))
    if world == 2:  # low-precision smoke: same comparison, dtype-based tolerance (verify.TOL)
        for scheme, variant, tp in VARIANTS[2]:
            for dtype in ("float32", "bfloat16"):
                out.append((replace(_vc(MHA, scheme, 2, variant, tp), dtype=dtype), None))
    if world == 2:
        # Non-vacuity: each bug must FAIL the very comparison the real code passes.
        out += [
            (_vc(MHA, "tp", 2), "missing_allreduce"),
            (_vc(MHA, "tp", 2), "unmasked_vocab_shard"),
            (_vc(MHA, "tp", 2), "head_input_grad_not_reduced"),
            (_vc(MHA, "tp_msp", 2), "unmasked_vocab_shard"),
            (_vc(MHA, "tp_msp", 2), "missing_grad_sync"),
            (_vc(MHA, "sp", 2), "wrong_zigzag_order"),
            (_vc(MHA, "sp", 2), "missing_grad_sync"),
            (_vc(MHA, "tsp", 2), "skipped_ring_hop"),
            (_vc(MHA, "tsp", 2), "wrong_zigzag_order"),
            (_vc(MHA, "tsp", 2), "no_reduce_to_owner"),
            (_vc(MHA, "tsp", 2), "missing_grad_sync"),
            (replace(_vc(MHA, "tsp", 2), vocab="ring"), "skipped_ring_hop"),
            (replace(_vc(MHA, "tsp", 2), vocab="ring"), "ring_head_local_softmax"),
            # a replicated gradient scaled on rank 1 only: caught because every rank's copy is compared
            (_vc(MHA, "tsp", 2), "perturbed_replica_grad"),
            (_vc(MHA, "tp", 2), "perturbed_replica_grad"),
            (_vc(MHA, "single", 1, dp=2), "perturbed_replica_grad"),
        ]
    if world == 4:
        out += [
            (_vc(MHA, "tsp", 4), "skipped_ring_hop"),
            (_vc(MHA, "tp_sp", 4, tp=2), "wrong_zigzag_order"),
            (_vc(MHA, "tp_sp", 4, tp=2), "head_input_grad_not_reduced"),
        ]
    return out


def decode_cases_for_world(world: int) -> list[tuple[VerifyConfig, str | None]]:
    """Serving: prefill 32 (36) tokens, decode a multiple of the group size (4; 3 at D = 3; 8 at D = 8), so the
    cache is balanced."""
    out: list[tuple[VerifyConfig, str | None]] = []
    steps = 3 if world == 3 else 4
    dec = lambda model, scheme, degree, variant="allgather", tp=0, dp=1: replace(  # noqa: E731
        _vc(model, scheme, degree, variant, tp, dp), decode_steps=steps
    )
    if world in VARIANTS:
        for scheme, variant, tp in VARIANTS[world]:
            for model in (MHA3, GQA3) if world == 3 else (MHA, GQA):
                out.append((dec(model, scheme, world, variant, tp), None))
    if world == 4:
        out += [(dec(GQA, "tsp", 2, dp=2), None), (dec(MHA, "single", 1, dp=4), None)]
    if world == 8:
        out += [(replace(dec(GQA8, "tsp", 8), decode_steps=8), None)]
    if world == 2:  # non-vacuity: the same comparison must fail
        out += [
            (dec(MHA, "tsp", 2), "decode_cached_everywhere"),
            (dec(MHA, "sp", 2), "decode_cached_everywhere"),
            (dec(MHA, "tp", 2), "missing_allreduce"),
            (dec(MHA, "tsp", 2), "missing_allreduce"),
        ]
    # greedy generation, 16 tokens: a few schemes at D = 2, tsp at D = 4, a broken cache position at D = 2
    greedy = lambda model, scheme, degree, variant="allgather", tp=0: replace(  # noqa: E731
        _vc(model, scheme, degree, variant, tp), decode_steps=GREEDY_TOKENS, greedy=True
    )
    if world == 2:
        for scheme, variant in (("tp", "allgather"), ("tp_msp", "allgather"), ("sp", "ring")):
            out.append((greedy(GQA, scheme, 2, variant), None))
        out += [(greedy(GQA, "tsp", 2), None), (greedy(MHA, "tp_sp", 2, tp=2), None)]
        out += [(greedy(MHA, "tsp", 2), "wrong_cache_position"), (greedy(MHA, "sp", 2), "wrong_cache_position")]
    if world == 4:
        out += [(greedy(GQA, "tsp", 4), None)]
    return out


def all_cases_for_world(world: int) -> list[tuple[VerifyConfig, str | None]]:
    return cases_for_world(world) + decode_cases_for_world(world)


WORLDS = (2, 3, 4, 8)
ALL = {case_id(vc, b): (w, vc, b) for w in WORLDS for vc, b in cases_for_world(w)}
DECODE = {case_id(vc, b): (w, vc, b) for w in WORLDS for vc, b in decode_cases_for_world(w)}
