"""Rank functions for tests/peers: one training forward + backward of our scheme and of Hugging Face's
LlamaForCausalLM under PyTorch's own parallelism (tspbench/peers/torch_plans.py; FSDP2's fully_shard), from the same
weights (tspbench/hf/convert.py), in float64 on gloo ranks. Rank 0 saves what it saw to `out` (torch.save), every
tensor at full shape, every collective as (op, phase, module or tag, numel, bytes)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tspbench.config import ModelConfig

SEED = 0
CFG = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=48)
"""Tiny GQA model: T = 2 divides heads, KV heads and vocabulary; every FSDP unit splits evenly over 2 ranks."""
B, S = 2, 16


class Float64Rope(nn.Module):
    """transformers' LlamaRotaryEmbedding's rotate_half cos/sin table (plain RoPE, attention_scaling 1), in float64
    (theirs: float32, autocast off)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids.to(torch.float64)[..., None] * self.inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _rms_norm_float64(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm.forward without its cast to float32 (the same formula in the input's dtype)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _eager_float64(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """transformers' eager_attention_forward (models/llama/modeling_llama.py, 5.x) line for line, except that its
    softmax runs in the input's dtype instead of float32."""
    from transformers.models.llama.modeling_llama import repeat_kv

    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = F.softmax(attn_weights, dim=-1)
    attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
    return attn_output, attn_weights


def float64_llama(hf: nn.Module, cfg: ModelConfig) -> nn.Module:
    """transformers' Llama computes three things in float32 whatever the model's dtype: RoPE's cos/sin, RMSNorm and
    the eager softmax, which alone put ~1e-8 relative error on float64 logits. Here the same maths runs in float64
    (Float64Rope; RMSNorm's forward without the cast; eager attention with the softmax in float64, installed as the
    module's `eager_attention_forward`, which LlamaAttention looks up at call time), so a comparison is limited by
    float64 rounding only. Nothing else of the model changes."""
    from transformers.models.llama import modeling_llama

    modeling_llama.eager_attention_forward = _eager_float64
    modeling_llama.LlamaRMSNorm.forward = _rms_norm_float64  # this process only (a spawned rank)
    hf.model.rotary_emb = Float64Rope(cfg.head_dim, cfg.rope_theta)
    return hf


def hf_model(cfg: ModelConfig = CFG, permute_rope: bool = True) -> nn.Module:
    """LlamaForCausalLM (eager attention, float64) holding our seed-SEED weights. `permute_rope=False` is the broken
    mapping: q/k rows left in our interleaved order, which transformers' rotate_half RoPE reads wrongly."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tspbench.hf.convert import hf_config_from_model, hf_name, state_dict_to_hf
    from tspbench.model import build_model

    hf = LlamaForCausalLM(LlamaConfig(**hf_config_from_model(cfg), attn_implementation="eager")).to(torch.float64)
    ours = build_model(cfg, SEED, torch.float64).state_dict()
    sd = state_dict_to_hf(ours, cfg) if permute_rope else {hf_name(k): v for k, v in ours.items()}
    hf.load_state_dict(sd, strict=True)
    return float64_llama(hf, cfg)


def batch(cfg: ModelConfig = CFG, rows: int = B) -> tuple[torch.Tensor, torch.Tensor]:
    from tspbench.model import synthetic_batch

    return synthetic_batch(cfg, rows, S, SEED)


def hf_forward(hf: nn.Module, tokens: torch.Tensor) -> Any:
    """Logits of `tokens` [b, S] with explicit positions and a 4-D causal mask over the whole sequence (under
    Megatron-SP the embedding's output holds S/T tokens, from which transformers would build an S/T mask)."""
    b, s = tokens.shape
    mask = torch.full((s, s), float("-inf"), dtype=torch.float64).triu(1)[None, None].expand(b, 1, s, s)
    return hf(input_ids=tokens, attention_mask=mask, position_ids=torch.arange(s)[None].expand(b, s)).logits


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def ours(scheme: str, degree: int, dp: int = 1, cfg: ModelConfig = CFG) -> dict[str, Any]:
    """Our scheme's step (collective): loss, full logits, gradients in Hugging Face names, every CommLog record."""
    from tspbench.hf.convert import state_dict_to_hf
    from tspbench.parallel import ParallelConfig
    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh
    from tspbench.schemes.comm import CommLog

    par = ParallelConfig(scheme=scheme, degree=degree, dp=dp)
    log = CommLog()
    pm = apply_scheme(cfg, par, ApplyArgs(build_mesh(par, "cpu"), S, SEED, torch.float64, "cpu", log))
    tokens, targets = batch(cfg, dp * B)
    tok, tgt, pos = pm.local_batch(tokens, targets)
    loss, logits = pm.loss(tok, tgt, pos)
    loss.backward()
    pm.finish_grad_sync()
    comm = [(r.op, r.phase, r.tag, r.numel, r.bytes) for r in log.records]
    log.enabled = False
    return {
        "loss": pm.replica_loss(loss),
        "logits": pm.full_logits(logits.detach()),
        "grads": state_dict_to_hf(pm.full_state(grads=True), cfg),
        "comm": comm,
    }


def torch_tp(sequence_parallel: bool, permute_rope: bool = True) -> dict[str, Any]:
    """Hugging Face's model under torchtitan's plan (torch_plans.parallelize_llama) on every rank of the default
    group, loss_parallel cross-entropy; collectives counted by SizedCommDebugMode."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel

    from tspbench.peers.torch_plans import SizedCommDebugMode, parallelize_llama

    hf = hf_model(permute_rope=permute_rope)
    parallelize_llama(hf, init_device_mesh("cpu", (dist.get_world_size(),)), sequence_parallel)
    tokens, targets = batch()
    with SizedCommDebugMode() as cm:
        logits = hf_forward(hf, tokens)
        with loss_parallel():
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            loss.backward()
    return {
        "loss": _full(loss.detach()),
        "logits": _full(logits.detach()),
        "grads": {n: _full(p.grad) for n, p in hf.named_parameters()},
        "comm": [(r.op, r.phase, r.module, r.numel, r.bytes) for r in cm.sized],
        "counts": {
            k: {ph: {str(op): n for op, n in c.items()} for ph, c in v.items()}
            for k, v in cm.comm_module_counts.items()
        },
    }


def torch_hf_plan() -> dict[str, Any]:
    """Hugging Face's model under transformers' own base_model_tp_plan (torch_plans.hf_layer_plan): the decoder
    layers' projections only; embedding, norms, head and loss replicated on every rank."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from tspbench.peers.torch_plans import SizedCommDebugMode, hf_layer_plan

    hf = hf_model()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in hf.model.layers:
        parallelize_module(block, mesh, hf_layer_plan(hf.config))
    tokens, targets = batch()
    with SizedCommDebugMode() as cm:
        logits = hf_forward(hf, tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
    return {
        "loss": loss.detach(),
        "logits": logits.detach(),
        "grads": {n: _full(p.grad) for n, p in hf.named_parameters()},
        "comm": [(r.op, r.phase, r.module, r.numel, r.bytes) for r in cm.sized],
    }


def torch_fsdp() -> dict[str, Any]:
    """Hugging Face's model under FSDP2 as torchtitan wraps Llama (one unit per decoder layer, one for the
    embedding, one for the final norm + LM head kept gathered after forward, the root owning nothing; one block
    prefetched each way, as our fsdp_sp), plain data parallelism: rank r runs row r of the global batch."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from tspbench.peers.torch_plans import SizedCommDebugMode

    world, rank = dist.get_world_size(), dist.get_rank()
    hf = hf_model()
    mesh = init_device_mesh("cpu", (world,))
    layers = list(hf.model.layers)
    units = [fully_shard(layer, mesh=mesh, reshard_after_forward=True) for layer in layers]
    units.append(fully_shard(hf.model.embed_tokens, mesh=mesh, reshard_after_forward=True))
    fully_shard([hf.model.norm, hf.lm_head], mesh=mesh, reshard_after_forward=False)
    units.append(hf.model.norm)  # either module of the shared unit reaches its state
    fully_shard(hf, mesh=mesh)
    for unit in units:
        unit.set_force_sum_reduction_for_comms(True)  # SUM then divide by the world: gloo has no AVG/PREMUL_SUM
    for prev, nxt in zip(layers, layers[1:]):
        prev.set_modules_to_forward_prefetch([nxt])
        nxt.set_modules_to_backward_prefetch([prev])
    tokens, targets = batch(rows=world * (B // world))
    mine = slice(rank * (B // world), (rank + 1) * (B // world))
    with SizedCommDebugMode() as cm:
        logits = hf_forward(hf, tokens[mine])
        loss = F.cross_entropy(logits.flatten(0, 1), targets[mine].flatten())
        loss.backward()
    comm = [(r.op, r.phase, r.module, r.numel, r.bytes) for r in cm.sized]
    rows = [torch.empty_like(logits) for _ in range(world)]
    dist.all_gather(rows, logits.detach().contiguous())
    total = loss.detach().clone()
    dist.all_reduce(total)
    return {
        "loss": total / world,
        "logits": torch.cat(rows),
        "grads": {n: _full(p.grad) for n, p in hf.named_parameters()},
        "comm": comm,
    }


def run(rank: int, world: int, out: str, jobs: list[tuple[str, dict[str, Any]]]) -> None:
    """Spawned rank: run each (function name, kwargs) of this module in turn; rank 0 saves {name: result}."""
    import sys

    here = sys.modules[__name__]
    results = {f"{name}:{sorted(kw.items())}": getattr(here, name)(**kw) for name, kw in jobs}
    if rank == 0:
        torch.save(results, out)
