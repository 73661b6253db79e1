"""`python -m tspbench +exp=NAME [overrides]`: compose, expand the grid, run each point, summarise.

Hydra lives only here, in the parent: it composes the typed ExperimentConfig (tspbench/run/experiment.py), owns
the run/sweep directories (conf/config.yaml) and, under `-m`, the sweep. `--help` lists every option with its
meaning (Hydra's own help: `--hydra-help`).

Before Hydra starts (so a refused command leaves no directory behind), every combination of the command line's
overrides is composed and checked (tspbench.run.checks.precheck), which also decides each grid point's fate
once (tspbench/run/fate.py); the Hydra job reuses those decisions. A mistake gets one line and exit 2. Then
tspbench.run.dispatch runs the grid as decided (measured runs as torchrun rank groups from a frozen spec file,
tspbench/run/supervise.py). `--config-name`, `--config-path`, `--config-dir`, `-m`, `+exp=` and plain overrides
all go through the same pre-check. With nodes > 1 every node of a Slurm allocation runs this job
(tspbench/run/slurm.py): the first node runs the grid, the others start their ranks when it says so.

Exit codes (tspbench.run.checks.EXIT_RULE, printed by --help and, with the counts, on the last line of every run):
0 when every grid point ended `ok` or was predicted not to fit (an `oom` decided before it started is a result),
1 when any point crashed, hung, was `invalid` or `implausible`, or a measured run ran out of memory
(`allow_failures=true` exits 0), 2 for a refused command, 130 on Ctrl-C.
"""

from __future__ import annotations

import itertools
import shutil
import sys
import textwrap
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from tspbench import cli
from tspbench.cli import CONF_DIR
from tspbench.config import ConfigError
from tspbench.record.spec import RunSpec
from tspbench.run.checks import EXIT_RULE, grid_outcome, precheck, run_dir_problem
from tspbench.run.experiment import ExperimentConfig, compose_experiment, register
from tspbench.run.progress import plan_line

register()

