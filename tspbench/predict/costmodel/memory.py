"""Per-device memory: the peak of one step of tspbench's own code (docs/method.md#memory), phase by phase.

Nothing here is fitted to the paper. Every term is written out with its source.

`memory_phases` is the peak of one step as a maximum over the moments where it can fall, each with its live
categories (MEMORY_KEYS); each phase is a function of its own below, on what every phase shares (`StepMemory`: the
model state alive all step, TSP's ring buffers, FSDP's gathered buffers, the gradients held). What one rank saves
per layer and at the head is activations.py. The terms are read off the code and checked against the fake-tensor
estimate (tspbench/predict/estimate.py, which runs the scheme code itself on the target shapes): it agrees within
1.1% for llama7b, 16K and 128K, D = 8, every scheme (< 0.1% for tp, sp, tp_sp), and to a few % on small GQA models,
B > 1, fp32 and dp > 1 (tests/integration/test_estimate.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from tspbench.config import GRAD_BUCKET_ELEMS, ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel.activations import (
    Geometry,
    geometry,
    head_saved_bytes,
    kv_cache_bytes,
    layer_backward_working_set,
    rebuilt_in_backward,
    ring_buffer_bytes,
    stored_per_layer,
)
from tspbench.predict.costmodel.comm import grad_sync_groups, kv_grad_sync_group
from tspbench.predict.costmodel.params import (
    kv_heads_per_rank,
    layer_weight_params,
    layer_weight_params_per_rank,
    layout,
    params_per_device,
    state_bytes_per_param,
)
from tspbench.predict.costmodel.workload import TRAINING, Training, Workload

ALLOCATOR_RESERVE = 0.10
"""The caching allocator's reserve beyond the allocated peak, as a fraction of it (a stated a-priori assumption:
PyTorch's caching allocator rounds large blocks up to 2 MiB / 20 MiB segments and keeps freed segments cached, so its
reserved peak, torch.cuda.max_memory_reserved, exceeds the allocated one, max_memory_allocated;
docs/method.md#choice-peak-memory). `reserved_bytes` applies it; tspbench/predict/fit.py fits it on the calibration
rows that publish a reserved peak, and `python -m tspbench.validate` prints both."""


RUNTIME_HEADROOM = 2e9
"""Bytes of the device the model's allocations cannot use (a stated assumption: the CUDA / ROCm context and the
NCCL / RCCL communicators' buffers, about 1 GB each)."""


def reserved_bytes(allocated: float, reserve: float = ALLOCATOR_RESERVE) -> float:
    """The caching allocator's reserved peak for an allocated peak: allocated · (1 + reserve)."""
    return allocated * (1.0 + reserve)


MEMORY_KEYS = ("params", "grads", "optimizer", "activations", "temporaries", "comm_buffers", "kv_cache")
"""The categories of a phase (and of `memory_breakdown`), in the order they are summed into its total."""


def largest_param_elems(model: ModelConfig, par: ParallelConfig) -> float:
    """The biggest single parameter a rank holds (the bound of its optimizer update's fp32 gradient transient)."""
    lay = layout(par)
    if par.spec.fsdp:  # every parameter's rows ÷ N
        return max(model.vocab_size, model.ffn_hidden, model.n_heads * model.head_dim) * model.dim / lay.weight_div
    return max(
        model.vocab_size * model.dim / lay.vocab_div,
        model.ffn_hidden * model.dim / lay.weight_div,
        model.n_heads * model.head_dim * model.dim / lay.weight_div,
    )


