"""Command-line plumbing every entry point shares (README.md, "Commands"). Every command
`python -m tspbench[.NAME]` takes `key=value` options into a typed dataclass whose attribute docstrings are its `--help`
(`help_text`), and answers a mistake with one line and exit code 2. Two ways to fill the dataclass:

    compose        Hydra's Compose API on conf/<name>.yaml, for the commands whose options include a model preset
                   with field overrides (`model=llama7b model.n_layers=4`): python -m tspbench, .verify, .estimate —
                   the same override means the same thing in each, and a bad one gets the same one-line error
    parse_options  plain `key=value` (lists comma-separated or in brackets) and, where a command takes them, bare
                   positional paths: .plan, .validate, .report, .gpu_check, .headline
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from typing import Any, TypeVar

from hydra.core.config_store import ConfigStore

from tspbench.config import ConfigError, ModelConfig, check_declared
from tspbench.paths import conf_dir

T = TypeVar("T")
CONF_DIR = conf_dir()
"""The configuration root (model/, scheme_opts/, hardware/, exp/, faults/ groups; tspbench.paths)."""


HF_PREFIX = "hf:"
"""`model=hf:PATH`: a Hugging Face config.json (or the directory holding one) instead of a preset."""
HF_HELP = "model=hf:PATH: a Hugging Face config.json (or the folder holding one) instead of a preset."
"""What every command's --help says beside its `model` option (help_text)."""


def hf_model_config(spec: str) -> ModelConfig:
    """`hf:PATH` → the ModelConfig of the Hugging Face config.json at PATH (a .json file or a directory with
    config.json; relative paths from the working directory, then from the repository root), named after the
    file (or directory). One-line ConfigError when it is missing or not representable."""
    import json
    from pathlib import Path

    from tspbench.hf.convert import model_config_from_hf

    raw = Path(spec.removeprefix(HF_PREFIX))
    candidates = [raw, CONF_DIR.parent / raw] if not raw.is_absolute() else [raw]
    for path in candidates:
        path = path / "config.json" if path.is_dir() else path
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise ConfigError(f"model={spec}: {path} is not JSON ({e.msg}, line {e.lineno})") from None
            name = path.parent.name if path.name == "config.json" else path.stem
            return model_config_from_hf(data, name=name)
    raise ConfigError(f"model={spec}: no such file; allowed: hf:PATH to a config.json or a directory holding one")


def model_from_name(name: str) -> ModelConfig:
    """A preset name (conf/model/NAME.yaml) or `hf:PATH` as a ModelConfig: what `model=` means in every command."""
    from tspbench.config import model_preset

    return hf_model_config(name) if name.startswith(HF_PREFIX) else model_preset(name)


def expand_hf_model(overrides: list[str]) -> list[str]:
    """Command-line overrides with `model=hf:PATH` replaced by one `model.FIELD=VALUE` per ModelConfig field (Hydra
    composes those onto the config's default preset, and later `model.FIELD=` overrides still apply)."""
    out: list[str] = []
    for o in overrides:
        key, sep, value = o.partition("=")
        if sep and key.lstrip("+~") == "model" and value.startswith(HF_PREFIX):
            cfg = hf_model_config(value)
            out += [f"model.{f.name}={_hydra_value(getattr(cfg, f.name))}" for f in dataclasses.fields(cfg)]
        else:
            out.append(o)
    return out


def _hydra_value(v: Any) -> str:
    """A value as a Hydra override writes it (a nested dataclass as a {key:value} dict)."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return "{" + ",".join(f"{f.name}:{_hydra_value(getattr(v, f.name))}" for f in dataclasses.fields(v)) + "}"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    return repr(v) if isinstance(v, float) else str(v)


def register() -> ConfigStore:
    """The schemas every config root shares (the `model` group is typed by ModelConfig)."""
    cs = ConfigStore.instance()
    cs.store(group="model", name="model_schema", node=ModelConfig)
    return cs


def compose(config_name: str, overrides: list[str]) -> Any:
    """Hydra's Compose API (no output directories, no @hydra.main) on conf/<config_name>.yaml → the typed
    object. Hydra's and OmegaConf's errors (a misspelt key, a value of the wrong type, an unknown preset)
    become a ConfigError with one line."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    overrides = expand_hf_model(overrides)  # model=hf:PATH (before Hydra, which knows only presets)
    try:
        with initialize_config_dir(str(CONF_DIR), version_base=None):
            cfg = hydra_compose(config_name, overrides=overrides)
        check_keys(cfg)
        obj = OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException) as e:
        try:
            line = explain(e, cfg_type(config_name))
        except Exception:  # noqa: BLE001 - explaining must never turn a user's mistake into a traceback
            line = one_line(e)
        raise ConfigError(line) from None
    check_declared(obj)  # each numeric field's declared Range, each Output path writable
    return obj


