"""Closed-form communication: elements received per device per layer (training, forward, decode), at the
embedding and LM head, in the per-step gradient sync, and the TSP/TP crossover (docs/method.md#communication).

Imports only the layers below it (workload.py, params.py); the tests bind each formula to the collectives the
scheme code issues (tests/parity/test_accounting.py, tests/parity/test_decode.py).
"""

from __future__ import annotations

import math

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel.params import (
    fsdp_shards,
    kv_heads_per_rank,
    layer_weight_params,
    layer_weight_params_per_rank,
    layout,
    megatron_tp_degree,
    mesh_megatron_sp,
    regathers_kv,
    replicated_params,
)
from tspbench.predict.costmodel.workload import Workload


# ---------------------------------------------------------------------------------------------- comm
def comm_per_layer(par: ParallelConfig, work: Workload, *, regather_kv: bool | None = None) -> dict:
    """Elements received per device per layer, by kind (docs/method.md#communication), plus per-step `grad_sync`
    (work.mode train or forward).

    Forward (bandwidth-optimal collectives, N = B·S):
        tp, tp_msp  activations 4·N·h·(T−1)/T          (2 all-reduces, or 2 all-gather + reduce-scatter pairs)
        sp          kv          2·N·(h/g)·(Σ−1)/Σ      (all-gather of K and V)
        tp_sp       activations 4·(N/Σ)·h·(T−1)/T  +  kv 2·N·(h/(g·T))·(Σ−1)/Σ   (Megatron-SP's all-gather +
                    reduce-scatter pairs over T, or with msp=false 2 all-reduces: the same volume)
        sp ulysses  heads       (N/Σ)·(2h + 2h/g)·(Σ−1)/Σ  (all-to-alls of Q, K, V in, of O out; #ulysses;
                    fsdp_sp ulysses the same)
                    (tp_sp ulysses: the same on the n/T local heads, ÷ T, beside the T axis's activations)
        tsp         weights     W·(D−1)/D              (attention broadcasts + MLP ring)
                    kv          2·N·(h/g)·(D−1)/D
        fsdp_sp     weights     (W + 2h)·(n−1)/n       (FSDP all-gather of the block unit over its shard group,
                                                       n = dp_shard·Σ)
                    kv          as sp
    With T (or D) > n_kv each rank holds one KV head replicated over T/n_kv ranks: h/(g·T) becomes d (tp_sp),
    and tsp's D owner shards carry D KV heads (weights and kv grow by the replicas; docs/method.md#choice-gqa).
    Backward, no recompute: TP repeats its all-reduces; Megatron-SP (tp_msp, tp_sp) its all-gather /
    reduce-scatter duals and re-gathers the two column-parallel inputs from the saved pieces (Megatron's
    LinearWithGradAccumulationAndAsyncCommunication): 6·(N/Σ)·h·(T−1)/T; SP/TP×SP reduce-scatter dK/dV (= kv);
    TSP re-sends the weights (W) and reduces the weight gradients to their owners (W) and reduce-scatters dK/dV
    (K); Ulysses runs the inverse all-to-alls of the gradients (= heads, and selective recompute replays none of
    them), so TSP is 3W + 2K forward + backward. `regather_kv=True` adds one K/V all-gather to the backward of
    sp/tp_sp/tsp (default None: what the code does, params.regathers_kv: for tsp the layout's regather_kv, true
    unless the layout keeps the K/V, whose 3W + 2K is docs/method.md#communication's). TSP's MLP moves the same
    volume whichever its `mlp_exchange` (ring hops, half-shard hops both ways, or broadcasts + reduces to owners;
    collectives.tsp_collectives has them op by op). fsdp_sp's backward all-gathers the unit again and
    reduce-scatters its gradient:
    2·(W + 2h)·(n−1)/n, and with HSDP (R = dp/dp_shard > 1 replicas of the shard group) all-reduces the 1/n gradient
    shard over the replicas: + 2·(W + 2h)/n·(R−1)/R (`fsdp_replicate_recv`); its recompute (full, or selective's K/V
    exchange) replays the K/V exchange only (the unit is gathered once for backward). Full recompute adds one more
    forward. `grad_sync` is per step, not per layer: the all-reduce over the group of gradients that ranks holding
    different tokens compute for the same weights (ring all-reduce: 2·n·(p−1)/p received).
    """
    model, mode = work.model, work.mode
    if mode not in ("train", "forward"):
        raise ValueError(f"mode={mode!r} is unknown; allowed: train, forward")
    fwd = _forward_per_layer(par, work)
    if regather_kv is None:  # what the code does: TSP re-gathers K/V in backward (schemes/ops/owner_attention.py)
        regather_kv = regathers_kv(par)
    bwd = dict.fromkeys(fwd, 0.0)
    if mode == "train":
        bwd["activations"] = fwd["activations"]  # TP: all-reduces (or AG/RS) mirrored
        if par.megatron_sp:  # + the column-parallel inputs re-gathered from the saved pieces (Megatron)
            bwd["activations"] += fwd["activations"] / 2
        bwd["kv"] = fwd["kv"] * (2 if regather_kv else 1)  # dK/dV reduce-scatter (+ re-gather)
        bwd["weights"] = 2 * fwd["weights"]  # TSP: weight re-send + weight-grad reduce
        if par.spec.fsdp:  # fsdp_sp: the unit again + its reduce-scatter (the 2 above); HSDP: + the all-reduce
            bwd["weights"] += fsdp_replicate_recv(par, layer_weight_params(model) + 2 * model.dim)
        bwd["heads"] = fwd["heads"]  # Ulysses: the inverse all-to-alls of dO and d[Q; K; V]
        if par.recompute == "full" and par.spec.fsdp:
            bwd["kv"] += fwd["kv"]  # the unit is already gathered for backward: only the exchange replays
            bwd["heads"] += fwd["heads"]
        elif par.recompute == "full":
            bwd = {key: bwd[key] + fwd[key] for key in bwd}  # one more forward's worth
        elif par.recompute == "selective" and par.exchange and not par.ulysses:
            bwd["kv"] += fwd["kv"]  # the K/V exchange is part of the recomputed core attention
    return {
        "fwd": fwd,
        "bwd": bwd,
        "fwd_total": sum(fwd.values()),
        "bwd_total": sum(bwd.values()),
        "grad_sync": grad_sync_elems(model, par) if mode == "train" else 0.0,
    }