def grad_sync_bucket_elems(model: ModelConfig, par: ParallelConfig) -> float:
    """Elements of the flat buffer the overlapped gradient sync concatenates when a bucket's last gradient arrives in
    backward (`ParallelModel._pack`): one bucket of at most GRAD_BUCKET_ELEMS (the in-group sum and the data-parallel
    average share it), after which the bucket's gradients are views of it and their separate copies are freed, so it
    is a one-bucket transient on top of the gradients held. Counted at the end of backward (`embedding_backward_phase`),
    where every gradient is held: an upper estimate when buckets do not fill exactly, or when the last one is a lone
    gradient (reduced in place, no copy)."""
    if par.spec.fsdp:  # FSDP reduce-scatters every gradient during backward: no bucket
        return 0.0
    groups = [*grad_sync_groups(model, par), kv_grad_sync_group(model, par)]
    n = max((n for n, p in groups if p > 1), default=0.0)  # buckets are cut per group
    # the embedding's gradient, the last of backward, closes the last bucket of its group: one of these when ranks
    # see different tokens at the embedding, else (dp > 1) the group of everything averaged over dp alone
    embedding_in_group = par.sp_degree > 1 or (par.megatron_sp and par.vocab_degree == 1)
    if par.dp > 1 and not embedding_in_group:
        n = params_per_device(model, par) - sum(n for n, _ in groups)
    return min(n, GRAD_BUCKET_ELEMS)


FSDP_BUFFERS = ("unit", "unit_grad", "head", "head_grad", "embed")


def fsdp_buffers(work: Workload, training: Training = TRAINING) -> dict[str, float]:
    """fsdp_sp's gathered weights and gradient buffers (bytes; docs/method.md#fsdp-sp), read off FSDP2:
    unit   a block unit's unsharded weights (W + 2h)·b; in backward the prefetched neighbour's too, and FSDP keeps
           the last reduce-scatter input (a unit's gradients, (W + 2h)·bg) until the next one is issued, so a
           middle layer's backward holds three unit-sized buffers
    head   final norm + LM head (V·h + h)·b, gathered from its forward until its backward
    embed  the embedding V·h·b, gathered from layer 0's backward (prefetch) through its own
    The unsharded gradient of the layer in backward is a temporary (autograd's, before the reduce-scatter)."""
    model, b, bg = work.model, work.elem_bytes, training.grad_bytes(work)
    h, v = model.dim, model.vocab_size
    return {
        "unit": (layer_weight_params(model) + 2 * h) * b,
        "unit_grad": (layer_weight_params(model) + 2 * h) * bg,
        "head": (v * h + h) * b,
        "head_grad": (v * h + h) * bg,
        "embed": v * h * b,
    }


# ---------------------------------------------------------------------------------------------- one step's phases
@dataclass(frozen=True)
class StepMemory:
    """What every phase of one step shares (bytes per device)."""

    par: ParallelConfig
    """The layout."""
    work: Workload
    """The step (train: every phase; forward: `forward_phases`)."""
    training: Training
    """The optimizer state and gradient format."""
    geo: Geometry
    """What the rank runs on (activations.geometry)."""
    state: dict[str, float]
    """Parameters and optimizer state, alive the whole step (steady state; forward: the parameters alone)."""
    ring: float
    """TSP's ring receive buffers (activations.ring_buffer_bytes): allocated in the first forward, alive from then
    on; 0 in every other scheme."""
    fsdp: dict[str, float]
    """fsdp_sp's gathered buffers (`fsdp_buffers`); zeros in every scheme without FSDP."""

    def phase(self, **live: float) -> dict[str, float]:
        """One phase by category (MEMORY_KEYS): the state and the ring buffers, plus what is `live` at it; + total."""
        out = {**dict.fromkeys(MEMORY_KEYS, 0.0), **self.state, **live}
        out["activations"] += self.ring
        out["total"] = sum(out[key] for key in MEMORY_KEYS)
        return out


def step_memory(par: ParallelConfig, work: Workload, training: Training = TRAINING) -> StepMemory:
    """What the phases of one step of `work` on `par` share."""
    k = state_bytes_per_param(work.dtype, training.optimizer, training.master_fp32, training.grad_dtype, work.mode)
    n_dev = params_per_device(work.model, par)
    state = {key: n_dev * k[key] for key in ("params", "optimizer")}
    fsdp = fsdp_buffers(work, training) if par.spec.fsdp else dict.fromkeys(FSDP_BUFFERS, 0.0)
    return StepMemory(par, work, training, geometry(par, work), state, ring_buffer_bytes(par, work), fsdp)


