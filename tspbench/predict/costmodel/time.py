"""Time model: α–β collectives and a roofline step time on a hardware profile (hardware.py).

Collectives follow Thakur, Rabenseifner & Gropp (IJHPCA 2005; docs/method.md#collective-cost); p ranks, n bytes (the
full, gathered/reduced tensor), link bandwidth β⁻¹ = bw·comm_efficiency and per-step latency α:

    ring all-gather / reduce-scatter   (p−1)·α + (p−1)/p · n/bw
    ring all-reduce                    2(p−1)·α + 2(p−1)/p · n/bw
    all-to-all (pairwise exchange)     (p−1)·α + (p−1)/p · n/bw       (n: one rank's buffer, in = out)
    broadcast / reduce (pipelined)     (p−1)·α + n/bw
    point-to-point                     α + n/bw_p2p

A collective uses the intra-node link when its group spans ≤ gpus_per_node consecutive ranks, else the
inter-node NIC. The TP axis of tp_sp is the inner (consecutive) axis, so its span is T; the Σ axis spans T·Σ.
Compute is a roofline: FLOPs / (peak · matmul_efficiency). Efficiencies are stated assumptions, not fits.
Overlap "none" adds compute and communication; "ideal" takes their maximum; "schedule" follows the issue order
the code has (`schedule_exposed_comm_s`, docs/method.md#choice-overlap): what each collective can hide behind.
"""

from __future__ import annotations

from dataclasses import replace

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel.comm import grad_sync_groups, kv_grad_sync_group
from tspbench.predict.costmodel.flops import hardware_flops_per_token
from tspbench.predict.costmodel.hardware import HardwareProfile, load_hardware  # noqa: F401 (re-exported)
from tspbench.predict.costmodel.memory import kv_cache_bytes
from tspbench.predict.costmodel.params import (
    BYTES,
    fsdp_shards,
    kv_heads_per_rank,
    layer_weight_params,
    layer_weight_params_per_rank,
    layout,
    local_gqa_ratio,
    megatron_sp,
    params_per_device,
    state_bytes_per_param,
)


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