def _forward_per_layer(par: ParallelConfig, work: Workload) -> dict[str, float]:
    """`comm_per_layer`'s forward elements by kind: the tensor axis's activations, the K/V exchange (or Ulysses'
    head shards), FSDP's unit, TSP's owner shards."""
    model, lay, h, n = work.model, layout(par), work.model.dim, work.tokens
    fwd = {"weights": 0.0, "kv": 0.0, "activations": 0.0, "heads": 0.0}
    if megatron_tp_degree(par) > 1:  # f/g all-reduces, or Megatron-SP's all-gather + reduce-scatter pairs
        fwd["activations"] = 4 * (n / lay.sp) * h * (lay.tp - 1) / lay.tp
    kv_d = model.head_dim * kv_heads_per_rank(model, lay.tp)  # K (or V) width per token on a rank: h/(g·T)
    if par.ulysses:
        fwd["heads"] = (n / lay.sp) * (2 * h + 2 * model.n_kv_heads * model.head_dim) / lay.tp * (lay.sp - 1) / lay.sp
    elif par.exchange:
        fwd["kv"] = 2 * n * kv_d * (lay.sp - 1) / lay.sp
    if par.spec.fsdp:
        nf = fsdp_shards(par)
        fwd["weights"] = (layer_weight_params(model) + 2 * h) * (nf - 1) / nf
    if par.scheme == "tsp":  # D owner shards (each with its own, possibly replicated, KV head) and their K/V
        d = par.degree
        fwd["weights"] = d * layer_weight_params_per_rank(model, par) * (d - 1) / d
        fwd["kv"] = 2 * n * d * kv_d * (d - 1) / d
    return fwd


