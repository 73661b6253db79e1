"""`python -m tspbench +exp=NAME [overrides]`: compose, expand the grid, run each point, summarise.

Hydra lives only here, in the parent: it composes the typed ExperimentConfig (tspbench/run/experiment.py), owns
the run/sweep directories (conf/config.yaml) and, under `-m`, the sweep. `--help` lists every option with its
meaning (Hydra's own help: `--hydra-help`).

Before Hydra starts (so a refused command leaves no directory behind), every combination of the command line's
overrides is composed and checked (tspbench.run.checks.precheck), which also decides each grid point's fate
once (tspbench/run/fate.py); the Hydra job reuses those decisions. A mistake gets one line and exit 2. Then
tspbench.run.dispatch runs the grid as decided (measured runs as torchrun rank groups from a frozen spec file,
tspbench/run/supervise.py). Exit codes: 0 when every grid point ended `ok` (or was already `ok`), 1 otherwise
(the counts on the last line; `allow_failures=true` exits 0), 2 for a refused command, 130 on Ctrl-C.
"""

from __future__ import annotations

import itertools
import shutil
import sys
import typing
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from tspbench import cli
from tspbench.cli import CONF_DIR
from tspbench.record.spec import RunSpec
from tspbench.run.checks import grid_outcome, precheck
from tspbench.run.experiment import ExperimentConfig, compose_experiment, register
from tspbench.run.fate import fallback_line

register()

EXAMPLES = [
    "python -m tspbench +exp=smoke                                   # all six schemes, tiny model, CPU",
    "python -m tspbench +exp=smoke seq_len=256 'schemes=[tp,tsp]'    # a scalar key replaces its grid axis",
    "python -m tspbench -m +exp=smoke seq_len=64,128                 # Hydra multirun: one combined results.jsonl",
    "python -m tspbench +exp=llama7b                                 # measured on 8 GPUs, else estimated + modelled",
]


def print_help() -> None:
    exp = [a for a in sys.argv[1:] if a.startswith("+exp=")]
    print(
        cli.help_text(
            "tspbench",
            compose_experiment(exp),
            "Run an experiment grid: " + __doc__.split(":", 1)[1].split("\n\n")[0].strip(),
            EXAMPLES,
            {"model": f"presets: {cli.presets('model')}", "faults": f"kinds: {cli.presets('faults')}"},
        )
    )
    print(
        f"experiments (+exp=NAME): {cli.presets('exp')};  hardware profiles (hardware=NAME): {cli.presets('hardware')}"
    )


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    from tspbench.config import ConfigError
    from tspbench.record.store import RESULTS_FILE
    from tspbench.record.tables import breakdown_table, summary_table
    from tspbench.run.dispatch import run_all

    exp = typing.cast(ExperimentConfig, OmegaConf.to_object(cfg))
    hydra_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
    run_dir = Path(exp.resume_dir or hydra_dir).resolve()
    if exp.resume_dir:  # the records go to resume_dir: leave no near-empty Hydra dir behind
        _drop_if_only_hydra(hydra_dir)
    try:
        specs = _prechecked(exp)
    except ConfigError as e:
        _drop_if_only_hydra(hydra_dir)
        print(f"tspbench: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"tspbench: {exp.exp_name}: {len(specs)} runs → {run_dir / RESULTS_FILE}", file=sys.stderr)
    fallback = fallback_line(specs)
    if fallback:
        print(fallback, file=sys.stderr)
    try:
        records = run_all(specs, run_dir, force=exp.force, progress=exp.progress, memory_check=exp.memory_check)
    except KeyboardInterrupt:
        print(
            f"\ntspbench: interrupted; finished runs are kept in {run_dir / RESULTS_FILE}; "
            f"re-run with resume_dir={run_dir} to continue",
            file=sys.stderr,
        )
        raise SystemExit(130) from None
    print(summary_table(records))
    breakdown = breakdown_table(records)
    if breakdown:
        print(breakdown)
    print(f"results: {run_dir / RESULTS_FILE}")
    if exp.paper_tables:
        from tspbench.paper.tables import print_tables

        print_tables(exp.paper_tables)
    if exp.report and not _in_multirun():  # a sweep gets one combined report (tspbench.run.callbacks)
        from tspbench.report import finish
        from tspbench.run.context import write_context_records

        # the report reads records only: the predictions' validation and the planner's page are records too
        finish([run_dir / RESULTS_FILE, *write_context_records(run_dir)], exp.exp_name)
    code, line = grid_outcome(specs, records, exp.allow_failures)
    print(line, flush=True)
    if code and not _in_multirun():  # a sweep's exit code comes from its combined results (run.callbacks)
        raise SystemExit(code)


def _drop_if_only_hydra(path: Path) -> None:
    """Remove Hydra's run dir if it holds nothing but Hydra's own files (.hydra/, the job log)."""
    if not path.is_dir() or any(p.name != ".hydra" and p.suffix != ".log" for p in path.iterdir()):
        return
    if any(p.suffix == ".log" and p.stat().st_size for p in path.iterdir()):
        return
    shutil.rmtree(path, ignore_errors=True)


_PRECHECKED: list[tuple[ExperimentConfig, list[RunSpec]]] = []
"""The command line's experiments as precheck_argv composed them, with their decided grids: the Hydra job (one
per experiment, in this process unless a launcher ships it elsewhere) takes its own instead of deciding again."""


def _prechecked(exp: ExperimentConfig) -> list[RunSpec]:
    """`exp`'s grid as precheck_argv decided it, or, when it did not see this experiment, precheck(exp)."""
    for i, (seen, specs) in enumerate(_PRECHECKED):
        if seen == exp:
            del _PRECHECKED[i]
            return specs
    return precheck(exp)


HYDRA_FLAGS_WITH_VALUE = ("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-dir", "-cd", "--info")


def precheck_argv(argv: list[str]) -> str | None:
    """Compose and check every combination of the overrides on the command line (a sweep's too) before Hydra
    starts; the first mistake as one line, or None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from tspbench.config import ConfigError

    if any(a in ("--config-name", "-cn") or a.startswith("--config-name=") for a in argv):
        return None  # another root config: Hydra checks it
    multirun = any(a in ("-m", "--multirun") for a in argv)
    overrides, skip = [], False
    for a in argv:
        if skip or a.startswith("-"):
            skip = a in HYDRA_FLAGS_WITH_VALUE
            continue
        if not a.lstrip("+~").startswith(("hydra.", "hydra/")):
            overrides.append(a)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        return cli.one_line(e)
    choices: list[list[str]] = []
    for o in parsed:
        if not o.is_sweep_override():
            choices.append([str(o.input_line)])
            continue
        if not multirun:
            return f"{o.input_line} is a sweep: add -m (python -m tspbench -m ...) or give one value"
        choices.append([f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()])
    combos = list(itertools.islice(itertools.product(*choices), 256))
    for combo in combos:
        try:
            exp = compose_experiment(list(combo))
            _PRECHECKED.append((exp, precheck(exp)))
        except ConfigError as e:
            where = f" (in the sweep's point {' '.join(combo)})" if len(combos) > 1 else ""
            return f"{e}{where}"
    return None


def _in_multirun() -> bool:
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.MULTIRUN


if __name__ == "__main__":
    if cli.wants_help(sys.argv[1:]):
        print_help()
        sys.exit(0)
    refused = precheck_argv(sys.argv[1:])
    if refused:
        print(f"tspbench: {refused}", file=sys.stderr)
        sys.exit(2)
    main()
