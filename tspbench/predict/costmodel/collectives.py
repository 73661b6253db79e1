"""The collectives a step issues, as α–β costs (docs/method.md#collective-cost): what the time model (time.py) adds up.

Collectives follow Thakur, Rabenseifner & Gropp (IJHPCA 2005); p ranks, n bytes (the full, gathered/reduced
tensor), effective bandwidth bw (bus bandwidth, nccl-tests' convention) and per-step latency α:

    ring all-gather / reduce-scatter   (p−1)·α + (p−1)/p · n/bw
    ring all-reduce                    2(p−1)·α + 2(p−1)/p · n/bw
    all-to-all (pairwise exchange)     (p−1)·α + (p−1)/p · n/bw       (n: one rank's buffer, in = out)
    broadcast / reduce (pipelined)     (p−1)·α + n/bw
    point-to-point                     α + n/bw_p2p

bw is what the group's links give (`collective_cost_s`, HardwareProfile.group_link): inside a node (a group spanning
≤ gpus_per_node consecutive ranks) a switch gives any group each GPU's whole link bandwidth, a fully connected mesh
a p-GPU group its p − 1 peer links (a point-to-point hop one); across nodes the NICs of the group's members on a
node. `Pricing.links="node"` prices by the span alone, as before the topology model (HardwareProfile.link). The TP
axis of tp_sp is the inner (consecutive) axis, so its span is T; the Σ axis spans T·Σ.
Each list below is of `Collective` tuples (op, group size p, tensor elements n, span in ranks, count); the volume
one rank receives from them is the closed form of comm.py (tests/unit/test_costmodel.py holds the two equal).
"""

from __future__ import annotations

import math

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel.hardware import HardwareProfile
from tspbench.predict.costmodel.params import (
    fsdp_shards,
    kv_heads_per_rank,
    layer_weight_params,
    layer_weight_params_per_rank,
    layout,
    megatron_tp_degree,
    regathers_kv,
)
from tspbench.predict.costmodel.workload import PRICING, Pricing, Workload

Collective = tuple[str, int, float, int, int]
"""(op, group size p, tensor elements n, span in consecutive ranks, count per layer or step)."""


# ---------------------------------------------------------------------------------------------- α–β
def collective_time_s(op: str, p: int, n_bytes: float, bw: float, alpha_s: float) -> float:
    """α–β time of one collective over p ranks moving a tensor of n_bytes (module docstring)."""
    if p <= 1 or n_bytes == 0:
        return 0.0
    if op in ("allgather", "reduce_scatter", "alltoall"):
        return (p - 1) * alpha_s + (p - 1) / p * n_bytes / bw
    if op == "allreduce":
        return 2 * (p - 1) * alpha_s + 2 * (p - 1) / p * n_bytes / bw
    if op in ("broadcast", "reduce"):
        return (p - 1) * alpha_s + n_bytes / bw
    if op == "p2p":
        return alpha_s + n_bytes / bw
    raise ValueError(f"op={op!r} is unknown")


def received_elems(op: str, p: int, n: float) -> float:
    """Elements one rank receives (on average over ranks) in one collective of an n-element tensor."""
    if p <= 1:
        return 0.0
    factor = {
        "allgather": (p - 1) / p,
        "reduce_scatter": (p - 1) / p,
        "allreduce": 2 * (p - 1) / p,
        "alltoall": (p - 1) / p,
        "broadcast": (p - 1) / p,
        "reduce": (p - 1) / p,
        "p2p": 1.0,
    }[op]
    return factor * n


def collective_cost_s(
    op: str, p: int, n_bytes: float, span: int, hw: HardwareProfile, *, pricing: Pricing = PRICING
) -> float:
    """α–β time of one collective `op` over p ranks spanning `span` consecutive ranks, moving a tensor of n_bytes, on
    the links it uses: `pricing.links` "topology" (the group's links on the profile's fabric,
    HardwareProfile.group_link) or "node" (the span alone, HardwareProfile.link: the rule before the topology model).
    Every collective the time model prices goes through here; a point-to-point ring hop is op "p2p" with p = 2."""
    if pricing.links == "topology":
        bw, alpha = hw.group_link(op, p, span)
    elif pricing.links == "node":
        bw, alpha = hw.link(span, p2p=(op == "p2p"))
    else:
        raise ValueError(f"links={pricing.links!r} is unknown; allowed: topology, node")
    return collective_time_s(op, p, n_bytes, bw, alpha)


def collectives_time_s(
    colls: list[Collective], hw: HardwareProfile, elem_bytes: int, *, pricing: Pricing = PRICING
) -> float:
    """α–β time of a list of collectives issued one after the other, each priced by `collective_cost_s`."""
    return sum(
        count * collective_cost_s(op, p, n * elem_bytes, span, hw, pricing=pricing) for op, p, n, span, count in colls
    )


