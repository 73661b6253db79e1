"""The configurations the peer estimators are run on: every in-scope row of conf/published (each published
layout mapped onto what the peers can express) and the paper's setting (tspbench/paper/setting.py: llama7b at 128K
on replicas of 8 MI300X, the memory table's setting: bf16, AdamW with fp32 master, full recompute, B = 1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.predict.published import Row, default_files, load_rows, memory_parallel

QUANTITIES = ("tokens_per_s_per_gpu", "step_s", "peak_mem_gib", "model_states_gib")
"""What is compared: throughput, iteration time (where published), peak memory and the model states (weights,
gradients and optimizer state: all DeepSpeed's estimators count)."""


@dataclass(frozen=True)
class PeerCase:
    """One configuration, in our terms and in the peers' (tensor degree, data-parallel sharding)."""

    id: str
    """The published row's id, or `paper_<layout>` for the paper's setting."""
    model: ModelConfig
    hardware: str
    """conf/hardware/<name>.yaml."""
    gpus: int
    """GPUs of the whole job."""
    par: ParallelConfig
    """Our layout, whose time the cost model predicts (as tspbench/predict/published.py does for the row)."""
    mem_par: ParallelConfig
    """Our layout whose memory is predicted (FSDP rows: fsdp_sp over every GPU, published.memory_parallel)."""
    seq_len: int
    micro_batch: int
    recompute: str
    tp: int
    """Megatron tensor degree, llm-analysis's tp_size (1: none)."""
    megatron_sp: bool
    """Megatron sequence parallelism on the tensor axis (llm-analysis's sp_size = tp_size)."""
    zero3_over: int
    """Ranks parameters, gradients and optimizer state are sharded over (FSDP / ZeRO-3); 0: not sharded."""
    context_parallel: int
    """Σ > 1: the sequence is split over ranks (context parallelism), which llm-analysis cannot express."""
    published: dict[str, float] = field(default_factory=dict)
    """The row's published numbers among QUANTITIES (none for the paper's setting)."""
    row: Row | None = None
    """The published row (None for the paper's setting)."""


def from_row(row: Row) -> PeerCase:
    """One in-scope published row as a case (its layout mapped as tspbench/predict/published.py maps it)."""
    lay = {k: v for k, v in row.layout.items() if k not in ("fsdp", "overlap")}
    degree = int(lay.get("degree", 1))
    lay.setdefault("dp", max(1, row.gpus // degree))
    par = ParallelConfig(recompute=row.recompute, **lay)
    mem_par = memory_parallel(row, par)
    scheme = par.scheme
    tp = degree if scheme in ("tp", "tp_msp") else (par.tp if scheme == "tp_sp" else 1)
    sharded = mem_par.scheme == "fsdp_sp"
    return PeerCase(
        id=row.id,
        model=ModelConfig(**{k: v for k, v in row.model.items() if k != "name"}),
        hardware=row.hardware,
        gpus=row.gpus,
        par=par,
        mem_par=mem_par,
        seq_len=row.seq_len,
        micro_batch=row.micro_batch,
        recompute=row.recompute,
        tp=tp,
        megatron_sp=scheme == "tp_msp",
        zero3_over=(mem_par.dp_shard or 1) * mem_par.degree if sharded else 0,
        context_parallel=par.sp_degree if par.spec.exchange else 1,  # the registry: a K/V-exchanging token axis
        published={q: v for q, v in row.measured.items() if q in QUANTITIES},
        row=row,
    )


def paper_cases() -> list[PeerCase]:
    """The paper's setting for the layouts the peers can express or partly express: TP T = 8, TP + Megatron-SP
    T = 8 (llm-analysis), FSDP×SP Σ = 8 (DeepSpeed's ZeRO-3 model states only: llm-analysis has no context
    parallelism), each replica of 8 MI300X in a 1,024-GPU job, the memory table's setting."""
    from tspbench.paper.setting import DEGREE, LLAMA7B, N_GPUS, PAPER_MEMORY_SETTING, SEQ_128K

    rc, b = PAPER_MEMORY_SETTING.recompute, PAPER_MEMORY_SETTING.batch
    dp = N_GPUS // DEGREE
    out = []
    for scheme in ("tp", "tp_msp", "fsdp_sp"):
        par = ParallelConfig(scheme=scheme, degree=DEGREE, dp=dp, recompute=rc)
        if scheme == "fsdp_sp":
            par = ParallelConfig(scheme=scheme, degree=DEGREE, dp=dp, recompute=rc, sp_variant="ulysses")
        fsdp = scheme == "fsdp_sp"
        out.append(
            PeerCase(
                id=f"paper_{scheme}_{DEGREE}_128k",
                model=LLAMA7B,
                hardware="mi300x",
                gpus=N_GPUS,
                par=par,
                mem_par=par,
                seq_len=SEQ_128K,
                micro_batch=b,
                recompute=rc,
                tp=1 if fsdp else DEGREE,
                megatron_sp=scheme == "tp_msp",
                zero3_over=DEGREE if fsdp else 0,  # FSDP2 shards within the replica (dp_shard = 1): N = Σ
                context_parallel=DEGREE if fsdp else 1,
            )
        )
    return out


def all_cases(files: list[Path] | None = None) -> list[PeerCase]:
    """Every in-scope published row (of `files`, default conf/published/*.yaml), then the paper's setting."""
    rows = load_rows(files if files is not None else default_files())
    return [from_row(r) for r in rows if not r.out_of_scope] + paper_cases()
