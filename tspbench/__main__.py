"""`python -m tspbench +exp=NAME [overrides]`: compose, expand the grid, run each point, summarise.

Hydra lives only here, in the parent: it composes the typed ExperimentConfig (tspbench/run/grid.py), owns
the run/sweep directories (conf/config.yaml) and, under `-m`, the sweep; each run's ranks are spawned by
tspbench.run.launch from a frozen spec file. `--help` lists every option with its meaning (Hydra's own help:
`--hydra-help`).
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from tspbench import cli
from tspbench.cli import CONF_DIR
from tspbench.run.grid import ExperimentConfig, compose_experiment, expand_grid, register

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
    from tspbench.run.launch import run_all

    exp = typing.cast(ExperimentConfig, OmegaConf.to_object(cfg))
    run_dir = Path(exp.resume_dir or HydraConfig.get().runtime.output_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        specs = expand_grid(exp)
    except ConfigError as e:
        print(f"tspbench: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"tspbench: {exp.exp_name}: {len(specs)} runs → {run_dir / RESULTS_FILE}", file=sys.stderr)
    _say_fallback(specs)
    try:
        records = run_all(specs, run_dir, force=exp.force, progress=exp.progress)
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

        finish([run_dir / RESULTS_FILE], exp.exp_name)


def _say_fallback(specs) -> None:
    """execution=auto without the devices: say once, in one line, what happens instead."""
    from tspbench.run.launch import choose_execution

    missing = [s for s in specs if s.execution == "auto" and choose_execution(s)[0] is None]
    if missing:
        need = max(s.world_size for s in missing)
        hw = missing[0].hardware or "h100"
        how = (
            "modelling them"
            if all(s.mode == "decode" for s in missing)
            else "estimating them (fake tensors) and modelling them"
        )
        print(
            f"tspbench: {len(missing)} runs need up to {need} {missing[0].device} devices that are not here: "
            f"{how} (hardware profile {hw}) instead",
            file=sys.stderr,
        )


def _in_multirun() -> bool:
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.MULTIRUN


if __name__ == "__main__":
    if cli.wants_help(sys.argv[1:]):
        print_help()
        sys.exit(0)
    main()