# ---------------------------------------------------------------------------------------------- per layer
def layer_collectives(
    par: ParallelConfig,
    work: Workload,
    *,
    regather_kv: bool | None = None,
    tp_regather: bool = True,
    ulysses_split: bool = True,
) -> list[Collective]:
    """The collectives of one layer (work.mode forward: the forward's; train: forward and backward).

    Forward as in docs/method.md#tsp and #communication; backward mirrors comm_per_layer (same received volume).
    Full recompute replays the forward in backward, except that FSDP keeps its unit gathered for it (only the
    sequence exchange replays). `tp_regather`: Megatron-SP's column-parallel inputs re-gathered in backward from
    the saved pieces (the code); False: the code before it, which kept the gathered inputs (Pricing.tp_async off).
    `ulysses_split`: Ulysses' Q, K and V exchanged one by one (the code, DeepSpeed's overlapped schedule); False:
    one packed [Q; K; V] all-to-all, the code before it (Pricing.ulysses_overlap off). The same volume either way.
    """
    if regather_kv is None:  # what the code does (params.regathers_kv)
        regather_kv = regathers_kv(par)
    if par.scheme == "tsp":
        fwd, bwd = _tsp_layer(par, work, regather_kv)
        replay = fwd
    else:
        fwd, bwd, exch = _mesh_layer(par, work, regather_kv, tp_regather, ulysses_split)
        replay = exch if par.spec.fsdp else fwd
    if work.mode == "forward":
        return fwd
    if par.recompute == "full":
        return fwd + bwd + replay
    return fwd + bwd


def _mesh_layer(
    par: ParallelConfig, work: Workload, regather_kv: bool, tp_regather: bool = True, ulysses_split: bool = True
) -> tuple[list[Collective], list[Collective], list[Collective]]:
    """(forward, backward, the sequence exchange's forward) of one layer of a layout built from a tensor axis T, a
    token axis Σ and FSDP (every scheme but tsp): FSDP's unit over N = dp_shard·Σ (+ HSDP's all-reduce of its gradient
    shard over the R = dp/dp_shard replicas; docs/method.md#fsdp-sp), then the
    tensor axis's collectives, then the K/V exchange over Σ (or Ulysses' all-to-alls, #ulysses)."""
    model, lay, h, n = work.model, layout(par), work.model.dim, work.tokens
    t, sig = lay.tp, lay.sp
    tensor, tensor_bwd = _tensor_axis(par, t, n / sig * h, tp_regather)
    if par.ulysses:  # Q, K, V to head shards, O back; the inverse all-to-alls backward
        exch = ulysses_exchanges(par, work, split=ulysses_split)
        exch_bwd, replay = list(exch), []  # selective: the all-to-alls stay outside the recomputed core
    elif par.exchange:  # K and V packed; dK/dV reduce-scattered back
        kv_d = model.head_dim * kv_heads_per_rank(model, t)  # h/(g·T); d for a replicated KV head (T > n_kv)
        kv: Collective = ("allgather", sig, 2 * n * kv_d, t * sig, 1)
        exch, exch_bwd = [kv], [("reduce_scatter", *kv[1:])]
        if par.exchange == "ring":  # ring attention: Σ−1 hops of one packed [K; V] block, the dK/dV back the same
            kv = ("p2p", 2, 2 * n / sig * kv_d, t * sig, sig - 1)  # way (schemes/ops/ring_attention.py)
            exch, exch_bwd = [kv], [kv]
        replay = [kv] if regather_kv or par.recompute == "selective" else []  # selective re-runs the exchange
    else:
        exch, exch_bwd, replay = [], [], []
    unit, unit_bwd = [], []
    if par.spec.fsdp:  # gathered for the forward, again for the backward, its gradient reduce-scattered (+ HSDP)
        u = fsdp_unit_gather(model, par)
        unit, unit_bwd = [u], [u, ("reduce_scatter", *u[1:]), *fsdp_replicate_all_reduce(par, u[2])]
    return unit + tensor + exch, unit_bwd + tensor_bwd + exch_bwd + replay, exch


def ulysses_exchanges(par: ParallelConfig, work: Workload, *, split: bool = True) -> list[Collective]:
    """Ulysses' all-to-alls of one layer's forward over Σ (schemes/ops/ulysses.py; the backward runs their inverses):
    Q (B·S/Σ·h/T), K and V (B·S/Σ·(h/g)/T each) one by one, then O (B·S/Σ·h/T); `split=False`: Q, K, V packed in
    one all-to-all, as the code before DeepSpeed's overlapped schedule."""
    model, lay = work.model, layout(par)
    t, sig = lay.tp, lay.sp
    q, kv = work.tokens / sig * model.dim / t, work.tokens / sig * model.n_kv_heads * model.head_dim / t
    if split:
        return [("alltoall", sig, q, t * sig, 1), ("alltoall", sig, kv, t * sig, 2), ("alltoall", sig, q, t * sig, 1)]
    return [("alltoall", sig, q + 2 * kv, t * sig, 1), ("alltoall", sig, q, t * sig, 1)]


