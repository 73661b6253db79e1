"""PyTorch's own tensor parallelism on Hugging Face's Llama, and a CommDebugMode that also records bytes
(docs/method.md#peers).

Plans. `layer_plan` is torchtitan's Llama plan (`apply_tp` in torchtitan/models/llama3/infra/parallelize.py, the
releases before 0.3.0, which replaced it by spmd_types sharding configs), written for transformers' module names
(attention_norm → input_layernorm, attention → self_attn, wq/wk/wv/wo → q/k/v/o_proj, ffn_norm →
post_attention_layernorm, feed_forward → mlp, w1/w3/w2 → gate/up/down_proj). With `sequence_parallel` it is the plan
as torchtitan runs it (SequenceParallel norms, PrepareModuleInput Shard(1) → Replicate into attention and MLP,
rowwise outputs Shard(1)): Megatron-SP, our tp_msp. Without, the norms and residual stream stay replicated and the
rowwise outputs Replicate: Megatron's plain TP, our tp (torchtitan's layout with enable_sp off). transformers calls
`self_attn(hidden_states=...)` by keyword, so its PrepareModuleInput names the keyword. `top_plan` shards the
embedding by vocabulary (RowwiseParallel of nn.Embedding) and the LM head by vocabulary (ColwiseParallel to Shard(-1),
the cross-entropy under `loss_parallel`), torchtitan's top-level plan with loss_parallel on.

Counting. CommDebugMode counts each collective per module and per phase (forward / backward) but not its size;
`SizedCommDebugMode` is CommDebugMode that also keeps, for every collective it counts, the module it ran in, the
phase, the group size and the full buffer's element count and bytes in tspbench.schemes.comm's convention (all-gather:
the output, reduce-scatter: the input, all-reduce: the tensor), so its records compare one to one with our CommLog.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.debug._comm_mode import _CommModeModuleTracker
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

OPS = {
    "all_reduce": "all_reduce",
    "allreduce_": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "_allgather_base_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "alltoall_base_": "all_to_all",
}
"""Collective op names (functional collectives and c10d ops, as CommDebugMode sees them) → our CommLog's op names."""


def layer_plan(sequence_parallel: bool) -> dict[str, Any]:
    """torchtitan's per-block plan for one LlamaDecoderLayer (module docstring)."""
    if not sequence_parallel:
        return {
            "self_attn": PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Replicate()},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            ),
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Replicate()),
            "mlp": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Replicate()),
        }
    return {
        "input_layernorm": SequenceParallel(),
        "self_attn": PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)},
            desired_input_kwarg_layouts={"hidden_states": Replicate()},
        ),
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
    }


def hf_layer_plan(config: Any) -> dict[str, Any]:
    """transformers' own plan for one decoder layer (`config.base_model_tp_plan`, e.g. LlamaConfig's
    "layers.*.self_attn.q_proj": "colwise", …, "layers.*.mlp.down_proj": "rowwise") in torch's styles:
    ColwiseParallel and RowwiseParallel with their defaults, and nothing else (no PrepareModuleInput; norms and
    embedding replicated)."""
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    return {
        key.removeprefix("layers.*."): styles[style]()
        for key, style in (config.base_model_tp_plan or {}).items()
        if key.startswith("layers.*.") and style in styles
    }


def top_plan(sequence_parallel: bool) -> dict[str, Any]:
    """torchtitan's top-level plan (embedding, final norm, LM head) with loss_parallel: vocabulary-sharded embedding
    whose partial lookups are all-reduced (TP) or reduce-scattered to sequence shards (SP), the head's logits left
    sharded by vocabulary (Shard(-1) DTensor) for loss_parallel's cross-entropy."""
    seq = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False),
    }
    if sequence_parallel:
        plan["model.norm"] = SequenceParallel()
    return plan


