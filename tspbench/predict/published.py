"""The cost model against published third-party measurements (conf/published): the rows, their predictions, the
errors and their summary. The command line is tspbench/validate.py (`python -m tspbench.validate [FILE ...]`).

Each in-scope row of conf/published/*.yaml (or the files given) is predicted with the closed-form cost model on
the row's hardware profile:
- tokens/s per GPU and the iteration time step_s from `cluster_throughput` (train step of micro_batch sequences
  per replica; overlap from the row's layout: default ideal for FSDP rows, whose prefetched all-gathers /
  reduce-scatters both frameworks overlap with compute, else none);
- MFU from those tokens/s with the publisher's FLOPs convention, the row's `flops`: `palm` (default; 6N + 12·L·h·S
  per token, no causal halving: torchtitan and llm-foundry both count it so) or `megatron_eq3` (Narayanan et al.
  2021, Eq. 3: 96·B·s·l·h²·(1 + s/6h + V/16lh) per iteration, i.e. the blocks' GEMM FLOPs ×4 (the full-recompute
  forward counted) + 6·V·h per token for the LM head);
- peak memory from the closed-form `memory_breakdown`, not the fake-tensor estimate (minutes per row at these
  shapes). FSDP rows (`fsdp: true`) take the memory of scheme fsdp_sp with Σ = degree = 1 and dp = dp_shard = gpus:
  every parameter, gradient and optimizer state sharded over N = gpus ranks, one block unit gathered (plus the
  prefetched one and the last reduce-scatter input), the LM head gathered from its forward to its backward, each
  rank running its whole sequences. config.validate_parallel refuses fsdp_sp with degree 1 for runs (it is the
  single-device token layout); the closed form accepts it and that is all this uses. Their TIME stays single × dp
  with overlap "ideal" (above). The model state is priced with the row's `training` (costmodel Training: default
  AdamW with fp32 master weights and moments, gradients in bf16; e.g. pure-bf16 training, or fp32 gradients).
A row whose stack has a part of MEMORY_ONLY_STACK (Megatron) is in scope for its peak memory only: it may not
publish a time quantity (`load_rows` refuses it), so its tokens/s is never compared nor fitted.
`record(row)` is one validation record (docs/records.md#validation-records): published vs predicted with the signed
error per quantity; `summary` the median and worst absolute error per quantity, separately for the calibration and
validation subsets; `validation_errors()` the validation subset's, which the planner and the README's headline
print. Memory is GiB here (the records' unit); printed, it is GB.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Annotated, Any

import yaml

from tspbench.config import GIB, ConfigError, ModelConfig, Range, check_mapping
from tspbench.parallel import RECOMPUTE, ParallelConfig
from tspbench.paths import conf_dir
from tspbench.predict.costmodel import Workload, cluster_throughput, flops_per_token, memory_breakdown
from tspbench.predict.costmodel.activations import PUBLISHED_POLICIES
from tspbench.predict.costmodel.hardware import HardwareProfile, shared_profile
from tspbench.predict.costmodel.memory import ALLOCATOR_RESERVE, RUNTIME_HEADROOM, reserved_bytes
from tspbench.predict.costmodel.workload import BYTES, PRICING, Pricing, Training

QUANTITIES = ("tokens_per_s_per_gpu", "mfu_pct", "peak_mem_gib", "step_s")
FLOPS_CONVENTIONS = ("palm", "megatron_eq3")
SUBSETS = ("calibration", "validation")


@dataclass
class Row:
    """One published configuration (keys of a `rows:` entry in conf/published/*.yaml)."""

    id: str
    """Unique name of the row."""
    source: str
    """URL or repository + path + table + row the numbers are copied from."""
    subset: str
    """calibration or validation, fixed in the file before any error was computed."""
    hardware: str
    """conf/hardware/<name>.yaml profile."""
    gpus: Annotated[int, Range(1)]
    """GPUs of the measured job."""
    model: dict[str, Any]
    """ModelConfig fields (a name from the file's `models:` table is resolved on load)."""
    layout: dict[str, Any]
    """scheme, degree (and tp, sp_variant); fsdp: true when the source sharded parameters with FSDP."""
    seq_len: Annotated[int, Range(1)]
    """Sequence length, tokens."""
    micro_batch: Annotated[int, Range(1)]
    """Sequences per micro-batch per replica."""
    recompute: str
    """none, selective or full (the source's mode mapped onto ours; see notes), or a published framework's policy the
    cost model prices for published rows only (costmodel.activations.PUBLISHED_POLICIES: op_sac, torchtitan's
    op-level selective activation checkpointing; LAYER_SAC, its per-layer one): ROW_RECOMPUTE."""
    precision: str
    """bf16 (in scope) or what the source used."""
    measured: Annotated[dict[str, float], Range(0, above=True)]
    """Published numbers: tokens_per_s_per_gpu, mfu_pct, peak_mem_gib, step_s (iteration time of the whole job).
    A published number in another form (e.g. model_tflops_per_gpu, tokens_per_s_job, peak_mem_gb when the source
    prints GB: PUBLISHED_FORMS) is kept under its own key, copied as published: it is recorded, never compared (the
    record says so per quantity), never converted into one of the four. The one exception is an exact unit
    (EXACT_UNITS: peak_mem_bytes), which `load_rows` turns into its quantity by arithmetic alone, keeping the printed
    number in `published_as`. Any other key (MEASURED_KEYS) is refused, and every value must be > 0."""
    flops: str = "palm"
    """FLOPs convention of the published MFU: palm (6N + 12·L·h·S per token) or megatron_eq3 (Narayanan et al.
    2021, Eq. 3: the blocks' GEMMs ×4, recompute forward included, + the LM head's 6·V·h)."""
    memory_kind: str = ""
    """Which memory the published peak is (MEMORY_KINDS): allocated (torch.cuda.max_memory_allocated), reserved (the
    caching allocator's max_memory_reserved), device_used (what nvidia-smi / rocm-smi show: reserved + the runtime
    context and communicator buffers) or unknown; the evidence in `notes`. The prediction compared with it is the
    same memory (`predicted_memory_gib`); unknown is compared as allocated, and says so."""
    memory_out_of_scope: str | None = None
    """Why the row's peak memory is not predicted although its time is (e.g. a stack that changes what its
    checkpointing policy saves); None: compared whenever the row is in scope and publishes a peak."""
    stack: str = ""
    """The implementation as the source ran it, its parts joined by "+": eager (PyTorch eager), torch_compile,
    float8, transformer_engine, deepspeed, cpu_offload, … Optional: "" (the default, and every row written before
    the field existed) means the file does not say, not eager."""
    checkpointing: str = ""
    """The source's activation-checkpointing policy in its own words (e.g. "selective op", "full"), where
    `recompute` is its mapping onto ours. Optional: "" (the default) means the file does not say."""
    out_of_scope: str | None = None
    """Why the model family cannot represent the row (kept, never dropped)."""
    notes: str = ""
    """Mapping caveats."""
    training: dict[str, Any] = field(default_factory=dict)
    """How the source kept the model state: fields of costmodel Training (optimizer: adamw or sgd; master_fp32:
    false for pure-bf16 training, parameters, gradients and AdamW moments all in bf16 with no fp32 master copy, as
    torchtune's `dtype: bf16`; grad_dtype: float32 for fp32 gradients, as Megatron keeps its main grads in bf16
    runs). Only the memory prediction takes it. Optional: {} (the default, and every row written before the field
    existed) is Training(): AdamW with fp32 master weights and moments, gradients in the run's bf16."""
    published_as: dict[str, str] = field(default_factory=dict)
    """Quantity → the number as the file gives it, where `load_rows` changed an exact unit (EXACT_UNITS), e.g.
    {"peak_mem_gib": "peak_mem_bytes: 72434837504"}. Set by the loader, not written in files."""
    file: str = field(default="", repr=False)
    """The file the row came from."""


EXACT_UNITS: dict[str, tuple[str, float]] = {"peak_mem_bytes": ("peak_mem_gib", 1.0 / GIB)}
"""A published key in an exact unit of a compared quantity → (the quantity, the factor). Bytes name their unit without
doubt (torch.cuda.max_memory_allocated returns bytes), so ÷ 2³⁰ is arithmetic, not a reading of the source. "GB" is
not exact (publishers print it for GiB and for 10⁹ bytes alike): peak_mem_gb stays recorded and uncompared."""


LAYER_SAC = "layer_sac"
"""torchtitan's per-layer selective activation checkpointing with selective_ac_option "2" (`_apply_layer_sac`,
torchtitan parallelize_llama.py @0413364 and activation_checkpoint.py later: every second block wrapped in a full
checkpoint, the others saving everything). A published row's policy, priced by `predict` as half its blocks under
recompute=full and half under none (`layer_sac_mean`)."""

ROW_RECOMPUTE = (*RECOMPUTE, *PUBLISHED_POLICIES, LAYER_SAC)
"""A row's `recompute`: ours (none, selective, full), torchtitan's op-level SAC (costmodel.activations), or its
per-layer SAC (LAYER_SAC, priced here)."""


PUBLISHED_FORMS = ("model_tflops_per_gpu", "tokens_per_s_job", "peak_mem_gb")
"""Published numbers in a form the cost model does not predict: recorded as published, never compared."""
MEASURED_KEYS = (*QUANTITIES, *PUBLISHED_FORMS, *EXACT_UNITS)
"""The keys a row's `measured` may hold; any other (a misspelt quantity) is refused."""
LAYOUT_EXTRA: dict[str, Any] = {"fsdp": bool, "overlap": str}
"""A row's `layout` keys besides ParallelConfig's fields."""


def load_rows(paths: list[Path]) -> list[Row]:
    """Every row of the files, model names resolved, each checked against the typed schema (Row's fields, with the
    models' ModelConfig and the layouts' ParallelConfig: types, declared ranges, allowed values, unique ids); a
    mistake raises ConfigError with one line naming the file and line."""
    rows: list[Row] = []
    seen: dict[str, str] = {}
    for path in paths:
        doc, node = _document(path)
        models = doc.get("models") or {}
        for i, raw in enumerate(doc["rows"]):
            where = ("rows", i)
            try:
                row = _row(raw, models, path)
            except ConfigError as e:
                rid = raw.get("id") if isinstance(raw, dict) else None
                at = e.key if e.key[:1] == ("models",) else (*where, *e.key)  # the field's own line
                raise ConfigError(f"{path}:{_line(node, at)}: row {rid if rid is not None else f'#{i}'}: {e}") from None
            here = f"{path}:{_line(node, where)}"
            if row.id in seen:
                raise ConfigError(f"{here}: row {row.id}: id is already used at {seen[row.id]}; allowed: a unique id")
            seen[row.id] = here
            rows.append(row)
    return rows


def _document(path: Path) -> tuple[dict[str, Any], yaml.Node]:
    """A published file's content and its YAML node (which carries the line numbers); ConfigError (one line naming
    the file and line) when it is not YAML or not a mapping of `models:` and a non-empty list of `rows:`."""
    loader = yaml.SafeLoader(path.read_text())
    try:
        node = loader.get_single_node()
        doc = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: not YAML: {getattr(e, 'problem', None) or e}") from None
    finally:
        loader.dispose()
    shape = "allowed: a mapping of models: (name → ModelConfig fields) and rows: (a list of rows)"
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}:1: not a mapping; {shape}")
    for key in doc:
        if key not in ("models", "rows"):
            raise ConfigError(f"{path}:{_line(node, (key,))}: {key} is not a key; {shape}")
    if not isinstance(doc.get("rows"), list) or not doc["rows"]:
        raise ConfigError(f"{path}:{_line(node, ('rows',))}: no rows; {shape}")
    if not isinstance(doc.get("models") or {}, dict):
        raise ConfigError(f"{path}:{_line(node, ('models',))}: models is not a mapping; {shape}")
    return doc, node


def _line(node: yaml.Node, keys: tuple[Any, ...]) -> int:
    """The 1-based line of the deepest key of `keys` found under `node` (a mapping key's own line)."""
    line = node.start_mark.line
    for k in keys:
        if isinstance(node, yaml.MappingNode):
            pair = next(((kn, vn) for kn, vn in node.value if kn.value == str(k)), None)
            if pair is None:
                break
            line, node = pair[0].start_mark.line, pair[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(k, int) and k < len(node.value):
            node = node.value[k]
            line = node.start_mark.line
        else:
            break
    return line + 1


def _row(raw: Any, models: dict[str, Any], path: Path) -> Row:
    """One `rows:` entry as a Row, or ConfigError (its `key`: the offending field's path; ("models", name, ...) for
    a field of the file's models: table)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{raw!r} is not a mapping of Row fields")
    raw = dict(raw)
    if "file" in raw:
        raise ConfigError("file is set by the loader (the file the row came from), not written in files", ("file",))
    if isinstance(raw.get("model"), str):
        name = raw["model"]
        if name not in models:
            raise ConfigError(f"model={name!r} is not in the file's models: ({', '.join(models)})", ("model",))
        if not isinstance(models[name], dict):
            raise ConfigError(f"models.{name} is not a mapping of ModelConfig fields", ("models", name))
        try:
            check_mapping(ModelConfig, models[name], f"models.{name}.")
        except ConfigError as e:
            raise ConfigError(str(e), ("models", name, *e.key)) from None
        raw["model"] = dict(models[name], name=name)
    check_mapping(Row, raw)  # every key a field, each value of its type and in its declared Range
    for name, schema, extra in (("model", ModelConfig, None), ("layout", ParallelConfig, LAYOUT_EXTRA)):
        try:
            check_mapping(schema, raw.get(name, {}), f"{name}.", extra=extra)
        except ConfigError as e:
            raise ConfigError(str(e), (name, *e.key)) from None
    unknown = [q for q in raw.get("measured", {}) if q not in MEASURED_KEYS]
    if unknown:
        raise ConfigError(
            f"measured.{unknown[0]} is not a published quantity; allowed: {', '.join(MEASURED_KEYS)}",
            ("measured", unknown[0]),
        )
    if raw.get("subset") not in SUBSETS:
        raise ConfigError(f"subset={raw.get('subset')!r}; allowed: {SUBSETS}", ("subset",))
    problem = exact_units(raw)
    if problem:
        raise ConfigError(problem, ("measured",))
    publishes_memory = any(k.startswith("peak_mem") for k in raw.get("measured", {}))
    if publishes_memory and raw.get("memory_kind") not in MEMORY_KINDS:  # unstated or free text (older files)
        said = raw.get("memory_kind")
        raw["memory_kind"] = "unknown"
        raw["notes"] = (raw.get("notes", "") + f" [memory_kind {said!r} read as unknown]").strip()
    if raw.get("flops", "palm") not in FLOPS_CONVENTIONS:
        raise ConfigError(f"flops={raw.get('flops')!r}; allowed: {FLOPS_CONVENTIONS}", ("flops",))
    if not raw.get("out_of_scope") and "recompute" in raw and raw["recompute"] not in ROW_RECOMPUTE:
        raise ConfigError(f"recompute={raw.get('recompute')!r}; allowed: {ROW_RECOMPUTE}", ("recompute",))
    problem = training_problem(raw.get("training", {}))
    if problem:
        raise ConfigError(problem, ("training",))
    problem = stack_problem(raw)
    if problem:
        raise ConfigError(problem, ("stack",))
    required = [f.name for f in fields(Row) if f.default is MISSING and f.default_factory is MISSING]
    missing = [name for name in required if name not in raw]
    if missing:
        raise ConfigError(f"missing field(s) {', '.join(missing)}; required: {', '.join(required)}")
    return Row(**raw, file=str(path))


def exact_units(raw: dict[str, Any]) -> str:
    """Turn the row's numbers in an exact unit (EXACT_UNITS) into their quantity, in place, keeping each as printed in
    `published_as`; what is wrong ("" when nothing): a row giving both forms, or a form set by hand."""
    if "published_as" in raw:
        return "published_as is set by the loader from EXACT_UNITS keys, not written in files"
    measured = dict(raw.get("measured") or {})
    done: dict[str, str] = {}
    for key, (quantity, factor) in EXACT_UNITS.items():
        if key not in measured:
            continue
        if quantity in measured:
            return f"measured gives both {key} and {quantity}: keep the one the source prints"
        value = measured.pop(key)
        measured[quantity] = float(value) * factor
        done[quantity] = f"{key}: {value}"
    if done:
        raw["measured"], raw["published_as"] = measured, done
    return ""


TRAINING_FIELDS = ("optimizer", "master_fp32", "grad_dtype")
"""The costmodel Training fields a row's `training` may set."""


def training_problem(training: Any) -> str:
    """What is wrong with a row's `training` ("" when nothing): a mapping of TRAINING_FIELDS with valid values."""
    if not isinstance(training, dict):
        return f"training={training!r} is not a mapping of {TRAINING_FIELDS}"
    unknown = sorted(set(training) - set(TRAINING_FIELDS))
    if unknown:
        return f"training has unknown field(s) {unknown}; allowed: {TRAINING_FIELDS}"
    if training.get("optimizer", "adamw") not in ("adamw", "sgd"):
        return f"training.optimizer={training['optimizer']!r}; allowed: adamw, sgd"
    if not isinstance(training.get("master_fp32", True), bool):
        return f"training.master_fp32={training['master_fp32']!r} is not true or false"
    if training.get("grad_dtype") not in (None, *BYTES):
        return f"training.grad_dtype={training['grad_dtype']!r}; allowed: {', '.join(BYTES)}"
    return ""


def published_flops_per_token(model: ModelConfig, seq_len: int, convention: str) -> float:
    """FLOPs per trained token as the publisher counts them for its MFU (module docstring)."""
    if convention == "megatron_eq3":
        blocks = flops_per_token(model, seq_len, mode="forward", causal_halved=False, include_lm_head=False)
        return 4 * blocks + 6 * model.vocab_size * model.dim
    return flops_per_token(model, seq_len, mode="train", causal_halved=False)


def memory_parallel(row: Row, par: ParallelConfig) -> ParallelConfig:
    """The layout whose closed-form memory is the row's: FSDP rows are fsdp_sp with Σ = 1 over dp = gpus."""
    if row.layout.get("fsdp"):
        return ParallelConfig(scheme="fsdp_sp", degree=1, dp=row.gpus, dp_shard=row.gpus, recompute=row.recompute)
    return par


MEMORY_KINDS = ("allocated", "reserved", "device_used", "unknown")
"""The memories a published peak can be (`Row.memory_kind`)."""


def predicted_memory_gib(row: Row, allocated_bytes: float, reserve: float = ALLOCATOR_RESERVE) -> float:
    """The model's peak in the memory the row publishes (GiB): the allocated peak, the caching allocator's reserved
    peak (`reserved_bytes`, `reserve` a priori ALLOCATOR_RESERVE; tspbench/predict/fit.py fits it on calibration rows)
    or the device's used memory (reserved + RUNTIME_HEADROOM: the runtime context and communicator buffers). A row of
    unknown kind is compared as allocated."""
    if row.memory_kind == "reserved":
        return reserved_bytes(allocated_bytes, reserve) / GIB
    if row.memory_kind == "device_used":
        return (reserved_bytes(allocated_bytes, reserve) + RUNTIME_HEADROOM) / GIB
    return allocated_bytes / GIB


MEMORY_ONLY_STACK = frozenset({"megatron"})
"""Stack parts whose peak memory the closed form represents but whose time it does not: Megatron's tensor
parallelism with sequence parallelism is tp_msp, but its kernels (TransformerEngine's, fused) and overlap are not
those the per-stack fit prices. A row whose stack has such a part (and no other unmodelled one) may be in scope for
its peak memory only: `load_rows` refuses it publishing a time quantity (TIME_QUANTITIES), so its time is
never compared and it never enters the tokens/s fit (tspbench/predict/fit.py fits rows publishing
tokens_per_s_per_gpu only). `predict` still returns the layout's eager-kernel time for it (every in-scope record
carries one); nothing compares it. A time the source prints is quoted in the row's `notes`."""

TIME_QUANTITIES = ("tokens_per_s_per_gpu", "mfu_pct", "step_s")
"""The compared quantities that are times (a MEMORY_ONLY_STACK row may publish none of them)."""


def stack_parts(row: Row) -> set[str]:
    """The parts of a row's `stack` ("" reads as eager PyTorch)."""
    return set((row.stack or "eager").split("+"))


def memory_only(row: Row) -> bool:
    """The row's stack has a MEMORY_ONLY_STACK part: only its peak memory is compared."""
    return bool(stack_parts(row) & MEMORY_ONLY_STACK)


def stack_problem(raw: dict[str, Any]) -> str:
    """Why an in-scope row (a raw `rows:` entry) cannot be compared as its stack stands ("" when it can): a
    MEMORY_ONLY_STACK part with a published time quantity."""
    if raw.get("out_of_scope"):
        return ""
    parts = set((raw.get("stack") or "eager").split("+"))
    times = sorted(q for q in raw.get("measured", {}) if q in TIME_QUANTITIES)
    if parts & MEMORY_ONLY_STACK and times:
        return (
            f"stack part(s) {sorted(parts & MEMORY_ONLY_STACK)} are modelled for memory only, but the row publishes "
            f"{times}; quote the source's time in its notes"
        )
    return ""


def stack_hardware(row: Row, hw: HardwareProfile) -> HardwareProfile:
    """The profile as the row's stack runs it (docs/method.md#fit): with `float8`, every GEMM runs on the fp8 peak
    (`peak_flops_fp8`) `float8_linear_speedup` times as fast as the bf16 GEMM (torchao's published float8-linear
    speed-up on the device, casts and scales included; a profile without it: at the bf16 GEMM's fraction of the fp8
    peak, i.e. the peaks' ratio), while the attention kernel stays in bf16 (its efficiency rescaled so that its time is
    the bf16 one). `torch_compile` and `triton_attention` (a Triton flash-attention kernel in place of SDPA's) change
    no FLOP and no constant a priori (compile's fusion touches the elementwise work the roofline does not price); the
    per-stack fit (tspbench/predict/fit.py) gives a stack its own constants where calibration rows allow. A float8 row
    on a profile without an fp8 peak is a ValueError."""
    if "float8" not in stack_parts(row):
        return hw
    if not hw.peak_flops_fp8:
        raise ValueError(f"row {row.id}: stack float8 on hardware {hw.name}, whose profile has no peak_flops_fp8")
    scale = hw.peak_flops_bf16 / hw.peak_flops_fp8
    speedup = hw.float8_linear_speedup or 1.0 / scale
    attn_f = (hw.attention_forward_efficiency or hw.matmul_efficiency) * scale
    attn_b = (hw.attention_backward_efficiency or hw.matmul_efficiency) * scale
    return replace(
        hw,
        peak_flops_bf16=hw.peak_flops_fp8,
        matmul_efficiency=hw.matmul_efficiency * speedup * scale,
        attention_forward_efficiency=attn_f,
        attention_backward_efficiency=attn_b,
    )


FUSED_ELEMENTWISE = frozenset({"torch_compile", "fused_elementwise"})
"""Stack parts whose elementwise work runs in fused kernels: torch.compile's, and Megatron-LM's hand-fused ones
(fused_elementwise: apex's FusedLayerNorm, the bias+GeLU, bias+dropout+add and scale+mask+softmax fusions)."""


def stack_pricing(row: Row) -> Pricing:
    """The time model's mechanisms as the row's stack runs them: a FUSED_ELEMENTWISE part prices the elementwise work
    fused (Pricing.elementwise = "compiled", costmodel/elementwise.py); every other stack runs it eagerly."""
    return replace(PRICING, elementwise="compiled") if stack_parts(row) & FUSED_ELEMENTWISE else PRICING


def layer_sac_mean(full: dict[str, float | None], none: dict[str, float | None]) -> dict[str, float | None]:
    """A layer-SAC row's prediction from the same row under full and under none: time per token, step time and
    exposed communication are the mean of the two (each block's replay is additive over blocks: exact while the
    step's overlap does not bind, which the FSDP rows' 'ideal' rule keeps), tokens/s and MFU their inverses, memory
    the mean of the two peaks (half the blocks keep their input only, half everything; the working set at the peak
    is approximated by the mean, a stated approximation: no such row publishes memory today)."""
    out: dict[str, float | None] = {}
    for k in full:
        a, b = full[k], none[k]
        if a is None or b is None:
            out[k] = None
        elif k in ("tokens_per_s_per_gpu", "mfu_pct"):
            out[k] = 2.0 / (1.0 / a + 1.0 / b)
        else:
            out[k] = (a + b) / 2.0
    return out


def predict(
    row: Row,
    hardware: Callable[[HardwareProfile], HardwareProfile] | None = None,
    reserve: float = ALLOCATOR_RESERVE,
) -> dict[str, float | None]:
    """The cost model's tokens/s per GPU, MFU (%) and peak memory (GiB, the memory the row publishes:
    `predicted_memory_gib`, with the allocator's `reserve`) for one row; `hardware` replaces constants of the row's
    profile (tspbench/predict/fit.py's fitted ones), None: the profile as it is. The memory is None when the row's
    memory is out of scope (`Row.memory_out_of_scope`); it prices the model state with the row's `training`. A
    layer-SAC row (LAYER_SAC) is the mean of the row under full and under none (`layer_sac_mean`)."""
    if row.recompute == LAYER_SAC:
        full, none = (predict(replace(row, recompute=r), hardware, reserve) for r in ("full", "none"))
        return layer_sac_mean(full, none)
    model = ModelConfig(**row.model)
    lay = {k: v for k, v in row.layout.items() if k not in ("fsdp", "overlap")}
    degree = int(lay.get("degree", 1))
    lay.setdefault("dp", max(1, row.gpus // degree))  # a row may state it (FSDP × CP rows); else the whole job
    par = ParallelConfig(recompute=row.recompute, **lay)
    base = shared_profile(row.hardware)
    hw = stack_hardware(row, hardware(base) if hardware is not None else base)
    overlap = row.layout.get("overlap", "ideal" if row.layout.get("fsdp") else "none")
    work = Workload(model, row.seq_len, row.micro_batch, mode="train")
    ct = cluster_throughput(par, work, hw, row.gpus, overlap=overlap, pricing=stack_pricing(row))
    tps = ct["tokens_per_s_per_device"]
    model_flops = published_flops_per_token(model, row.seq_len, row.flops)
    training = Training(**row.training)
    mem = None if row.memory_out_of_scope else memory_breakdown(memory_parallel(row, par), work, training)["total"]
    return {
        "tokens_per_s_per_gpu": tps,
        "mfu_pct": 100.0 * tps * model_flops / base.peak_flops("bfloat16"),  # of the bf16 peak, as published
        "peak_mem_gib": None if mem is None else predicted_memory_gib(row, mem, reserve),
        "allocated_mem_gib": None if mem is None else mem / GIB,
        "step_s": ct["step_s"],
        "exposed_comm_s": ct["step_s"] - ct["compute_s"],
    }


def record(row: Row) -> dict[str, Any]:
    """The JSONL record of one row (fields in docs/records.md#validation-records)."""
    rec: dict[str, Any] = {
        "kind": "validation",
        "row_id": row.id,
        "source": row.source,
        "subset": row.subset,
        "hardware": row.hardware,
        "gpus": row.gpus,
        "model": row.model.get("name", ""),
        "layout": row.layout,
        "seq_len": row.seq_len,
        "micro_batch": row.micro_batch,
        "recompute": row.recompute,
        "precision": row.precision,
        "flops": row.flops,
        "status": "out_of_scope" if row.out_of_scope else "ok",
        "out_of_scope": row.out_of_scope,
        "published": dict(row.measured),
        "published_as": dict(row.published_as),
        "predicted": {},
        "error_pct": {},
        "quantity_out_of_scope": {},
    }
    if row.out_of_scope:
        return rec
    pred = predict(row)
    rec["predicted"] = pred
    for q in row.measured:
        if q not in QUANTITIES:
            rec["quantity_out_of_scope"][q] = f"{q} is recorded as published; the cost model predicts only {QUANTITIES}"
            if memory_only(row):
                rec["quantity_out_of_scope"][q] += f" (stack {row.stack}: its memory only, MEMORY_ONLY_STACK)"
    for q in QUANTITIES:
        if q not in row.measured:
            continue
        p = pred.get(q)
        if p is None:
            why = row.memory_out_of_scope if q == "peak_mem_gib" and row.memory_out_of_scope else None
            rec["quantity_out_of_scope"][q] = why or "the cost model gives no prediction of it for this layout"
            continue
        rec["error_pct"][q] = 100.0 * (p - row.measured[q]) / row.measured[q]
    return rec


LONG_SEQ = 16384
"""Rows at this sequence length or more are also summarised on their own (`summary(long=True)`)."""


def summary(records: list[dict[str, Any]], long: bool = False) -> dict[str, dict[str, dict[str, float]]]:
    """Median and worst absolute error (%) and row count per subset and quantity (`long`: rows at S ≥ LONG_SEQ)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    records = [r for r in records if not long or r["seq_len"] >= LONG_SEQ]
    for subset in SUBSETS:
        for q in QUANTITIES:
            errs = [abs(r["error_pct"][q]) for r in records if r["subset"] == subset and q in r["error_pct"]]
            if errs:
                out.setdefault(subset, {})[q] = {
                    "median_abs_pct": statistics.median(errs),
                    "worst_abs_pct": max(errs),
                    "n": len(errs),
                }
    return out


def default_files() -> list[Path]:
    return sorted((conf_dir() / "published").glob("*.yaml"))


def validation_errors(files: list[Path] | None = None) -> dict[str, dict[str, float]]:
    """The validation subset's errors per quantity (`summary`'s "validation" entry: median_abs_pct, worst_abs_pct,
    n) for the repo's published rows (or `files`), predicted now: what applies to any prediction the model makes
    (the README's headline and the planner print them)."""
    return summary([record(r) for r in load_rows(files or default_files())]).get("validation", {})
