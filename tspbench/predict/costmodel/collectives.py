"""The collectives a step issues, as α–β costs (docs/method.md#collective-cost): what the time model (time.py) adds up.

Collectives follow Thakur, Rabenseifner & Gropp (IJHPCA 2005); p ranks, n bytes (the full, gathered/reduced
tensor), link bandwidth β⁻¹ = bw·comm_efficiency and per-step latency α:

    ring all-gather / reduce-scatter   (p−1)·α + (p−1)/p · n/bw
    ring all-reduce                    2(p−1)·α + 2(p−1)/p · n/bw
    all-to-all (pairwise exchange)     (p−1)·α + (p−1)/p · n/bw       (n: one rank's buffer, in = out)
    broadcast / reduce (pipelined)     (p−1)·α + n/bw
    point-to-point                     α + n/bw_p2p

A collective uses the intra-node link when its group spans ≤ gpus_per_node consecutive ranks, else the
inter-node NIC. The TP axis of tp_sp is the inner (consecutive) axis, so its span is T; the Σ axis spans T·Σ.
Each list below is of `Collective` tuples (op, group size p, tensor elements n, span in ranks, count); the volume
one rank receives from them is the closed form of comm.py (tests/unit/test_costmodel.py holds the two equal).
"""

from __future__ import annotations

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
from tspbench.predict.costmodel.workload import Workload

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


def collectives_time_s(colls: list[Collective], hw: HardwareProfile, elem_bytes: int) -> float:
    """α–β time of a list of collectives issued one after the other, each on the link its span reaches."""
    total = 0.0
    for op, p, n, span, count in colls:
        bw, alpha = hw.link(span, p2p=(op == "p2p"))
        total += count * collective_time_s(op, p, n * elem_bytes, bw, alpha)
    return total


# ---------------------------------------------------------------------------------------------- per layer
def layer_collectives(par: ParallelConfig, work: Workload, *, regather_kv: bool | None = None) -> list[Collective]:
    """The collectives of one layer (work.mode forward: the forward's; train: forward and backward).

    Forward as in docs/method.md#tsp and #communication; backward mirrors comm_per_layer (same received volume).
    Full recompute replays the forward in backward, except that FSDP keeps its unit gathered for it (only the
    sequence exchange replays).
    """
    if regather_kv is None:  # what the code does (params.regathers_kv)
        regather_kv = regathers_kv(par)
    if par.scheme == "tsp":
        fwd, bwd = _tsp_layer(par, work, regather_kv)
        replay = fwd
    else:
        fwd, bwd, exch = _mesh_layer(par, work, regather_kv)
        replay = exch if par.spec.fsdp else fwd
    if work.mode == "forward":
        return fwd
    if par.recompute == "full":
        return fwd + bwd + replay
    return fwd + bwd


def _mesh_layer(
    par: ParallelConfig, work: Workload, regather_kv: bool
) -> tuple[list[Collective], list[Collective], list[Collective]]:
    """(forward, backward, the sequence exchange's forward) of one layer of a layout built from a tensor axis T, a
    token axis Σ and FSDP (every scheme but tsp): FSDP's unit over N = dp·Σ (docs/method.md#fsdp-sp), then the
    tensor axis's collectives, then the K/V exchange over Σ (or Ulysses' all-to-alls, #ulysses)."""
    model, lay, h, n = work.model, layout(par), work.model.dim, work.tokens
    t, sig = lay.tp, lay.sp
    tensor = _tensor_axis(par, t, n / sig * h)
    if par.ulysses:  # [Q; K; V] to head shards, O back; the inverse all-to-alls backward
        qkv, o = n / sig * (h + 2 * model.n_kv_heads * model.head_dim) / t, n / sig * h / t
        exch = [("alltoall", sig, qkv, t * sig, 1), ("alltoall", sig, o, t * sig, 1)]
        exch_bwd, replay = list(exch), []  # selective: the all-to-alls stay outside the recomputed core
    elif par.exchange:  # K and V packed; dK/dV reduce-scattered back
        kv_d = model.head_dim * kv_heads_per_rank(model, t)  # h/(g·T); d for a replicated KV head (T > n_kv)
        kv: Collective = ("allgather", sig, 2 * n * kv_d, t * sig, 1)
        exch, exch_bwd = [kv], [("reduce_scatter", *kv[1:])]
        replay = [kv] if regather_kv or par.recompute == "selective" else []  # selective re-runs the exchange
    else:
        exch, exch_bwd, replay = [], [], []
    unit, unit_bwd = [], []
    if par.spec.fsdp:  # gathered for the forward, again for the backward, its gradient reduce-scattered
        u = fsdp_unit_gather(model, par)
        unit, unit_bwd = [u], [u, ("reduce_scatter", *u[1:])]
    return unit + tensor + exch, unit_bwd + tensor + exch_bwd + replay, exch


