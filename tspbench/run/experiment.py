"""The experiment schema: `ExperimentConfig` (Hydra, parent only), what one `python -m tspbench +exp=NAME`
invocation runs, and the checks of it as a whole.

Hydra composes conf/config.yaml + conf/exp/NAME.yaml + the command line into an `ExperimentConfig`
(`compose_experiment` for tools and tests; tspbench/__main__.py under @hydra.main); its attribute docstrings
are what `python -m tspbench --help` prints. `validate_experiment` refuses, with one line, what no grid point
could mean (an unknown scheme, mode, dtype, ...); the grid itself is tspbench/run/grid.py, and what is refused
per grid point is tspbench/run/checks.py and tspbench/run/fate.py.

Axes and their scalar overrides: the plural fields are the grid (`seq_lens: [64, 128]`); the singular
ones (`seq_len=128`, `degree=4`, `batch=2`, `mode=forward`, and verify's own spellings `scheme=tsp`,
`vocab=ring`, `tp=2`, `sp_variant=ring`, `msp=false`, `kv_bucket_heads=1`), when set, replace the axis with
one value, which is what a Hydra multirun sweeps (`-m seq_len=64,128`). The scheme axis is `schemes=[tp,tsp]`
(sweep it as
`-m 'schemes=[tp],[tsp]'` or `-m scheme=tp,tsp`). `axes`, `schemes_of` and `options_of` apply that rule; they
live here because the experiment's own checks need the axes it will run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from tspbench.config import DTYPES, MODES, ConfigError, ModelConfig, Output, Range, check_declared
from tspbench.parallel import AXES, MLP_EXCHANGES, RECOMPUTE, SCHEMES, SP_VARIANTS, VOCAB, scheme, takers, takes

DEVICES = ("auto", "cpu", "cuda")
EXECUTIONS = ("auto", "measure", "estimate", "model")
FAULT_KINDS = ("none", "crash", "hang", "oom")
PAPER_TABLES = ("memory", "throughput", "plausibility", "crossover")
"""The tables tspbench.paper.tables.print_tables knows."""
RESUME = (
    "the directory of an earlier run (results/<time>_<exp_name>, the one holding its results.jsonl), or no resume_dir"
)
"""What `resume_dir` takes (its Output declaration's hint)."""


@dataclass
class FaultConfig:
    """Fault injection, to prove the runner's failure handling on CPU (conf/faults/*.yaml)."""

    kind: str = "none"
    """none | crash (raise in the worker) | hang (sleep forever) | oom (raise torch.OutOfMemoryError)."""
    rank: Annotated[int, Range(0)] = 0
    """Global rank that misbehaves (a run whose world is smaller is left alone)."""
    scheme: str | None = None
    """Only runs of this scheme (null: every scheme)."""
    seq_len: Annotated[int | None, Range(1)] = None
    """Only runs of this sequence length (null: every length)."""


@dataclass
class SchemeOptions:
    """A scheme's grid axes: its defaults are conf/scheme_opts/<name>.yaml (`scheme_defaults`), an experiment or the
    command line overrides them under `scheme_opts.<name>`."""

    sp_variants: list[str] = field(default_factory=lambda: ["allgather"])
    """Schemes with a K/V exchange (sp, tp_sp, fsdp_sp): the exchanges to run (allgather | ring | ulysses,
    docs/method.md#ulysses); ignored by the other schemes."""
    vocabs: list[str] = field(default_factory=lambda: ["auto"])
    """Embedding / LM-head layouts to run (ParallelConfig.vocab: auto | replicated | ring, ring for tsp only),
    e.g. `scheme_opts.tsp.vocabs=[auto,ring]` or `scheme_opts.tp.vocabs=[auto,replicated]`."""
    tps: Annotated[list[int], Range(0, note="0: auto")] = field(default_factory=lambda: [0])
    """tp_sp: tensor degrees T to run (0 = the largest T ≤ √degree); values that are not proper divisors
    of the degree (1 < T < degree) are skipped, and if none is left T is auto. Ignored elsewhere."""
    msps: list[bool] = field(default_factory=lambda: [True])
    """tp_sp: Megatron-SP on the tensor axis (true, the default) and/or the plain TP × SP ablation (false), e.g.
    `scheme_opts.tp_sp.msps=[true,false]`; ignored by the other schemes (ParallelConfig.msp)."""
    kv_bucket_heads: Annotated[list[int], Range(0)] = field(default_factory=lambda: [0])
    """tsp: KV heads per K/V all-gather to run (ParallelConfig.kv_bucket_heads; 0: one all-gather per owner), e.g.
    `scheme_opts.tsp.kv_bucket_heads=[0,1]`; ignored by the other schemes."""
    mlp_exchanges: list[str] = field(default_factory=lambda: ["ring"])
    """tsp: how the MLP's weight shards travel (ParallelConfig.mlp_exchange: ring | biring | broadcast), e.g.
    `scheme_opts.tsp.mlp_exchanges=[ring,biring]`; ignored by the other schemes."""
    regather_kvs: list[bool] = field(default_factory=lambda: [True])
    """tsp: backward re-gathers K/V (true) and/or keeps the ones gathered last (false; ParallelConfig.regather_kv);
    ignored by the other schemes."""
    dp_shards: Annotated[list[int], Range(1)] = field(default_factory=lambda: [1])
    """fsdp_sp: replicas one FSDP shard group spans (ParallelConfig.dp_shard; 1: within the replica, HSDP; dp: all);
    values that do not divide dp are skipped; ignored by the other schemes."""


@dataclass
class ExperimentConfig:
    """`python -m tspbench +exp=NAME [key=value ...]`: everything one invocation runs."""

    exp_name: str = "default"
    """Experiment name: results/<time>_<exp_name>/ and the `experiment` field of every record."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model preset (`model=tiny|small|llama7b|llama3_8b`) or field overrides (`model.n_layers=1`)."""
    schemes: list[str] = field(default_factory=lambda: list(SCHEMES))
    """Scheme axis of the grid. `single` always runs at degree 1 (the single-device baseline)."""
    scheme_opts: dict[str, SchemeOptions] = field(default_factory=lambda: scheme_defaults())
    """Per-scheme grid options, every registered scheme's from conf/scheme_opts/<name>.yaml
    (`scheme_opts.sp.sp_variants=[ring]`)."""
    seq_lens: Annotated[list[int], Range(1)] = field(default_factory=lambda: [64])
    """Sequence-length axis S."""
    degrees: Annotated[list[int], Range(1)] = field(default_factory=lambda: [2])
    """Degree axis: ranks per model replica (T, Σ, T·Σ or D)."""
    batches: Annotated[list[int], Range(1)] = field(default_factory=lambda: [1])
    """Micro-batch axis B (sequences per replica per step)."""
    modes: list[str] = field(default_factory=lambda: ["train"])
    """Mode axis: train (forward + backward + AdamW step) | forward (no grad) | decode (serving: a KV-cache prefill
    of seq_len tokens, then one token per step; measured or modelled, never estimated)."""
    seq_len: Annotated[int | None, Range(1)] = None
    """If set, replaces `seq_lens` with this one value (what `-m seq_len=64,128` sweeps)."""
    degree: Annotated[int | None, Range(1)] = None
    """If set, replaces `degrees`."""
    batch: Annotated[int | None, Range(1)] = None
    """If set, replaces `batches`."""
    mode: str | None = None
    """If set, replaces `modes`."""
    scheme: str | None = None
    """If set, replaces `schemes` (the spelling `python -m tspbench.verify` uses)."""
    sp_variant: str | None = None
    """If set, replaces the `sp_variants` of every scheme with a K/V exchange (allgather | ring | ulysses)."""
    vocab: str | None = None
    """If set, replaces every scheme's `scheme_opts.<name>.vocabs` (auto | replicated | ring, ring for tsp only)."""
    tp: Annotated[int | None, Range(0, note="0: auto")] = None
    """If set, replaces `scheme_opts.tp_sp.tps` (tp_sp's tensor degree T; 0 = auto); tp_sp only."""
    kv_bucket_heads: Annotated[int | None, Range(0, note="0: one all-gather per owner")] = None
    """If set, replaces `scheme_opts.tsp.kv_bucket_heads` (KV heads per K/V all-gather; 0: one per owner); tsp only."""
    msp: bool | None = None
    """If set, replaces `scheme_opts.tp_sp.msps` (false: the plain TP × SP ablation); tp_sp only."""
    mlp_exchange: str | None = None
    """If set, replaces `scheme_opts.tsp.mlp_exchanges` (ring | biring | broadcast); tsp only."""
    regather_kv: bool | None = None
    """If set, replaces `scheme_opts.tsp.regather_kvs` (false: backward keeps the K/V gathered last); tsp only."""
    dp_shard: Annotated[int | None, Range(1)] = None
    """If set, replaces `scheme_opts.fsdp_sp.dp_shards` (replicas one FSDP shard group spans); fsdp_sp only."""
    dp: Annotated[int, Range(1, note="data-parallel replicas; world size = dp × degree")] = 1
    """Data-parallel replicas per run; world size = dp × degree."""
    cluster_gpus: Annotated[int | None, Range(1)] = None
    """Also model every layout of the grid on this many GPUs (dp = cluster_gpus / degree; execution=model, in the
    grid's modes and forward, the mode of the paper's throughput claims): the paper's 1,024-GPU point beside the
    measured or estimated one (tspbench/run/grid.py). null: none."""
    recompute: str = "none"
    """Activation recompute: none | selective | full (the same key as in verify)."""
    dtype: str = "float32"
    """float64 | float32 | bfloat16."""
    device: str = "auto"
    """auto (cuda if available, else cpu) | cpu (gloo) | cuda (nccl)."""
    execution: str = "auto"
    """auto (measure where the devices exist, CPU always; else estimate and model each run instead: an `estimated`
    record and a `modelled` twin, decode modelled only) | measure (without the devices: recorded `invalid`) |
    estimate (fake tensors; not decode) | model (the cost model on `hardware`). Decided once per grid point,
    before anything runs (tspbench/run/fate.py)."""
    hardware: Any = None
    """Hardware profile for estimated/modelled numbers: a name, or the `hardware/` group's dict (null: cpu for
    device=cpu, else h100)."""
    seed: Annotated[int, Range(0)] = 0
    """Seed for weights and the synthetic batch (the same for every scheme)."""
    warmup_steps: Annotated[int, Range(0)] = 2
    """Steps run and discarded before the measured window (allocator, caches, kernels)."""
    measured_steps: Annotated[int, Range(1)] = 5
    """Steps in the measured window (decode: tokens decoded in it)."""
    lr: Annotated[float, Range(0, above=True)] = 1e-4
    """AdamW learning rate (train mode)."""
    memory_breakdown: bool = True
    """Run one extra, untimed step under MemTracker for the params/grads/optimizer/activations split."""
    power_sample_s: Annotated[float, Range(0, above=True)] = 0.1
    """Power-timeline sampling period (NVML/amdsmi; ignored on CPU)."""
    timeout_s: Annotated[float, Range(0, above=True)] = 600.0
    """Wall-clock limit per run of ranks (launch + warm-up + window); a hung rank group is killed and recorded
    `timeout`."""
    nodes: Annotated[int, Range(1, note="1: this machine; N > 1: a Slurm allocation of N nodes")] = 1
    """Nodes of the Slurm allocation the grid runs on (tspbench/run/slurm.py: one task per node, each node one
    torchrun agent per run; `hydra/launcher=slurm_8gpu` asks Slurm for this many). A measured point whose
    dp × degree is nodes × gpus_per_node spans them, one that fits gpus_per_node runs on the first node alone;
    1: this machine only."""
    gpus_per_node: Annotated[int, Range(1, note="ranks per node when nodes > 1")] = 8
    """Ranks (GPUs, or CPU ranks with device=cpu) per node when nodes > 1; each node must see at least this many
    devices (checked when the job starts). Ignored when nodes=1 (the devices this machine has)."""
    control_port: Annotated[int | None, Range(1024, 65535, note="a TCP port, or null: from the job id")] = None
    """With nodes > 1: the TCP port of the first node's control store, which tells the other nodes when to start
    their ranks; None: 20000 + the Slurm job id mod 10000 (set it when two jobs may share a node)."""
    resume_dir: Annotated[str | None, Output(dir=True, exists=True, hint=RESUME)] = None
    """Write records into this existing directory instead of Hydra's run dir, skipping its `ok` runs (a path
    that does not exist is refused)."""
    force: bool = False
    """Re-run runs already recorded `ok`."""
    progress: bool = True
    """Show the progress bar and the live per-run line."""
    paper_tables: list[str] = field(default_factory=list)
    """Tables from tspbench.paper.tables printed at the end (memory | throughput | plausibility | crossover): the
    cost model's answer to the paper's claims, beside the claims."""
    report: bool = True
    """End with the HTML report (reports/<exp_name>-<time>.html) and the matched claims in the terminal."""
    faults: FaultConfig = field(default_factory=FaultConfig)
    """Fault injection (`faults=crash|hang|oom faults.scheme=tp`)."""
    allow_failures: bool = False
    """Exit 0 even when some grid points crash, hang, are invalid or implausible, or run out of memory while measured;
    by default those exit 1, while a point predicted not to fit (an `oom` decided before it started) is a result and
    exits 0 (tspbench/run/checks.py EXIT_RULE)."""
    memory_check: bool = True
    """Before a measured run's ranks start, compare the cost model's per-rank peak with the memory the run
    can get (free device memory on GPU, available RAM / ranks on CPU) and record `oom` if it cannot fit."""


# ------------------------------------------------------------------------------------ axes after the singular keys
def axes(cfg: ExperimentConfig) -> tuple[list[int], list[int], list[int], list[str]]:
    """(seq_lens, degrees, batches, modes), each singular key replacing its axis."""
    return (
        [cfg.seq_len] if cfg.seq_len is not None else list(cfg.seq_lens),
        [cfg.degree] if cfg.degree is not None else list(cfg.degrees),
        [cfg.batch] if cfg.batch is not None else list(cfg.batches),
        [cfg.mode] if cfg.mode is not None else list(cfg.modes),
    )


def schemes_of(cfg: ExperimentConfig) -> list[str]:
    """The scheme axis (`scheme=` replaces `schemes`)."""
    return [cfg.scheme] if cfg.scheme is not None else list(cfg.schemes)


def options_of(cfg: ExperimentConfig, scheme: str) -> SchemeOptions:
    """A scheme's options with the singular keys (`sp_variant=`, `vocab=`, `tp=`, `msp=`, `kv_bucket_heads=`,
    `mlp_exchange=`, `regather_kv=`, `dp_shard=`: each option field's own name) applied."""
    opts = cfg.scheme_opts.get(scheme) or SchemeOptions()
    axes = {}
    for option, axis in AXES.items():  # tspbench.parallel: option field → its SchemeOptions / LayoutOptions axis
        single = getattr(cfg, option)
        axes[axis] = [single] if single is not None else list(getattr(opts, axis))
    return SchemeOptions(**axes)


def scheme_defaults() -> dict[str, SchemeOptions]:
    """Every registered scheme's grid defaults, read from conf/scheme_opts/<name>.yaml (a scheme without the file
    runs SchemeOptions' defaults; docs/adding-a-scheme.md's test requires the file)."""
    import yaml

    from tspbench.paths import conf_dir

    out = {}
    for name in SCHEMES:
        path = conf_dir() / "scheme_opts" / f"{name}.yaml"
        data = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
        out[name] = SchemeOptions(**data)
    return out


# --------------------------------------------------------------------------------------------- checks
def _one_of(name: str, value: Any, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is unknown; allowed: {', '.join(map(str, allowed))}")


def validate_experiment(cfg: ExperimentConfig) -> None:
    """Experiment-level mistakes (one line each): every field against its declared Range and Output
    (config.check_declared), then the names. Layout checks happen per grid point (tspbench/run/fate.py), so one
    bad degree is recorded `invalid` while the rest of the grid runs."""
    check_declared(cfg)
    for s in cfg.schemes:
        _one_of("schemes", s, SCHEMES)
    if cfg.scheme is not None:
        _one_of("scheme", cfg.scheme, SCHEMES)
    if cfg.sp_variant is not None:
        _one_of("sp_variant", cfg.sp_variant, SP_VARIANTS)
    if cfg.mlp_exchange is not None:
        _one_of("mlp_exchange", cfg.mlp_exchange, MLP_EXCHANGES)
    if cfg.vocab is not None:
        _one_of("vocab", cfg.vocab, VOCAB)
        others = [s for s in schemes_of(cfg) if cfg.vocab not in scheme(s).vocabs]
        if others:
            allowed = takers("vocab", cfg.vocab)
            raise ConfigError(
                f"vocab={cfg.vocab} is a {'|'.join(allowed)} option; use scheme={allowed[0]} vocab={cfg.vocab}, or "
                f"scheme_opts.{allowed[0]}.vocabs=[{cfg.vocab}] for it inside a grid of several schemes"
            )
    for key in AXES:  # a singular key of one scheme's option: a scheme taking it must be in the grid
        if key in ("sp_variant", "vocab"):  # several schemes take these (checked above and per grid point)
            continue
        if getattr(cfg, key) is not None and not any(takes(s, key) for s in schemes_of(cfg)):
            name = takers(key)[0]
            value = getattr(cfg, key)
            raise ConfigError(f"{key}={value} is a {name} option; add {name} to the schemes (scheme={name})")
    for name in cfg.scheme_opts:
        _one_of("scheme_opts key", name, SCHEMES)
    for m in [cfg.mode] if cfg.mode else cfg.modes:
        _one_of("mode", m, MODES)
        if m == "decode" and cfg.execution == "estimate":
            raise ConfigError(
                "mode=decode cannot be estimated (fake tensors trace train and forward only); "
                "allowed with it: execution=measure|model|auto"
            )
    _one_of("dtype", cfg.dtype, DTYPES)
    _one_of("device", cfg.device, DEVICES)
    _one_of("execution", cfg.execution, EXECUTIONS)
    _one_of("recompute", cfg.recompute, RECOMPUTE)
    _one_of("faults.kind", cfg.faults.kind, FAULT_KINDS)
    for t in cfg.paper_tables:
        _one_of("paper_tables", t, PAPER_TABLES)
    if cfg.faults.scheme is not None:
        _one_of("faults.scheme", cfg.faults.scheme, SCHEMES)
    for name, opts in cfg.scheme_opts.items():
        for v in opts.sp_variants:
            _one_of(f"scheme_opts.{name}.sp_variants", v, SP_VARIANTS)
        for v in opts.vocabs:
            _one_of(f"scheme_opts.{name}.vocabs", v, VOCAB)
            _one_of(f"scheme_opts.{name}.vocabs", v, scheme(name).vocabs)
        for v in opts.mlp_exchanges:
            _one_of(f"scheme_opts.{name}.mlp_exchanges", v, MLP_EXCHANGES)


# ------------------------------------------------------------------------------------------------ Hydra
def register():
    """Register the experiment schema (and the model schema) in Hydra's ConfigStore."""
    from tspbench.cli import register as register_base

    cs = register_base()
    cs.store(name="experiment_schema", node=ExperimentConfig)
    cs.store(group="faults", name="faults_schema", node=FaultConfig)
    return cs


def compose_experiment(overrides: list[str]) -> ExperimentConfig:
    """conf/config.yaml + overrides → the typed ExperimentConfig (Hydra's Compose API: no output directories,
    no @hydra.main; for tests and tools). A bad override raises ConfigError with one line."""
    from tspbench import cli

    register()
    try:
        return cli.compose("config", overrides)
    except ConfigError as e:
        key = str(e).split(" ", 1)[0]
        if str(e).startswith(f"{key} is not a key") and key in VERIFY_ONLY:
            raise ConfigError(
                f"{key} is a `python -m tspbench.verify` key; in an experiment: {VERIFY_ONLY[key]}"
            ) from None
        raise


VERIFY_ONLY = {
    "decode_steps": "mode=decode (measured_steps sets the tokens decoded per run)",
    "optimizer_step": "mode=train (forward + backward + AdamW step) or mode=forward",
    "grad_bucket_elems": "not settable (the worker uses the default bucket); use verify to test bucketing",
}
"""verify's keys that an experiment does not have, and what to type instead (one vocabulary across the CLIs)."""
