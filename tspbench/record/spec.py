"""A run's frozen specification: one grid point, plain data, JSON-serialisable. The worker reads it from a
file (it never sees Hydra); every record repeats it under provenance.config.

`run_id` is a hash of the workload part of the spec (model, layout, shape, dtype, device, steps, seed), so
re-running an experiment into the same directory finds the runs already recorded `ok` and skips them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from tspbench.config import ModelConfig, ParallelConfig

METHOD_OF = {"measure": "measured", "estimate": "estimated", "model": "modelled"}


@dataclass
class RunSpec:
    """One grid point, frozen: what the worker reads (as JSON) and what the record repeats."""

    experiment: str
    scheme: str
    degree: int
    tp: int
    dp: int
    sp_variant: str
    recompute: str
    seq_len: int
    batch: int
    mode: str
    dtype: str
    device: str
    execution: str
    hardware: str | None
    model: dict[str, Any]
    seed: int = 0
    warmup_steps: int = 2
    measured_steps: int = 5
    lr: float = 1e-4
    memory_breakdown: bool = True
    power_sample_s: float = 0.1
    timeout_s: float = 600.0
    nodes: int = 1
    fault: dict[str, Any] = field(default_factory=lambda: {"kind": "none", "rank": 0})
    run_id: str = ""
    results_file: str = ""
    status_dir: str = ""
    vocab: str = "auto"
    msp: bool = True
    """tp_sp: Megatron-SP on the tensor axis (ParallelConfig.msp); false is the plain ablation."""
    state_file: str = ""
    """If set, rank 0 saves the trained parameters (full shape) there after the run (tests compare them with
    the single-device model); not part of the workload, so not of the run_id."""

    # Fields that define the workload, hence the run_id. Paths, time limits and faults do not.
    IDENTITY = (
        "scheme",
        "degree",
        "tp",
        "dp",
        "sp_variant",
        "recompute",
        "seq_len",
        "batch",
        "mode",
        "dtype",
        "device",
        "execution",
        "model",
        "seed",
        "warmup_steps",
        "measured_steps",
        "lr",
        "memory_breakdown",
    )

    def __post_init__(self):
        if not self.run_id:
            self.run_id = make_run_id(self)

    def parallel(self) -> ParallelConfig:
        return ParallelConfig(
            scheme=self.scheme,
            degree=self.degree,
            tp=self.tp,
            dp=self.dp,
            sp_variant=self.sp_variant,
            msp=self.msp,
            recompute=self.recompute,
            vocab=self.vocab,
        )

    def model_config(self) -> ModelConfig:
        return ModelConfig(**self.model)

    @property
    def world_size(self) -> int:
        return self.dp * self.degree

    @property
    def method(self) -> str:
        return METHOD_OF.get(self.execution, "measured")

    def label(self) -> str:
        extra = f" T={self.parallel().tp_degree}" if self.scheme == "tp_sp" else ""
        extra += f" {self.sp_variant}" if self.scheme in ("sp", "tp_sp", "fsdp_sp") else ""
        extra += " plain" if self.scheme == "tp_sp" and not self.msp else ""
        extra += f" vocab={self.vocab}" if self.vocab != "auto" else ""
        return f"{self.scheme} d{self.degree}{extra} S={self.seq_len} B={self.batch} {self.mode}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        d = json.loads(text)
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def make_run_id(spec: RunSpec) -> str:
    """`<scheme>-d<degree>-s<S>-b<B>-<mode>-<hash>`: readable, and stable for the same workload."""
    ident = {k: getattr(spec, k) for k in RunSpec.IDENTITY}
    if spec.vocab != "auto":  # the default keeps the run ids of records written before the option
        ident["vocab"] = spec.vocab
    if spec.scheme == "tp_sp":  # Megatron-SP on T became the default: never share an id with a plain run
        ident["msp"] = spec.msp
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:10]
    return f"{spec.scheme}-d{spec.degree}-s{spec.seq_len}-b{spec.batch}-{spec.mode}-{digest}"