def parallelize_llama(model: torch.nn.Module, mesh, sequence_parallel: bool) -> torch.nn.Module:
    """Apply `top_plan` and every layer's `layer_plan` to a LlamaForCausalLM with torch's parallelize_module."""
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, mesh, top_plan(sequence_parallel))
    for layer in model.model.layers:  # type: ignore[union-attr]
        parallelize_module(layer, mesh, layer_plan(sequence_parallel))
    return model


@dataclass
class SizedRecord:
    """One collective as PyTorch issued it, in our CommLog's terms."""

    op: str
    """all_reduce | all_gather | reduce_scatter | all_to_all."""
    phase: str
    """fwd | bwd (CommDebugMode's module tracker)."""
    module: str
    """The innermost module it ran in (CommDebugMode's fully qualified name)."""
    group_size: int
    numel: int
    """Elements of the full buffer (all-gather: the output; reduce-scatter: the input; all-reduce: the tensor)."""
    bytes: int


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    return []


def _group_size(name: str, args: tuple) -> int:
    """The group size from a functional collective's arguments (funcol: the int after the tensors), or a c10d op's
    ProcessGroup argument."""
    import torch.distributed as dist

    for a in args:
        if isinstance(a, dist.ProcessGroup):
            return a.size()
    if name in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        return int(next(a for a in args if isinstance(a, int)))
    group_name = next((a for a in args if isinstance(a, str) and a not in ("sum", "avg", "max", "min")), None)
    if group_name is not None:
        from torch.distributed.distributed_c10d import _resolve_process_group

        return _resolve_process_group(cast(Any, group_name)).size()  # a GroupName is a str
    return dist.get_world_size()


class _Tracker(_CommModeModuleTracker):
    """CommDebugMode's module tracker, with one fix: it registers a forward hook on a module each time the module is
    entered and never removes it, so a module instance called again (transformers 5 wraps its hub-kernel functions,
    e.g. the RoPE application, in one shared `Func` module that every layer calls) pops the parent stack once per
    past call and the stack underflows (IndexError in _fw_set_module_hook); and the hooks of such a shared module
    outlive the mode, breaking the next one. Here a module's earlier hook is removed when it is entered again, and
    every hook when the mode exits."""

    def __init__(self) -> None:
        super().__init__()
        self._mine: dict[int, Any] = {}

    def _fw_pre_hook(self, mod, input):
        before = dict(self.register_forward_hook_handles)
        super()._fw_pre_hook(mod, input)
        new = [h for k, h in self.register_forward_hook_handles.items() if before.get(k) is not h]
        if new:
            old = self._mine.pop(id(mod), None)
            if old is not None:
                old.remove()
            self._mine[id(mod)] = new[0]

    def __exit__(self, *args):
        super().__exit__(*args)
        for handle in self._mine.values():  # also those the name-keyed dict lost (a shared module outlives us)
            handle.remove()
        self._mine.clear()


class SizedCommDebugMode(CommDebugMode):
    """CommDebugMode, plus a SizedRecord per collective it counts (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.advanced_module_tracker = _Tracker()
        self.sized: list[SizedRecord] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = self.get_total_counts()
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is NotImplemented or self.get_total_counts() == before or any(t == DTensor for t in types):
            return out
        name = func._overloadpacket.__name__
        op = OPS.get(name, name)
        biggest = max(_tensors(args) + _tensors(out), key=lambda t: t.numel())
        tracker = self.advanced_module_tracker
        self.sized.append(
            SizedRecord(
                op=op,
                phase="bwd" if tracker.is_bw else "fwd",
                module=str(tracker.name),
                group_size=_group_size(name, tuple(args)),
                numel=biggest.numel(),
                bytes=biggest.numel() * biggest.element_size(),
            )
        )
        return out

    def of(self, prefix: str, phase: str | None = None) -> list[tuple[str, int, int]]:
        """(op, numel, bytes) of the collectives run in modules whose name contains `prefix` (e.g.
        ".layers.0."), in issue order, one phase or both."""
        return [
            (r.op, r.numel, r.bytes)
            for r in self.sized
            if prefix in r.module + "." and (phase is None or r.phase == phase)
        ]