def _tensor_axis(
    par: ParallelConfig, t: int, n: float, regather: bool = True
) -> tuple[list[Collective], list[Collective]]:
    """(forward, backward) of Megatron's tensor axis around attention and MLP on n elements: an all-gather in and a
    reduce-scatter out with Megatron-SP, the duals backward plus the column-parallel inputs re-gathered from the
    saved pieces (`regather`; schemes/ops/tensor_parallel.py); else the f/g all-reduces, f's backward; none without
    a head split."""
    if par.megatron_sp:
        fwd: list[Collective] = [("allgather", t, n, t, 2), ("reduce_scatter", t, n, t, 2)]
        return fwd, fwd + ([("allgather", t, n, t, 2)] if regather else [])
    if megatron_tp_degree(par) > 1:
        return [("allreduce", t, n, t, 2)], [("allreduce", t, n, t, 2)]
    return [], []


def _tsp_layer(par: ParallelConfig, work: Workload, regather_kv: bool) -> tuple[list[Collective], list[Collective]]:
    """TSP's layer (docs/method.md#tsp): each owner's attention shard broadcast, the MLP shards exchanged as
    `mlp_exchange` says, K/V all-gathered per owner; backward re-sends the weights, returns their gradients to the
    owners (reduces; the MLP's gradient ring or reduces) and reduce-scatters dK/dV (re-gathering K/V: `regather_kv`)."""
    c = tsp_collectives(par, work)
    fwd: list[Collective] = [c["broadcast"][0], *c["mlp"], c["kv"][0]]
    bwd: list[Collective] = [c["broadcast"][0], *c["mlp"], c["reduce"][0], *c["mlp_grad"], c["kv_rs"][0]]
    return fwd, bwd + (c["kv"] if regather_kv else [])


def tsp_mlp_piece_channels(par: ParallelConfig, model: ModelConfig) -> list[float]:
    """Channels of each message an MLP shard travels as (schemes/tsp.py mlp_pieces): the shard's ffn/D (ring,
    broadcast), or its halves ⌈c/2⌉ and ⌊c/2⌋ (biring: one each way round the ring)."""
    c = model.ffn_hidden / par.degree
    if par.mlp_exchange == "biring" and c >= 2:
        half = float(math.ceil(c / 2)) if c == int(c) else c / 2
        return [half, c - half]
    return [c]


def tsp_collectives(par: ParallelConfig, work: Workload) -> dict[str, list[Collective]]:
    """TSP's collectives of one layer by role, as the code issues them (schemes/ops/owner_attention.py,
    schemes/ops/ring.py; the time model prices each role on its own, time.py):
        broadcast  D broadcasts of one owner's attention shard ((2 + 2/g)·h²/D)
        reduce     D reduces of its gradient to the owner (backward)
        kv         D all-gathers of one owner's [K; V] over the whole sequence (2·N·h/(g·D)); kv_rs their
                   reduce-scatters (dK/dV, backward)
        mlp        the MLP's weight exchange (3·ffn·h/D per shard): ring D−1 hops p → p+1; biring D−1 hops each way
                   of half a shard (one tuple per direction); broadcast D broadcasts of a shard
        mlp_grad   its gradients' way back (backward): ring/biring the gradient hops (the same tuples), broadcast D
                   reduces to the owners"""
    model, h, n, d = work.model, work.model.dim, work.tokens, par.degree
    kv_d = model.head_dim * kv_heads_per_rank(model, layout(par).tp)
    mlp_shard = 3 * model.ffn_hidden * h / d
    attn_shard = layer_weight_params_per_rank(model, par) - mlp_shard  # one owner's
    kv: Collective = ("allgather", d, 2 * n * kv_d, d, d)  # one owner's heads, whole sequence
    if par.mlp_exchange == "broadcast":
        mlp: list[Collective] = [("broadcast", d, mlp_shard, d, d)]
        mlp_grad: list[Collective] = [("reduce", d, mlp_shard, d, d)]
    else:  # one tuple per direction round the ring (biring: p → p+1 and p → p−1, half a shard each)
        mlp = [("p2p", 2, 3 * c * h, d, d - 1) for c in tsp_mlp_piece_channels(par, model)]
        mlp_grad = list(mlp)
    return {
        "broadcast": [("broadcast", d, attn_shard, d, d)],
        "reduce": [("reduce", d, attn_shard, d, d)],
        "kv": [kv],
        "kv_rs": [("reduce_scatter", *kv[1:])],
        "mlp": mlp,
        "mlp_grad": mlp_grad,
    }


