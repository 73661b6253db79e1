"""Each grid point's fate is decided once, by the pre-check, and everything after it reads the decision
(tspbench/run/fate.py): the dispatcher, the exit-2 rule and the fallback line. Config-level and the offline
paths only: the measured runner is replaced by a stub, so nothing here starts a rank (the real records of every
fate: tests/integration/test_runner.py::test_each_fate_is_what_the_spec_carries_and_the_record_says)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tspbench.run.fate as fate_mod
from tspbench.config import ConfigError
from tspbench.record.schema import base_record
from tspbench.record.spec import Fate, RunSpec
from tspbench.run import dispatch
from tspbench.run.checks import precheck
from tspbench.run.experiment import compose_experiment
from tspbench.run.grid import expand_grid
from tspbench.run.supervise import parent_record

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA devices: auto would measure")
QUIET = ["progress=false", "report=false", "model.n_layers=1", "seq_len=32"]


@pytest.fixture
def calls(monkeypatch) -> dict[str, int]:
    """Counts of the two questions a decision asks: is the layout valid, are the devices here."""
    n = {"validate_parallel": 0, "missing_devices": 0}
    validate, missing = fate_mod.validate_parallel, fate_mod.missing_devices

    def counted_validate(*a, **k):
        n["validate_parallel"] += 1
        return validate(*a, **k)

    def counted_missing(*a, **k):
        n["missing_devices"] += 1
        return missing(*a, **k)

    monkeypatch.setattr(fate_mod, "validate_parallel", counted_validate)
    monkeypatch.setattr(fate_mod, "missing_devices", counted_missing)
    return n


def _fake_measured(spec: RunSpec, run_dir, on_step=None) -> dict:
    return parent_record(Path(spec.results_file), base_record(spec, "ok"))


def test_a_grid_point_is_decided_once_from_precheck_to_records(tmp_path, calls, monkeypatch):
    """compose → precheck → run_all: one validate_parallel per grid point, at most one device count, none after
    the pre-check, and every record's provenance.config carries the decision its spec carried."""
    monkeypatch.setattr(dispatch, "run_measured", _fake_measured)
    exp = compose_experiment(["+exp=smoke", *QUIET, "schemes=[single,tp,tsp]", "degrees=[2,3]"])
    specs = precheck(exp)
    assert len(specs) == 5  # single; tp and tsp at degrees 2 and 3
    assert calls == {"validate_parallel": 5, "missing_devices": 3}  # single, tp d2, tsp d2: the valid ones
    decided = dict(calls)
    recs = dispatch.run_all(specs, tmp_path, progress=False, memory_check=False)
    assert calls == decided, "the dispatcher decided again"
    assert [(r["scheme"], r["degree"], r["status"]) for r in recs] == [
        ("single", 1, "ok"),
        ("tp", 2, "ok"),
        ("tp", 3, "invalid"),
        ("tsp", 2, "ok"),
        ("tsp", 3, "invalid"),
    ]
    for spec, rec in zip(specs, recs):
        assert rec["provenance"]["config"]["fate"] == {"kind": spec.fate.kind, "reason": spec.fate.reason}
        if spec.fate.kind == "refused":
            assert rec["reason"] == spec.fate.reason


def test_offline_fates_are_decided_once(tmp_path, calls):
    """execution=model: no device count at all; run_all writes the modelled records without deciding again."""
    specs = precheck(compose_experiment(["+exp=smoke", *QUIET, "schemes=[tp,tsp]", "execution=model"]))
    assert [s.fate for s in specs] == [Fate("model"), Fate("model")]
    recs = dispatch.run_all(specs, tmp_path, progress=False)
    assert calls == {"validate_parallel": 2, "missing_devices": 0}
    assert [(r["method"], r["status"]) for r in recs] == [("modelled", "ok"), ("modelled", "ok")]