def layer_collectives(
    model: ModelConfig,
    par: ParallelConfig,
    seq_len: int,
    batch: int,
    *,
    mode: str = "forward",
    regather_kv: bool | None = None,
) -> list[tuple[str, int, float, int, int]]:
    """The collectives of one layer: (op, group size p, tensor elements n, span in ranks, count).

    Forward as in docs/method.md#tsp and #communication; backward mirrors comm_per_layer (same received volume).
    """
    lay, h, n = layout(par), model.dim, batch * seq_len
    s, t, sig = par.scheme, lay.tp, lay.sp
    if regather_kv is None:  # what the code does (costmodel.comm.comm_per_layer)
        regather_kv = s == "tsp"
    kv_d = model.head_dim * kv_heads_per_rank(model, t)  # h/(g·T); d for a replicated KV head (T > n_kv)
    fwd: list[tuple[str, int, float, int, int]] = []
    bwd: list[tuple[str, int, float, int, int]] = []
    if s == "tp":
        fwd += [("allreduce", t, n * h, t, 2)]
        bwd += fwd
    elif s == "tp_msp":
        fwd += [("allgather", t, n * h, t, 2), ("reduce_scatter", t, n * h, t, 2)]
        bwd += fwd
    elif s in ("sp", "tp_sp") and par.sp_variant == "ulysses":  # [Q; K; V] to head shards, O back (#ulysses)
        if megatron_sp(par):  # Megatron-SP on T: all-gather in, reduce-scatter out
            fwd += [("allgather", t, n / sig * h, t, 2), ("reduce_scatter", t, n / sig * h, t, 2)]
        elif t > 1:
            fwd += [("allreduce", t, n / sig * h, t, 2)]
        qkv, o = n / sig * (h + 2 * model.n_kv_heads * model.head_dim) / t, n / sig * h / t
        fwd += [("alltoall", sig, qkv, t * sig, 1), ("alltoall", sig, o, t * sig, 1)]
        bwd += fwd
    elif s in ("sp", "tp_sp"):
        kv = ("allgather", sig, 2 * n * kv_d, t * sig, 1)  # K and V packed
        if megatron_sp(par):  # Megatron-SP on T: all-gather in, reduce-scatter out (the duals backward)
            tp_colls = [("allgather", t, n / sig * h, t, 2), ("reduce_scatter", t, n / sig * h, t, 2)]
        else:
            tp_colls = [("allreduce", t, n / sig * h, t, 2)] if t > 1 else []
        fwd += tp_colls + [kv]
        bwd += tp_colls + [("reduce_scatter",) + kv[1:]]
        bwd += [kv] if regather_kv or par.recompute == "selective" else []  # selective re-runs the exchange
    elif s == "fsdp_sp":  # docs/method.md#fsdp-sp: the unit over N = dp·Σ, sp's exchange over Σ
        unit = _fsdp_unit_gather(model, par)
        if par.sp_variant == "ulysses":  # [Q; K; V] to head shards, O back; the inverse all-to-alls backward
            qkv, o = n / sig * (h + 2 * model.n_kv_heads * model.head_dim), n / sig * h
            exch = [("alltoall", sig, qkv, sig, 1), ("alltoall", sig, o, sig, 1)]
            exch_bwd, replay = list(exch), []  # selective: the all-to-alls stay outside the recomputed core
        else:
            kv = ("allgather", sig, 2 * n * kv_d, sig, 1)
            exch, exch_bwd = [kv], [("reduce_scatter",) + kv[1:]]
            replay = [kv] if regather_kv or par.recompute == "selective" else []
        fwd += [unit, *exch]
        bwd += [unit, ("reduce_scatter",) + unit[1:], *exch_bwd, *replay]
        if mode == "train" and par.recompute == "full":  # the unit stays gathered: only the exchange replays
            return fwd + bwd + exch
    elif s == "tsp":
        d = par.degree
        attn_shard = layer_weight_params_per_rank(model, par) - 3 * model.ffn_hidden * h / d  # one owner's
        kv = ("allgather", d, 2 * n * kv_d, d, d)  # one owner's heads, whole sequence
        fwd += [("broadcast", d, attn_shard, d, d), ("p2p", 2, 3 * model.ffn_hidden * h / d, d, d - 1), kv]
        bwd += [
            ("broadcast", d, attn_shard, d, d),
            ("p2p", 2, 3 * model.ffn_hidden * h / d, d, d - 1),
            ("reduce", d, attn_shard, d, d),
            ("p2p", 2, 3 * model.ffn_hidden * h / d, d, d - 1),
            ("reduce_scatter",) + kv[1:],
        ]
        bwd += [kv] if regather_kv else []
    if mode == "forward":
        return fwd
    if par.recompute == "full":
        bwd = bwd + fwd
    return fwd + bwd


def _collectives_time_s(colls, hw: HardwareProfile, elem_bytes: int) -> float:
    total = 0.0
    for op, p, n, span, count in colls:
        bw, alpha = hw.link(span, p2p=(op == "p2p"))
        total += count * collective_time_s(op, p, n * elem_bytes, bw, alpha)
    return total


def edge_collectives(
    model: ModelConfig, par: ParallelConfig, seq_len: int, batch: int, *, mode: str = "forward"
) -> list[tuple[str, int, float, int, int]]:
    """Once per step: the vocabulary-parallel embedding, LM head and cross-entropy (costmodel.comm_embed_head;
    none where the vocabulary is replicated). Same tuple format as `layer_collectives`."""
    t, h = par.vocab_degree, model.dim
    if par.scheme == "fsdp_sp":  # the embedding and head units over N = dp·Σ (gathered; embedding again + both RS)
        nf = fsdp_shards(par)
        emb, head = float(model.vocab_size * h), float(model.vocab_size * h + h)
        units: list[tuple[str, int, float, int, int]] = [("allgather", nf, emb, nf, 1), ("allgather", nf, head, nf, 1)]
        grads = [("allgather", nf, emb, nf, 1), ("reduce_scatter", nf, emb, nf, 1), ("reduce_scatter", nf, head, nf, 1)]
        return units if mode == "forward" else units + grads
    if t <= 1:
        return []
    n = batch * seq_len / layout(par).sp
    if par.vocab == "ring":  # tsp: weight rings of V·h/D (and gradient rings in training)
        shard = model.vocab_size * h / t
        fwd = [("p2p", 2, shard, t, 2 * (t - 1))]
        bwd = [("p2p", 2, shard, t, 3 * (t - 1))]
        return fwd if mode == "forward" else fwd + bwd
    if par.scheme == "tp_msp" or megatron_sp(par):
        fwd = [("reduce_scatter", t, n * h, t, 1), ("allgather", t, n * h, t, 1), ("allreduce", t, n, t, 3)]
        bwd = [("allgather", t, n * h, t, 1), ("reduce_scatter", t, n * h, t, 1)]
    else:
        fwd = [("allreduce", t, n * h, t, 1), ("allreduce", t, n, t, 3)]
        bwd = [("allreduce", t, n * h, t, 1)]
    return fwd if mode == "forward" else fwd + bwd