def comm_embed_head(par: ParallelConfig, work: Workload) -> dict[str, dict[str, float]]:
    """Elements received per device per step by the vocabulary-parallel embedding ("embed") and LM head +
    cross-entropy ("head"), forward and backward (tspbench/schemes/ops/vocab.py); zero where the vocabulary is
    replicated (sp, tsp, tp_sp with T = 1). With T the tensor degree, N = B·S tokens, n = N/Σ local tokens:
        tp, tp_sp   embed  fwd all-reduce of [n, h]               2·n·h·(T−1)/T;  bwd nothing (g's dual)
                    head   fwd 3 all-reduces of n scalars (max, Σexp, target logit)  6·n·(T−1)/T;
                           bwd all-reduce of the head-input gradient (f's dual)       2·n·h·(T−1)/T
        tsp, vocab=ring  V·h/D per ring hop: embed fwd V·h·(D−1)/D (weights), bwd the same (gradients);
                    head fwd V·h·(D−1)/D, bwd 2·V·h·(D−1)/D (weights again + gradients)
        tp_msp      embed  fwd reduce-scatter of [N, h] into the sequence shards  N·h·(T−1)/T; bwd all-gather, the same
                    head   fwd all-gather of the final norm's output N·h·(T−1)/T + 6·N·(T−1)/T;
                           bwd reduce-scatter of its gradient                         N·h·(T−1)/T
        fsdp_sp     FSDP units over n = dp_shard·Σ: embed fwd all-gather V·h·(n−1)/n, bwd all-gather + reduce-scatter
                    2·V·h·(n−1)/n; head (final norm + LM head, kept gathered after forward, torchtitan's choice)
                    fwd (V·h + h)·(n−1)/n, bwd its reduce-scatter, the same; HSDP adds to each backward the all-reduce
                    of the unit's 1/n gradient shard over the R = dp/dp_shard replicas (`fsdp_replicate_recv`)
        tp_sp (msp) the tp_msp terms on shard σ's n = N/Σ tokens (msp=false: the tp terms)
    """
    model, mode = work.model, work.mode
    t, h = par.vocab_degree, model.dim
    zero = {"fwd": 0.0, "bwd": 0.0}
    out = {"embed": dict(zero), "head": dict(zero)}
    if par.spec.fsdp:
        nf = fsdp_shards(par)
        emb, head = model.vocab_size * h * (nf - 1) / nf, (model.vocab_size * h + h) * (nf - 1) / nf
        train = mode == "train"
        emb_ar = fsdp_replicate_recv(par, model.vocab_size * h)
        head_ar = fsdp_replicate_recv(par, model.vocab_size * h + h)
        return {
            "embed": {"fwd": emb, "bwd": 2 * emb + emb_ar if train else 0.0},
            "head": {"fwd": head, "bwd": head + head_ar if train else 0.0},
        }
    if t <= 1:
        return out
    f = (t - 1) / t
    if par.vocab == "ring":  # tsp: V·h/D per hop; embed D−1 weight hops + D−1 gradient hops, head 1 + 2 rings
        out = {
            "embed": {"fwd": model.vocab_size * h * f, "bwd": model.vocab_size * h * f},
            "head": {"fwd": model.vocab_size * h * f, "bwd": 2 * model.vocab_size * h * f},
        }
        return out if mode == "train" else {k: {"fwd": v["fwd"], "bwd": 0.0} for k, v in out.items()}
    n = work.tokens / layout(par).sp
    if par.megatron_sp:  # the embedding's output reduce-scattered into, the head's input gathered from, the pieces
        out["embed"] = {"fwd": n * h * f, "bwd": n * h * f}
        out["head"] = {"fwd": n * h * f + 6 * n * f, "bwd": n * h * f}
    else:
        out["embed"] = {"fwd": 2 * n * h * f, "bwd": 0.0}
        out["head"] = {"fwd": 6 * n * f, "bwd": 2 * n * h * f}
    if mode == "forward":
        out = {k: {"fwd": v["fwd"], "bwd": 0.0} for k, v in out.items()}
    elif mode != "train":
        raise ValueError(f"mode={mode!r} is unknown; allowed: train, forward")
    return out