def cfg_type(config_name: str) -> type | None:
    """The schema class a config root is typed by (its `*_schema` default), for error messages."""
    import yaml
    from hydra.core.config_store import ConfigStore

    defaults = (yaml.safe_load((CONF_DIR / f"{config_name}.yaml").read_text()) or {}).get("defaults", [])
    repo = ConfigStore.instance().repo
    for d in defaults:
        if isinstance(d, str) and d.endswith("_schema") and f"{d}.yaml" in repo:
            return repo[f"{d}.yaml"].node._metadata.object_type
    return None


def check_keys(cfg: Any, prefix: str = "") -> None:
    """Hydra lets `+key=value` add a key the typed schema does not have, which the run then ignores: refuse
    it, naming the allowed keys (the closest first)."""
    from omegaconf import DictConfig, OmegaConf

    cls = OmegaConf.get_type(cfg)
    if not (isinstance(cfg, DictConfig) and cls is not None and dataclasses.is_dataclass(cls)):
        return
    allowed = [f.name for f in dataclasses.fields(cls)]
    for key in map(str, cfg.keys()):
        if key not in allowed:
            raise ConfigError(unknown_key(f"{prefix}{key}", allowed, prefix))
        hint = typing.get_type_hints(cls).get(key)
        if dataclasses.is_dataclass(hint):
            check_keys(cfg[key], f"{prefix}{key}.")
        elif typing.get_origin(hint) is dict and isinstance(cfg[key], DictConfig):  # scheme_opts.<name>
            for name in map(str, cfg[key].keys()):
                check_keys(cfg[key][name], f"{prefix}{key}.{name}.")


def unknown_key(key: str, allowed: list[str], prefix: str = "") -> str:
    import difflib

    leaf = key.rpartition(".")[2]
    near = difflib.get_close_matches(leaf, allowed, n=1)
    hint = f"did you mean {prefix}{near[0]}? " if near else ""
    return f"{key} is not a key: {hint}allowed: {', '.join(prefix + a for a in allowed)}"


def explain(e: BaseException, schema: type | None) -> str:
    """Hydra's multi-line composition errors → one line saying what to type instead."""
    import re

    text = str(e)
    first = one_line(e)
    m = re.search(r"Could not find '([^/']+)/([^']+)'", text)
    if m:
        group, name = m.groups()
        plus = "+" if group == "exp" else ""
        allowed = " | ".join(f"{plus}{group}={p}" for p in presets(group).split(" | "))
        return f"{plus}{group}={name} is unknown; allowed: {allowed}"
    m = re.search(r"Could not override '([^']+)'\. No match in the defaults list", text)
    if m:
        g = m.group(1)
        return f"{g} is a config group added with a '+': type +{g}=NAME (allowed: {presets(g)})"
    m = re.search(r"Could not override '([^']+)'", text)
    if m and schema is not None:
        key = m.group(1)
        head, _, _leaf = key.rpartition(".")
        cls: Any = schema
        for part in head.split(".") if head else []:
            cls = typing.get_type_hints(cls).get(part) if dataclasses.is_dataclass(cls) else None
            if typing.get_origin(cls) is dict:  # e.g. scheme_opts.<name>.<field>: names are the group's presets
                value = typing.get_args(cls)[1]
                names = presets(part) if (CONF_DIR / part).is_dir() else "..."
                fields = ", ".join(f.name for f in dataclasses.fields(value)) if dataclasses.is_dataclass(value) else ""
                return f"{key} is not a key: allowed: {part}.NAME.FIELD with NAME one of {names}" + (
                    f" and FIELD one of {fields}" if fields else ""
                )
        if cls is not None and dataclasses.is_dataclass(cls):
            return unknown_key(key, [f.name for f in dataclasses.fields(cls)], head + "." if head else "")
    m = re.search(r"Could not append to config\. An item is already at '([^']+)'", text)
    if m:
        return f"{m.group(1)} is already a key: drop the '+' (e.g. {m.group(1)}=VALUE)"
    m = re.match(r"Error merging override (([^=]+)=(.*))", first)
    if m and e.__cause__ is not None:
        override, key, value = m.groups()
        why = one_line(e.__cause__).rstrip(".")
        return f"{override}: {why}; {key.strip('+')} expects {expected(schema, key.strip('+'), value)}"
    return first


def expected(schema: type | None, key: str, value: str = "...") -> str:
    """What a field takes, in words (for a value that did not convert)."""
    cls: Any = schema
    hint: Any = None
    for part in key.split("."):
        if cls is None or not dataclasses.is_dataclass(cls):
            return "another type (see --help)"
        hint = typing.get_type_hints(cls).get(part)
        cls = hint
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (list, tuple):
        return f"a list in brackets, e.g. {key}=[{value}]"
    if args and type(None) in args:
        return _word(next(a for a in args if a is not type(None))) + " or null"
    return _word(hint)


def _word(t: Any) -> str:
    words = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    return words.get(t, getattr(t, "__name__", str(t)))


def one_line(e: BaseException) -> str:
    """The first non-empty line of an exception's message (Hydra's are multi-line)."""
    return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)


def hardware_name(hw: Any) -> str | None:
    """The profile's name whether the config holds a name or the `hardware/` group's dict."""
    if hw is None or isinstance(hw, str):
        return hw
    if isinstance(hw, dict):
        return hw.get("name")
    return getattr(hw, "name", None)


