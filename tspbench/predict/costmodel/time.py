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
    collective_time_s,
    collectives_time_s,
    decode_collectives,
    edge_collectives,
    fsdp_unit_gather,
    layer_collectives,
)
from tspbench.predict.costmodel.comm import grad_sync_groups, kv_grad_sync_group
from tspbench.predict.costmodel.flops import hardware_flops_per_token
from tspbench.predict.costmodel.hardware import HardwareProfile, load_hardware  # noqa: F401 (re-exported)
from tspbench.predict.costmodel.params import (
    layer_weight_params,
    layer_weight_params_per_rank,
    layout,
    local_gqa_ratio,
    params_per_device,
    selective_reruns_kernel,
    state_bytes_per_param,
)
from tspbench.predict.costmodel.workload import PRICING, Pricing, Workload

# ---------------------------------------------------------------------------------------------- overlap
OVERLAPS = ("none", "ideal", "schedule")


def schedule_exposed_comm_s(par: ParallelConfig, work: Workload, hw: HardwareProfile) -> float:
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
    colls = layer_collectives(par, work)
    if par.spec.fsdp:
        return _fsdp_exposed_comm_s(par, work, hw, colls)
    if par.scheme != "tsp":
        return collectives_time_s(colls, hw, work.elem_bytes)
    model, b, seq_len = work.model, work.elem_bytes, work.seq_len
    d, h, ffn = par.degree, model.dim, model.ffn_hidden
    eff = hw.peak_flops(work.dtype) * hw.matmul_efficiency
    tokens = work.tokens / d  # this rank's tokens
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
    if work.mode == "train":
        t_r, t_rs = one("reduce"), one("reduce_scatter")
        back_gathers = d * (t_g / n_b + (n_b - 1) * max(0.0, t_g / n_b - 2 * kernel / n_b))
        exposed += t_b + (d - 1) * max(0.0, t_b - 2 * c_a) + back_gathers + (d - 1) * max(0.0, 2 * t_h - 2 * c_m)
        exposed += d * max(0.0, t_r + t_rs - 2 * c_a)
        if par.recompute == "full":  # the replay: the forward's schedule once more
            exposed += t_b + (d - 1) * max(0.0, t_b - c_a) + gathers + (d - 1) * max(0.0, t_h - c_m)
    return exposed


def _fsdp_exposed_comm_s(par: ParallelConfig, work: Workload, hw: HardwareProfile, colls: list[Collective]) -> float:
    """fsdp_sp's exposed communication per layer under the schedule rule (`schedule_exposed_comm_s`)."""
    model, seq_len = work.model, work.seq_len
    unit = fsdp_unit_gather(model, par)
    unit_rs = ("reduce_scatter", *unit[1:])
    rest = [c for c in colls if c not in (unit, unit_rs)]  # the sequence exchange: synchronous, exposed
    b, eff = work.elem_bytes, hw.peak_flops(work.dtype) * hw.matmul_efficiency
    tokens = work.tokens / par.sp_degree
    c_f = tokens * 2 * layer_weight_params(model) / eff + tokens * 4 * seq_len * model.dim * 0.5 / eff
    ag, rs = collectives_time_s([unit], hw, b), collectives_time_s([unit_rs], hw, b)
    exposed = collectives_time_s(rest, hw, b) + max(0.0, ag - c_f)
    if work.mode == "train":
        exposed += max(0.0, ag + rs - 2 * c_f)
    return exposed


