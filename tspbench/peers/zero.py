"""DeepSpeed's ZeRO model-state memory estimators (deepspeed 0.19.8, called, not transcribed):
`deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs` and, for reference,
`deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs`. Without offload they are
    ZeRO-2  GPU bytes = 2·Ψ + ⌊18·Ψ / N⌋      (16-bit weights replicated; 16-bit and fp32 gradients, fp32 weights, m, v
                                              sharded over the N GPUs)
    ZeRO-3  GPU bytes = 4·Ψ_layer + ⌊18·Ψ / N⌋  (all of it sharded; the largest module's weights gathered, counted 4 B
                                              per parameter)
with Ψ the parameter count and Ψ_layer the largest module's own parameters (their `model_to_params`). Model states
only: activations, temporaries and communication buffers are not counted, and 18 B/param assumes fp32 gradient
copies, where our memory model's bf16 AdamW with fp32 master weights keeps 16 (2 + 2 + 12).
"""

from __future__ import annotations

from tspbench.config import GIB, ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel.params import params_per_device


def available() -> str | None:
    """None when DeepSpeed's estimators import, else why not (one line). Without a GPU, DeepSpeed's accelerator
    auto-detection prints a warning on stdout at import; naming the CPU accelerator (DS_ACCELERATOR, when unset)
    keeps it out of the printed table: the estimators are arithmetic and use no accelerator."""
    import os

    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed.runtime.zero.stage3  # noqa: F401
    except ImportError as e:
        return f"deepspeed is not installed ({e}); DS_BUILD_OPS=0 pip install --no-deps --no-build-isolation deepspeed"
    return None


def total_params(model: ModelConfig) -> int:
    """Ψ: every parameter of the model (untied embedding and LM head), as DeepSpeed's model_to_params counts them."""
    return int(params_per_device(model, ParallelConfig()))


def largest_module_params(model: ModelConfig) -> int:
    """Ψ_layer: the largest module's own parameters (model_to_params: max over modules of their non-recursive
    parameters): the embedding or LM head (V·h), or an MLP projection (ffn·h), or W_Q / W_O (h·h)."""
    return max(model.vocab_size * model.dim, model.ffn_hidden * model.dim, model.dim * model.dim)


def split_nodes(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(num_gpus_per_node, num_nodes) of a job of `gpus` GPUs."""
    per_node = min(gpus, gpus_per_node)
    return per_node, max(gpus // per_node, 1)


def zero3_gpu_gib(model: ModelConfig, over: int, gpus_per_node: int = 8) -> float:
    """DeepSpeed's ZeRO-3 model states per GPU (GiB), no offload, sharded over `over` GPUs."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    per_node, nodes = split_nodes(over, gpus_per_node)
    _, gpu, _ = estimate_zero3_model_states_mem_needs(
        total_params(model),
        largest_module_params(model),
        num_gpus_per_node=per_node,
        num_nodes=nodes,
        cpu_offload=False,
        cpu_offload_params=False,
        zero_init=True,
    )
    return gpu / GIB


def zero2_gpu_gib(model: ModelConfig, over: int, gpus_per_node: int = 8) -> float:
    """DeepSpeed's ZeRO-2 model states per GPU (GiB), no offload, over `over` GPUs (16-bit weights replicated)."""
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    per_node, nodes = split_nodes(over, gpus_per_node)
    _, gpu = estimate_zero2_model_states_mem_needs(
        total_params(model), num_gpus_per_node=per_node, num_nodes=nodes, cpu_offload=False
    )
    return gpu / GIB
