"""Time model: a roofline step time on a hardware profile (hardware.py) with the α–β collectives of collectives.py.

Compute is a roofline: FLOPs / (peak · matmul_efficiency) (flops.hardware_flops_per_token: what the step executes,
recompute and the flash backward included; a calibrated profile times the attention kernel at its own measured
rates). Communication is the α–β time of the step's collectives (docs/method.md#collective-cost). Efficiencies are
stated assumptions, not fits. Overlap "none" adds compute and communication; "ideal" takes their maximum;
"schedule" follows the issue order the code has (`schedule_exposed_comm_s`, docs/method.md#choice-overlap): what
each collective can hide behind.
"""

from __future__ import annotations

from dataclasses import replace

from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel.activations import kv_cache_bytes
from tspbench.predict.costmodel.collectives import (
    Collective,
    collective_cost_s,
    collectives_time_s,
    decode_collectives,
    edge_collectives,
    fsdp_replicate_all_reduce,
    fsdp_unit_gather,
    layer_collectives,
    tsp_collectives,
)
from tspbench.predict.costmodel.comm import grad_sync_groups, kv_grad_sync_group
from tspbench.predict.costmodel.elementwise import elementwise_time_s
from tspbench.predict.costmodel.flops import hardware_flops_per_token
from tspbench.predict.costmodel.hardware import HardwareProfile, load_hardware  # noqa: F401 (re-exported)
from tspbench.predict.costmodel.kernels import KERNELS, layer_shape_time_s
from tspbench.predict.costmodel.params import (
    kv_heads_per_rank,
    layer_weight_params,
    layer_weight_params_per_rank,
    layout,
    local_gqa_ratio,
    megatron_tp_degree,
    params_per_device,
    regathers_kv,
    selective_reruns_kernel,
    state_bytes_per_param,
)
from tspbench.predict.costmodel.workload import PRICING, Pricing, Workload

# ---------------------------------------------------------------------------------------------- overlap
OVERLAPS = ("none", "ideal", "schedule")


def schedule_exposed_comm_s(
    par: ParallelConfig, work: Workload, hw: HardwareProfile, *, pricing: Pricing = PRICING
) -> float:
    """One layer's exposed communication under the schedule the code has (docs/method.md#choice-overlap); each
    collective priced on its links as `pricing.links` says (collectives.collective_cost_s).

    tp, tp_msp, sp, tp_sp: Megatron's default schedule (no --tp-comm-overlap; schemes/ops/tensor_parallel.py): the
    forward's collectives synchronous, exposed; in backward each column-parallel entry (Q, K, V; gate and up)
    re-gathers its input (Megatron-SP) behind its dgrad GEMMs and reduces the dgrad (reduce-scatter, or the plain
    form's all-reduce) behind its wgrad GEMMs, max(0, t_comm − t_gemm) exposed each (`_tp_backward_hidden_s`;
    Pricing.tp_async off: the code before it, no re-gather and every collective exposed). The row-parallel exits'
    duals and the K/V exchange are synchronous, exposed. The baselines' other overlap options (TransformerEngine's
    userbuffer TP overlap, torchtitan's async TP) are not implemented: the "ideal" rule bounds them, and every
    modelled record carries both. sp_variant=ulysses (sp, tp_sp, fsdp_sp): DeepSpeed's overlapped exchanges
    (schemes/ops/ulysses.py), what they hide is `_ulysses_hidden_s` (Pricing.ulysses_overlap off: one packed
    exchange and O's, exposed).
    tsp (schemes/ops/owner_attention.py, schemes/ops/ring.py): `_tsp_exposed_comm_s`. The in-group gradient
    all-reduce and the edges stay exposed (they follow the layers).
    fsdp_sp (FSDP2, schemes/fsdp_sp.py: explicit prefetch, collectives on FSDP's own streams): the next unit's
    all-gather runs behind this layer's forward, max(0, t_ag − c_f); in backward the previous unit's all-gather and
    this unit's gradient reduce-scatter run behind its backward, max(0, t_ag + t_rs − 2·c_f), with c_f one layer's
    forward compute on the rank's tokens (GEMMs + kernel); sp's K/V exchange stays exposed (synchronous)."""
    colls = layer_collectives(par, work, tp_regather=pricing.tp_async, ulysses_split=pricing.ulysses_overlap)
    seq_hidden = _ulysses_hidden_s(par, work, hw, pricing) + _ring_hidden_s(par, work, hw, pricing)
    if par.spec.fsdp:  # sp's attention: Ulysses' or the ring's overlap as in sp, beside FSDP's
        return _fsdp_exposed_comm_s(par, work, hw, colls, pricing=pricing) - seq_hidden
    if par.scheme != "tsp":
        exposed = collectives_time_s(colls, hw, work.elem_bytes, pricing=pricing)
        return exposed - _tp_backward_hidden_s(par, work, hw, pricing) - seq_hidden
    return _tsp_exposed_comm_s(par, work, hw, pricing)


