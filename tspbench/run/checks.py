"""Up-front checks of an experiment, before any rank starts: everything one line can refuse, and the exit code.

`precheck` refuses (ConfigError, one line naming the field and its allowed values) what cannot be meant: a value
outside its field's declared Range (an empty axis too) or an Output path that cannot be written
(config.check_declared; `resume_dir` must exist), a tp_sp tensor degree that divides none of the degrees, an empty
grid, and a grid in which no point could run at all; `run_dir_problem` the directory Hydra would make. It decides
each grid point's fate (tspbench/run/fate.py: measured, estimated and modelled instead, estimated, modelled, or
refused) and returns the specs carrying it; "no point could run" is every fate `refused` (a layout
validate_parallel refuses, or execution=measure without the devices). A grid where only some points are refused
runs: those points are recorded `invalid` and the exit code says so (`grid_outcome`).

With nodes > 1 (a Slurm allocation, tspbench/run/slurm.py) the devices are the allocation's, declared as
nodes × gpus_per_node and checked on each node when the job starts: a measured point runs when its dp × degree
spans the allocation or fits one node, and is refused otherwise (`decide_across_nodes`).

The resource check of one measured run (recorded `oom` when it cannot fit) is tspbench.run.memfit, made by the
dispatcher just before the run (free memory is a property of that moment, not of the grid).

The exit code (`grid_outcome`, and run.callbacks for a sweep): 0 when every grid point ended `ok` or was predicted
not to fit (an `oom` decided before anything ran: an estimated or modelled peak above the device, or the memory
check refusing to start it; a result, not a failure); 1 when any point crashed (`failed`), hung (`timeout`), was
`invalid` or `implausible`, or a measured run ran out of memory; 2 for refused input (ConfigError, before
anything runs); 130 for Ctrl-C (tspbench/__main__.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from tspbench.config import ConfigError, Output, check_declared, check_writable
from tspbench.parallel import takes
from tspbench.record.spec import Fate, RunSpec
from tspbench.run.experiment import ExperimentConfig, axes, options_of, schemes_of
from tspbench.run.fate import decide, decide_all
from tspbench.run.grid import expand_grid

EXIT_RULE = (
    "exit codes: 0 when every grid point ended ok or was predicted not to fit (an oom decided by the estimate, "
    "the cost model or the memory check before the run started is a result); 1 when any point crashed (failed), "
    "hung (timeout), was invalid or implausible, or a measured run ran out of memory (allow_failures=true: 0); "
    "2 for refused input (one line naming the field, before any rank starts); 130 for Ctrl-C"
)
"""The exit-code rule in one paragraph: `--help` prints it, the README repeats it."""


def precheck(cfg: ExperimentConfig) -> list[RunSpec]:
    """The grid of `cfg`, each spec carrying its fate, or ConfigError with one line when the experiment cannot be
    meant as typed."""
    check_declared(cfg)  # every numeric field in its declared Range (axes non-empty), resume_dir writable
    _seq_lens, degrees, _batches, _modes = axes(cfg)
    for name in schemes_of(cfg):
        if takes(name, "tp"):  # a 2-D mesh's tensor degree T
            _check_tps(cfg, name, [d for d in degrees if d > 1])
    specs = expand_grid(cfg)
    if not specs:
        raise ConfigError(
            f"the grid has no point (schemes={_list(schemes_of(cfg))}, modes={_list(axes(cfg)[3])}); allowed: "
            "one or more values on every axis"
        )
    fates = decide_across_nodes(specs, cfg.nodes, cfg.gpus_per_node) if cfg.nodes > 1 else decide_all(specs)
    reasons = [f.reason for f in fates if f.kind == "refused"]
    if specs and len(reasons) == len(specs):
        more = f" (and {len(specs) - 1} more grid point(s) refused)" if len(specs) > 1 else ""
        raise ConfigError(f"no grid point can run: {reasons[0]}{more}")
    return specs


def run_dir_problem(hydra_overrides: list[str], multirun: bool) -> str | None:
    """The directory Hydra makes for the job (hydra.run.dir, or hydra.sweep.dir under -m: the command line's, else
    conf/config.yaml's up to its first interpolation) checked writable before Hydra starts: the one line refusing
    it, or None."""
    import yaml

    from tspbench.paths import conf_dir

    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = [o.split("=", 1)[1] for o in hydra_overrides if o.lstrip("+").split("=", 1)[0] == key]
    if given:
        value = given[-1]
    else:
        hydra = yaml.safe_load((conf_dir() / "config.yaml").read_text())["hydra"]
        value = hydra["sweep" if multirun else "run"]["dir"].split("${", 1)[0] or "."
    try:
        check_writable(key, value, Output(dir=True))
    except ConfigError as e:
        return str(e)
    return None


def decide_across_nodes(specs: list[RunSpec], nodes: int, per_node: int) -> list[Fate]:
    """The fates of a grid for a Slurm allocation of `nodes` × `per_node` devices (in place, as decide_all): the
    layout's own checks as on one machine (tspbench.run.fate.decide), execution=estimate | model as asked, and
    otherwise measure when dp × degree spans the allocation (nodes × per_node ranks) or fits one node (≤ per_node:
    run on the first node alone), refused otherwise. The devices are not counted here (this may be a login node):
    each node checks its own when the job starts (tspbench.run.slurm.allocation_for)."""
    out = []
    for spec in specs:
        layout = decide(replace(spec, execution="estimate", fate=None))  # validate_parallel, no device count
        if layout.kind == "refused":
            fate = layout
        elif spec.execution in ("estimate", "model"):
            fate = Fate(spec.execution)
        elif spec.world_size == nodes * per_node or spec.world_size <= per_node:
            fate = Fate("measure")
        else:
            fate = Fate(
                "refused",
                f"dp × degree = {spec.world_size} ranks neither spans nodes={nodes} × gpus_per_node={per_node} = "
                f"{nodes * per_node} nor fits one node; allowed: dp × degree = {nodes * per_node}, or ≤ {per_node}",
            )
        spec.fate = fate
        out.append(fate)
    return out


def _check_tps(cfg: ExperimentConfig, name: str, degrees: list[int]) -> None:
    """Every tensor degree T of a 2-D mesh (tp_sp) must be a proper divisor (1 < T < degree) of some degree of the
    grid (0 = auto always fits). A degree that none of them divides runs T = auto (documented on
    SchemeOptions.tps; +exp=paper_throughput relies on it at degree 2)."""
    tps = options_of(cfg, name).tps
    key = f"tp={cfg.tp}" if cfg.tp is not None else f"scheme_opts.{name}.tps={_list(tps)}"

    def fits(t: int, d: int) -> bool:
        return t == 0 or (1 < t < d and d % t == 0)

    def allowed(d: int) -> str:
        return ", ".join(["0 (auto)", *(str(t) for t in range(2, d) if d % t == 0)])

    for t in tps:
        if degrees and not any(fits(t, d) for d in degrees):
            d = degrees[0]
            raise ConfigError(
                f"{key}: T={t} is not a proper divisor of degree={d}; allowed at degree {d}: {allowed(d)}"
            )


def _list(v: list) -> str:
    return "[" + ",".join(map(str, v)) + "]"


# ------------------------------------------------------------------------------------------ exit code
PREDICTED_OOM = "oom (predicted; a result)"
MEASURED_OOM = "oom (ran out of memory)"


def predicted_oom(rec: dict) -> bool:
    """Is this `oom` record a prediction (decided before anything ran: an estimated or modelled peak above the
    device, or the memory check refusing to start the ranks) rather than a run that ran out of memory? The record's
    `oom_kind` says so; records written before it existed are judged by their method and reason."""
    kind = rec.get("oom_kind")
    if kind is not None:
        return kind == "predicted"
    return rec.get("method") in ("estimated", "modelled") or "not started" in str(rec.get("reason") or "")


def point_status(records: list[dict]) -> str:
    """One grid point's outcome from its current records (an estimated point has a modelled twin): `ok` when all
    are, PREDICTED_OOM when every other one is a predicted oom, else the first other status (a measured oom as
    MEASURED_OOM); `missing` without a record."""
    if not records:
        return "missing"
    bad = [r for r in records if r.get("status") != "ok"]
    if not bad:
        return "ok"
    real = [r for r in bad if not (r.get("status") == "oom" and predicted_oom(r))]
    if not real:
        return PREDICTED_OOM
    status = str(real[0].get("status", "missing"))
    return MEASURED_OOM if status == "oom" else status


GOOD = ("ok", PREDICTED_OOM)
"""The outcomes that exit 0: measured, estimated or modelled, or predicted not to fit."""


def outcome(statuses: Iterable[str], allow_failures: bool = False, noun: str = "grid points") -> tuple[int, str]:
    """(exit code, last line) from each point's outcome, e.g. "24 grid points: 23 ok, 1 oom (predicted; a result)
    → exit 0"."""
    counts: dict[str, int] = {}
    for st in statuses:
        counts[st] = counts.get(st, 0) + 1
    total = sum(counts.values())
    order = [*GOOD, *sorted(k for k in counts if k not in GOOD)]
    parts = [f"{counts.get(k, 0)} {k}" for k in order if counts.get(k) or k == "ok"]
    failed = any(k not in GOOD for k in counts)
    code = 1 if failed and not allow_failures else 0
    why = " (allow_failures=true)" if failed and allow_failures else ""
    return code, f"tspbench: {total} {noun}: {', '.join(parts)} → exit {code}{why}"


def grid_outcome(specs: list[RunSpec], records: list[dict], allow_failures: bool = False) -> tuple[int, str]:
    """(exit code, last line) of one experiment: each grid point's outcome (`point_status`; a point measured
    elsewhere, estimated + modelled twin, counts once) and the rule of `EXIT_RULE`."""
    by_id = {str(r.get("run_id")): r for r in records}
    statuses = [point_status([by_id[i] for i in (s.run_id, s.run_id + "-model") if i in by_id]) for s in specs]
    return outcome(statuses, allow_failures)
