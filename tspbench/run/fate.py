"""Each grid point's fate, decided once before anything runs: measured here, estimated and modelled instead,
estimated, modelled, or refused, with the reason.

The pre-check (tspbench.run.checks.precheck) decides every point of the expanded grid (`decide_all`) and the
decision travels with the spec (`RunSpec.fate`: in the spec file the worker reads and in every record's
provenance.config). Everything after it reads the decision instead of rebuilding it: the exit-2 rule "no grid
point can run" (checks), the one line saying what replaces the missing devices (`fallback_line`, printed by
tspbench/__main__.py), and the dispatcher (tspbench/run/dispatch.py: which records to write, which estimates to
prefetch, which runs to hand to the torchrun supervisor). Only `decide` calls validate_parallel or counts devices.

The rules, in order:
  1. a layout validate_parallel refuses → refused (recorded `invalid` with its one line);
  2. execution=estimate | model → that;
  3. the devices are here (CPU always; CUDA: dp × degree visible devices) → measure;
  4. execution=auto without them → estimate+model (an estimated record and a modelled twin whose run_id ends in
     "-model"), or model for decode (fake tensors trace train and forward only: decode is modelled only);
  5. execution=measure without them → refused ("needs N cuda devices, found H ...").
"""

from __future__ import annotations

from collections.abc import Iterable

from tspbench.config import ConfigError
from tspbench.parallel import validate_parallel
from tspbench.record.spec import Fate, RunSpec

OFFLINE = ("estimate", "model", "estimate+model")
"""Fates that run no ranks (the records are written by the parent)."""


def decide(spec: RunSpec) -> Fate:
    """What will happen to this grid point on this host, and why when it is not what `execution` asked."""
    try:
        validate_parallel(spec.model_config(), spec.parallel(), spec.seq_len, spec.batch)
    except ConfigError as e:
        return Fate("refused", str(e))
    if spec.execution in ("estimate", "model"):
        return Fate(spec.execution)
    missing = missing_devices(spec)
    if missing is None:
        return Fate("measure")
    if spec.execution == "auto":
        return Fate("model" if spec.mode == "decode" else "estimate+model", missing)
    return Fate("refused", missing)


def missing_devices(spec: RunSpec) -> str | None:
    """Why this host cannot measure the run (its CUDA devices are too few), or None when it can."""
    if spec.device == "cpu":  # gloo ranks on the host's cores: any world size runs
        return None
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have >= spec.world_size:
        return None
    return (
        f"needs {spec.world_size} cuda devices, found {have} (execution={spec.execution}; "
        f"use device=cpu, or execution=estimate|model)"
    )


def decide_all(specs: Iterable[RunSpec]) -> list[Fate]:
    """Decide every spec (the pre-check), in place; their fates, in order."""
    out = []
    for spec in specs:
        spec.fate = decide(spec)
        out.append(spec.fate)
    return out


def fate_of(spec: RunSpec) -> Fate:
    """The spec's fate, deciding it now only if nobody has (a spec that skipped the pre-check: built by hand, or
    straight from expand_grid in a test); a decided spec is never decided again."""
    if spec.fate is None:
        spec.fate = decide(spec)
    return spec.fate


def fell_back(spec: RunSpec) -> bool:
    """execution=auto without the devices: estimated and/or modelled instead of measured."""
    return spec.execution == "auto" and fate_of(spec).kind in OFFLINE


def fallback_line(specs: list[RunSpec]) -> str | None:
    """The one line that says, once for the grid, which runs are estimated and modelled because the devices are
    not here (None when none is)."""
    missing = [s for s in specs if fell_back(s)]
    if not missing:
        return None
    need = max(s.world_size for s in missing)
    hw = missing[0].hardware or "h100"
    how = (
        "modelling them"
        if all(fate_of(s).kind == "model" for s in missing)
        else "estimating them (fake tensors) and modelling them"
    )
    return (
        f"tspbench: {len(missing)} runs need up to {need} {missing[0].device} devices that are not here: "
        f"{how} (hardware profile {hw}) instead"
    )