def test_a_spec_that_skipped_the_precheck_is_decided_once_by_the_dispatcher(tmp_path, calls):
    specs = expand_grid(compose_experiment(["+exp=smoke", *QUIET, "schemes=[tp]", "execution=model"]))
    assert specs[0].fate is None
    (rec,) = dispatch.run_all(specs, tmp_path, progress=False)
    assert calls["validate_parallel"] == 1 and specs[0].fate == Fate("model")
    assert rec["provenance"]["config"]["fate"] == {"kind": "model", "reason": None}


def test_the_command_line_decides_once(calls):
    """precheck_argv (before Hydra) decides; the Hydra job takes those decisions instead of deciding again."""
    import tspbench.__main__ as entry

    argv = ["+exp=smoke", *QUIET, "schemes=[tp,tsp]", "execution=model"]
    assert entry.precheck_argv(argv) is None
    specs = entry._prechecked(compose_experiment(argv))
    assert calls["validate_parallel"] == len(specs) == 2 and all(s.fate == Fate("model") for s in specs)


@NO_CUDA
def test_the_refusal_and_the_fallback_line_come_from_the_decisions():
    auto = precheck(compose_experiment(["+exp=smoke", "schemes=[tp,tsp]", "degrees=[2,3]", "device=cuda"]))
    assert [s.fate.kind for s in auto] == ["estimate+model", "refused", "estimate+model", "refused"]
    assert auto[0].fate.reason.startswith("needs 2 cuda devices, found 0 (execution=auto")
    # the refused points are recorded invalid, not counted as estimated instead
    assert fate_mod.fallback_line(auto) == (
        "tspbench: 2 runs need up to 2 cuda devices that are not here: estimating them (fake tensors) and "
        "modelling them (hardware profile h100) instead"
    )
    decode = precheck(compose_experiment(["+exp=smoke", "schemes=[tsp]", "device=cuda", "mode=decode"]))
    assert [s.fate.kind for s in decode] == ["model"]
    assert "runs need up to 2 cuda devices that are not here: modelling them" in fate_mod.fallback_line(decode)
    assert fate_mod.fallback_line(precheck(compose_experiment(["+exp=smoke", "execution=model"]))) is None

    measure = expand_grid(compose_experiment(["+exp=smoke", "schemes=[tp,tsp]", "device=cuda", "execution=measure"]))
    with pytest.raises(ConfigError) as e:
        precheck(compose_experiment(["+exp=smoke", "schemes=[tp,tsp]", "device=cuda", "execution=measure"]))
    first = fate_mod.decide(measure[0])
    assert (
        first.kind == "refused"
        and str(e.value) == f"no grid point can run: {first.reason} (and 1 more grid point(s) refused)"
    )


def test_the_decision_travels_in_the_spec_json_and_is_not_identity():
    overrides = ["+exp=smoke", "schemes=[single,tp]", "degree=3", "execution=model"]
    tp = precheck(compose_experiment(overrides))[1]
    assert tp.fate is not None and tp.fate.kind == "refused"
    assert RunSpec.from_json(tp.to_json()).fate == tp.fate  # what the worker reads
    undecided = expand_grid(compose_experiment(overrides))[1]
    assert undecided.fate is None and undecided.run_id == tp.run_id
    assert RunSpec.from_json(undecided.to_json()).fate is None


def test_model_fields_added_later_keep_old_run_ids_at_their_defaults():
    """RoPE scaling, tied embeddings and the sliding window entered ModelConfig after records were written: at their
    defaults they stay out of the run id (the smoke experiment's ids are the ones computed before them, so resume finds
    old records); a non-default value changes the id."""
    from dataclasses import replace

    from tspbench.record.spec import make_run_id
    from tspbench.run.experiment import compose_experiment
    from tspbench.run.grid import expand_grid

    specs = expand_grid(compose_experiment(["+exp=smoke"]))
    assert [s.run_id for s in specs[:3]] == [
        "single-d1-s128-b1-train-6217da25cb",  # computed by the code before the fields existed
        "tp-d2-s128-b1-train-75ac623473",
        "tp_msp-d2-s128-b1-train-4962fb798c",
    ]
    tied = replace(specs[0], model={**specs[0].model, "tie_embeddings": True})
    assert make_run_id(tied) != specs[0].run_id
