"""Up-front checks of an experiment, before any rank starts: everything one line can refuse, and the exit code.

`precheck` refuses (ConfigError, one line naming the field and its allowed values) what cannot be meant: an
axis value that no layout accepts (degree, dp, batch, seq_len < 1), a tp_sp tensor degree that divides none of
the degrees, a `resume_dir` that does not exist, and a grid in which no point could run at all. It decides each
grid point's fate (tspbench/run/fate.py: measured, estimated and modelled instead, estimated, modelled, or
refused) and returns the specs carrying it; "no point could run" is every fate `refused` (a layout
validate_parallel refuses, or execution=measure without the devices). A grid where only some points are refused
runs: those points are recorded `invalid` and the exit code says so (`grid_outcome`).

The resource check of one measured run (recorded `oom` when it cannot fit) is tspbench.run.memfit, made by the
dispatcher just before the run (free memory is a property of that moment, not of the grid).
"""

from __future__ import annotations

from pathlib import Path

from tspbench.config import ConfigError
from tspbench.parallel import takes
from tspbench.record.spec import RunSpec
from tspbench.run.experiment import ExperimentConfig, axes, options_of, schemes_of
from tspbench.run.fate import decide_all
from tspbench.run.grid import expand_grid


def precheck(cfg: ExperimentConfig) -> list[RunSpec]:
    """The grid of `cfg`, each spec carrying its fate, or ConfigError with one line when the experiment cannot be
    meant as typed."""
    seq_lens, degrees, batches, _modes = axes(cfg)
    for name, single, values in (
        ("seq_len", cfg.seq_len, seq_lens),
        ("degree", cfg.degree, degrees),
        ("batch", cfg.batch, batches),
    ):
        for v in values:
            if v < 1:
                key = name if single is not None else f"{name}s"
                raise ConfigError(f"{key}={v if single is not None else values}: every {name} must be ≥ 1")
    if cfg.dp < 1:
        raise ConfigError(f"dp={cfg.dp} must be ≥ 1 (data-parallel replicas; world size = dp × degree)")
    for name in schemes_of(cfg):
        if takes(name, "tp"):  # a 2-D mesh's tensor degree T
            _check_tps(cfg, name, [d for d in degrees if d > 1])
    if cfg.resume_dir is not None and not Path(cfg.resume_dir).is_dir():
        raise ConfigError(
            f"resume_dir={cfg.resume_dir} does not exist; allowed: the directory of an earlier run "
            "(results/<time>_<exp_name>, the one holding its results.jsonl), or no resume_dir"
        )
    specs = expand_grid(cfg)
    reasons = [f.reason for f in decide_all(specs) if f.kind == "refused"]
    if specs and len(reasons) == len(specs):
        more = f" (and {len(specs) - 1} more grid point(s) refused)" if len(specs) > 1 else ""
        raise ConfigError(f"no grid point can run: {reasons[0]}{more}")
    return specs


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
def grid_outcome(specs: list[RunSpec], records: list[dict], allow_failures: bool = False) -> tuple[int, str]:
    """(exit code, last line): 0 only when every grid point ended `ok` (or was skipped as already `ok`);
    a point measured elsewhere (estimated + modelled twin) is ok when both of its records are."""
    by_id = {str(r.get("run_id")): r for r in records}
    counts: dict[str, int] = {}
    for s in specs:
        mine = [by_id[i] for i in (s.run_id, s.run_id + "-model") if i in by_id]
        bad = [r.get("status", "missing") for r in mine if r.get("status") != "ok"]
        status = bad[0] if bad else ("ok" if mine else "missing")
        counts[status] = counts.get(status, 0) + 1
    n_ok = counts.pop("ok", 0)
    rest = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    line = f"tspbench: {n_ok} of {len(specs)} grid points ok" + (f", {rest}" if rest else "")
    if not counts:
        return 0, line
    if allow_failures:
        return 0, line + " (allow_failures=true: exit 0)"
    return 1, line + " → exit 1 (allow_failures=true exits 0 for sweeps that expect some oom)"