def forward_phases(step: StepMemory, *, kv_cache: bool = True) -> dict[str, dict[str, float]]:
    """Forward without grad: the LM head (logits, their fp32 copy and the log-softmax output) or one layer's working
    set, + a KV cache of K and V per layer when `kv_cache` (prefill; tspbench's forward keeps none). fsdp_sp adds
    the gathered head, or a layer's unit, the prefetched next one and the last flat all-gather."""
    par, work, geo = step.par, step.work, step.geo
    model, b, h = work.model, work.elem_bytes, work.model.dim
    vd = layout(par).vocab_div
    v_loc = model.vocab_size / vd
    if vd > 1:  # logits [tokens, V/T] + the cross-entropy's shifted fp32 copy (exp, softmax in place),
        # or, Megatron-SP, the all-gathered head input while the logits are computed
        gathered = geo.n_loss * h * b if geo.n_loss > geo.n_res else 0.0
        logits = max(geo.n_loss * v_loc * (b + 4), gathered + geo.n_loss * v_loc * b)
    else:  # logits + their fp32 copy + log-softmax
        logits = geo.n_loss * model.vocab_size * (b + (4 if b < 4 else 0) + 4)
    ffn_a = geo.n_gemm * model.ffn_hidden / geo.t * b
    if par.scheme == "tsp":  # one MLP shard of the ring at a time
        ffn_a = geo.n_gemm * model.ffn_hidden / par.degree * b
    layer = max(
        geo.n_res * (h * b + 3 * 4 * h),  # RMSNorm in fp32
        geo.n_res * h * b + geo.n_gemm * h * b + 3 * ffn_a,  # SwiGLU: silu(gate), up, product
        geo.n_res * h * b
        + 2 * 2 * (geo.kv_tokens or geo.n_gemm) * model.head_dim * kv_heads_per_rank(model, geo.t) * b,
    )
    if par.ulysses:
        # block input, its norm, local Q/K/V, the packed chunks posted and the head shards received; tp_sp (its
        # three exchanges posted back to back after the fused projection) also the kernel output and its
        # re-zigzagged copy; sp and fsdp_sp (projections split, schemes/ops/ulysses.py) peak when V's exchange is
        # posted: the local Q/K/V are freed before the un-zigzag, the output moment is smaller
        qkv = 3 * (h + 2 * h / model.gqa_ratio) / geo.t
        out = 2 * h / geo.t if par.scheme == "tp_sp" else 0.0
        layer = max(layer, geo.n_res * (2 * h + qkv + out) * b)
    kv = kv_cache_bytes(par, work) if kv_cache else 0.0
    return {
        "head": step.phase(temporaries=logits + geo.n_res * h * b, kv_cache=kv, comm_buffers=step.fsdp["head"]),
        "layer": step.phase(temporaries=layer, kv_cache=kv, comm_buffers=3 * step.fsdp["unit"]),
    }


@dataclass(frozen=True)
class Gradients:
    """Gradient bytes a rank holds in a training step, by piece (fsdp_sp: its 1/N shards; the unsharded gradient of
    the layer in backward is autograd's, a temporary until its reduce-scatter)."""

    layer: float
    """One block's weights and its two norms."""
    mlp: float
    """One block's MLP weights: they exist by the block's norm and attention moments."""
    mlp_tmp: float
    """fsdp_sp: the MLP's unsharded gradient at those moments (a temporary); 0 elsewhere."""
    wo: float
    """W_O's, which exists by the attention moment."""
    wo_tmp: float
    """fsdp_sp: W_O's unsharded gradient at the attention moment (a temporary); 0 elsewhere."""
    embed: float
    """The embedding's."""
    embed_full: float
    """The embedding backward's dense gradient (fsdp_sp: unsharded, before its reduce-scatter)."""
    head: float
    """The LM head's and the final norm's."""
    all: float
    """Every gradient of the rank."""


