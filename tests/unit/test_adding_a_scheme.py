"""docs/adding-a-scheme.md: every registered scheme has each of the six pieces a scheme needs, and its layout fields
round-trip through the worker's spec and the records; a scheme registered without them is caught."""

from __future__ import annotations

import importlib
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest

from tspbench.config import ConfigError, ModelConfig
from tspbench.parallel import (
    RECOMPUTE,
    SCHEME_REGISTRY,
    SCHEMES,
    SP_VARIANTS,
    VOCAB,
    LayoutOptions,
    ParallelConfig,
    Scheme,
    layout_fields,
    layouts,
    scheme,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
MODEL = ModelConfig(name="probe", vocab_size=96, dim=96, n_layers=2, n_heads=12, n_kv_heads=12, ffn_hidden=192)
"""Heads, channels and vocabulary divisible by 2, 3 and 4, so every scheme runs at those degrees."""
LAYOUT_FIELDS = {f.name for f in fields(ParallelConfig)}
EVERY_OPTION = LayoutOptions(sp_variants=SP_VARIANTS, msps=(True, False), vocabs=VOCAB, kv_bucket_heads=(0, 1))


def _scheme_file(s: Scheme) -> str | None:
    try:
        module = importlib.import_module(f"tspbench.schemes.{s.name}")
    except ModuleNotFoundError:
        return f"tspbench/schemes/{s.name}.py: no such module"
    return None if callable(getattr(module, "apply", None)) else f"tspbench/schemes/{s.name}.py: no apply()"


def _entry(s: Scheme) -> str | None:
    bad = [o for o in s.options if o not in LAYOUT_FIELDS] + [v for v in s.vocabs if v not in VOCAB]
    if not (s.title and s.summary and s.role in ("reference", "baseline", "method")) or bad:
        return f"tspbench/parallel/registry.py: {s.name}'s entry is incomplete ({bad or 'title/summary/role'})"
    return None


def _conf(s: Scheme) -> str | None:
    from tspbench.run.experiment import compose_experiment

    if not (ROOT / "conf" / "scheme_opts" / f"{s.name}.yaml").is_file():
        return f"conf/scheme_opts/{s.name}.yaml: missing"
    if s.name not in compose_experiment([]).scheme_opts:
        return f"conf/scheme_opts/{s.name}.yaml: not read by the experiment config"
    return None


def _parity(s: Scheme) -> str | None:
    from parity_cases import ALL

    mine = [(w, b) for w, vc, b in ALL.values() if vc.scheme == s.name]
    worlds = {w for w, b in mine if b is None}
    need = {4} if s.single_device else {2, 3, 4}  # the reference runs at degree 1 (dp replicas)
    if not need <= worlds or not any(b for _, b in mine):
        return f"tests/parity_cases.py: {s.name} lacks cases at D in {sorted(need - worlds)} or a broken variant"
    return None


def _cost_model(s: Scheme) -> str | None:
    from tspbench.predict.costmodel import (
        Workload,
        comm_per_layer,
        geometry,
        layer_collectives,
        load_hardware,
        memory_breakdown,
        step_time,
    )

    work, hw = Workload(MODEL, 48, 1, mode="train"), load_hardware("h100")
    for degree in [1] if s.single_device else [2, 4]:
        par = ParallelConfig(scheme=s.name, degree=degree)
        try:
            geometry(par, work)
            comm = comm_per_layer(par, work)
            layer_collectives(par, work)
            memory_breakdown(par, work)
            step_time(par, work, hw)
        except (ValueError, KeyError, AssertionError) as e:
            return f"tspbench/predict/costmodel/: {s.name} at degree {degree}: {type(e).__name__}: {e}"
        if not s.single_device and comm["fwd_total"] <= 0:
            return f"tspbench/predict/costmodel/comm.py: {s.name} communicates nothing at degree {degree}"
    return None


def _method_doc(s: Scheme) -> str | None:
    naming = (ROOT / "docs" / "method.md").read_text().split('<a id="naming"></a>', 1)[1].split("<a id=", 1)[0]
    return None if f"| `{s.name}` |" in naming else f"docs/method.md#naming: no row for `{s.name}`"


def missing_pieces(s: Scheme) -> list[str]:
    """What docs/adding-a-scheme.md asks of a scheme that `s` lacks (empty: nothing)."""
    checks = (_scheme_file, _entry, _conf, _parity, _cost_model, _method_doc)
    return [why for check in checks if (why := check(s))]


@pytest.mark.parametrize("name", SCHEMES)
def test_every_registered_scheme_has_its_six_pieces(name):
    assert missing_pieces(scheme(name)) == []


@pytest.mark.parametrize("name", SCHEMES)
def test_layout_fields_round_trip(name):
    """Every layout of the scheme (every value of every option it takes) through the worker's spec JSON and a
    record, and back."""
    from tspbench.record.schema import base_record
    from tspbench.record.spec import RunSpec

    degrees = [1] if scheme(name).single_device else [2, 4]
    base = [p for d in degrees for p in layouts(d, schemes=[name], options=EVERY_OPTION)]
    pars = [replace(p, recompute=rc, dp=dp) for p in base for rc in RECOMPUTE for dp in (1, 2)]
    assert pars
    for par in pars:
        spec = RunSpec(
            **{f: getattr(par, f) for f in LAYOUT_FIELDS},
            experiment="x",
            seq_len=48,
            batch=1,
            mode="train",
            dtype="float32",
            device="cpu",
            execution="model",
            hardware=None,
            model={},
        )
        back = RunSpec.from_json(spec.to_json())
        assert back.parallel() == par
        rec = base_record(back, "ok")
        assert ParallelConfig.from_record(rec).key() == par.key() and layout_fields(par).items() <= rec.items()


def test_a_scheme_without_its_pieces_is_caught():
    """Non-vacuity: a scheme entered in the registry and nowhere else lacks all six."""
    fake = replace(scheme("sp"), name="fake_sp", title="", summary="")
    SCHEME_REGISTRY[fake.name] = fake
    try:
        missing = missing_pieces(fake)
    finally:
        del SCHEME_REGISTRY[fake.name]
    where = "tspbench/schemes/", "conf/scheme_opts/"  # split: this file does not cite paths that must not exist
    assert [m.split(":", 1)[0] for m in missing] == [
        where[0] + "fake_sp.py",
        "tspbench/parallel/registry.py",
        where[1] + "fake_sp.yaml",
        "tests/parity_cases.py",
        "tspbench/predict/costmodel/",
        "docs/method.md#naming",
    ], missing
    with pytest.raises(ConfigError):
        scheme("fake_sp")