# ---------------------------------------------------------------------------------------------- overlap
OVERLAPS = ("none", "ideal", "schedule")


def schedule_exposed_comm_s(
    model: ModelConfig, par: ParallelConfig, seq_len: int, batch: int, hw: HardwareProfile, *, mode: str, dtype: str
) -> float:
    """One layer's exposed communication under the schedule the code has (docs/method.md#choice-overlap).

    tp, tp_msp, sp, tp_sp: every collective is issued synchronously on the critical path (Megatron's default
    without --tp-comm-overlap; our all-gather K/V exchange): all exposed. The baselines' overlap options
    (TransformerEngine's userbuffer TP overlap, torchtitan's async TP) are not implemented: the "ideal" rule bounds
    them, and every modelled record carries both.
    tsp (schemes/ops/owner_attention.py, schemes/ops/ring.py), per layer, with c_a one owner's attention compute
    (its GEMMs and kernel), k one bucket's kernel, c_m one MLP shard's GEMMs (×2 in backward):
        broadcasts     the first exposed, each next one hidden behind the current owner: t_b + (D−1)·max(0, t_b − c_a)
        K/V gathers    per owner, bucket 0 exposed, bucket b+1 behind bucket b: t_g/n_b + (n_b−1)·max(0, t_g/n_b − k)
        ring hops      behind the current shard: (D−1)·max(0, t_h − c_m); backward's weight and gradient hops share
                       the link: (D−1)·max(0, 2·t_h − 2·c_m)
        reduce, dK/dV reduce-scatter (backward)   behind the next owner's backward: D·max(0, t_r + t_rs − 2·c_a)
    The in-group gradient all-reduce and the edges stay exposed (they follow the layers).
    fsdp_sp (FSDP2, schemes/fsdp_sp.py: explicit prefetch, collectives on FSDP's own streams): the next unit's
    all-gather runs behind this layer's forward, max(0, t_ag − c_f); in backward the previous unit's all-gather and
    this unit's gradient reduce-scatter run behind its backward, max(0, t_ag + t_rs − 2·c_f), with c_f one layer's
    forward compute on the rank's tokens (GEMMs + kernel); sp's K/V exchange stays exposed (synchronous)."""
    colls = layer_collectives(model, par, seq_len, batch, mode=mode)
    b = BYTES[dtype]
    if par.scheme == "fsdp_sp":
        return _fsdp_exposed_comm_s(model, par, seq_len, batch, hw, colls, mode, dtype)
    if par.scheme != "tsp":
        return _collectives_time_s(colls, hw, b)
    d, h, ffn = par.degree, model.dim, model.ffn_hidden
    eff = hw.peak_flops(dtype) * hw.matmul_efficiency
    tokens = batch * seq_len / d  # this rank's tokens
    attn_w = layer_weight_params_per_rank(model, par) - 3 * ffn * h / d  # one owner's attention shard
    kernel = tokens * 4 * seq_len * model.n_heads * model.head_dim * 0.5 / eff / d  # one owner's heads
    c_a = tokens * 2 * attn_w / eff + kernel
    c_m = tokens * 2 * 3 * ffn * h / d / eff
    n_kv_owner = max(model.n_kv_heads // d, 1)
    n_b = -(-n_kv_owner // par.kv_bucket_heads) if par.kv_bucket_heads else 1

    def one(op: str) -> float:  # one collective of this kind (the tuple's count is how many per layer)
        c = next(c for c in colls if c[0] == op)
        bw, alpha = hw.link(c[3], p2p=(op == "p2p"))
        return collective_time_s(op, c[1], c[2] * b, bw, alpha)

    t_b, t_g, t_h = one("broadcast"), one("allgather"), one("p2p")
    gathers = d * (t_g / n_b + (n_b - 1) * max(0.0, t_g / n_b - kernel / n_b))
    exposed = t_b + (d - 1) * max(0.0, t_b - c_a) + gathers + (d - 1) * max(0.0, t_h - c_m)
    if mode == "train":
        t_r, t_rs = one("reduce"), one("reduce_scatter")
        back_gathers = d * (t_g / n_b + (n_b - 1) * max(0.0, t_g / n_b - 2 * kernel / n_b))
        exposed += t_b + (d - 1) * max(0.0, t_b - 2 * c_a) + back_gathers + (d - 1) * max(0.0, 2 * t_h - 2 * c_m)
        exposed += d * max(0.0, t_r + t_rs - 2 * c_a)
        if par.recompute == "full":  # the replay: the forward's schedule once more
            exposed += t_b + (d - 1) * max(0.0, t_b - c_a) + gathers + (d - 1) * max(0.0, t_h - c_m)
    return exposed


def _fsdp_unit_gather(model: ModelConfig, par: ParallelConfig) -> tuple[str, int, float, int, int]:
    """fsdp_sp's per-layer unit all-gather (the block's weights and its 2 norms over N = dp·Σ); its gradient
    reduce-scatter is the same tuple with op "reduce_scatter"."""
    nf = fsdp_shards(par)
    return ("allgather", nf, layer_weight_params(model) + 2 * model.dim, nf, 1)


def _fsdp_exposed_comm_s(model, par, seq_len, batch, hw, colls, mode: str, dtype: str) -> float:
    """fsdp_sp's exposed communication per layer under the schedule rule (`schedule_exposed_comm_s`)."""
    unit = _fsdp_unit_gather(model, par)
    unit_rs = ("reduce_scatter", *unit[1:])
    rest = [c for c in colls if c not in (unit, unit_rs)]  # the sequence exchange: synchronous, exposed
    b, eff = BYTES[dtype], hw.peak_flops(dtype) * hw.matmul_efficiency
    tokens = batch * seq_len / par.sp_degree
    c_f = tokens * 2 * layer_weight_params(model) / eff + tokens * 4 * seq_len * model.dim * 0.5 / eff
    ag, rs = _collectives_time_s([unit], hw, b), _collectives_time_s([unit_rs], hw, b)
    exposed = _collectives_time_s(rest, hw, b) + max(0.0, ag - c_f)
    if mode == "train":
        exposed += max(0.0, ag + rs - 2 * c_f)
    return exposed


def _attention_flops_per_token(
    model: ModelConfig, seq_len: int, mode: str, par: ParallelConfig, n_layers: int, causal_halved: bool
) -> tuple[float, float]:
    """(forward, backward) attention-kernel FLOPs per token of the replica inside hardware_flops_per_token: the
    forward (re-run under full, and under selective except tsp) and the flash backward (2.5 forwards)."""
    attn = n_layers * 4 * seq_len * model.n_heads * model.head_dim * (0.5 if causal_halved else 1.0)
    if mode != "train":
        return attn, 0.0
    reruns = 1 if par.recompute == "full" or (par.recompute == "selective" and par.scheme != "tsp") else 0
    return attn * (1 + reruns), 2.5 * attn


# ---------------------------------------------------------------------------------------------- step
def step_time(
    model: ModelConfig,
    par: ParallelConfig,
    seq_len: int,
    batch: int,
    hw: HardwareProfile,
    *,
    mode: str = "forward",
    overlap: str = "none",
    layers: int | None = None,
    dtype: str = "bfloat16",
    causal_halved: bool = True,
    regather_kv: bool | None = None,
) -> dict:
    """One replica's step on one device: compute, communication, and the step under the overlap rule.

    Compute: the replica's executed FLOPs (flops.hardware_flops_per_token: recompute, flash backward) split over
    its ranks, except the LM head, which each rank runs on B·S/loss_div tokens × V/vocab_div classes.
    Communication: per-layer collectives × layers, the vocabulary-parallel embedding / head collectives
    (full model), plus (train) the in-group gradient all-reduce.
    `layers=None` is the full model (with LM head); `layers=k` a k-block benchmark (no embedding/LM head).
    """
    if overlap not in OVERLAPS:
        raise ValueError(f"overlap={overlap!r} is unknown; allowed: {', '.join(OVERLAPS)}")
    lay, b = layout(par), BYTES[dtype]
    n_layers = model.n_layers if layers is None else layers
    body = hardware_flops_per_token(  # what the step executes, recompute included (flops.py)
        model,
        seq_len,
        mode,
        par.recompute,
        par.scheme,
        layers=n_layers,
        include_lm_head=False,
        causal_halved=causal_halved,
    )
    flops = batch * seq_len * body / par.degree
    if layers is None:  # LM head: 2·V·h per token, ×3 in training (never checkpointed)
        mult = 1 if mode == "forward" else 3
        if par.vocab == "ring":  # every class for the rank's tokens; backward recomputes the logits
            flops += batch * seq_len / lay.loss_div * 2 * model.vocab_size * model.dim * (mult + (mult > 1))
        else:
            flops += batch * seq_len / lay.loss_div * 2 * model.vocab_size / lay.vocab_div * model.dim * mult
    compute_s = flops / (hw.peak_flops(dtype) * hw.matmul_efficiency)
    if hw.calibration:  # measured kernel efficiencies: the attention kernel's FLOPs at their own rate
        fwd_attn, bwd_attn = _attention_flops_per_token(model, seq_len, mode, par, n_layers, causal_halved)
        peak = hw.peak_flops(dtype)
        attn_tokens = batch * seq_len / par.degree
        compute_s -= attn_tokens * (fwd_attn + bwd_attn) / (peak * hw.matmul_efficiency)
        compute_s += attn_tokens * fwd_attn / (peak * (hw.attention_forward_efficiency or hw.matmul_efficiency))
        compute_s += attn_tokens * bwd_attn / (peak * (hw.attention_backward_efficiency or hw.matmul_efficiency))

    colls = layer_collectives(model, par, seq_len, batch, mode=mode, regather_kv=regather_kv)
    comm_s = n_layers * _collectives_time_s(colls, hw, b)
    if layers is None:
        comm_s += _collectives_time_s(edge_collectives(model, par, seq_len, batch, mode=mode), hw, b)
    if mode == "train":
        groups = [*grad_sync_groups(model, par, layers), kv_grad_sync_group(model, par, layers)]
        comm_s += _collectives_time_s([("allreduce", p, n_sync, par.degree, 1) for n_sync, p in groups], hw, b)
    if overlap == "schedule":
        layer_comm = _collectives_time_s(colls, hw, b)
        hidden = layer_comm - schedule_exposed_comm_s(model, par, seq_len, batch, hw, mode=mode, dtype=dtype)
        step_s = compute_s + comm_s - n_layers * max(hidden, 0.0)
    else:
        step_s = compute_s + comm_s if overlap == "none" else max(compute_s, comm_s)
    return {
        "compute_s": compute_s,
        "comm_s": comm_s,
        "step_s": step_s,
        "exposed_comm_s": step_s - compute_s,
        "flops_per_device": flops,
    }


def decode_collectives(model: ModelConfig, par: ParallelConfig, batch: int) -> list[tuple[str, int, float, int, int]]:
    """One layer of one decode step (schemes/ops/decode.py), in `layer_collectives`' format; received volume
    = costmodel.comm_decode_per_layer."""
    lay, h, n_h, d, b, s = layout(par), model.dim, model.n_heads, model.head_dim, batch, par.scheme
    out: list[tuple[str, int, float, int, int]] = []
    if s in ("tp", "tp_msp", "tp_sp") and lay.tp > 1:
        out.append(("allreduce", lay.tp, b * h, lay.tp, 2))  # f/g: W_O and MLP outputs
    if s == "fsdp_sp":  # FSDP gathers the unit for every step's forward
        out.append(_fsdp_unit_gather(model, par))
    if par.exchange and lay.sp > 1:
        heads = n_h / lay.tp
        out += [
            ("allreduce", lay.sp, b * heads, par.degree, 1),  # the max
            ("allreduce", lay.sp, b * heads * (d + 1), par.degree, 1),  # numerator ‖ denominator
        ]
    if s == "tsp":
        p = par.degree
        out += [
            ("allgather", p, b * (n_h + 2 * p * kv_heads_per_rank(model, p)) * d, p, 1),  # q, k, v packed
            ("allreduce", p, b * n_h, p, 1),  # the max
            ("reduce_scatter", p, b * n_h * (d + 1), p, 1),  # numerator ‖ denominator, onto the head owners
            ("allreduce", p, b * h, p, 2),
        ]
    return out


def decode_step_time(
    model: ModelConfig,
    par: ParallelConfig,
    context_len: int,
    batch: int,
    hw: HardwareProfile,
    *,
    dtype: str = "bfloat16",
    overlap: str = "none",
) -> dict:
    """One decode step (one new token for each of a replica's B sequences, context_len cached) on one device.

    Memory: every weight this rank holds and its KV cache are read once per step, at hw.mem_bw (decode is
    bandwidth-bound). Compute: 2 FLOPs per held matmul weight per token (sp applies all weights to the replicated
    token) + attention, 2·g FLOPs per cached K or V element, at the roofline efficiency. Communication: the
    decode collectives of every layer (`decode_collectives`; latency-bound at these sizes). Step: the larger
    of memory and compute, plus communication (overlap="none") or the largest of the three ("ideal")."""
    if overlap not in ("none", "ideal"):
        raise ValueError(f"overlap={overlap!r} is unknown; allowed: none, ideal")
    b = BYTES[dtype]
    weights = params_per_device(model, par) * b
    kv = kv_cache_bytes(model, par, context_len, batch, dtype)
    memory_s = (weights + kv) / hw.mem_bw
    matmul_params = (
        params_per_device(model, par) - model.vocab_size * model.dim / layout(par).vocab_div
    )  # no lookup FLOPs
    flops = 2 * batch * matmul_params + 2 * local_gqa_ratio(model, layout(par).tp) * kv / b
    compute_s = flops / (hw.peak_flops(dtype) * hw.matmul_efficiency)
    comm_s = model.n_layers * _collectives_time_s(decode_collectives(model, par, batch), hw, b)
    device_s = max(memory_s, compute_s)
    step_s = device_s + comm_s if overlap == "none" else max(device_s, comm_s)
    return {
        "memory_s": memory_s,
        "compute_s": compute_s,
        "comm_s": comm_s,
        "step_s": step_s,
        "kv_cache_bytes": kv,
        "weight_bytes": weights,
        "tokens_per_s": batch / step_s,
    }


def cluster_throughput(
    model: ModelConfig,
    par: ParallelConfig,
    seq_len: int,
    batch: int,
    hw: HardwareProfile,
    n_gpus: int,
    *,
    mode: str = "forward",
    overlap: str = "none",
    layers: int | None = None,
    dtype: str = "bfloat16",
    causal_halved: bool = True,
) -> dict:
    """Tokens/s of n_gpus // degree data-parallel replicas, each running `step_time`.

    Training adds the DP gradient all-reduce of each device's gradients (ring over the replicas, on the
    inter-node NIC once the cluster spans nodes) to the communication; a forward pass has none.
    """
    dp = n_gpus // par.degree
    if dp < 1:
        raise ValueError(f"n_gpus={n_gpus} is smaller than the group size degree={par.degree}")
    if par.scheme == "fsdp_sp":  # FSDP shards over every replica (dp × Σ): its reduce-scatter is the DP average
        par = replace(par, dp=dp)
    st = step_time(
        model,
        par,
        seq_len,
        batch,
        hw,
        mode=mode,
        overlap="schedule" if overlap == "schedule" else "none",
        layers=layers,
        dtype=dtype,
        causal_halved=causal_halved,
    )
    dp_allreduce_s = 0.0
    if mode == "train" and dp > 1 and par.scheme != "fsdp_sp":
        grad_bytes = params_per_device(model, par, layers) * state_bytes_per_param(dtype)["grads"]
        bw, alpha = hw.link(dp * par.degree)
        dp_allreduce_s = collective_time_s("allreduce", dp, grad_bytes, bw, alpha)
    comm_s = st["comm_s"] + dp_allreduce_s
    if overlap == "ideal":
        step_s = max(st["compute_s"], comm_s)
    else:  # none; schedule: the layers' hidden part is already out of st's step, the DP all-reduce follows them
        step_s = st["step_s"] + dp_allreduce_s
    tokens_per_s = dp * batch * seq_len / step_s
    return {
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_device": tokens_per_s / (dp * par.degree),
        "dp_replicas": dp,
        "step_s": step_s,
        "dp_allreduce_s": dp_allreduce_s,
        "compute_s": st["compute_s"],
        "comm_s": comm_s,
        "exposed_comm_s": step_s - st["compute_s"],
    }