def fsdp_replicate_recv(par: ParallelConfig, unit: float) -> float:
    """Elements one rank receives in HSDP's all-reduce of a unit's gradient shard (unit/n elements, n = dp_shard·Σ)
    over the R = dp/dp_shard replicas of its shard group: 2·(unit/n)·(R−1)/R; 0 for plain FSDP (R = 1) and for every
    scheme without FSDP (docs/method.md#fsdp-sp)."""
    r = par.dp // par.dp_shard if par.spec.fsdp else 1
    return 2 * unit / fsdp_shards(par) * (r - 1) / r if r > 1 else 0.0


def comm_decode_per_layer(model: ModelConfig, par: ParallelConfig, batch: int) -> float:
    """Elements received per device per layer in one decode step (tspbench/schemes/ops/decode.py): B new tokens,
    replicated on the group; the KV cache never moves.
        tp, tp_msp (T)  2 all-reduces of [B, h] (f/g)                              4·B·h·(T−1)/T
        sp (Σ)          merge: all-reduce of the max [B, n_h], then of numerator and
                        denominator packed [B, n_h, d + 1]                         2·B·n_h·(d + 2)·(Σ−1)/Σ
        tp_sp           the two, the merge on the n_h/T local heads
        fsdp_sp         sp's merge, and FSDP all-gathers the block unit for every step's forward (resharded
                        after it)                                            + (W + 2h)·(n−1)/n, n = dp_shard·Σ
        tsp (D)         all-gather q, k, v over heads (B·(n_h + 2·n_kv)·d), the merge: max all-reduced
                        (2·B·n_h), numerator‖denominator reduce-scattered over heads (B·n_h·(d + 1)),
                        and 2 all-reduces of [B, h]:                               B·(6h + 2h/g + 3·n_h)·(D−1)/D
                        (D > n_kv: the replicated KV heads travel too, 2·D·d instead of 2h/g)
    """
    h, n_h, d, b = model.dim, model.n_heads, model.head_dim, batch

    def f(p: int) -> float:
        return (p - 1) / p

    if par.scheme == "tsp":
        kv = 2 * par.degree * d * kv_heads_per_rank(model, par.degree)  # 2h/g, or 2·D·d replicated
        return b * (6 * h + kv + 3 * n_h) * f(par.degree)
    t, out = megatron_tp_degree(par), 0.0
    if t > 1:  # f/g: W_O's and the MLP's outputs
        out += 4 * b * h * f(t)
    if par.exchange:  # the merge of the token shards' partial attention, on the n_h/T local heads
        out += 2 * b * (n_h / t) * (d + 2) * f(layout(par).sp)
    if par.spec.fsdp:  # the block unit, gathered for every step's forward
        out += (layer_weight_params(model) + 2 * h) * f(fsdp_shards(par))
    return out


