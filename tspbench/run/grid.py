"""The grid expansion: an `ExperimentConfig` (tspbench/run/experiment.py) → one frozen `RunSpec` per grid point.

An experiment is a grid, schemes × sequence lengths × degrees × micro-batches × modes (and, per scheme,
the option axes of tspbench.parallel.layouts: K/V exchanges, tp_sp's tensor degrees and Megatron-SP, vocabulary
layouts, tsp's K/V buckets), run in one invocation. Each grid point becomes a `RunSpec`: plain data,
JSON-serialisable, with everything a worker needs; the worker reads it from a file and never sees Hydra.

`run_id` is a hash of the workload part of the spec (model, layout, shape, dtype, device, steps, seed), so
re-running an experiment into the same directory finds the runs already recorded `ok` and skips them.

Next in the flow: tspbench.run.checks.precheck refuses what cannot be meant and decides each spec's fate
(tspbench/run/fate.py); tspbench.run.dispatch runs them.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from tspbench.cli import hardware_name
from tspbench.config import ConfigError
from tspbench.parallel import AXES, LayoutOptions, layouts, scheme
from tspbench.record.spec import RunSpec
from tspbench.run.experiment import ExperimentConfig, FaultConfig, axes, options_of, schemes_of, validate_experiment


def expand_grid(cfg: ExperimentConfig, results_file: str = "", status_dir: str = "") -> list[RunSpec]:
    """Every grid point as a RunSpec, in a stable order (seq_len outermost, then scheme), then, with
    `cluster_gpus`, the same layouts modelled on that many GPUs (`cluster_point`). Duplicates (e.g. `single` under
    several degrees) are dropped."""
    validate_experiment(cfg)
    out = _expand(cfg, results_file, status_dir)
    if cfg.cluster_gpus is not None:
        seen = {s.run_id for s in out}
        out += [s for s in cluster_point(cfg, results_file, status_dir) if s.run_id not in seen]
    return out


CLUSTER_MODE = "forward"
"""The mode of the paper's throughput claims (conf/claims.yaml: "mostly forward pass"), always in the cluster point."""


def cluster_point(cfg: ExperimentConfig, results_file: str = "", status_dir: str = "") -> list[RunSpec]:
    """The grid's layouts modelled on `cfg.cluster_gpus` devices: dp = cluster_gpus / degree replicas (each degree
    must divide it), execution=model (closed form on the experiment's hardware profile: nothing that large runs
    here), in the grid's modes and forward. ConfigError (one line) when a degree does not divide it."""
    n = int(cfg.cluster_gpus or 0)
    _, degrees, _, modes = axes(cfg)
    bad = [d for d in degrees if n < 1 or n % d]
    if bad:
        raise ConfigError(
            f"cluster_gpus={cfg.cluster_gpus} must be a positive multiple of every degree ({', '.join(map(str, bad))} "
            f"does not divide it), e.g. cluster_gpus={max(degrees) * 128}"
        )
    names = schemes_of(cfg)
    point = replace(
        cfg,
        execution="model",
        cluster_gpus=None,
        scheme=None,
        mode=None,
        degree=None,
        modes=sorted({*modes, CLUSTER_MODE}, key=[*modes, CLUSTER_MODE].index),
    )
    out: list[RunSpec] = []
    multi = [x for x in names if not scheme(x).single_device]
    for d in degrees if multi else []:  # dp fills the cluster (and bounds the FSDP shard groups' dp_shard)
        out += _expand(replace(point, schemes=multi, degrees=[d], dp=n // d), results_file, status_dir)
    single = [x for x in names if scheme(x).single_device]
    if single:
        out += _expand(replace(point, schemes=single, dp=n), results_file, status_dir)
    return out


def _expand(cfg: ExperimentConfig, results_file: str, status_dir: str) -> list[RunSpec]:
    seq_lens, degrees, batches, modes = axes(cfg)
    device = resolve_device(cfg.device)
    model = asdict(cfg.model) if not isinstance(cfg.model, dict) else dict(cfg.model)
    out: list[RunSpec] = []
    seen: set[str] = set()
    for seq_len in seq_lens:
        for name in schemes_of(cfg):
            for degree in [1] if scheme(name).single_device else degrees:
                opts = layout_options(cfg, name, degree)
                for par in layouts(degree, dp=cfg.dp, schemes=[name], options=opts, recompute=cfg.recompute):
                    for batch in batches:
                        for mode in modes:
                            spec = RunSpec(
                                **asdict(par),
                                experiment=cfg.exp_name,
                                seq_len=seq_len,
                                batch=batch,
                                mode=mode,
                                dtype=cfg.dtype,
                                device=device,
                                execution=cfg.execution,
                                hardware=hardware_name(cfg.hardware),
                                model=model,
                                seed=cfg.seed,
                                warmup_steps=cfg.warmup_steps,
                                measured_steps=cfg.measured_steps,
                                lr=cfg.lr,
                                memory_breakdown=cfg.memory_breakdown,
                                power_sample_s=cfg.power_sample_s,
                                timeout_s=cfg.timeout_s,
                                nodes=cfg.nodes,
                                fault=_fault_for(cfg.faults, name, seq_len, cfg.dp * par.degree),
                                results_file=results_file,
                                status_dir=status_dir,
                            )
                            if spec.run_id not in seen:
                                seen.add(spec.run_id)
                                out.append(spec)
    return out


def layout_options(cfg: ExperimentConfig, name: str, degree: int) -> LayoutOptions:
    """The grid's option axes of one scheme at one degree (tspbench.parallel.layouts; an axis the scheme does not
    take is not run). tp_sp's T: 0 (auto) and the proper divisors 1 < T < degree of `tps` (T = degree would be TP,
    T = 1 SP); a degree none of them divides runs auto (tspbench.run.checks refuses a T that divides none of the
    degrees)."""
    opts = options_of(cfg, name)
    axes = {axis: tuple(getattr(opts, axis)) for axis in AXES.values()}
    axes["tps"] = tuple(t for t in opts.tps if t == 0 or (1 < t < degree and degree % t == 0)) or (0,)
    return LayoutOptions(**axes)


def _fault_for(f: FaultConfig, scheme: str, seq_len: int, world: int) -> dict[str, Any]:
    hit = (
        f.kind != "none"
        and (f.scheme is None or f.scheme == scheme)
        and (f.seq_len is None or f.seq_len == seq_len)
        and 0 <= f.rank < world
    )
    return {"kind": f.kind if hit else "none", "rank": f.rank}


def resolve_device(device: str) -> str:
    """`device=auto` on this host: cuda where torch sees a CUDA device, else cpu (the spec and the run_id
    carry the resolved one)."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