EXAMPLES = [
    "python -m tspbench +exp=smoke                                   # every scheme but fsdp_sp, tiny model, CPU",
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
    print("\n" + "\n".join(textwrap.wrap(EXIT_RULE[0].upper() + EXIT_RULE[1:] + ".", 110)))


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    from tspbench.config import ConfigError
    from tspbench.record.store import RESULTS_FILE
    from tspbench.record.tables import breakdown_table, summary_table
    from tspbench.run import slurm
    from tspbench.run.dispatch import run_all

    obj = OmegaConf.to_object(cfg)
    hydra_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
    if not isinstance(obj, ExperimentConfig):  # --config-name of a config that is not an experiment
        _drop_if_only_hydra(hydra_dir)
        print(f"tspbench: {NOT_AN_EXPERIMENT}", file=sys.stderr)
        raise SystemExit(2)
    exp = obj
    run_dir = Path(exp.resume_dir or hydra_dir).resolve()
    if exp.resume_dir:  # the records go to resume_dir: leave no near-empty Hydra dir behind
        _drop_if_only_hydra(hydra_dir)
    alloc = None
    try:
        specs = _prechecked(exp)
        refused = slurm.refused_in_multi_task_job(exp.nodes)
        if refused:
            raise ConfigError(refused)
        if exp.nodes > 1:  # every node of the allocation runs this job: check that it is the one asked for
            device = "cuda" if any(s.device == "cuda" for s in specs) else "cpu"
            alloc = slurm.allocation_for(exp.nodes, exp.gpus_per_node, device, control_port=exp.control_port)
    except ConfigError as e:
        _drop_if_only_hydra(hydra_dir)
        print(f"tspbench: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if alloc is not None and not alloc.driver:  # a follower: start this node's ranks when the first node says so
        code = slurm.follow(alloc, say=lambda line: print(line, file=sys.stderr, flush=True))
        if code and not _in_multirun():
            raise SystemExit(code)
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    print(plan_line(specs, exp.nodes, exp.gpus_per_node), file=sys.stderr)
    print(f"tspbench: records → {run_dir / RESULTS_FILE}", file=sys.stderr, flush=True)
    cluster, why = None, "done"
    try:
        if alloc is not None:
            cluster = slurm.Driver(alloc, exp.gpus_per_node)
        records = run_all(
            specs, run_dir, force=exp.force, progress=exp.progress, memory_check=exp.memory_check, cluster=cluster
        )
    except KeyboardInterrupt:
        why = "interrupted"
        print(
            f"\ntspbench: interrupted; finished runs are kept in {run_dir / RESULTS_FILE}; "
            f"re-run with resume_dir={run_dir} to continue",
            file=sys.stderr,
        )
        raise SystemExit(130) from None
    finally:
        if cluster is not None:  # the other nodes' tasks end with the grid
            cluster.close(why)
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
CONFIG_FLAGS = {"--config-name": "name", "-cn": "name", "--config-path": "path", "-cp": "path"}
CONFIG_FLAGS |= {"--config-dir": "dir", "-cd": "dir"}
NOT_AN_EXPERIMENT = (
    "--config-name names a config that is not an experiment; allowed: a config whose defaults list starts with "
    "experiment_schema (as conf/config.yaml's), or one that extends conf/config.yaml (defaults: [config, _self_])"
)


def config_flags(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Hydra's --config-name / --config-path / --config-dir (either spelling, `--flag value` or `--flag=value`) →
    {"name"|"path"|"dir": value}, and the rest of argv."""
    flags: dict[str, str] = {}
    rest: list[str] = []
    it = iter(argv)
    for a in it:
        key, eq, value = a.partition("=")
        if key in CONFIG_FLAGS and a.startswith("-"):
            flags[CONFIG_FLAGS[key]] = value if eq else next(it, "")
        else:
            rest.append(a)
    return flags, rest


def compose_named(flags: dict[str, str], overrides: list[str]) -> ExperimentConfig:
    """The experiment as Hydra will compose it under --config-name / --config-path / --config-dir (a relative
    --config-path is relative to this file's folder, as Hydra reads it for @hydra.main), through the same key and
    type checks as compose_experiment; ConfigError with one line."""
    if not flags.get("path") and not flags.get("dir") and flags.get("name", "config") == "config":
        return compose_experiment(overrides)
    return _compose_in(flags, overrides)


def _compose_in(flags: dict[str, str], overrides: list[str]) -> ExperimentConfig:
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from tspbench.config import ConfigError

    register()
    path = Path(flags["path"]) if flags.get("path") else CONF_DIR
    path = path if path.is_absolute() else (Path(__file__).resolve().parent / path)
    name = flags.get("name") or "config"
    extra = []
    if flags.get("dir"):  # --config-dir: another folder on the search path (the primary config may be in it)
        more = Path(flags["dir"]).resolve()
        if (more / f"{name}.yaml").is_file():
            path, more = more, path
        extra = [f"hydra.searchpath=[file://{more}]"]
    if not path.is_dir():
        where = Path(__file__).resolve().parent
        raise ConfigError(f"--config-path={flags['path']} is not a directory (a relative one is taken from {where})")
    try:
        with initialize_config_dir(str(path), version_base=None):
            cfg = compose(name, overrides=[*extra, *overrides])
        cli.check_keys(cfg)
        obj = OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException) as e:
        try:
            line = cli.explain(e, ExperimentConfig)
        except Exception:  # noqa: BLE001 - explaining must never turn a user's mistake into a traceback
            line = cli.one_line(e)
        if "_schema'" in line and "Could not load" in line:  # typed by another command's schema (verify, estimate)
            line = NOT_AN_EXPERIMENT.replace("--config-name", f"--config-name={name}", 1)
        elif line.startswith("Cannot find primary config"):
            text = {p.stem: p.read_text() for p in path.glob("*.yaml")}  # the experiments: typed or extending ours
            names = " | ".join(sorted(n for n, t in text.items() if "experiment_schema" in t or "- config\n" in t))
            line = f"--config-name={name} is unknown in {path}; allowed: {names}"
        raise ConfigError(line) from None
    if not isinstance(obj, ExperimentConfig):
        raise ConfigError(NOT_AN_EXPERIMENT.replace("--config-name", f"--config-name={name}", 1))
    return obj


def precheck_argv(argv: list[str]) -> str | None:
    """Compose and check every combination of the overrides on the command line (a sweep's too) before Hydra
    starts, under the config --config-name / --config-path / --config-dir name if given; the first mistake as one
    line, or None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from tspbench.config import ConfigError
    from tspbench.run.slurm import refused_launcher

    flags, argv = config_flags(argv)
    multirun = any(a in ("-m", "--multirun") for a in argv)
    refused = refused_launcher(argv, multirun)
    if refused:
        return refused
    overrides: list[str] = []
    hydra_overrides: list[str] = []
    skip = False
    for a in argv:
        if skip or a.startswith("-"):
            skip = a in HYDRA_FLAGS_WITH_VALUE
            continue
        (hydra_overrides if a.lstrip("+~").startswith(("hydra.", "hydra/")) else overrides).append(a)
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
            exp = compose_named(flags, list(combo)) if flags else compose_experiment(list(combo))
            _PRECHECKED.append((exp, precheck(exp)))
        except ConfigError as e:
            where = f" (in the sweep's point {' '.join(combo)})" if len(combos) > 1 else ""
            return f"{e}{where}"
    return run_dir_problem(hydra_overrides, multirun)  # the directory Hydra makes next


def _in_multirun() -> bool:
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.MULTIRUN


if __name__ == "__main__":
    if cli.wants_help(sys.argv[1:]):
        print_help()
        sys.exit(0)
    try:  # model=hf:PATH (a Hugging Face config.json) becomes one model.FIELD=VALUE override per field, for Hydra
        sys.argv[1:] = cli.expand_hf_model(sys.argv[1:])
    except ConfigError as e:
        print(f"tspbench: {e}", file=sys.stderr)
        sys.exit(2)
    refused = precheck_argv(sys.argv[1:])
    if refused:
        print(f"tspbench: {refused}", file=sys.stderr)
        sys.exit(2)
    main()