def _tsp_exposed_comm_s(par: ParallelConfig, work: Workload, hw: HardwareProfile, pricing: Pricing) -> float:
    """TSP's exposed communication per layer under the schedule rule (docs/method.md#choice-overlap), each collective
    of `collectives.tsp_collectives` priced on its own (collective_cost_s). With c_a one owner's attention compute
    (its GEMMs and kernel), c_qkv its projections, k its kernel (k_b = k/n_b one bucket's), c_rest = c_a − k + k_b
    what an owner step computes besides the kernels that hide its own later buckets, c_m one MLP shard's GEMMs (×2
    in backward), t_b / t_r one attention broadcast / reduce, t_g one owner's K/V gather (t_g/n_b a bucket's), t_rs
    its dK/dV reduce-scatter:
        attention, Pricing.tsp_kv_pipeline (the code: owner r+1's shard, projections and first K/V bucket before
        owner r's attention):
            forward    broadcasts: shard 0 exposed, 1 behind owner 0's projections, r+2 behind owner r's attention:
                       t_b + max(0, t_b − c_qkv) + (D−2)·max(0, t_b − c_a); gathers: owner 0's first bucket behind
                       owner 1's projections, owner r+1's behind owner r's step, bucket b+1 behind bucket b:
                       max(0, t_g/n_b − c_qkv) + (D−1)·max(0, t_g/n_b − c_rest) + D·(n_b−1)·max(0, t_g/n_b − k_b)
            backward   broadcasts t_b + (D−1)·max(0, t_b − 2·c_a); re-gathers (regather_kv) owner 0's first
                       exposed, owner r+1's behind owner r's backward: t_g/n_b + (D−1)·max(0, t_g/n_b − 2·c_rest)
                       + D·(n_b−1)·max(0, t_g/n_b − 2·k_b); none with regather_kv=False
        attention, tsp_kv_pipeline off (the code before the pipeline: each owner's first bucket waited at once):
            forward    t_b + (D−1)·max(0, t_b − c_a) + D·(t_g/n_b + (n_b−1)·max(0, t_g/n_b − k_b))
            backward   t_b + (D−1)·max(0, t_b − 2·c_a) + D·(t_g/n_b + (n_b−1)·max(0, t_g/n_b − 2·k_b)) (regather_kv)
        both: the reduces and dK/dV reduce-scatters behind the next owner's backward, D·max(0, t_r + t_rs − 2·c_a);
        recompute=full replays the forward's schedule once more.
        MLP (mlp_exchange):
            ring       a hop of a shard t_h behind the current shard: (D−1)·max(0, t_h − c_m); backward's weight and
                       gradient hops share the link: (D−1)·max(0, 2·t_h − 2·c_m)
            biring     the same with t_h the step's hops: each direction's link carries its half, concurrently
                       (t_h = max of the two halves' hops; at D = 2 both halves cross the one link: their sum)
            broadcast  as attention's broadcasts and reduces: t_m + (D−1)·max(0, t_m − c_m) forward,
                       t_m + (D−1)·max(0, t_m − 2·c_m) + D·max(0, t_mr − 2·c_m) backward"""
    model, b, seq_len = work.model, work.elem_bytes, work.seq_len
    d, h, ffn = par.degree, model.dim, model.ffn_hidden
    eff = hw.peak_flops(work.dtype) * hw.matmul_efficiency
    tokens = work.tokens / d  # this rank's tokens
    attn_w = layer_weight_params_per_rank(model, par) - 3 * ffn * h / d  # one owner's attention shard
    kernel = tokens * 4 * seq_len * model.n_heads * model.head_dim * 0.5 / eff / d  # one owner's heads
    c_qkv = tokens * 2 * (attn_w - h * model.n_heads * model.head_dim / d) / eff  # W_Q, W_K, W_V of one owner
    c_a = tokens * 2 * attn_w / eff + kernel
    c_m = tokens * 2 * 3 * ffn * h / d / eff
    n_kv_owner = max(model.n_kv_heads // d, 1)
    n_b = -(-n_kv_owner // par.kv_bucket_heads) if par.kv_bucket_heads else 1
    k_b = kernel / n_b
    c_rest = c_a - kernel + k_b
    colls = tsp_collectives(par, work)

    def t(role: str, i: int = 0) -> float:  # one collective of this role (its tuple's count is how many per layer)
        op, p, n, span, _count = colls[role][i]
        return collective_cost_s(op, p, n * b, span, hw, pricing=pricing)

    t_b, t_g = t("broadcast"), t("kv")
    t_bk = t_g / n_b  # one bucket's gather
    later_buckets = d * (n_b - 1) * max(0.0, t_bk - k_b)
    if pricing.tsp_kv_pipeline:
        fwd_attn = t_b + max(0.0, t_b - c_qkv) + (d - 2) * max(0.0, t_b - c_a)
        fwd_attn += max(0.0, t_bk - c_qkv) + (d - 1) * max(0.0, t_bk - c_rest) + later_buckets
        bwd_gathers = t_bk + (d - 1) * max(0.0, t_bk - 2 * c_rest) + d * (n_b - 1) * max(0.0, t_bk - 2 * k_b)
    else:  # the code before the pipeline
        fwd_attn = t_b + (d - 1) * max(0.0, t_b - c_a) + d * t_bk + later_buckets
        bwd_gathers = d * (t_bk + (n_b - 1) * max(0.0, t_bk - 2 * k_b))
    if par.mlp_exchange == "broadcast":
        t_m = t("mlp")
        fwd_mlp = t_m + (d - 1) * max(0.0, t_m - c_m)
        bwd_mlp = t_m + (d - 1) * max(0.0, t_m - 2 * c_m) + d * max(0.0, t("mlp_grad") - 2 * c_m)
    else:  # ring (one tuple) or biring (one per direction: concurrent links, or one link at D = 2)
        hops = [t("mlp", i) for i in range(len(colls["mlp"]))]
        t_h = sum(hops) if d == 2 else max(hops)
        fwd_mlp = (d - 1) * max(0.0, t_h - c_m)
        bwd_mlp = (d - 1) * max(0.0, 2 * t_h - 2 * c_m)
    exposed = fwd_attn + fwd_mlp
    if work.mode == "train":
        exposed += t_b + (d - 1) * max(0.0, t_b - 2 * c_a) + bwd_mlp
        exposed += bwd_gathers if regathers_kv(par) else 0.0
        exposed += d * max(0.0, t("reduce") + t("kv_rs") - 2 * c_a)
        if par.recompute == "full":  # the replay: the forward's schedule once more
            exposed += fwd_attn + fwd_mlp
    return exposed


def _tp_backward_hidden_s(par: ParallelConfig, work: Workload, hw: HardwareProfile, pricing: Pricing) -> float:
    """What Megatron's default backward overlap hides in one layer (schemes/ops/tensor_parallel.py,
    docs/method.md#choice-overlap): for each column-parallel entry (attention's Q, K, V; the MLP's gate and up), on
    the rank's n GEMM tokens, the input's re-gather (Megatron-SP) behind the dgrad GEMMs and the dgrad's
    reduce-scatter (Megatron-SP) or all-reduce behind the wgrad GEMMs, min(t_comm, 2·n·h·out/peak) each. 0 with
    Pricing.tp_async off, in forward, and without a head split."""
    t = megatron_tp_degree(par)
    if not pricing.tp_async or work.mode != "train" or t <= 1:
        return 0.0
    model, b = work.model, work.elem_bytes
    h, d = model.dim, model.head_dim
    n = work.tokens / layout(par).sp
    eff = hw.peak_flops(work.dtype) * hw.matmul_efficiency
    act = n * h * b  # the gathered input = the dgrad, bytes
    gather = collective_cost_s("allgather", t, act, t, hw, pricing=pricing) if par.megatron_sp else 0.0
    reduce_op = "reduce_scatter" if par.megatron_sp else "allreduce"
    reduce = collective_cost_s(reduce_op, t, act, t, hw, pricing=pricing)
    hidden = 0.0
    for out in (model.n_heads * d / t + 2 * kv_heads_per_rank(model, t) * d, 2 * model.ffn_hidden / t):
        gemm = 2 * n * h * out / eff  # the dgrad GEMMs; the wgrad GEMMs take as long
        hidden += min(gather, gemm) + min(reduce, gemm)
    return hidden


def _ulysses_hidden_s(par: ParallelConfig, work: Workload, hw: HardwareProfile, pricing: Pricing) -> float:
    """What DeepSpeed's overlapped Ulysses exchanges hide in one layer (schemes/ops/ulysses.py,
    docs/method.md#ulysses): with t_q, t_k = t_v, t_o the exchanges of Q, K, V and O over Σ (one after the other
    on the link) and c_q, c_k = c_v, c_o the GEMMs of one projection on the rank's B·S/Σ tokens:
        forward   (sp, fsdp_sp: projections split) Q's exchange posted before K's projection, K's before V's, all
                  waited after V's: exposed end − (c_k + c_v) on the timeline; O's exposed. tp_sp (its fused
                  column-parallel QKV): all exposed.
        backward  O's gradient behind W_O's wgrad, min(t_o, c_o) hidden; dV, dK, dQ posted together, dV waited
                  first, V's projection backward (2·c_v) before dK's wait, K's (2·c_k) before dQ's (sp, fsdp_sp;
                  tp_sp: exposed). recompute=full replays the forward's schedule.
    0 with Pricing.ulysses_overlap off (the code before it: synchronous) and for other exchanges."""
    if not (par.ulysses and pricing.ulysses_overlap):
        return 0.0
    model, lay, b = work.model, layout(par), work.elem_bytes
    t, sig = lay.tp, lay.sp
    if sig <= 1:
        return 0.0
    n, h = work.tokens / sig, model.dim
    eff = hw.peak_flops(work.dtype) * hw.matmul_efficiency
    q_w, kv_w = h / t, model.n_kv_heads * model.head_dim / t  # output width of W_Q (and W_O's input), of W_K / W_V
    t_q, t_kv = (collective_cost_s("alltoall", sig, n * w * b, t * sig, hw, pricing=pricing) for w in (q_w, kv_w))
    c_q, c_kv = 2 * n * h * q_w / eff, 2 * n * h * kv_w / eff
    split = par.scheme != "tp_sp"  # tp_sp's Q, K, V come from one fused column-parallel Function
    fwd_hidden = 0.0
    if split:  # the forward timeline from Q's post: K's projection, K's post, V's projection, V's post, the waits
        q_end = t_q
        k_end = max(q_end, c_kv) + t_kv
        v_end = max(k_end, 2 * c_kv) + t_kv
        fwd_hidden = t_q + 2 * t_kv - (max(v_end, 2 * c_kv) - 2 * c_kv)
    hidden = 0.0
    if work.mode == "train":
        hidden += min(t_q, c_q)  # O's gradient behind W_O's wgrad (c_o = c_q)
        if split:  # dV (waited first), dK behind V's projection backward, dQ behind K's
            clock = t_kv + 2 * c_kv
            clock = max(clock, 2 * t_kv) + 2 * c_kv
            clock = max(clock, 2 * t_kv + t_q)
            hidden += t_q + 2 * t_kv - (clock - 4 * c_kv)
        hidden += fwd_hidden * (2 if par.recompute == "full" else 1)
    else:
        hidden += fwd_hidden
    return hidden


def _ring_hidden_s(par: ParallelConfig, work: Workload, hw: HardwareProfile, pricing: Pricing) -> float:
    """What ring attention's hops hide in one layer (schemes/ops/ring_attention.py, docs/method.md#choice-overlap):
    each of the Σ−1 forward hops of the packed [K; V] block is posted before a step's kernels and waited after them,
    min(t_hop, c_s) hidden with c_s one step's share of the rank's attention kernel (kernel / Σ, the zigzag layout
    balancing the steps); backward's Σ−1 reverse hops of dK/dV each run behind a step's kernel backward (2·c_s);
    a replay (recompute full, or selective's recomputed core) hides as the forward. The hop is priced as every ring
    hop is (collective_cost_s "p2p": one link of a mesh, the switch's links, the NIC across nodes). 0 for other
    exchanges and Σ = 1."""
    if par.exchange != "ring":
        return 0.0
    model, lay = work.model, layout(par)
    t, sig = lay.tp, lay.sp
    if sig <= 1:
        return 0.0
    eff = hw.peak_flops(work.dtype) * hw.matmul_efficiency
    kv_d = model.head_dim * kv_heads_per_rank(model, t)
    hop = collective_cost_s("p2p", 2, 2 * work.tokens / sig * kv_d * work.elem_bytes, t * sig, hw, pricing=pricing)
    kernel = work.tokens / sig * 4 * work.seq_len * model.n_heads / t * model.head_dim * 0.5 / eff
    c_s = kernel / sig
    hidden = (sig - 1) * min(hop, c_s)
    if work.mode == "train":
        hidden += (sig - 1) * min(hop, 2 * c_s)
        if par.recompute in ("full", "selective"):
            hidden += (sig - 1) * min(hop, c_s)
    return hidden


def _fsdp_exposed_comm_s(
    par: ParallelConfig, work: Workload, hw: HardwareProfile, colls: list[Collective], *, pricing: Pricing = PRICING
) -> float:
    """fsdp_sp's exposed communication per layer under the schedule rule (`schedule_exposed_comm_s`): with c_f one
    layer's forward compute, the unit all-gather t_ag behind the forward, max(0, t_ag − c_f); in backward the
    previous unit's all-gather, this unit's reduce-scatter t_rs and, with HSDP, the all-reduce of its gradient shard
    over the replicas t_ar (FSDP2 posts it on its own stream right after the reduce-scatter) behind its backward:
    max(0, t_ag + t_rs + t_ar − 2·c_f); Pricing.dp_overlap off: the all-reduce exposed, max(0, t_ag + t_rs − 2·c_f)
    + t_ar. The sequence exchange is synchronous, exposed."""
    model, seq_len = work.model, work.seq_len
    unit = fsdp_unit_gather(model, par)
    unit_rs = ("reduce_scatter", *unit[1:])
    unit_ar = fsdp_replicate_all_reduce(par, unit[2])  # HSDP; [] for plain FSDP
    rest = [c for c in colls if c not in (unit, unit_rs, *unit_ar)]  # the sequence exchange: synchronous, exposed
    b, eff = work.elem_bytes, hw.peak_flops(work.dtype) * hw.matmul_efficiency
    tokens = work.tokens / par.sp_degree
    c_f = tokens * 2 * layer_weight_params(model) / eff + tokens * 4 * seq_len * model.dim * 0.5 / eff
    ag, rs = collectives_time_s([unit], hw, b, pricing=pricing), collectives_time_s([unit_rs], hw, b, pricing=pricing)
    ar = collectives_time_s(unit_ar, hw, b, pricing=pricing)
    exposed = collectives_time_s(rest, hw, b, pricing=pricing) + max(0.0, ag - c_f)
    if work.mode == "train" and pricing.dp_overlap:
        exposed += max(0.0, ag + rs + ar - 2 * c_f)
    elif work.mode == "train":
        exposed += max(0.0, ag + rs - 2 * c_f) + ar
    return exposed


def grad_sync_time_s(
    par: ParallelConfig,
    work: Workload,
    hw: HardwareProfile,
    dp: int = 1,
    *,
    layers: int | None = None,
    pricing: Pricing = PRICING,
) -> dict[str, float]:
    """The step's gradient reduction over `dp` replicas (ParallelModel's overlapped sync, schemes/base.py;
    docs/method.md#choice-overlap), in seconds:
        in_group_s  the in-group all-reduces (comm.grad_sync_groups, kv_grad_sync_group; one per group)
        dp_s        the data-parallel all-reduce of every gradient of the device over dp replicas (ring over ranks
                    degree apart, on the links dp·degree ranks reach); 0 for fsdp_sp (FSDP reduces its own)
        exposed_s   what the step waits for. The code posts bucket k's one all-reduce (in-group sum and DP average
                    together) as soon as backward has produced its last gradient, buckets in reverse layer order, so
                    with Pricing.dp_overlap each layer's buckets (its in-group and DP all-reduces) queue on the link
                    behind the backward of the layers still to run: the LM head's (and final norm's) when backward
                    starts, layer l's after its backward, the embedding's after the last layer's (with c the backward
                    compute of one layer: free = max(free, ready) + t, exposed = free at the end − L·c; at least
                    the embedding's bucket, which nothing follows); without it every all-reduce follows the
                    backward: in_group_s + dp_s.
    The one collective per group of in_group_s and dp_s is the volume's cost (a step's sum); the pipeline's buckets
    are one per layer (the code's 2²⁵-element buckets: a few per layer), each with its latency; exposed_s is capped
    at the sum."""
    model, b = work.model, work.elem_bytes
    n_layers = model.n_layers if layers is None else layers

    def in_group(lay: int | None) -> list[Collective]:
        groups = [*grad_sync_groups(model, par, lay), kv_grad_sync_group(model, par, lay)]
        return [("allreduce", p, n, par.degree, 1) for n, p in groups]

    def dp_all_reduce(n: float) -> list[Collective]:
        return [] if dp <= 1 or par.spec.fsdp else [("allreduce", dp, n, dp * par.degree, 1)]

    gb = state_bytes_per_param(work.dtype)["grads"]
    in_group_s = collectives_time_s(in_group(layers), hw, b, pricing=pricing)
    dp_s = collectives_time_s(dp_all_reduce(params_per_device(model, par, layers)), hw, gb, pricing=pricing)
    out = {"in_group_s": in_group_s, "dp_s": dp_s, "exposed_s": in_group_s + dp_s}
    if not pricing.dp_overlap or in_group_s + dp_s == 0.0 or work.mode != "train":
        return out
    t_layer = collectives_time_s(in_group(1), hw, b, pricing=pricing)
    t_layer += collectives_time_s(dp_all_reduce(params_per_device(model, par, 1)), hw, gb, pricing=pricing)
    t_edges = 0.0
    if layers is None:  # the embedding and LM head (+ final norm): what the step's total has beyond its layers
        one = in_group(1)
        in_edges = [(op, p, n - n_layers * one[i][2], span, k) for i, (op, p, n, span, k) in enumerate(in_group(None))]
        dp_edges = dp_all_reduce(params_per_device(model, par) - n_layers * params_per_device(model, par, 1))
        t_edges = collectives_time_s(in_edges, hw, b, pricing=pricing) + collectives_time_s(
            dp_edges, hw, gb, pricing=pricing
        )
    train_s = compute_time_s(par, work, hw, layers=n_layers, pricing=pricing)[1]
    forward_s = compute_time_s(par, replace(work, mode="forward"), hw, layers=n_layers, pricing=pricing)[1]
    c = (train_s - forward_s) / n_layers  # one layer's backward (its recompute included)
    free = t_edges / 2  # the LM head's bucket: ready as the layers' backward starts
    for k in range(1, n_layers + 1):  # layer L − k's buckets, ready after its backward
        free = max(free, k * c) + t_layer
    free = max(free, n_layers * c) + t_edges / 2  # the embedding's, after every layer's
    out["exposed_s"] = min(free - n_layers * c, in_group_s + dp_s)
    return out


# ---------------------------------------------------------------------------------------------- step
def compute_time_s(
    par: ParallelConfig,
    work: Workload,
    hw: HardwareProfile,
    *,
    layers: int | None = None,
    causal_halved: bool = True,
    pricing: Pricing = PRICING,
) -> tuple[float, float]:
    """(FLOPs per device, seconds) of one replica's step on one device: the replica's executed FLOPs
    (flops.hardware_flops_per_token: recompute, flash backward) split over its ranks, except the LM head (full
    model only), which each rank runs on B·S/loss_div tokens × V/vocab_div classes; at the roofline, the attention
    kernel at its own measured rates on a calibrated profile. Pricing.kernels="shape": the layers' GEMM and attention
    calls each at its own shape's efficiency (kernels.layer_shape_time_s), the rest (LM head) at the roofline. Plus
    the elementwise work at the memory bandwidth (Pricing.elementwise, costmodel/elementwise.py)."""
    if pricing.kernels not in KERNELS:
        raise ValueError(f"Pricing.kernels={pricing.kernels!r} is unknown; allowed: {', '.join(KERNELS)}")
    model, mode, lay = work.model, work.mode, layout(par)
    n_layers = model.n_layers if layers is None else layers
    body = hardware_flops_per_token(par, work, layers=n_layers, include_lm_head=False, causal_halved=causal_halved)
    flops = work.tokens * body / par.degree
    if layers is None:  # LM head: 2·V·h per token, ×3 in training (never checkpointed)
        mult = 1 if mode == "forward" else 3
        if par.vocab == "ring":  # every class for the rank's tokens; backward recomputes the logits
            flops += work.tokens / lay.loss_div * 2 * model.vocab_size * model.dim * (mult + (mult > 1))
        else:
            flops += work.tokens / lay.loss_div * 2 * model.vocab_size / lay.vocab_div * model.dim * mult
    compute_s = flops / (hw.peak_flops(work.dtype) * hw.matmul_efficiency)
    if hw.attention_forward_efficiency or hw.attention_backward_efficiency:  # the attention kernel at its own rates
        fwd_attn, bwd_attn = _attention_flops_per_token(par, work, n_layers, causal_halved)
        peak = hw.peak_flops(work.dtype)
        attn_tokens = work.tokens / par.degree
        compute_s -= attn_tokens * (fwd_attn + bwd_attn) / (peak * hw.matmul_efficiency)
        compute_s += attn_tokens * fwd_attn / (peak * (hw.attention_forward_efficiency or hw.matmul_efficiency))
        compute_s += attn_tokens * bwd_attn / (peak * (hw.attention_backward_efficiency or hw.matmul_efficiency))
    if pricing.kernels == "shape":
        reruns = 1 if work.mode == "train" and (par.recompute == "full" or selective_reruns_kernel(par)) else 0
        layer_flops, layer_s = layer_shape_time_s(par, work, hw, reruns=reruns)
        rest = max(0.0, flops - n_layers * layer_flops)  # the LM head (and what the listed calls do not cover)
        compute_s = rest / (hw.peak_flops(work.dtype) * hw.matmul_efficiency) + n_layers * layer_s
    compute_s += elementwise_time_s(par, work, hw.mem_bw, pricing.elementwise, n_layers, with_loss=layers is None)
    return flops, compute_s


def _attention_flops_per_token(
    par: ParallelConfig, work: Workload, n_layers: int, causal_halved: bool
) -> tuple[float, float]:
    """(forward, backward) attention-kernel FLOPs per token of the replica inside hardware_flops_per_token: the
    forward (re-run under full, and under selective except tsp) and the flash backward (2.5 forwards)."""
    model = work.model
    attn = n_layers * 4 * work.seq_len * model.n_heads * model.head_dim * (0.5 if causal_halved else 1.0)
    if work.mode != "train":
        return attn, 0.0
    reruns = 1 if par.recompute == "full" or selective_reruns_kernel(par) else 0
    return attn * (1 + reruns), 2.5 * attn


def step_time(
    par: ParallelConfig,
    work: Workload,
    hw: HardwareProfile,
    *,
    overlap: str = "none",
    layers: int | None = None,
    causal_halved: bool = True,
    pricing: Pricing = PRICING,
) -> dict:
    """One replica's step on one device: compute, communication, and the step under the overlap rule (`pricing`:
    which priced mechanisms apply, workload.Pricing).

    Compute: `compute_time_s`. Communication: per-layer collectives × layers, the vocabulary-parallel embedding /
    head collectives (full model), plus (train) the in-group gradient all-reduce (`grad_sync_time_s`; under
    "schedule" with Pricing.dp_overlap only its part the backward cannot hide is exposed).
    `layers=None` is the full model (with LM head); `layers=k` a k-block benchmark (no embedding/LM head).
    """
    if overlap not in OVERLAPS:
        raise ValueError(f"overlap={overlap!r} is unknown; allowed: {', '.join(OVERLAPS)}")
    b, model = work.elem_bytes, work.model
    n_layers = model.n_layers if layers is None else layers
    flops, compute_s = compute_time_s(par, work, hw, layers=layers, causal_halved=causal_halved, pricing=pricing)

    colls = layer_collectives(par, work, tp_regather=pricing.tp_async, ulysses_split=pricing.ulysses_overlap)
    comm_s = n_layers * collectives_time_s(colls, hw, b, pricing=pricing)
    if layers is None:
        comm_s += collectives_time_s(edge_collectives(par, work), hw, b, pricing=pricing)
    sync = {"in_group_s": 0.0, "exposed_s": 0.0}
    if work.mode == "train":  # the in-group gradient all-reduces (grad_sync_time_s; the DP one: cluster_throughput)
        sync = grad_sync_time_s(par, work, hw, 1, layers=layers, pricing=pricing)
        comm_s += sync["in_group_s"]
    if overlap == "schedule":
        layer_comm = collectives_time_s(colls, hw, b, pricing=pricing)
        hidden = layer_comm - schedule_exposed_comm_s(par, work, hw, pricing=pricing)
        step_s = compute_s + comm_s - n_layers * max(hidden, 0.0)
        step_s -= sync["in_group_s"] - sync["exposed_s"]  # Pricing.dp_overlap: buckets posted during backward
    else:
        step_s = compute_s + comm_s if overlap == "none" else max(compute_s, comm_s)
    return {
        "compute_s": compute_s,
        "comm_s": comm_s,
        "step_s": step_s,
        "exposed_comm_s": step_s - compute_s,
        "flops_per_device": flops,
    }


def decode_step_time(
    par: ParallelConfig, work: Workload, hw: HardwareProfile, *, overlap: str = "none", pricing: Pricing = PRICING
) -> dict:
    """One decode step (one new token for each of a replica's B = work.batch sequences, work.seq_len tokens cached)
    on one device.

    Memory: every weight this rank holds and its KV cache are read once per step, at hw.mem_bw (decode is
    bandwidth-bound). Compute: 2 FLOPs per held matmul weight per token (sp applies all weights to the replicated
    token) + attention, 2·g FLOPs per cached K or V element, at the roofline efficiency. Communication: the
    decode collectives of every layer (`decode_collectives`; latency-bound at these sizes). Step: the larger
    of memory and compute, plus communication (overlap="none") or the largest of the three ("ideal")."""
    if overlap not in ("none", "ideal"):
        raise ValueError(f"overlap={overlap!r} is unknown; allowed: none, ideal")
    model, batch, b = work.model, work.batch, work.elem_bytes
    weights = params_per_device(model, par) * b
    kv = kv_cache_bytes(par, work)
    memory_s = (weights + kv) / hw.mem_bw
    lookup = 0.0 if model.tie_embeddings else model.vocab_size * model.dim / layout(par).vocab_div  # no FLOPs
    matmul_params = params_per_device(model, par) - lookup  # a tied matrix is the LM head's GEMM too
    flops = 2 * batch * matmul_params + 2 * local_gqa_ratio(model, layout(par).tp) * kv / b
    compute_s = flops / (hw.peak_flops(work.dtype) * hw.matmul_efficiency)
    comm_s = model.n_layers * collectives_time_s(decode_collectives(model, par, batch), hw, b, pricing=pricing)
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
    par: ParallelConfig,
    work: Workload,
    hw: HardwareProfile,
    n_gpus: int,
    *,
    overlap: str = "none",
    layers: int | None = None,
    causal_halved: bool = True,
    pricing: Pricing = PRICING,
) -> dict:
    """Tokens/s of n_gpus // degree data-parallel replicas, each running `step_time` (`pricing`: workload.Pricing).

    Training adds the DP gradient all-reduce of each device's gradients (ring over the replicas, on the
    inter-node NIC once the cluster spans nodes) to the communication; a forward pass has none. Under "schedule"
    with Pricing.dp_overlap it runs, bucket by bucket, behind the backward of the layers still to run, with the
    in-group sum it shares each bucket's all-reduce with (`grad_sync_time_s`); otherwise it follows the step.
    fsdp_sp: FSDP reduces its own gradients, sharded over the layout's shard group (dp_shard·Σ ranks); with
    dp_shard < dp (HSDP) each unit's gradient shard is all-reduced over the dp/dp_shard replicas, inside the
    layer's collectives (`_fsdp_exposed_comm_s`), and the layout's memory is the same layout's.
    """
    dp = n_gpus // par.degree
    if dp < 1:
        raise ValueError(f"n_gpus={n_gpus} is smaller than the group size degree={par.degree}")
    if par.spec.fsdp:  # the cluster's replicas: HSDP's replica count dp/dp_shard (the shard group is the layout's)
        if dp % par.dp_shard:
            raise ValueError(f"dp_shard={par.dp_shard} must divide the cluster's dp = {dp} replicas (fsdp_sp)")
        par = replace(par, dp=dp)
    sched = "schedule" if overlap == "schedule" else "none"
    st = step_time(par, work, hw, overlap=sched, layers=layers, causal_halved=causal_halved, pricing=pricing)
    dp_allreduce_s, step_s = 0.0, st["step_s"]
    if work.mode == "train":
        sync = grad_sync_time_s(par, work, hw, dp, layers=layers, pricing=pricing)
        dp_allreduce_s = sync["dp_s"]
        if sched == "schedule":  # st exposed the in-group part alone; the DP all-reduce shares its buckets
            in_group = grad_sync_time_s(par, work, hw, 1, layers=layers, pricing=pricing)
            step_s += sync["exposed_s"] - in_group["exposed_s"]
        else:
            step_s += dp_allreduce_s
    comm_s = st["comm_s"] + dp_allreduce_s
    if overlap == "ideal":
        step_s = max(st["compute_s"], comm_s)
    tokens_per_s = dp * work.tokens / step_s
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