# ---------------------------------------------------------------------------------------------- step
def compute_time_s(
    par: ParallelConfig, work: Workload, hw: HardwareProfile, *, layers: int | None = None, causal_halved: bool = True
) -> tuple[float, float]:
    """(FLOPs per device, seconds) of one replica's step on one device: the replica's executed FLOPs
    (flops.hardware_flops_per_token: recompute, flash backward) split over its ranks, except the LM head (full
    model only), which each rank runs on B·S/loss_div tokens × V/vocab_div classes; at the roofline, the attention
    kernel at its own measured rates on a calibrated profile."""
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
    if hw.calibration:  # measured kernel efficiencies: the attention kernel's FLOPs at their own rate
        fwd_attn, bwd_attn = _attention_flops_per_token(par, work, n_layers, causal_halved)
        peak = hw.peak_flops(work.dtype)
        attn_tokens = work.tokens / par.degree
        compute_s -= attn_tokens * (fwd_attn + bwd_attn) / (peak * hw.matmul_efficiency)
        compute_s += attn_tokens * fwd_attn / (peak * (hw.attention_forward_efficiency or hw.matmul_efficiency))
        compute_s += attn_tokens * bwd_attn / (peak * (hw.attention_backward_efficiency or hw.matmul_efficiency))
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
    head collectives (full model), plus (train) the in-group gradient all-reduce.
    `layers=None` is the full model (with LM head); `layers=k` a k-block benchmark (no embedding/LM head).
    """
    if overlap not in OVERLAPS:
        raise ValueError(f"overlap={overlap!r} is unknown; allowed: {', '.join(OVERLAPS)}")
    b, model = work.elem_bytes, work.model
    n_layers = model.n_layers if layers is None else layers
    flops, compute_s = compute_time_s(par, work, hw, layers=layers, causal_halved=causal_halved)

    colls = layer_collectives(par, work)
    comm_s = n_layers * collectives_time_s(colls, hw, b)
    if layers is None:
        comm_s += collectives_time_s(edge_collectives(par, work), hw, b)
    if work.mode == "train":
        groups = [*grad_sync_groups(model, par, layers), kv_grad_sync_group(model, par, layers)]
        comm_s += collectives_time_s([("allreduce", p, n_sync, par.degree, 1) for n_sync, p in groups], hw, b)
    if overlap == "schedule":
        layer_comm = collectives_time_s(colls, hw, b)
        hidden = layer_comm - schedule_exposed_comm_s(par, work, hw)
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


def decode_step_time(par: ParallelConfig, work: Workload, hw: HardwareProfile, *, overlap: str = "none") -> dict:
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
    matmul_params = (
        params_per_device(model, par) - model.vocab_size * model.dim / layout(par).vocab_div
    )  # no lookup FLOPs
    flops = 2 * batch * matmul_params + 2 * local_gqa_ratio(model, layout(par).tp) * kv / b
    compute_s = flops / (hw.peak_flops(work.dtype) * hw.matmul_efficiency)
    comm_s = model.n_layers * collectives_time_s(decode_collectives(model, par, batch), hw, b)
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
    inter-node NIC once the cluster spans nodes) to the communication; a forward pass has none.
    """
    dp = n_gpus // par.degree
    if dp < 1:
        raise ValueError(f"n_gpus={n_gpus} is smaller than the group size degree={par.degree}")
    if par.spec.fsdp:  # FSDP shards over every replica (dp × Σ): its reduce-scatter is the DP average
        par = replace(par, dp=dp)
    sched = "schedule" if overlap == "schedule" else "none"
    st = step_time(par, work, hw, overlap=sched, layers=layers, causal_halved=causal_halved, pricing=pricing)
    dp_allreduce_s = 0.0
    if work.mode == "train" and dp > 1 and not par.spec.fsdp:
        grad_bytes = params_per_device(work.model, par, layers) * state_bytes_per_param(work.dtype)["grads"]
        bw, alpha = hw.link(dp * par.degree)
        dp_allreduce_s = collective_time_s("allreduce", dp, grad_bytes, bw, alpha)
    comm_s = st["comm_s"] + dp_allreduce_s
    if overlap == "ideal":
        step_s = max(st["compute_s"], comm_s)
    else:  # none; schedule: the layers' hidden part is already out of st's step, the DP all-reduce follows them
        step_s = st["step_s"] + dp_allreduce_s
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