def step_gradients(step: StepMemory) -> Gradients:
    """The gradient pieces of a training step (bytes of the gradient dtype)."""
    par, model, geo = step.par, step.work.model, step.geo
    bg, lay, h = step.training.grad_bytes(step.work), layout(par), model.dim
    v_loc = model.vocab_size / lay.vocab_div
    g_layer = (layer_weight_params_per_rank(model, par) + 2 * h) * bg
    g_mlp = 3 * model.ffn_hidden * h / lay.weight_div * bg
    g_embed, g_head = v_loc * h * bg, (v_loc * h + h) * bg
    g_wo = model.dim * model.dim / geo.t * bg
    g_all = params_per_device(model, par) * bg
    if not par.spec.fsdp:
        return Gradients(g_layer, g_mlp, 0.0, g_wo, 0.0, g_embed, g_embed, g_head, g_all)
    nf = lay.weight_div  # sharded gradients ÷ N; the layer's own in backward is unsharded (a temporary)
    g_layer = (layer_weight_params(model) + 2 * h) / nf * bg
    return Gradients(
        g_layer, 0.0, 3.0 * model.ffn_hidden * h * bg, 0.0, g_wo, g_embed / nf, g_embed, g_head / nf, g_all
    )


def loss_backward_phase(step: StepMemory, grads: Gradients) -> dict[str, float]:
    """Loss backward: every stored activation (L layers + head) and F.cross_entropy's two fp32 [tokens, V]
    gradients (replicated head), or the vocabulary-parallel softmax turned into the gradient in place plus its copy
    in the run dtype; then the final norm's fp32 backward (its saved fp32 input + 5 fp32 temporaries per element)
    with the head's weight gradient. The larger of the two."""
    par, work, geo = step.par, step.work, step.geo
    model, b, h = work.model, work.elem_bytes, work.model.dim
    vd = layout(par).vocab_div
    stored = model.n_layers * stored_per_layer(par, work)
    ce_tmp = 2 * geo.n_loss * model.vocab_size * 4 if vd == 1 else geo.n_loss * (model.vocab_size / vd) * b
    return max(
        step.phase(
            activations=stored + head_saved_bytes(par, work), temporaries=ce_tmp, comm_buffers=step.fsdp["head"]
        ),
        step.phase(
            grads=grads.head,
            activations=stored + geo.n_res * 4 * h,
            temporaries=5 * 4 * h * geo.n_res,
            comm_buffers=step.fsdp["head"],
        ),
        key=lambda p: p["total"],
    )


@dataclass(frozen=True)
class LayerBackward:
    """One block's backward on one rank (bytes), the same for every block."""

    stored: float
    """What each block keeps from its forward (activations.stored_per_layer)."""
    working_set: dict[str, float]
    """Each moment's extra bytes, the saved part alive at it and its comm part
    (activations.layer_backward_working_set)."""


def layer_backward_phases(step: StepMemory, grads: Gradients) -> dict[str, dict[str, float]]:
    """The layers' backward, each phase at the largest of a block's moments (mlp, norm, attn).

    bwd_first      the last layer's: L layers' stored activations + the LM-head gradient + one layer's backward
                   working set (with full recompute: that layer's recomputed activations too)
    bwd_mid_first  fsdp_sp, L ≥ 3: the next one's, where FSDP holds three block-sized buffers (the layer's unit,
                   the prefetched one before it and the last reduce-scatter input), more than either end
    bwd_last       layer 0's: one layer's stored activations + every gradient but layer 0's and the embedding's +
                   the working set (the layers in between are linear between the two)
    """
    par, work, fb, L = step.par, step.work, step.fsdp, step.work.model.n_layers
    lb = LayerBackward(stored_per_layer(par, work), layer_backward_working_set(par, work))
    # fsdp_sp: the layer's unit, the prefetched one before it (the embedding for layer 0) and the last
    # reduce-scatter input (the head's for the last layer)
    fsdp_comm = {
        "bwd_first": 2 * fb["unit"] + fb["head_grad"],
        "bwd_mid_first": 2 * fb["unit"] + fb["unit_grad"],
        "bwd_last": fb["unit"] + fb["embed"] + fb["unit_grad"],
    }
    layers = [("bwd_first", L, grads.head), ("bwd_last", 1, grads.all - grads.embed - grads.layer)]
    if par.spec.fsdp and L >= 3:
        layers.insert(1, ("bwd_mid_first", L - 1, grads.head + grads.layer))
    out = {}
    for name, n_stored, held in layers:
        moments = [m for m in ("mlp", "col", "norm", "attn") if m in lb.working_set]
        out[name] = max(
            (_layer_moment(step, grads, lb, moment, n_stored, held, fsdp_comm[name]) for moment in moments),
            key=lambda p: p["total"],
        )
    return out


