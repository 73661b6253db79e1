"""Inputs checked where they are declared (config.Range, config.Output, the published rows' typed schema): every bad
input of each kind gets one line naming the field (or the file and line) and exit code 2 at every entry point that
takes it, before any work: the work each command would do next is replaced by a failure here. Valid input runs as
before (tests/unit/test_experiment_inputs.py, test_plan.py, test_validate.py)."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from tspbench import estimate, gpu_check, headline, plan, validate
from tspbench.__main__ import precheck_argv
from tspbench.config import ConfigError, ModelConfig, Output, Range, RopeScaling, check_writable
from tspbench.parallel import ParallelConfig
from tspbench.predict import published
from tspbench.report import __main__ as report
from tspbench.run.experiment import ExperimentConfig, FaultConfig, SchemeOptions
from tspbench.verify import __main__ as verify
from tspbench.verify.case import VerifyConfig

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from published_rows import BASE  # noqa: E402


def no_work(*_a, **_k):
    pytest.fail("the command started its work on refused input")


@pytest.fixture
def idle(monkeypatch):
    """Each command's work replaced by a failure: a refusal must come before it."""
    import tspbench.predict.estimate as est
    import tspbench.predict.gpu_check as gc

    monkeypatch.setattr(verify, "run_cases", no_work)
    monkeypatch.setattr(est, "estimate", no_work)
    monkeypatch.setattr(plan, "plan", no_work)
    monkeypatch.setattr(plan, "fit_main", no_work)
    monkeypatch.setattr(validate, "record", no_work)
    monkeypatch.setattr(headline, "headline_markdown", no_work)
    monkeypatch.setattr(headline, "changes_markdown", no_work)
    monkeypatch.setattr(gc, "memory_checks", no_work)
    monkeypatch.setattr(report, "read_all", no_work)
    monkeypatch.setattr(report, "build_report", no_work)


MAINS = {
    "tspbench.verify": verify.main,
    "tspbench.estimate": estimate.main,
    "tspbench.plan": plan.main,
    "tspbench.validate": validate.main,
    "tspbench.headline": headline.main,
    "tspbench.gpu_check": gpu_check.main,
    "tspbench.report": report.main,
}


