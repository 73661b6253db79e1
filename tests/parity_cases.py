"""The parity matrix: every scheme × D ∈ {2, 3, 4} × {MHA, GQA} × recompute {none, selective, full} in
float64 (a covering design: both models without recompute, selective and full on alternating models, every
(scheme, model, recompute) triple met somewhere: `covering`), D = 8 for tsp, sp (allgather and ulysses), fsdp_sp and
tp_sp (T2Σ4, T4Σ2), D = 6 for tp_sp (T2Σ3, T3Σ2), tp_sp with Megatron-SP on T (the default) and without (`-plain`, the
ablation), data-parallel replicas (dp = 2, with small gradient buckets so every bucketing path runs; fsdp_sp's HSDP
also at dp = 4, dp_shard = 2), the K/V-exchange variants, the embedding / head options, and broken variants.

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
# GQA with fewer KV heads than the tensor degree: each KV head replicated over T/n_kv ranks (Megatron)
KV2 = replace(MHA, name="tiny_kv2", n_kv_heads=2)  # at T = 4: each KV head on 2 ranks
KV1 = replace(MHA, name="tiny_kv1", n_kv_heads=1)  # MQA at T = 8: the one KV head on every rank
# world → (model, scheme, degree, tp, recompute)
KV_REPLICATED = {
    4: [(KV2, s, 4, 0, "none") for s in ("tp", "tp_msp", "tsp")] + [(KV2, "tsp", 4, 0, "selective")],
    8: [(KV1, s, 8, 0, "none") for s in ("tp", "tp_msp", "tsp")]
    + [(KV2, "tp_sp", 8, 4, "none"), (KV1, "tp_sp", 8, 4, "none"), (KV2, "tp_sp", 8, 4, "selective")],
}
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
        ("sp", "ulysses", 0),
        ("tsp", "allgather", 0),
        ("tp_sp", "allgather", 1),
        ("tp_sp", "allgather", 2),
        ("fsdp_sp", "allgather", 0),
        ("fsdp_sp", "ulysses", 0),
    ],
    4: [
        ("tp", "allgather", 0),
        ("tp_msp", "allgather", 0),
        ("sp", "allgather", 0),
        ("sp", "ring", 0),
        ("sp", "ulysses", 0),
        ("tsp", "allgather", 0),
        ("tp_sp", "allgather", 2),
        ("tp_sp", "ring", 2),
        ("fsdp_sp", "allgather", 0),
        ("fsdp_sp", "ring", 0),
        ("tp_sp", "ulysses", 2),
        ("fsdp_sp", "ulysses", 0),
    ],
    3: [
        ("tp", "allgather", 0),
        ("tp_msp", "allgather", 0),
        ("sp", "allgather", 0),
        ("sp", "ring", 0),
        ("sp", "ulysses", 0),
        ("tsp", "allgather", 0),
        ("tp_sp", "allgather", 1),
        ("tp_sp", "allgather", 3),
        ("fsdp_sp", "allgather", 0),
        ("fsdp_sp", "ulysses", 0),
    ],
}


def case_id(vc: VerifyConfig, breakage: str | None) -> str:
    s = f"{vc.scheme}-D{vc.degree}-dp{vc.dp}-{vc.model.name}-rc_{vc.recompute}"
    if vc.dtype != "float64":
        s += f"-{vc.dtype}"
    if vc.scheme in ("sp", "tp_sp", "fsdp_sp"):
        s += f"-{vc.sp_variant}"
    if vc.scheme == "tp_sp":
        s += f"-T{vc.tp}" + ("" if vc.msp else "-plain")
    if vc.vocab != "auto":
        s += f"-vocab_{vc.vocab}"
    if vc.kv_bucket_heads:
        s += f"-kvb{vc.kv_bucket_heads}"
    if vc.mlp_exchange != "ring":
        s += f"-mlp_{vc.mlp_exchange}"
    if not vc.regather_kv:
        s += "-keepkv"
    if vc.dp_shard != 1:
        s += f"-dps{vc.dp_shard}"
    if vc.grad_bucket_elems:
        s += f"-bucket{vc.grad_bucket_elems}"
    if vc.decode_steps:
        s += f"-decode{vc.decode_steps}"
    if vc.greedy:
        s += "-greedy"
    if not vc.strict:
        s += "-lenient"  # NCCL's rules not enforced (schemes/nccl_rules.py): what gloo alone lets through
    return s + (f"-BROKEN_{breakage}" if breakage else "")


def _vc(model, scheme, degree, variant="allgather", tp=0, dp=1, recompute="none", msp=True) -> VerifyConfig:
    return VerifyConfig(
        model=model,
        scheme=scheme,
        degree=degree,
        tp=tp,
        dp=dp,
        sp_variant=variant,
        msp=msp,
        recompute=recompute,
        seq_len=36 if model.n_heads % 3 == 0 else 32,
        batch=2,
        dtype="float64",
    )


def covering(i: int, models: tuple[ModelConfig, ModelConfig]) -> list[tuple[ModelConfig, str]]:
    """(model, recompute) pairs of a variant (i: its index in VARIANTS[world] + world // 2): both models without
    recompute (the mode whose backward collectives the accounting formulas pin), selective and full once each, on
    models that alternate with i, so a variant run at D = 2 and D = 4 meets both models in both modes, and every
    scheme meets every (model, recompute) pair (tests/parity/test_parity.py checks it): 4 cases per variant instead
    of the 6 of the full cross product."""
    mha, gqa = models
    alt = (mha, gqa) if i % 2 == 0 else (gqa, mha)
    return [(mha, "none"), (gqa, "none"), (alt[0], "selective"), (alt[1], "full")]


def cases_for_world(world: int) -> list[tuple[VerifyConfig, str | None]]:
    out: list[tuple[VerifyConfig, str | None]] = []
    if world in VARIANTS:
        models = (MHA3, GQA3) if world == 3 else (MHA, GQA)
        for i, (scheme, variant, tp) in enumerate(VARIANTS[world]):
            for model, rc in covering(i + world // 2, models):
                out.append((_vc(model, scheme, world, variant, tp, recompute=rc), None))
    if world == 4:  # data parallel: 2 replicas of a 2-rank group, one gradient all-reduce over dp × group
        for scheme, variant, tp in VARIANTS[2]:
            out.append((_vc(GQA, scheme, 2, variant, tp, dp=2), None))
            out.append((replace(_vc(MHA, scheme, 2, variant, tp, dp=2), grad_bucket_elems=SMALL_BUCKET), None))
        out.append((_vc(MHA, "single", 1, dp=4), None))
        out.append((replace(_vc(MHA, "single", 1, dp=4), grad_bucket_elems=SMALL_BUCKET), None))
    for model, scheme, degree, tp, rc in KV_REPLICATED.get(world, []):
        out.append((_vc(model, scheme, degree, tp=tp, recompute=rc), None))
    if world == 8:  # MQA at T = 2 with 2 replicas: the K/V gradient all-reduce spans dp × sp × the 2 tensor ranks
        out.append((_vc(KV1, "tp_sp", 4, tp=2, dp=2), None))
    if world == 8:
        for scheme in ("tsp", "sp", "fsdp_sp"):
            for model in (MHA, GQA8):
                out.append((_vc(model, scheme, 8), None))
        for model in (MHA, GQA8):  # Ulysses at D = 8: 8 | n_kv_heads for both
            out.append((_vc(model, "sp", 8, "ulysses"), None))
        # tp_sp with Megatron-SP on T at both factorisations of 8; the plain ablation once
        for tp, model_rc in (
            (2, [(MHA, rc) for rc in RECOMPUTE] + [(GQA8, "none")]),
            (4, [(GQA8, rc) for rc in RECOMPUTE] + [(MHA, "none")]),
        ):
            for model, rc in model_rc:
                out.append((_vc(model, "tp_sp", 8, tp=tp, recompute=rc), None))
        out.append((_vc(GQA8, "tp_sp", 8, tp=2, msp=False), None))
        # data parallel over a T2Σ2 group (the gradient sync over dp × sp and dp × sp × tp)
        out.append((_vc(GQA, "tp_sp", 4, tp=2, dp=2, recompute="selective"), None))
        out.append((replace(_vc(MHA, "tp_sp", 4, tp=2, dp=2), grad_bucket_elems=SMALL_BUCKET), None))
    if world == 6:  # tp_sp at D = 6 (heads, KV heads, vocabulary divisible by 2 and 3; S = 36)
        out += [
            (_vc(MHA3, "tp_sp", 6, tp=2), None),
            (_vc(MHA3, "tp_sp", 6, tp=2, recompute="full"), None),
            (_vc(MHA3, "tp_sp", 6, tp=3), None),
            (_vc(GQA3, "tp_sp", 6, tp=3, recompute="selective"), None),
            (_vc(GQA3, "tp_sp", 6, tp=3, variant="ring"), None),
        ]
    if world == 4:  # the plain TP × SP ablation (msp=false)
        out += [
            (_vc(MHA, "tp_sp", 4, tp=2, msp=False), None),
            (_vc(GQA, "tp_sp", 4, tp=2, recompute="selective", msp=False), None),
            (_vc(MHA, "tp_sp", 4, "ring", tp=2, recompute="full", msp=False), None),
            (replace(_vc(MHA, "tp_sp", 4, tp=2, msp=False), vocab="replicated"), None),
            (replace(_vc(GQA, "tp_sp", 4, tp=2, recompute="full"), vocab="replicated"), None),
        ]
    if world in (2, 4):  # the embedding / head options: TSP's vocabulary ring, the TP family replicated
        for model in (MHA, GQA):
            for rc in ("none", "full"):
                out.append((replace(_vc(model, "tsp", world, recompute=rc), vocab="ring"), None))
        for scheme, tp in (("tp", 0), ("tp_msp", 0), ("tp_sp", 2 if world == 4 else 1)):
            out.append((replace(_vc(MHA, scheme, world, tp=tp), vocab="replicated"), None))
    if world in (2, 3, 4):  # TSP's bucketed K/V all-gather: several buckets per owner (MHA), one (GQA at D = 3)
        models = (MHA3, GQA3) if world == 3 else (MHA, GQA)
        for model, rc in zip(models, ("none", "full")):
            out.append((replace(_vc(model, "tsp", world, recompute=rc), kv_bucket_heads=1), None))
        if world == 2:  # 4 KV heads per owner in buckets of 3: an uneven last bucket
            out.append((replace(_vc(MHA, "tsp", 2, recompute="selective"), kv_bucket_heads=3), None))
    # ---- TSP's MLP exchanges and kept K/V (docs/method.md#tsp-mlp, #choice-backward) --------------------------
    # mlp_exchange=biring | broadcast and regather_kv=false, each at D = 2, 3, 4 in a covering design (D = 2: MHA
    # without recompute, GQA full; D = 3: GQA without, MHA full; D = 4 as D = 2), the kept K/V in head buckets, a
    # biring whose halves are uneven (33 channels per shard at D = 4), and a broken variant of each.
    if world in (2, 3, 4):
        mha, gqa = (MHA3, GQA3) if world == 3 else (MHA, GQA)
        pairs = [(gqa, "none"), (mha, "full")] if world == 3 else [(mha, "none"), (gqa, "full")]
        for option in ({"mlp_exchange": "biring"}, {"mlp_exchange": "broadcast"}, {"regather_kv": False}):
            for model, rc in pairs:
                out.append((replace(_vc(model, "tsp", world, recompute=rc), **option), None))
        if world == 4:
            out.append((replace(_vc(MHA, "tsp", 4, recompute="full"), regather_kv=False, kv_bucket_heads=1), None))
            odd = replace(MHA, name="tiny_ffn132", ffn_hidden=132)
            out.append((replace(_vc(odd, "tsp", 4), mlp_exchange="biring"), None))
            out.append((replace(_vc(GQA, "tsp", 4, recompute="full"), regather_kv=False), "kept_kv_wrong_owner"))
        if world == 2:
            out += [
                (replace(_vc(MHA, "tsp", 2), mlp_exchange="biring"), "biring_half_applied_twice"),
                (replace(_vc(MHA, "tsp", 2), mlp_exchange="broadcast"), "mlp_broadcast_skipped"),
                (replace(_vc(MHA, "tsp", 2), regather_kv=False), "kept_kv_wrong_owner"),
            ]
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
            (_vc(MHA, "sp", 2, "ulysses"), "ulysses_wrong_dim"),
            (_vc(GQA, "sp", 2, "ulysses"), "wrong_zigzag_order"),
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
            (_vc(MHA, "fsdp_sp", 2), "fsdp_no_reduce_scatter"),
            # a K/V bucket that gathers another bucket's heads: caught only where there are several buckets
            (replace(_vc(MHA, "tsp", 2), kv_bucket_heads=1), "kv_bucket_wrong_heads"),
        ]
        # Megatron's column-parallel backward (schemes/ops/tensor_parallel.py) without its dgrad reduction: the
        # Megatron-SP reduce-scatter (tp_msp) and the plain all-reduce (tp) skipped
        out += [(_vc(MHA, "tp_msp", 2), "tp_dgrad_not_reduced"), (_vc(GQA, "tp", 2), "tp_dgrad_not_reduced")]
    if world == 4:
        out += [
            (_vc(MHA, "tsp", 4), "skipped_ring_hop"),
            (_vc(MHA, "tp_sp", 4, tp=2), "wrong_zigzag_order"),
            (_vc(MHA, "tp_sp", 4, tp=2, msp=False), "head_input_grad_not_reduced"),
            (_vc(MHA, "tp_sp", 4, tp=2), "msp_without_reduce_scatter"),
            (_vc(GQA, "tp_sp", 4, tp=2, recompute="full"), "msp_without_reduce_scatter"),
            # replicated KV heads whose gradients are summed over the wrong ranks
            (_vc(KV2, "tsp", 4), "kv_head_wrong_group"),
            (_vc(KV2, "tp", 4), "kv_head_wrong_group"),
            (_vc(GQA, "fsdp_sp", 2, dp=2), "fsdp_no_reduce_scatter"),
            (_vc(GQA, "sp", 4, "ulysses"), "ulysses_wrong_dim"),
            # ring attention whose [dK; dV] never travels back: forward exact, K/V gradients wrong
            (_vc(GQA, "sp", 4, "ring"), "ring_dkv_not_returned"),
            (_vc(MHA, "fsdp_sp", 4, "ring"), "ring_dkv_not_returned"),
            (replace(_vc(MHA, "tsp", 4), kv_bucket_heads=1), "kv_bucket_wrong_heads"),
        ]
    # ---- the data-parallel side: overlapped gradient sync and HSDP (docs/method.md#choice-overlap, #fsdp-sp) -----
    # The gradient sync posts each bucket from backward's gradient hooks (every dp = 2 case above runs it, the
    # `-bucket512` ones with lone and packed buckets); a bucket posted at its first gradient instead of its last must
    # fail (sp: the in-group sum; tp: the DP average). fsdp_sp at dp = 2 with dp_shard = 1 (HSDP: shard within the
    # replica, all-reduce across the 2; the dp = 2 cases above) and dp_shard = 2 (plain FSDP over all 2·Σ ranks), at
    # D = 2 (MHA, GQA) and D = 4 (MHA with dp_shard 1, GQA with 2); HSDP without its all-reduce must fail. At dp = 2
    # the gradient's divisor dp equals either the replica count dp/dp_shard (HSDP) or dp_shard (plain FSDP), so a wrong
    # one passes there: HSDP at dp = 4, dp_shard = 2 (2 replicas of a 4-rank shard group, D = 2) tells them apart.
    if world == 2:
        out.append((_vc(MHA, "sp", 2), "grad_bucket_posted_early"))
    if world == 4:
        out += [
            (replace(_vc(MHA, "fsdp_sp", 2, dp=2), dp_shard=2), None),
            (replace(_vc(GQA, "fsdp_sp", 2, dp=2, recompute="full"), dp_shard=2), None),
            (_vc(MHA, "tp", 2, dp=2), "grad_bucket_posted_early"),
            (_vc(GQA, "fsdp_sp", 2, dp=2), "hsdp_no_replicate_all_reduce"),
        ]
    if world == 8:
        out += [
            (_vc(MHA, "fsdp_sp", 4, dp=2, recompute="selective"), None),
            (replace(_vc(GQA, "fsdp_sp", 4, dp=2), dp_shard=2), None),
            (replace(_vc(MHA, "fsdp_sp", 2, dp=4), dp_shard=2), None),
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
        out += [(dec(KV2, "tsp", 4), None), (dec(KV2, "tp", 4), None)]  # KV heads replicated over 2 ranks
    if world == 4:  # the plain tp_sp ablation serves too, and Megatron-SP with a replicated vocabulary
        out += [(replace(_vc(MHA, "tp_sp", 4, tp=2, msp=False), decode_steps=steps), None)]
        out += [(replace(_vc(GQA, "tp_sp", 4, tp=2), vocab="replicated", decode_steps=steps), None)]
    if world == 8:
        out += [(replace(dec(GQA8, "tsp", 8), decode_steps=8), None)]
    if world == 2:  # non-vacuity: the same comparison must fail
        # the prefill's old strided all-reduce of the first token's logits (GPU finding 1), with strict comm off: at
        # B = 2 gloo sums the wrong memory, so the ranks that do not hold position S − 1 get a wrong first token (with
        # strict comm on, the default, it is refused: tests/parity/test_strict.py)
        out += [(replace(dec(MHA, s, 2), strict=False), "strided_first_token") for s in ("tsp", "sp")]
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
    # ---- TSP's MLP exchanges serve too: the prefill moves the MLP shards as the layout says (decode keeps them in
    # place), and regather_kv (a backward option) changes nothing in serving
    if world == 4:
        out += [(replace(dec(MHA, "tsp", 4), mlp_exchange="biring"), None)]
        out += [(replace(dec(GQA, "tsp", 4), mlp_exchange="broadcast", regather_kv=False), None)]
    return out


def all_cases_for_world(world: int) -> list[tuple[VerifyConfig, str | None]]:
    return cases_for_world(world) + decode_cases_for_world(world)


WORLDS = (2, 3, 4, 6, 8)
ALL = {case_id(vc, b): (w, vc, b) for w in WORLDS for vc, b in cases_for_world(w)}
DECODE = {case_id(vc, b): (w, vc, b) for w in WORLDS for vc, b in decode_cases_for_world(w)}