def _layer_moment(
    step: StepMemory, grads: Gradients, lb: LayerBackward, moment: str, n_stored: int, held: float, fsdp_comm: float
) -> dict[str, float]:
    """One moment of a block's backward with `n_stored` blocks' activations alive and `held` gradient bytes besides
    the block's own (activations.layer_backward_working_set names the moments)."""
    ws, h, n_res = lb.working_set, step.work.model.dim, step.geo.n_res
    saved, extra, comm = ws[f"{moment}_saved"], ws[moment], ws[f"{moment}_comm"]
    g = held + (grads.mlp if moment in ("norm", "attn") else 0.0) + (grads.wo if moment == "attn" else 0.0)
    col_wgrads = 0.0
    if moment == "col":  # W_down's gradient is attached; gate's and up's are just computed (not yet .grad)
        g += grads.mlp / 3
        col_wgrads = 2 * grads.mlp / 3
    if rebuilt_in_backward(step.par):  # the layer's activations are rebuilt in backward: temporaries
        act = n_stored * lb.stored
        comm_b = comm
        tmp = saved + extra - comm_b
    else:  # saved in forward: activations (minus what is already freed)
        act = (n_stored - 1) * lb.stored + saved
        if moment == "norm":  # the MLP-norm's saved fp32 input is one of the 6 fp32 copies
            act += 4 * h * n_res
            extra -= 4 * h * n_res
        comm_b, tmp = comm, extra - comm
    if moment in ("norm", "attn"):
        tmp += grads.mlp_tmp + (grads.wo_tmp if moment == "attn" else 0.0)
    tmp += col_wgrads
    return step.phase(grads=g, activations=act, temporaries=tmp, comm_buffers=comm_b + fsdp_comm)


def embedding_backward_phase(step: StepMemory, grads: Gradients) -> dict[str, float]:
    """Embedding backward, the larger of two moments. Its work: the incoming gradient and the dense embedding gradient
    (+ fsdp_sp: the gathered embedding and layer 0's last reduce-scatter input); a vocabulary-parallel embedding adds
    the masked lookup's gradient, and under Megatron-SP its incoming gradient is an all-gather output. Then the
    gradient sync's last bucket, packed when the embedding's gradient completes it: every gradient plus the flat
    buffer (`grad_sync_bucket_elems`; the overlapped sync posts it there, docs/method.md#choice-overlap)."""
    geo, fb = step.geo, step.fsdp
    h, b = step.work.model.dim, step.work.elem_bytes
    bucket = grad_sync_bucket_elems(step.work.model, step.par) * step.training.grad_bytes(step.work)
    packed = step.phase(grads=grads.all, comm_buffers=bucket)
    if layout(step.par).vocab_div == 1:
        work = step.phase(
            grads=grads.all - grads.embed,
            temporaries=geo.n_res * h * b + grads.embed_full,
            comm_buffers=fb["embed"] + fb["unit_grad"],
        )
    else:
        n_emb = geo.n_loss  # the embedding sees the head's tokens (Megatron-SP: the gathered ones)
        gathered = n_emb * h * b if geo.n_loss > geo.n_res else 0.0
        work = step.phase(
            grads=grads.all - grads.embed, temporaries=2 * n_emb * h * b - gathered + grads.embed, comm_buffers=gathered
        )
    return max(work, packed, key=lambda p: p["total"])


