"""A run's frozen specification: one grid point, plain data, JSON-serialisable. The worker reads it from a
file (it never sees Hydra); every record repeats it under provenance.config.

`run_id` is a hash of the workload part of the spec (model, layout, shape, dtype, device, steps, seed), so
re-running an experiment into the same directory finds the runs already recorded `ok` and skips them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from tspbench.config import ModelConfig, RopeScaling
from tspbench.parallel import ParallelConfig, takes

METHOD_OF = {"measure": "measured", "estimate": "estimated", "model": "modelled"}
FATES = ("measure", "estimate", "model", "estimate+model", "refused")
"""What the parent does with a grid point (`Fate.kind`; decided by tspbench/run/fate.py)."""


@dataclass(frozen=True)
class Fate:
    """The parent's one decision about a grid point, made before anything runs (tspbench.run.fate.decide) and
    carried by the spec, so nothing after the pre-check decides it again."""

    kind: str
    """measure (ranks on this machine) | estimate (fake tensors) | model (closed-form cost model; also decode
    under execution=auto without the devices) | estimate+model (execution=auto without the devices: an estimated
    record and a modelled twin) | refused (recorded `invalid`: a layout validate_parallel refuses, or
    execution=measure without the devices)."""
    reason: str | None = None
    """Why the point does not run as `execution` asked: for `refused` the one line its `invalid` record (and an
    all-refused grid's exit-2 line) carries; under execution=auto without the devices, which ones are missing.
    None when it runs as asked."""

    def __post_init__(self):
        if self.kind not in FATES:  # a hand-edited spec file
            raise ValueError(f"fate.kind={self.kind!r} is unknown; allowed: {', '.join(FATES)}")


@dataclass(kw_only=True)
class RunSpec(ParallelConfig):
    """One grid point, frozen: what the worker reads (as JSON) and what the record repeats. The layout fields
    (scheme, degree, tp, dp, sp_variant, kv_bucket_heads, recompute, msp, vocab) are ParallelConfig's, inherited,
    so every layout option reaches the worker and the record; `parallel()` takes them back out."""

    experiment: str
    """The experiment's name (the record's `experiment`)."""
    seq_len: int
    """Tokens per sequence S."""
    batch: int
    """Micro-batch B per replica."""
    mode: str
    """train | forward | decode (tspbench.config.MODES)."""
    dtype: str
    """Parameter/compute dtype (tspbench.config.DTYPES)."""
    device: str
    """cpu (gloo) | cuda (nccl)."""
    execution: str
    """What was asked: auto | measure | estimate | model (tspbench/run/experiment.py EXECUTIONS); what happens is
    `fate`."""
    hardware: str | None
    """Hardware profile of estimated / modelled numbers (conf/hardware/), or None."""
    model: dict[str, Any]
    """ModelConfig fields."""
    seed: int = 0
    """Seed for the weights and the synthetic batch."""
    warmup_steps: int = 2
    """Untimed steps before the measured window."""
    measured_steps: int = 5
    """Steps in the measured window."""
    lr: float = 1e-4
    """AdamW learning rate."""
    memory_breakdown: bool = True
    """One extra untimed step under MemTracker for the category breakdown."""
    power_sample_s: float = 0.1
    """Power-timeline sampling period."""
    timeout_s: float = 600.0
    """Wall-clock limit of the run's rank group."""
    nodes: int = 1
    """Nodes the run spans (the worker sets it from the torchrun environment)."""
    fault: dict[str, Any] = field(default_factory=lambda: {"kind": "none", "rank": 0})
    """Fault injection: {kind, rank} (tests of the runner's failure handling)."""
    run_id: str = ""
    """`make_run_id` unless given."""
    results_file: str = ""
    """JSONL file rank 0 appends the record to."""
    status_dir: str = ""
    """Where each rank leaves its status file when it fails."""
    state_file: str = ""
    """If set, rank 0 saves the trained parameters (full shape) there after the run (tests compare them with
    the single-device model); not part of the workload, so not of the run_id."""
    fate: Fate | None = None
    """What the parent decided for this grid point, once, in the pre-check (tspbench/run/fate.py): the dispatcher
    and the exit-2 refusal read it. Not part of the workload, so not of the run_id; None until decided."""

    # Fields that define the workload, hence the run_id. Paths, time limits and faults do not.
    IDENTITY: ClassVar[tuple[str, ...]] = (
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

    def model_config(self) -> ModelConfig:
        return ModelConfig(**self.model)

    @property
    def method(self) -> str:
        return METHOD_OF.get(self.execution, "measured")

    def run_label(self) -> str:
        """The layout's label and the run's shape, e.g. "TSP D=8 S=131072 B=1 train" (progress lines, logs)."""
        try:
            layout = self.parallel().label()
        except ValueError:  # an unknown scheme still gets a line (it is recorded `invalid`)
            layout = f"{self.scheme} d{self.degree}"
        return f"{layout} S={self.seq_len} B={self.batch} {self.mode}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        d = json.loads(text)
        if isinstance(d.get("fate"), dict):
            d["fate"] = Fate(**d["fate"])
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


NO_ROPE_SCALING = asdict(RopeScaling())
"""ModelConfig.rope_scaling's default as a record stores it."""


def make_run_id(spec: RunSpec) -> str:
    """`<scheme>-d<degree>-s<S>-b<B>-<mode>-<hash>`: readable, and stable for the same workload."""
    ident: dict[str, Any] = {k: getattr(spec, k) for k in RunSpec.IDENTITY}
    # ModelConfig fields added later (RoPE scaling, tied embeddings, sliding window): at their defaults they stay out
    # of the hash, so records written before them keep their run ids (resume finds them)
    model = dict(ident["model"])
    if isinstance(model.get("rope_scaling"), RopeScaling):
        model["rope_scaling"] = asdict(model["rope_scaling"])
    added: tuple[tuple[str, Any], ...] = (
        ("rope_scaling", NO_ROPE_SCALING),
        ("tie_embeddings", False),
        ("sliding_window", None),
    )
    for field_name, unset in added:
        if model.get(field_name, unset) == unset:
            model.pop(field_name, None)
    ident["model"] = model
    if spec.vocab != "auto":  # the default keeps the run ids of records written before the option
        ident["vocab"] = spec.vocab
    for option, default in (("kv_bucket_heads", 0), ("mlp_exchange", "ring"), ("regather_kv", True), ("dp_shard", 1)):
        if getattr(spec, option) != default:  # likewise: a default keeps the run ids of earlier records
            ident[option] = getattr(spec, option)
    if takes(spec.scheme, "msp"):  # Megatron-SP on T became the default: never share an id with a plain run
        ident["msp"] = spec.msp
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:10]
    return f"{spec.scheme}-d{spec.degree}-s{spec.seq_len}-b{spec.batch}-{spec.mode}-{digest}"