def grad_sync_groups(model: ModelConfig, par: ParallelConfig, layers: int | None = None) -> list[tuple[float, int]]:
    """[(elements all-reduced, group size)] of the per-step in-group gradient all-reduces (not DP), one per group.

    Ranks that see different tokens produce different partial gradients of a weight they share (fsdp_sp: none
    here, FSDP reduce-scatters every gradient per unit, counted in comm_per_layer and comm_embed_head):
    sp all-reduces every gradient over Σ; tp_sp the T-sharded weights, vocabulary slices and norms over Σ (with
    Megatron-SP the norms, and a replicated embedding / head, see rank (σ, t)'s own tokens: summed over the
    T·Σ ranks in a second group); tsp the replicated norm/embedding/LM-head weights over D (vocab=ring: the norms;
    the embedding and head shards' gradients travel the ring); tp_msp the norm
    weights over T (norms run on each rank's S/T tokens; the vocabulary-parallel embedding and head see every
    token). tp and single need none. A KV head replicated over T/n_kv ranks is summed in a group of its own
    (`kv_grad_sync_group`), not here.
    """
    lay = layout(par)
    n_layers = model.n_layers if layers is None else layers
    if mesh_megatron_sp(par):
        norms = (2 * n_layers + (1 if layers is None else 0)) * model.dim
        edges = replicated_params(model, layers, par) - norms  # vocabulary slices (or the whole, replicated)
        sharded = n_layers * (layer_weight_params_per_rank(model, par) - kv_grad_sync_group(model, par, 1)[0])
        if par.vocab_degree > 1:
            return [(sharded + edges, lay.sp), (norms, par.degree)]
        return [(sharded, lay.sp), (norms + edges, par.degree)]
    if par.spec.fsdp:  # FSDP reduce-scatters every gradient per unit (comm_per_layer, comm_embed_head)
        return []
    if par.exchange:  # sp, and tp_sp without Megatron-SP: every rank of a token shard holds whole norms
        block = layer_weight_params_per_rank(model, par) - kv_grad_sync_group(model, par, 1)[0]
        return [(n_layers * block + replicated_params(model, layers, par), lay.sp)]
    if par.scheme == "tsp":  # vocab=ring: the embedding and head shards travel the weight ring, only norms are synced
        if par.vocab == "ring":
            return [((2 * n_layers + (1 if layers is None else 0)) * model.dim, par.degree)]
        return [(replicated_params(model, layers), par.degree)]
    if par.megatron_sp:  # tp_msp: the norms run on each rank's own S/T tokens (a vocabulary-parallel embedding and
        # head see all of them; replicated ones see the rank's S/T tokens too)
        if par.vocab_degree == 1:
            return [(replicated_params(model, layers, par), par.degree)]
        return [((2 * n_layers + (1 if layers is None else 0)) * model.dim, par.degree)]
    return []


def kv_grad_sync_group(model: ModelConfig, par: ParallelConfig, layers: int | None = None) -> tuple[float, int]:
    """(elements, group size) of the replicated-KV gradient all-reduce: with tensor degree T > n_kv each rank's
    W_K, W_V slice (one KV head, 2·h·d per layer) gets partial gradients from its own query heads only, summed
    over the T/n_kv ranks sharing the head (× Σ in tp_sp, whose token shards share it too; tsp's D owner shards
    are each on one rank). (0, 1) otherwise."""
    lay = layout(par)
    if lay.tp <= model.n_kv_heads:
        return 0.0, 1
    n_layers = model.n_layers if layers is None else layers
    reps = lay.tp // model.n_kv_heads
    return n_layers * 2 * model.dim * model.head_dim, reps * (lay.sp if megatron_tp_degree(par) > 1 else 1)


def grad_sync_elems(model: ModelConfig, par: ParallelConfig, layers: int | None = None) -> float:
    """Per-step elements received per device by the in-group gradient ring all-reduces: Σ 2·n·(p−1)/p over the
    token groups and the replicated KV heads' group."""
    groups = [*grad_sync_groups(model, par, layers), kv_grad_sync_group(model, par, layers)]
    return sum(2 * n * (p - 1) / p for n, p in groups if p > 1)


def crossover_tokens(model: ModelConfig, degree: int, mode: str = "forward") -> int:
    """Smallest B·S at which TSP's per-layer volume ≤ TP's, for D = T = degree.

    Forward: W·(D−1)/D + 2N(h/g)(D−1)/D ≤ 4Nh(D−1)/D  ⇔  N ≥ W / (h·(4 − 2/g));
        W = (2 + 2/g)h² + 3·ffn·h, so g = 1, ffn = 4h gives N ≥ 16h²/2h = 8h.
    Train (no recompute, K/V kept from the forward): 3W + 2K ≤ 8Nh  ⇔  N ≥ 3W / (h·(8 − 4/g)),
        i.e. 12h for g = 1, ffn = 4h.
    (D−1)/D cancels, so `degree` only matters through degree ≥ 2.
    """
    if degree < 2:
        raise ValueError("degree must be ≥ 2: with one rank neither scheme communicates")
    w, h, g = layer_weight_params(model), model.dim, model.gqa_ratio
    denom = h * (4 - 2 / g) if mode == "forward" else h * (8 - 4 / g)
    num = w if mode == "forward" else 3 * w
    return math.ceil(num / denom - 1e-9)