def grad_sync_phase(step: StepMemory, grads: Gradients) -> dict[str, float]:
    """finish_grad_sync: every gradient. The buckets were posted during backward and their flat buffers are the
    gradients' own memory (`embedding_backward_phase` counts the last one's concatenation); this only waits."""
    return step.phase(grads=grads.all)


def optimizer_phase(step: StepMemory, grads: Gradients) -> dict[str, float]:
    """The optimizer step: AdamW's fp32 gradient copy of the largest parameter (master_fp32: gradients upcast a bin
    of at most its size at a time + fused update) or two parameter-sized temporaries (torch's single-tensor
    AdamW); nothing for SGD."""
    tr, b = step.training, step.work.elem_bytes
    big = largest_param_elems(step.work.model, step.par)
    adamw = tr.optimizer == "adamw"
    opt_tmp = big * 4 if (tr.master_fp32 and b < 4 and adamw) else (2 * big * b if adamw else 0.0)
    return step.phase(grads=grads.all, temporaries=opt_tmp)


# ---------------------------------------------------------------------------------------------- the peak
def memory_phases(
    par: ParallelConfig, work: Workload, training: Training = TRAINING, *, kv_cache: bool = True
) -> dict[str, dict[str, float]]:
    """Bytes per device at each phase's peak of one training step (or forward), by category.

    Train. The optimizer state exists throughout (steady state); gradients start as None (zero_grad with
    set_to_none) and appear layer by layer in backward. Phases (the moments tspbench.predict.estimate reports):
        backward   loss backward (`loss_backward_phase`): every stored activation (L layers + head) + two fp32
                   [tokens, V] gradients
        bwd_first, bwd_last (and fsdp_sp's bwd_mid_first)   the layers' backward (`layer_backward_phases`)
        embed_bwd  embedding backward (`embedding_backward_phase`): the incoming gradient and the dense embedding
                   gradient, or every gradient + the gradient sync's last flat bucket
        grad_sync  finish_grad_sync, waiting for the buckets posted in backward (`grad_sync_phase`)
        optimizer  AdamW's temporaries (`optimizer_phase`)
    The forward phases are below `backward` (which holds every stored activation plus the loss gradients).
    Forward (no grad, `forward_phases`): the LM head or one layer's working set, + the KV cache when `kv_cache`.
    """
    if work.mode not in ("train", "forward"):
        raise ValueError(f"mode={work.mode!r} is unknown; allowed: train, forward")
    step = step_memory(par, work, training)
    if work.mode == "forward":
        return forward_phases(step, kv_cache=kv_cache)
    grads = step_gradients(step)
    return {
        "backward": loss_backward_phase(step, grads),
        **layer_backward_phases(step, grads),
        "embed_bwd": embedding_backward_phase(step, grads),
        "grad_sync": grad_sync_phase(step, grads),
        "optimizer": optimizer_phase(step, grads),
    }


def memory_breakdown(
    par: ParallelConfig, work: Workload, training: Training = TRAINING, *, kv_cache: bool = True
) -> dict[str, float]:
    """Predicted peak bytes per device and its breakdown by category (keys MEMORY_KEYS + total): the phase
    of `memory_phases` with the largest total, i.e. what is live at the step's peak (not the sum of each
    category's own maximum: weight gradients and stored activations, for instance, peak at different
    moments). `peak_phase()` names the phase."""
    phases = memory_phases(par, work, training, kv_cache=kv_cache)
    best = max(phases.values(), key=lambda p: p["total"])
    return {key: float(best[key]) for key in (*MEMORY_KEYS, "total")}


def peak_phase(par: ParallelConfig, work: Workload, training: Training = TRAINING, *, kv_cache: bool = True) -> str:
    """Name of the phase `memory_breakdown` reports."""
    phases = memory_phases(par, work, training, kv_cache=kv_cache)
    return max(phases, key=lambda k: phases[k]["total"])


def comm_buffer_bytes(par: ParallelConfig, work: Workload) -> float:
    """Communication buffers live at one layer's backward peak (mlp moment; full recompute)."""
    return layer_backward_working_set(par, work)["mlp_comm"]
