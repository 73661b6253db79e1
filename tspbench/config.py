"""Typed configuration shared by every part of tspbench: the model (`ModelConfig`), the dtypes and modes, and
`ConfigError`. The parallel layout is tspbench.parallel (`ParallelConfig`, the scheme registry).

Every field has an attribute docstring; a numeric one declares its range beside its type (`Range`), a path the
command writes is marked `Output`, and `check_declared` checks a config against both (`check_mapping`: a raw
mapping, e.g. a published row). Mistakes raise `ConfigError` (a `ValueError`) with one actionable line naming the
field and the allowed values; every entry point prints it and exits 2 before any work. This module is a leaf: it
imports nothing of tspbench's but paths.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import torch

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
GRAD_BUCKET_ELEMS = 2**25
"""Gradient all-reduce bucket (schemes/base.py ParallelModel.finish_grad_sync): at most 32M elements are
concatenated at once (Megatron's DDP default is 40M), so the sync never holds a second copy of all the gradients.
Here, not in schemes/, so that the cost model reads it without importing torch.distributed."""
GIB = 2**30
"""Bytes per GiB: records store memory in GiB (keys ending `_gib`; docs/records.md)."""
GB = 10**9
"""Bytes per GB: every printed table, the report and the paper state memory in decimal GB."""
GIB_TO_GB = GIB / GB
"""1 GiB = 1.073741824 GB."""
MODES = ("train", "forward", "decode")
"""train: forward + backward + AdamW; forward: one forward (prefill without a cache); decode: serving, a
KV-cache prefill of seq_len tokens, then one new token per step (schemes/ops/decode.py)."""


class ConfigError(ValueError):
    """A user mistake in the configuration; its message is one actionable line. `key`: the field's path (e.g.
    ("measured", "step_s")) when a schema check names one, so that a file's loader can add the line it is on."""

    def __init__(self, message: str, key: tuple[Any, ...] = ()) -> None:
        super().__init__(message)
        self.key = key


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class Range:
    """A numeric field's allowed values, declared beside its type: `seq_len: Annotated[int, Range(1)]`. On a list
    every element must be in it and the list must not be empty; on a mapping, every value. `above`: lo excluded."""

    lo: float | None = None
    hi: float | None = None
    above: bool = False
    note: str = ""
    """What the bounds mean, added to the refusal in parentheses."""

    def text(self) -> str:
        if self.lo is not None and self.hi is not None:
            return f"in {_num(self.lo)}..{_num(self.hi)}"
        if self.lo is not None:
            return f"{'>' if self.above else '≥'} {_num(self.lo)}"
        return f"≤ {_num(self.hi)}" if self.hi is not None else "a number"

    def holds(self, v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:  # bool is an int; nan is no number
            return False
        return (self.lo is None or (v > self.lo if self.above else v >= self.lo)) and (self.hi is None or v <= self.hi)

    def problem(self, key: str, value: Any) -> str | None:
        """The one line refusing `value` of field `key`, or None when it is allowed (None: an unset optional)."""
        if value is None or (not isinstance(value, (dict, list, tuple)) and self.holds(value)):
            return None  # the common case, first: the planner validates a ModelConfig per layout
        note = f" ({self.note})" if self.note else ""
        if isinstance(value, dict):
            bad = [k for k, v in value.items() if not self.holds(v)]
            return f"{key}.{bad[0]}={value[bad[0]]!r} must be {self.text()}{note}" if bad else None
        if isinstance(value, (list, tuple)):
            if not value:
                return f"{key}=[] is empty; allowed: one or more values, each {self.text()}{note}"
            ok = all(self.holds(v) for v in value)
            return None if ok else f"{key}={list(value)}: every value must be {self.text()}{note}"
        return f"{key}={value!r} must be {self.text()}{note}"


@dataclass(frozen=True)
class Output:
    """A path the command writes, declared beside its type: `out: Annotated[str | None, Output()]`; checked
    writable before any work (`check_writable`). `dir`: a directory; `exists`: it must exist already (a file
    rewritten in place, a run directory resumed), `hint` saying what to give instead."""

    dir: bool = False
    exists: bool = False
    hint: str = ""


def check_writable(key: str, value: str, out: Output = Output()) -> None:
    """ConfigError (one line) unless the command can write `value`: an existing path of the right kind that can be
    written, or a new one under a writable directory (probed by creating and removing a temporary file)."""
    import os
    import tempfile

    path = Path(value).expanduser()
    kind = "a directory" if out.dir else "a file"
    allowed = out.hint or f"{kind} path under a writable directory"
    if out.exists and not path.exists():
        raise ConfigError(f"{key}={value} does not exist; allowed: {allowed}")
    if path.exists() and path.is_dir() != out.dir:
        raise ConfigError(f"{key}={value} is not {kind}; allowed: {allowed}")
    if path.is_file() and not os.access(path, os.W_OK):
        raise ConfigError(f"{key}={value} cannot be written (read-only); allowed: {allowed}")
    where = path if path.is_dir() else path.parent
    while not where.exists():
        where = where.parent
    if not where.is_dir():
        raise ConfigError(f"{key}={value} cannot be written: {where} is not a directory; allowed: {allowed}")
    try:
        tempfile.TemporaryFile(dir=where).close()
    except OSError as e:
        raise ConfigError(
            f"{key}={value} cannot be written: {where} is not writable ({e.strerror}); allowed: {allowed}"
        ) from None


def _rules(hint: Any) -> tuple[Any, ...]:
    return getattr(hint, "__metadata__", ())


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    """A dataclass's field types with their Annotated declarations (evaluated once per class)."""
    return typing.get_type_hints(cls, include_extras=True)


@functools.cache
def _declared(cls: Any) -> list[tuple[str, tuple[Any, ...], bool]]:
    """(field, its Range / Output declarations, whether it may hold a dataclass) for each field of `cls` that
    declares one or may hold one: what check_declared visits, listed once per class (the planner validates a
    ModelConfig per layout)."""
    out = []
    for f in dataclasses.fields(cls):
        hint = _hints(cls)[f.name]
        base = typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint
        nests = base is Any or dataclasses.is_dataclass(base) or typing.get_origin(base) is dict
        if _rules(hint) or nests:
            out.append((f.name, _rules(hint), nests))
    return out


def check_declared(obj: Any, prefix: str = "") -> None:
    """Every field of the dataclass `obj` (nested dataclasses and mappings of them too) against what its type
    declares: its `Range`, its `Output`. ConfigError naming the field, the value and what is allowed."""
    for name, rules, nests in _declared(typing.cast(typing.Hashable, type(obj))):
        value, key = getattr(obj, name), prefix + name
        for rule in rules:
            if isinstance(rule, Range) and (line := rule.problem(key, value)):
                raise ConfigError(line, (name,))
            if isinstance(rule, Output) and value:
                check_writable(key, value, rule)
        if not nests:
            continue
        inner = value.items() if isinstance(value, dict) else [("", value)]
        for sub, v in inner:
            if dataclasses.is_dataclass(v) and not isinstance(v, type):
                check_declared(v, f"{key}.{sub}." if sub else f"{key}.")


def type_problem(value: Any, hint: Any) -> tuple[tuple[Any, ...], str] | None:
    """Where `value` (read from YAML or JSON) is not of type `hint` (the path inside it: keys, indices) and what
    was expected there ("an integer", ...), or None when it is. A nested dataclass's fields: check_mapping's."""
    hint = typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return None
    if origin in (typing.Union, types.UnionType):
        found = [type_problem(value, a) for a in args]
        if None in found:
            return None
        return (), " or ".join(f[1] for f in found if f is not None)
    if hint is type(None):
        return None if value is None else ((), "null")
    if origin is dict or dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            return (), "a mapping"
        items: list[tuple[Any, Any]] = list(value.items()) if args else []
    elif origin is list:
        if not isinstance(value, list):
            return (), "a list"
        items = list(enumerate(value))
    else:
        ok = isinstance(value, hint) and not (hint is int and isinstance(value, bool))
        ok = ok or (hint is float and isinstance(value, int) and not isinstance(value, bool))
        words = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
        return None if ok else ((), words.get(hint, getattr(hint, "__name__", str(hint))))
    for k, v in items:
        found_in = type_problem(v, args[-1])
        if found_in is not None:
            return (k, *found_in[0]), found_in[1]
    return None


def check_mapping(cls: type, data: dict[str, Any], prefix: str = "", extra: dict[str, Any] | None = None) -> None:
    """A raw mapping against the dataclass `cls` as a typed schema: every key a field (or one of `extra`, key →
    type), every value of the field's type and within its declared Range, nested dataclass fields likewise.
    ConfigError (one line, its `key` the path to the offending field)."""
    hints = {**_hints(cls), **(extra or {})}
    names = [f.name for f in dataclasses.fields(cls)] + list(extra or {})
    for name, value in data.items():
        key = f"{prefix}{name}"
        if name not in names:
            raise ConfigError(f"{key} is not a field; allowed: {', '.join(prefix + n for n in names)}", (name,))
        hint = hints[name]
        found = type_problem(value, hint)
        if found is not None:
            where, shown = found[0], value
            for k in where:
                shown = shown[k]
            raise ConfigError(f"{'.'.join([key, *map(str, where)])}={shown!r} is not {found[1]}", (name, *where))
        for rule in _rules(hint):
            if isinstance(rule, Range) and (line := rule.problem(key, value)):
                bad = [k for k, v in value.items() if not rule.holds(v)][:1] if isinstance(value, dict) else []
                raise ConfigError(line, (name, *bad))
        base = typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint
        if dataclasses.is_dataclass(base) and isinstance(value, dict):
            try:
                check_mapping(base, value, f"{key}.")  # type: ignore[arg-type]
            except ConfigError as e:
                raise ConfigError(str(e), (name, *e.key)) from None


@dataclass
class RopeScaling:
    """Llama 3.1's RoPE frequency scaling (Hugging Face `rope_type: llama3`): wavelengths longer than
    original_max_position_embeddings / low_freq_factor are divided by `factor`, those shorter than
    original_max_position_embeddings / high_freq_factor are kept, and the band between is interpolated smoothly.
    factor = 1 (the default) is plain RoPE: the formula is then the identity whatever the other three fields."""

    factor: Annotated[float, Range(0, above=True, note="1: no scaling")] = 1.0
    """Divisor of the low frequencies (Llama 3.1: 8; 1: no scaling)."""
    low_freq_factor: Annotated[float, Range(0, above=True)] = 1.0
    """Wavelengths above original_max_position_embeddings / low_freq_factor are scaled fully (Llama 3.1: 1)."""
    high_freq_factor: Annotated[float, Range(0, above=True)] = 4.0
    """Wavelengths below original_max_position_embeddings / high_freq_factor are not scaled (Llama 3.1: 4)."""
    original_max_position_embeddings: Annotated[int, Range(1)] = 8192
    """The context length the model was pre-trained at (Llama 3.1: 8192)."""


@dataclass(frozen=True)
class Rope:
    """What RoPE needs besides the positions: the base and the optional frequency scaling (ModelConfig.rope)."""

    theta: float
    scaling: RopeScaling | None = None


@dataclass
class ModelConfig:
    """Llama-style decoder (docs/method.md#published; SwiGLU + RMSNorm + RoPE per docs/method.md#choice-activation)."""

    name: str = "tiny"
    """Label used in results and reports."""
    vocab_size: Annotated[int, Range(1)] = 256
    """Vocabulary size V (the paper does not state one; llama7b uses Llama-2's 32000)."""
    dim: Annotated[int, Range(1)] = 64
    """Hidden size h."""
    n_layers: Annotated[int, Range(1)] = 2
    """Number of decoder blocks L."""
    n_heads: Annotated[int, Range(1)] = 4
    """Query heads n_h; head dim d = dim / n_heads."""
    n_kv_heads: Annotated[int, Range(1)] = 4
    """Key/value heads n_kv (GQA ratio g = n_heads / n_kv_heads; equal to n_heads for MHA)."""
    ffn_hidden: Annotated[int, Range(1)] = 256
    """Intermediate size of the gated MLP (F·h; the paper's F = 4 gives 4·h)."""
    norm_eps: Annotated[float, Range(0, above=True)] = 1e-5
    """RMSNorm epsilon."""
    rope_theta: Annotated[float, Range(0, above=True)] = 10000.0
    """RoPE base."""
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    """RoPE frequency scaling (Llama 3.1's `llama3` type: `model.rope_scaling.factor=8`; factor 1: plain RoPE)."""
    tie_embeddings: bool = False
    """The LM head shares the embedding's weight (Hugging Face `tie_word_embeddings`; Llama 3.2 1B/3B)."""
    sliding_window: Annotated[int | None, Range(1, note="null: full causal attention")] = None
    """Mistral's attention window (Hugging Face `sliding_window`). The model attends causally over the whole
    sequence, which equals a sliding window only when seq_len ≤ sliding_window: a longer sequence is refused
    (Transformer.forward). None: full causal attention (Llama, Mistral v0.3)."""

    def __post_init__(self) -> None:
        if isinstance(self.rope_scaling, dict):  # from YAML, JSON or a record's asdict()
            self.rope_scaling = RopeScaling(**self.rope_scaling)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def rope(self) -> Rope:
        """RoPE's base and scaling, as every attention module takes them (tspbench/model.py rope_cos_sin)."""
        return Rope(self.rope_theta, self.rope_scaling if self.rope_scaling.factor != 1.0 else None)

    @property
    def gqa_ratio(self) -> int:
        return self.n_heads // self.n_kv_heads


def model_preset(name: str) -> ModelConfig:
    """A model preset, conf/model/<name>.yaml, as a ModelConfig (the same file Hydra's `model=<name>` reads)."""
    import yaml

    from tspbench.paths import conf_dir

    path = conf_dir() / "model" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ConfigError(f"model={name!r} is unknown; allowed: {', '.join(known)}")
    data = {k: v for k, v in yaml.safe_load(path.read_text()).items() if k != "defaults"}
    return ModelConfig(**data)


def require_untied(m: ModelConfig, where: str) -> None:
    """Refuse tied embeddings where a scheme holds the embedding and the LM head as two different shardings."""
    _need(
        not m.tie_embeddings,
        f"model.tie_embeddings=true cannot be sharded by {where} (embedding and LM head sharded apart); allowed: "
        "vocab=replicated with scheme=single|tp|tp_msp|sp|tp_sp|tsp, or model.tie_embeddings=false",
    )


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def validate_model(m: ModelConfig) -> None:
    check_declared(m, "model.")  # each field's declared Range
    _need(m.dim % m.n_heads == 0, f"model.dim={m.dim} must be divisible by model.n_heads={m.n_heads}")
    _need(m.n_heads % m.n_kv_heads == 0, f"model.n_kv_heads={m.n_kv_heads} must divide model.n_heads={m.n_heads} (GQA)")
    _need(m.head_dim % 2 == 0, f"model.dim/n_heads={m.head_dim} must be even for RoPE")
    r = m.rope_scaling
    if r.factor != 1.0:
        _need(
            r.low_freq_factor < r.high_freq_factor,
            f"model.rope_scaling.low_freq_factor={r.low_freq_factor} and high_freq_factor={r.high_freq_factor} "
            "must satisfy 0 < low_freq_factor < high_freq_factor",
        )
