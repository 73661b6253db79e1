"""The paper's setting, shared by its tables (tspbench.paper.tables) and the headline: the reference model, the
lengths and cluster, the one memory setting and the layouts compared.

Reference model `LLAMA7B` (docs/method.md#published): h = 4096, L = 32, 32 query and 32 KV heads (MHA), gated MLP
with ffn = 4h = 16384, 8.59B non-embedding parameters. The paper's vocabulary is not stated; we use
Llama-2's V = 32000 with an untied LM head: split by vocabulary over the tensor axis in TP, TP+Megatron-SP and
TP×SP (Megatron's vocabulary parallelism), replicated in SP and TSP (docs/method.md#choice-embedding), as in
tspbench's code.
"""

from __future__ import annotations

from dataclasses import dataclass

from tspbench.config import GB, GIB, model_preset
from tspbench.parallel import LayoutOptions, ParallelConfig, layouts

LLAMA7B = model_preset("llama7b")
SEQ_16K, SEQ_128K = 16384, 131072
N_GPUS = 1024
DEGREE = 8
UNIT_BYTES = {"GB": GB, "GiB": GIB}
"""How the published memory figures can be read: decimal GB or GiB."""


@dataclass(frozen=True)
class MemorySetting:
    """The one training setting used for every scheme in the memory table."""

    optimizer: str = "adamw"
    dtype: str = "bfloat16"
    grad_dtype: str | None = None  # None = dtype (bf16 grads, k = 16); "float32" gives k = 18
    master_fp32: bool = True
    recompute: str = "full"
    batch: int = 1
    unit: str = "GB"  # how the published figures are read: decimal GB or GiB

    @property
    def bytes_per_param(self) -> int:
        return 2 + (4 if self.grad_dtype == "float32" else 2) + 8 + (4 if self.master_fp32 else 0)


PAPER_MEMORY_SETTING = MemorySetting()
"""The memory table's setting, chosen by tspbench.paper.memory.memory_setting_scan (docs/method.md#memory)."""


def every_factorisation(degree: int = DEGREE) -> LayoutOptions:
    """tp_sp at every T dividing the degree (T = 1 is pure SP, T = degree is TP + Megatron-SP)."""
    return LayoutOptions(tps=tuple(t for t in range(1, degree + 1) if degree % t == 0))


def paper_layouts(degree: int = DEGREE, ablations: bool = False) -> list[ParallelConfig]:
    """TSP (D), TP (T), and every TP×SP factorisation T·Σ = degree (T = 1 is pure SP, T = degree is TP), TP×SP
    with Megatron-SP on its tensor axis (the default, docs/method.md#choice-tp-sp-msp). `ablations`: also TP +
    Megatron-SP over all D (tp_msp) and the plain TP×SP (msp=false) for every 1 < T < degree
    (tspbench.parallel.layouts, as every enumeration)."""
    out = layouts(degree, schemes=("tsp", "tp", "tp_sp"), options={"tp_sp": every_factorisation(degree)})
    if ablations:
        out += layouts(degree, schemes=("tp_msp", "tp_sp"), options={"tp_sp": LayoutOptions(msps=(False,))})
    return out


def is_method(par: ParallelConfig) -> bool:
    """Is this layout the method under test (TSP), not a baseline (tspbench.parallel's scheme role)."""
    return par.spec.role == "method"