# ---------------------------------------------------------------------------------------------- --help
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass (the string literal right after each field), base classes
    included; a subclass's own docstring wins."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def help_text(
    prog: str,
    defaults: Any,
    intro: str,
    examples: list[str],
    groups: dict[str, str] | None = None,
    positional: str | None = None,
) -> str:
    """`--help` for a CLI whose options are the fields of the dataclass instance `defaults` (the config composed
    without overrides, so the values shown are the ones a run gets), nested dataclasses as prefix.field; the list
    field `positional` (bare arguments, e.g. report's paths) is shown as NAME ... ."""
    cls = type(defaults)
    bare = f" [{positional.upper()} ...]" if positional else ""
    lines = [
        f"usage: python -m {prog} [key=value ...]{bare}",
        "",
        intro.strip(),
        "",
        "options (key=value; every field of the typed config, with its default):",
    ]
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        default = getattr(defaults, f.name)
        if f.name == positional:
            lines.append(_row(f"{positional.upper()} ...", docs.get(f.name, "")))
            continue
        if dataclasses.is_dataclass(hints.get(f.name)):
            sub = hints[f.name]
            what = (groups or {}).get(f.name, "")
            what = _with_hf(what) if f.name == "model" else what
            lines.append(_row(f"{f.name}=NAME", (docs.get(f.name, "") + (" " + what if what else "")).strip()))
            sub_docs = field_docs(sub)
            for sf in dataclasses.fields(sub):
                lines.append(
                    _row(f"  {f.name}.{sf.name}={_show(getattr(default, sf.name))}", sub_docs.get(sf.name, ""))
                )
            continue
        what = (groups or {}).get(f.name, "")
        what = _with_hf(what) if f.name == "model" else what
        lines.append(_row(f"{f.name}={_show(default)}", (docs.get(f.name, "") + (" " + what if what else "")).strip()))
    if examples:
        lines += ["", "examples:", *(f"  {e}" for e in examples)]
    return "\n".join(lines) + "\n"


def _with_hf(what: str) -> str:
    """A `model` option's help tail (its presets, if any) followed by HF_HELP."""
    return f"{what.rstrip('.')}. {HF_HELP}" if what else HF_HELP


def _show(value: Any) -> str:
    """A value as it is typed on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(_show, value)) + "]"
    if isinstance(value, dict):
        return str(value.get("name", "{...}"))
    return str(value)


def _row(key: str, doc: str, width: int = 34) -> str:
    wrapped = textwrap.wrap(doc, 110 - width) or [""]
    first = f"  {key:<{width}} {wrapped[0]}" if len(key) < width else f"  {key}\n  {'':<{width}} {wrapped[0]}"
    return "\n".join([first, *(f"  {'':<{width}} {w}" for w in wrapped[1:])])


def presets(group: str) -> str:
    """The presets of a config group, e.g. "llama3_8b | llama7b | small | tiny"."""
    return " | ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))


def parse_options(cls: type[T], argv: list[str], positional: str | None = None) -> T:
    """`key=value` arguments → an instance of the dataclass `cls`, each value converted to its field's type (int,
    float, bool as true/false, str, lists as `a,b` or `[a,b]`, `null` for an optional field). Bare arguments fill
    the list field `positional` when the command has one; then every field against its declared Range and Output
    (config.check_declared). ConfigError with one line for anything else."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name != positional]  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    bare: list[str] = []
    for arg in argv:
        key, sep, raw = arg.partition("=")
        if not sep:
            if positional is None:
                raise ConfigError(f"{arg}: expected key=value; keys: {', '.join(names)}")
            bare.append(arg)
            continue
        if key not in names:
            raise ConfigError(unknown_key(key, names))
        values[key] = _convert(key, raw, hints[key])
    if positional is not None:
        values[positional] = bare
    obj = cls(**values)
    check_declared(obj)  # each numeric field's declared Range, each Output path writable
    return obj


def _convert(key: str, raw: str, hint: Any) -> Any:
    """One option's text as its field's type (the message names the field and what it takes)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if args and type(None) in args:  # X | None
        if raw in ("null", "none", ""):
            return None
        hint = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (list, tuple):
        items = [v.strip() for v in raw.strip("[]").split(",") if v.strip()]
        try:
            return [_scalar(v, args[0]) for v in items]
        except ValueError:
            plural, example = _PLURAL.get(args[0], (f"{_word(args[0])} values", "a,b"))
            raise ConfigError(f"{key}={raw!r} must be comma-separated {plural}, e.g. {key}={example}") from None
    try:
        return _scalar(raw, hint)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} must be {_word(hint)}") from None


_PLURAL = {int: ("integers", "1,2"), float: ("numbers", "0.5,1"), bool: ("true/false values", "true,false")}


def _scalar(raw: str, t: Any) -> Any:
    if t is bool:
        if raw.lower() not in ("true", "false"):
            raise ValueError(raw)
        return raw.lower() == "true"
    return t(raw)


def wants_help(argv: list[str]) -> bool:
    return any(a in ("-h", "--help") for a in argv)