def _tensor_axis(par: ParallelConfig, t: int, n: float) -> list[Collective]:
    """Megatron's tensor axis around attention and MLP on n elements (the duals backward): an all-gather in and a
    reduce-scatter out with Megatron-SP, else the f/g all-reduces; none without a head split."""
    if par.megatron_sp:
        return [("allgather", t, n, t, 2), ("reduce_scatter", t, n, t, 2)]
    if megatron_tp_degree(par) > 1:
        return [("allreduce", t, n, t, 2)]
    return []


def _tsp_layer(par: ParallelConfig, work: Workload, regather_kv: bool) -> tuple[list[Collective], list[Collective]]:
    """TSP's layer (docs/method.md#tsp): each owner's attention shard broadcast, the MLP shards round the ring, K/V
    all-gathered per owner; backward re-sends the weights, reduces their gradients to the owners and
    reduce-scatters dK/dV (re-gathering K/V: `regather_kv`)."""
    model, h, n, d = work.model, work.model.dim, work.tokens, par.degree
    kv_d = model.head_dim * kv_heads_per_rank(model, layout(par).tp)
    attn_shard = layer_weight_params_per_rank(model, par) - 3 * model.ffn_hidden * h / d  # one owner's
    kv: Collective = ("allgather", d, 2 * n * kv_d, d, d)  # one owner's heads, whole sequence
    hop: Collective = ("p2p", 2, 3 * model.ffn_hidden * h / d, d, d - 1)
    fwd: list[Collective] = [("broadcast", d, attn_shard, d, d), hop, kv]
    bwd: list[Collective] = [
        ("broadcast", d, attn_shard, d, d),
        hop,
        ("reduce", d, attn_shard, d, d),
        hop,
        ("reduce_scatter", *kv[1:]),
    ]
    return fwd, bwd + ([kv] if regather_kv else [])


def fsdp_unit_gather(model: ModelConfig, par: ParallelConfig) -> Collective:
    """fsdp_sp's per-layer unit all-gather (the block's weights and its 2 norms over N = dp·Σ); its gradient
    reduce-scatter is the same tuple with op "reduce_scatter"."""
    nf = fsdp_shards(par)
    return ("allgather", nf, layer_weight_params(model) + 2 * model.dim, nf, 1)


# ---------------------------------------------------------------------------------------------- per step, decode
def edge_collectives(par: ParallelConfig, work: Workload) -> list[Collective]:
    """Once per step: the vocabulary-parallel embedding, LM head and cross-entropy (costmodel.comm_embed_head;
    none where the vocabulary is replicated). Same tuple format as `layer_collectives`."""
    model, mode = work.model, work.mode
    t, h = par.vocab_degree, model.dim
    if par.spec.fsdp:  # the embedding and head units over N = dp·Σ (gathered; embedding again + both RS)
        nf = fsdp_shards(par)
        emb, head = float(model.vocab_size * h), float(model.vocab_size * h + h)
        units: list[Collective] = [("allgather", nf, emb, nf, 1), ("allgather", nf, head, nf, 1)]
        grads = [("allgather", nf, emb, nf, 1), ("reduce_scatter", nf, emb, nf, 1), ("reduce_scatter", nf, head, nf, 1)]
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