def fsdp_unit_gather(model: ModelConfig, par: ParallelConfig) -> Collective:
    """fsdp_sp's per-layer unit all-gather (the block's weights and its 2 norms over its shard group, N = dp_shard·Σ
    consecutive ranks); its gradient reduce-scatter is the same tuple with op "reduce_scatter"."""
    nf = fsdp_shards(par)
    return ("allgather", nf, layer_weight_params(model) + 2 * model.dim, nf, 1)


def fsdp_replicate_all_reduce(par: ParallelConfig, unit: float) -> list[Collective]:
    """HSDP (fsdp_sp, dp_shard < dp): FSDP2's all-reduce of a unit's reduce-scattered gradient shard (unit/N elements)
    over the R = dp/dp_shard replicas of the shard group, ranks N apart (the group spans all dp·Σ ranks); none when
    R = 1 (docs/method.md#fsdp-sp)."""
    r = par.dp // par.dp_shard
    if r <= 1:
        return []
    return [("allreduce", r, unit / fsdp_shards(par), par.dp * par.degree, 1)]


# ---------------------------------------------------------------------------------------------- per step, decode
def edge_collectives(par: ParallelConfig, work: Workload) -> list[Collective]:
    """Once per step: the vocabulary-parallel embedding, LM head and cross-entropy (costmodel.comm_embed_head;
    none where the vocabulary is replicated). Same tuple format as `layer_collectives`."""
    model, mode = work.model, work.mode
    t, h = par.vocab_degree, model.dim
    if par.spec.fsdp:  # the embedding and head units over N = dp_shard·Σ (gathered; embedding again + both RS; HSDP
        # all-reduces both gradient shards over the replicas)
        nf = fsdp_shards(par)
        emb, head = float(model.vocab_size * h), float(model.vocab_size * h + h)
        units: list[Collective] = [("allgather", nf, emb, nf, 1), ("allgather", nf, head, nf, 1)]
        grads = [("allgather", nf, emb, nf, 1), ("reduce_scatter", nf, emb, nf, 1), ("reduce_scatter", nf, head, nf, 1)]
        grads += fsdp_replicate_all_reduce(par, emb) + fsdp_replicate_all_reduce(par, head)
        return units if mode == "forward" else units + grads
    if t <= 1:
        return []
    n = work.tokens / layout(par).sp
    if par.vocab == "ring":  # tsp: weight rings of V·h/D (and gradient rings in training)
        shard = model.vocab_size * h / t
        fwd: list[Collective] = [("p2p", 2, shard, t, 2 * (t - 1))]
        bwd: list[Collective] = [("p2p", 2, shard, t, 3 * (t - 1))]
        return fwd if mode == "forward" else fwd + bwd
    if par.megatron_sp:  # the embedding's output reduce-scattered into, the head's input gathered from, the pieces
        fwd = [("reduce_scatter", t, n * h, t, 1), ("allgather", t, n * h, t, 1), ("allreduce", t, n, t, 3)]
        bwd = [("allgather", t, n * h, t, 1), ("reduce_scatter", t, n * h, t, 1)]
    else:
        fwd = [("allreduce", t, n * h, t, 1), ("allreduce", t, n, t, 3)]
        bwd = [("allreduce", t, n * h, t, 1)]
    return fwd if mode == "forward" else fwd + bwd


def decode_collectives(model: ModelConfig, par: ParallelConfig, batch: int) -> list[Collective]:
    """One layer of one decode step (schemes/ops/decode.py), in `layer_collectives`' format; received volume
    = costmodel.comm_decode_per_layer."""
    lay, h, n_h, d, b = layout(par), model.dim, model.n_heads, model.head_dim, batch
    out: list[Collective] = []
    if megatron_tp_degree(par) > 1:
        out.append(("allreduce", lay.tp, b * h, lay.tp, 2))  # f/g: W_O and MLP outputs
    if par.spec.fsdp:  # FSDP gathers the unit for every step's forward
        out.append(fsdp_unit_gather(model, par))
    if par.exchange and lay.sp > 1:
        heads = n_h / lay.tp
        out += [
            ("allreduce", lay.sp, b * heads, par.degree, 1),  # the max
            ("allreduce", lay.sp, b * heads * (d + 1), par.degree, 1),  # numerator ‖ denominator
        ]
    if par.scheme == "tsp":
        p = par.degree
        out += [
            ("allgather", p, b * (n_h + 2 * p * kv_heads_per_rank(model, p)) * d, p, 1),  # q, k, v packed
            ("allreduce", p, b * n_h, p, 1),  # the max
            ("reduce_scatter", p, b * n_h * (d + 1), p, 1),  # numerator ‖ denominator, onto the head owners
            ("allreduce", p, b * h, p, 2),
        ]
    return out