def refused(name: str, argv: list[str], capsys) -> str:
    """Run the command in-process (`tspbench` itself: its pre-check, what runs before Hydra starts); its one line."""
    if name == "tspbench":
        line = precheck_argv(["+exp=smoke", *argv])
        assert line is not None and "\n" not in line, line
        return line
    rc = MAINS[name](argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith(f"{name}: ") and "Traceback" not in err, (rc, err)
    return err.strip()


# (entry point, arguments, what the one line must say)
OUT_OF_RANGE = [
    ("tspbench", ["seq_len=-1"], "seq_len=-1 must be ≥ 1"),
    ("tspbench", ["seq_lens=[64,-8]"], "seq_lens=[64, -8]: every value must be ≥ 1"),
    ("tspbench", ["degree=0"], "degree=0 must be ≥ 1"),
    ("tspbench", ["degrees=[2,0]"], "degrees=[2, 0]: every value must be ≥ 1"),
    ("tspbench", ["batch=0"], "batch=0 must be ≥ 1"),
    ("tspbench", ["batches=[-1]"], "batches=[-1]: every value must be ≥ 1"),
    ("tspbench", ["dp=0"], "dp=0 must be ≥ 1"),
    ("tspbench", ["timeout_s=-1"], "timeout_s=-1.0 must be > 0"),
    ("tspbench", ["measured_steps=0"], "measured_steps=0 must be ≥ 1"),
    ("tspbench", ["control_port=80"], "control_port=80 must be in 1024..65535"),
    ("tspbench", ["model.n_layers=0"], "model.n_layers=0 must be ≥ 1"),
    ("tspbench", ["scheme_opts.tsp.kv_bucket_heads=[-1]"], "scheme_opts.tsp.kv_bucket_heads=[-1]: every value"),
    ("tspbench", ["faults.rank=-1"], "faults.rank=-1 must be ≥ 0"),
    ("tspbench.verify", ["seq_len=-4"], "seq_len=-4 must be ≥ 1"),
    ("tspbench.verify", ["seq_len=0"], "seq_len=0 must be ≥ 1"),
    ("tspbench.verify", ["degree=0"], "degree=0 must be ≥ 1"),
    ("tspbench.verify", ["batch=-2"], "batch=-2 must be ≥ 1"),
    ("tspbench.verify", ["dp=0"], "dp=0 must be ≥ 1"),
    ("tspbench.verify", ["decode_steps=-1"], "decode_steps=-1 must be ≥ 0 (0: training parity)"),
    ("tspbench.verify", ["model.dim=-64"], "model.dim=-64 must be ≥ 1"),
    ("tspbench.estimate", ["seq_len=-4096"], "seq_len=-4096 must be ≥ 1"),
    ("tspbench.estimate", ["degree=0"], "degree=0 must be ≥ 1"),
    ("tspbench.estimate", ["batch=0"], "batch=0 must be ≥ 1"),
    ("tspbench.estimate", ["rank=-1"], "rank=-1 must be ≥ 0"),
    ("tspbench.plan", ["seq_len=-131072"], "seq_len=-131072 must be ≥ 1"),
    ("tspbench.plan", ["seq_len=0"], "seq_len=0 must be ≥ 1"),
    ("tspbench.plan", ["gpus=0"], "gpus=0 must be ≥ 1"),
    ("tspbench.plan", ["max_degree=-8"], "max_degree=-8 must be ≥ 1"),
    ("tspbench.plan", ["batches=1,0"], "batches=[1, 0]: every value must be ≥ 1"),
    ("tspbench.plan", ["dp_shards=0"], "dp_shards=[0]: every value must be ≥ 1"),
    ("tspbench.plan", ["kv_bucket_heads=-1"], "kv_bucket_heads=[-1]: every value must be ≥ 0"),
    ("tspbench.plan", ["top=0"], "top=0 must be ≥ 1"),
    ("tspbench.plan", ["fit", "seq_len=-1", "family=llama2"], "seq_len=-1 must be ≥ 1"),
    ("tspbench.plan", ["fit", "gpus=0"], "gpus=0 must be ≥ 1"),
]
EMPTY = [
    ("tspbench", ["seq_lens=[]"], "seq_lens=[] is empty; allowed: one or more values, each ≥ 1"),
    ("tspbench", ["degrees=[]"], "degrees=[] is empty"),
    ("tspbench", ["batches=[]"], "batches=[] is empty"),
    ("tspbench", ["scheme=tp_sp", "scheme_opts.tp_sp.tps=[]"], "scheme_opts.tp_sp.tps=[] is empty"),
    ("tspbench", ["schemes=[]"], "the grid has no point (schemes=[]"),
    ("tspbench", ["modes=[]"], "the grid has no point"),
    ("tspbench.plan", ["batches="], "batches=[] is empty; allowed: one or more values, each ≥ 1"),
    ("tspbench.plan", ["batches=[]"], "batches=[] is empty"),
    ("tspbench.plan", ["kv_bucket_heads="], "kv_bucket_heads=[] is empty"),
    ("tspbench.plan", ["dp_shards=[]"], "dp_shards=[] is empty"),
]
NOT_A_NUMBER = [
    ("tspbench", ["seq_len=long"], "seq_len=long: Value 'long' of type 'str' could not be converted to Integer"),
    ("tspbench", ["degrees=[2,x]"], "degrees=[2,x]"),
    ("tspbench", ["timeout_s=soon"], "timeout_s expects a number"),
    ("tspbench.verify", ["seq_len=long"], "seq_len expects an integer"),
    ("tspbench.verify", ["degree=2.5"], "degree expects an integer"),
    ("tspbench.estimate", ["batch=one"], "batch expects an integer"),
    ("tspbench.plan", ["seq_len=long"], "seq_len='long' must be an integer"),
    ("tspbench.plan", ["gpus=8.5"], "gpus='8.5' must be an integer"),
    ("tspbench.plan", ["batches=1,two"], "batches='1,two' must be comma-separated integers"),
]


@pytest.mark.parametrize(
    "name,argv,needle",
    OUT_OF_RANGE + EMPTY + NOT_A_NUMBER,
    ids=[f"{n} {' '.join(a)}" for n, a, _ in OUT_OF_RANGE + EMPTY + NOT_A_NUMBER],
)
def test_a_bad_number_gets_one_line_before_any_work(name, argv, needle, capsys, idle):
    assert needle in refused(name, argv, capsys)


def test_an_empty_axis_exits_2_with_one_line_and_no_directory(tmp_path):
    """The command itself (`seq_lens=[]` ran zero points and exited 0): exit 2, one line, nothing written."""
    p = subprocess.run(
        [sys.executable, "-m", "tspbench", "+exp=smoke", "seq_lens=[]"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and p.stderr == "tspbench: seq_lens=[] is empty; allowed: one or more values, each ≥ 1\n"
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------ output paths
@pytest.fixture
def blocked(tmp_path: Path) -> Path:
    """A regular file: no path under it can be written (whoever runs the test, root included)."""
    f = tmp_path / "a_file"
    f.write_text("x")
    return f


def output_cases(blocked: Path, readme: Path) -> list[tuple[str, list[str], str]]:
    under, folder = f"{blocked}/sub/out.jsonl", str(blocked.parent)
    return [
        ("tspbench", [f"hydra.run.dir={blocked}/run"], f"hydra.run.dir={blocked}/run cannot be written: {blocked} is"),
        ("tspbench", ["-m", f"hydra.sweep.dir={blocked}/s"], f"hydra.sweep.dir={blocked}/s cannot be written"),
        ("tspbench", [f"resume_dir={blocked}"], f"resume_dir={blocked} is not a directory; allowed: the directory of"),
        ("tspbench", [f"resume_dir={blocked}/no"], f"resume_dir={blocked}/no does not exist; allowed: the directory"),
        ("tspbench.plan", [f"out={under}"], f"out={under} cannot be written: {blocked} is not a directory"),
        ("tspbench.plan", [f"out={folder}"], f"out={folder} is not a file; allowed: a file path under a writable"),
        ("tspbench.plan", ["fit", f"out={under}"], f"out={under} cannot be written"),
        ("tspbench.validate", [f"out={under}"], f"out={under} cannot be written"),
        ("tspbench.validate", [f"peers_out={folder}"], f"peers_out={folder} is not a file"),
        ("tspbench.report", [f"out={under}", str(readme)], f"out={under} cannot be written"),
        ("tspbench.headline", [f"readme={under}"], f"readme={under} does not exist; allowed: the README to rewrite"),
        ("tspbench.headline", [f"readme={folder}"], f"readme={folder} is not a file"),
        ("tspbench.gpu_check", [f"calibration_out={blocked}"], f"calibration_out={blocked} is not a directory"),
        ("tspbench.gpu_check", [f"calibration_out={blocked}/x"], f"calibration_out={blocked}/x cannot be written"),
    ]


def test_an_output_path_that_cannot_be_written_gets_one_line_before_any_work(blocked, capsys, idle):
    readme = blocked.parent / "README.md"
    readme.write_text("x")
    for name, argv, needle in output_cases(blocked, readme):
        assert needle in refused(name, argv, capsys), (name, argv)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_read_only_directory_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match=r"out=.* cannot be written: .* is not writable"):
            check_writable("out", str(ro / "x.jsonl"))
    finally:
        ro.chmod(0o700)


def test_a_writable_output_path_passes_and_nothing_is_left_behind(tmp_path):
    check_writable("out", str(tmp_path / "new" / "deeper" / "x.jsonl"))
    check_writable("calibration_out", str(tmp_path), Output(dir=True))
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------------------------------- published rows
def rows_file(tmp_path: Path, rows: list, models: dict | None = None) -> Path:
    path = tmp_path / "rows.yaml"
    doc = ({"models": models} if models else {}) | {"rows": [copy.deepcopy(r) for r in rows]}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def line_of(path: Path, text: str, nth: int = 1) -> int:
    """The 1-based line of the nth line of `path` containing `text`."""
    hits = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    return hits[nth - 1]


M = BASE["measured"]
MALFORMED = [
    # (name, rows, models, (text on the line named, nth), what the line says)
    ("wrong type", [BASE | {"gpus": "four"}], None, ("gpus:", 1), "row x: gpus='four' is not an integer"),
    (
        "wrong type of a number",
        [BASE | {"measured": {"step_s": "fast"}}],
        None,
        ("step_s", 1),
        "step_s='fast' is not a number",
    ),
    ("wrong type in the model", [BASE | {"model": BASE["model"] | {"dim": "wide"}}], None, ("dim:", 1), "model.dim"),
    ("wrong type of a mapping", [BASE | {"layout": "fsdp"}], None, ("layout:", 1), "layout='fsdp' is not a mapping"),
    ("duplicate id", [BASE, BASE | {"subset": "validation"}], None, ("- id: x", 2), "row x: id is already used at"),
    ("unknown quantity", [BASE | {"measured": {"tokens_per_sec": 3.0}}], None, ("tokens_per_sec", 1), "not a"),
    ("non-positive measurement", [BASE | {"measured": {"peak_mem_gib": 0}}], None, ("peak_mem_gib", 1), "> 0"),
    ("negative measurement", [BASE | {"measured": M | {"step_s": -1.5}}], None, ("step_s", 1), "step_s=-1.5 must"),
    ("non-positive seq_len", [BASE | {"seq_len": 0}], None, ("seq_len:", 1), "row x: seq_len=0 must be ≥ 1"),
    ("zero degree", [BASE | {"layout": {"scheme": "tp", "degree": 0}}], None, ("degree:", 1), "layout.degree=0"),
    ("unknown field", [BASE | {"gpu": 4}], None, ("gpu:", 1), "row x: gpu is not a field; allowed: id, source"),
    ("unknown layout key", [BASE | {"layout": {"degre": 2}}], None, ("degre", 1), "layout.degre is not a field"),
    ("missing field", [{k: v for k, v in BASE.items() if k != "gpus"}], None, ("- id: x", 1), "missing field(s) gpus"),
    ("bad model in the table", [BASE | {"model": "m"}], {"m": {"dim": -1}}, ("dim:", 1), "models.m.dim=-1 must"),
    ("unknown model", [BASE | {"model": "nope"}], {"m": {"dim": 64}}, ("model: nope", 1), "model='nope' is not"),
]


@pytest.mark.parametrize("name,rows,models,at,needle", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_published_file_names_the_file_and_line(name, rows, models, at, needle, tmp_path, capsys, idle):
    path = rows_file(tmp_path, rows, models)
    with pytest.raises(ConfigError) as e:
        published.load_rows([path])
    assert str(e.value).startswith(f"{path}:{line_of(path, *at)}: ") and needle in str(e.value), str(e.value)
    assert refused("tspbench.validate", [str(path), f"out={tmp_path / 'v.jsonl'}"], capsys).endswith(str(e.value))


@pytest.mark.parametrize(
    "text,line,needle",
    [
        ("rows:\n  - id: x\n    gpus: [1,\n  oops: :\n", 4, "not YAML"),
        ("rows:\n  - id: x\n\tgpus: 4\n", 3, "not YAML"),
        ("- id: x\n", 1, "not a mapping; allowed: a mapping of models:"),
        ("rows: []\n", 1, "no rows"),
        ("models: {}\n", 1, "no rows"),
        ("rowz:\n  - id: x\n", 1, "rowz is not a key"),
        ("rows:\n  - just text\n", 2, "row #0: 'just text' is not a mapping"),
    ],
)
def test_a_file_that_is_no_rows_file_names_the_file_and_line(text, line, needle, tmp_path, capsys, idle):
    path = tmp_path / "rows.yaml"
    path.write_text(text)
    said = refused("tspbench.validate", [str(path), f"out={tmp_path / 'v.jsonl'}"], capsys)
    assert f"tspbench.validate: {path}:{line}: " in said and needle in said, said


def test_a_duplicate_id_across_files_names_both(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    first, second = rows_file(a, [BASE]), rows_file(b, [BASE])
    with pytest.raises(ConfigError, match=rf"^{second}:2: row x: id is already used at {first}:2; allowed: a unique"):
        published.load_rows([first, second])


def test_the_shipped_rows_pass_the_schema():
    rows = published.load_rows(published.default_files())
    assert len({r.id for r in rows}) == len(rows) and all(all(v > 0 for v in r.measured.values()) for r in rows)


# ------------------------------------------------------------------------------------------ declarations
CONFIGS = [
    ExperimentConfig,
    FaultConfig,
    SchemeOptions,
    ModelConfig,
    RopeScaling,
    ParallelConfig,
    VerifyConfig,
    estimate.EstimateConfig,
    plan.PlanConfig,
    validate.ValidateConfig,
    headline.HeadlineConfig,
    gpu_check.GpuCheckConfig,
    report.ReportConfig,
    published.Row,
]
NUMBERS = (int, float, int | None, float | None, list[int], list[float])


@pytest.mark.parametrize("cls", CONFIGS, ids=[c.__name__ for c in CONFIGS])
def test_every_numeric_option_declares_its_range_and_every_output_path_is_declared(cls):
    """What the checks read: a Range beside each numeric field's type, an Output beside each path written."""
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        base, rules = (typing.get_args(hint)[0], hint.__metadata__) if hasattr(hint, "__metadata__") else (hint, ())
        if base in NUMBERS:
            assert any(isinstance(r, Range) for r in rules), f"{cls.__name__}.{f.name} declares no Range"
        if f.name in ("out", "peers_out", "readme", "calibration_out", "resume_dir"):
            assert any(isinstance(r, Output) for r in rules), f"{cls.__name__}.{f.name} declares no Output"


def test_defaults_and_shipped_models_pass():
    """No refusal for what runs today: the commands' defaults and the shipped models (the shipped experiments:
    tests/unit/test_experiment_inputs.py)."""
    from tspbench.config import check_declared, model_preset

    for cls in (ModelConfig, ParallelConfig, VerifyConfig, plan.PlanConfig, validate.ValidateConfig):
        check_declared(cls())
    for p in sorted((ROOT / "conf" / "model").glob("*.yaml")):
        check_declared(model_preset(p.stem))
    assert verify.compose([]).seq_len > 0 and estimate.compose([]).seq_len > 0
