"""llm-analysis (github.com/cli99/llm-analysis, 0.2.2) on one case, its configs built here so that nothing is
fetched: ModelConfig from our model, GPUConfig from our hardware profile, DtypeConfig w16a16e16 (bf16), and
`LLMAnalysis.training`.

What it models (llm_analysis/analysis.py, read at 0.2.2): latency = the step's FLOPs / (tp·pp · peak · one fixed
efficiency), with no communication at all; FLOPs per layer = 24·B·S·h² (+ GQA's smaller K/V) + 4·B·S²·h, i.e. an MLP
of two 4h matrices whatever ffn_embed_dim is (a gated MLP's third matrix and its real width are ignored) and the
attention scores without causal halving; backward = 2 × forward. Parameters per layer: 2 MLP matrices of
ffn_embed_dim (the gate's third is missing). Sequence sharding: Megatron-SP only (sp_size = tp_size); no context
parallelism. Memory: weights, gradients, optimizer state (sharded over dp by its ZeRO stage) + activations by
Korthikanti et al.'s per-layer formulas.
"""

from __future__ import annotations

import logging
from typing import Any

from tspbench.config import GIB
from tspbench.peers.cases import PeerCase
from tspbench.predict.costmodel.hardware import shared_profile

RECOMPUTE = {"none": "NONE", "selective": "SELECTIVE", "full": "FULL", "op_sac": "SELECTIVE", "layer_sac": "SELECTIVE"}
"""Our recompute modes as llm-analysis's ActivationRecomputation. torchtitan's op-level SAC (op_sac: matmul outputs
kept, the rest recomputed) has no equivalent there; its SELECTIVE (Korthikanti's core-attention recompute) is the
nearest (also for its per-layer SAC, layer_sac: every second block fully checkpointed), and that mapping is part of
the difference."""


def available() -> str | None:
    """None when llm-analysis imports, else why not (one line)."""
    try:
        import llm_analysis.analysis  # noqa: F401
    except ImportError as e:
        return f"llm-analysis is not installed ({e}); pip install --no-deps llm-analysis fire"
    return None


def representable(case: PeerCase) -> str | None:
    """None when llm-analysis can express the case's layout, else why not."""
    if case.recompute not in RECOMPUTE:
        return f"no recompute={case.recompute}"
    if case.context_parallel > 1:  # llm-analysis shards sequences only by Megatron-SP (sp_size = tp_size)
        return f"no context parallelism (Σ = {case.context_parallel})"
    return None


def analyse(case: PeerCase, efficiency: float | None = None) -> dict[str, Any]:
    """llm-analysis's training summary dict for `case`. `efficiency`: its flops_efficiency (default: the case's
    hardware profile's matmul_efficiency, the constant our cost model uses for GEMMs, so that both start from the
    same assumption)."""
    from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
    from llm_analysis.config import DtypeConfig, GPUConfig, ModelConfig, ParallelismConfig
    from llm_analysis.logger import logger

    logger.setLevel(logging.ERROR)  # its one logger (named "__name__") reports every intermediate, and warns
    m, hw = case.model, shared_profile(case.hardware)
    model = ModelConfig(
        name=f"tspbench_{case.id}",
        num_layers=m.n_layers,
        n_head=m.n_heads,
        hidden_dim=m.dim,
        vocab_size=m.vocab_size,
        max_seq_len=case.seq_len,
        num_key_value_heads=m.n_kv_heads,
        ffn_embed_dim=m.ffn_hidden,
        expansion_ratio=m.ffn_hidden / m.dim,  # given, so its integer-ratio assertion is not reached
        model_type="llama",
    )
    gpu = GPUConfig(
        name=hw.name,
        mem_per_GPU_in_GB=hw.mem_bytes / GIB,  # it multiplies this "GB" by 1024**3
        hbm_bandwidth_in_GB_per_sec=hw.mem_bw / 1e9,
        intra_node_bandwidth_in_GB_per_sec=hw.intra_node_bw / 1e9,
        intra_node_min_message_latency=hw.intra_node_latency_s,
        peak_fp16_TFLOPS=hw.peak_flops_bf16 / 1e12,
        inter_node_bandwidth_in_GB_per_sec=hw.inter_node_bw / 1e9,
    )
    dp = case.gpus // max(case.tp * case.context_parallel, 1)
    par = ParallelismConfig(tp_size=case.tp, pp_size=1, dp_size=dp, sp_size=case.tp if case.megatron_sp else 1)
    la = LLMAnalysis(
        model,
        gpu,
        DtypeConfig(),
        par,
        flops_efficiency=efficiency if efficiency is not None else hw.matmul_efficiency,
    )
    return la.training(
        batch_size_per_gpu=case.micro_batch,
        gradient_accumulation_steps=1,
        global_batch_size=case.micro_batch * dp,
        seq_len=case.seq_len,
        activation_recomputation=getattr(ActivationRecomputation, RECOMPUTE[case.recompute]),
        ds_zero=DSZeRO.STAGE_3 if case.zero3_over else DSZeRO.NONE,
        flash_attn=True,
        mlp_gated_linear_units=True,
    )


def quantities(case: PeerCase, summary: dict[str, Any]) -> dict[str, float]:
    """Our quantities from its summary: tokens/s per GPU (a replica of tp GPUs runs micro_batch·S tokens per
    latency_per_micro_batch), iteration time, peak memory and model states (GiB; it counts bytes)."""
    tokens = case.micro_batch * case.seq_len
    step = float(summary["latency_per_micro_batch"])
    return {
        "tokens_per_s_per_gpu": tokens / step / case.tp,
        "step_s": step,
        "peak_mem_gib": float(summary["(weight+op_state+grad+act)_memory_per_gpu"]) / GIB,
        "model_states_gib": float(summary["(weight+op_state+grad)_memory_per_gpu"]) / GIB,
    }
