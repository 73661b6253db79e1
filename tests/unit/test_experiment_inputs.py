"""The experiment CLI (`python -m tspbench`) refuses what cannot be meant with one line naming the field and
the allowed values, before Hydra makes a directory and before any rank starts; verify's spellings mean the same
here; exit codes count grid points; `python -m tspbench.report` never builds a silent empty report. Config-level
only: nothing here starts a rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tspbench.__main__ import precheck_argv
from tspbench.record.schema import current_records
from tspbench.record.spec import RunSpec
from tspbench.run.checks import grid_outcome, precheck
from tspbench.run.experiment import compose_experiment
from tspbench.run.grid import expand_grid
from tspbench.run.memfit import memory_refusal

ROOT = Path(__file__).resolve().parents[2]
HARDWARE = " | ".join(f"hardware={p.stem}" for p in sorted((ROOT / "conf" / "hardware").glob("*.yaml")))
"""Every profile conf/hardware holds, as the refusal lists them (derived: adding a profile changes no test)."""

# (command line, the one line it must get): the tally of bad inputs
BAD = [
    (["+exp=smoke", "+seq_lenn=128"], "seq_lenn is not a key: did you mean seq_len? allowed: exp_name,"),
    (["+exp=smoke", "sheme=tsp"], "sheme is not a key: did you mean scheme?"),
    (["+exp=smoke", "model.n_layer=1"], "model.n_layer is not a key: did you mean model.n_layers?"),
    (["+exp=smoke", "scheme=zig"], "scheme='zig' is unknown; allowed: single, tp, tp_msp, sp, tp_sp, fsdp_sp, tsp"),
    (["+exp=smoke", "vocab=ring"], "vocab=ring is a tsp option; use scheme=tsp vocab=ring"),
    (["+exp=smoke", "scheme=tsp", "vocab=sharded"], "vocab='sharded' is unknown; allowed: auto, replicated, ring"),
    (["+exp=smoke", "sp_variant=ulyses"], "sp_variant='ulyses' is unknown; allowed: allgather, ring, ulysses"),
    (["+exp=smoke", "recompute=partial"], "recompute='partial' is unknown; allowed: none, selective, full"),
    (["+exp=smoke", "scheme=tp", "tp=2"], "tp=2 is a tp_sp option; add tp_sp to the schemes"),
    (["+exp=smoke", "scheme=tp_sp", "degree=4", "tp=3"], "tp=3: T=3 is not a proper divisor of degree=4; allowed"),
    (["+exp=smoke", "scheme_opts.tp_sp.tps=[3]", "degree=4"], "tps=[3]: T=3 is not a proper divisor of degree=4"),
    (["+exp=smoke", "resume_dir=/nonexistent/run"], "resume_dir=/nonexistent/run does not exist"),
    (["+exp=smoke", "degree=0"], "degree=0 must be ≥ 1"),
    (["+exp=smoke", "degrees=[2,0]"], "degrees=[2, 0]: every value must be ≥ 1"),
    (["+exp=smoke", "dp=0"], "dp=0 must be ≥ 1"),
    (["+exp=smoke", "batch=0"], "batch=0 must be ≥ 1"),
    (["+exp=smoke", "seq_len=-1"], "seq_len=-1 must be ≥ 1"),
    (["+exp=smoke", "seq_lens=[]"], "seq_lens=[] is empty; allowed: one or more values, each ≥ 1"),
    (["+exp=smoke", "scheme=tp", "degree=3"], "no grid point can run: model.n_heads=8 must be divisible"),
    (["+exp=smoke", "scheme=tp", "model.vocab_size=255"], "no grid point can run: model.vocab_size=255"),
    (["+exp=smoke", "device=cuda", "execution=measure"], "no grid point can run: needs"),
    (["+exp=smoke", "device=tpu"], "device='tpu' is unknown; allowed: auto, cpu, cuda"),
    (["+exp=smoke", "model=foo"], "model=foo is unknown; allowed: model=llama3_8b | model=llama7b"),
    (["+exp=smok"], "+exp=smok is unknown; allowed: +exp=llama7b"),
    (["exp=smoke"], "exp is a config group added with a '+': type +exp=NAME"),
    (["+exp=smoke", "hardware=h1"], f"hardware=h1 is unknown; allowed: {HARDWARE}"),
    (["+exp=smoke", "seq_len=abc"], "seq_len=abc: Value 'abc' of type 'str' could not be converted to Integer"),
    (["+exp=smoke", "schemes=tsp"], "schemes expects a list in brackets, e.g. schemes=[tsp]"),
    (["+exp=smoke", "progress=maybe"], "progress expects true or false"),
    (["+exp=smoke", "seq_len=64,128"], "seq_len=64,128 is a sweep: add -m"),
    (["-m", "+exp=smoke", "seq_len=64,0"], "seq_len=0 must be ≥ 1 (in the sweep's point"),
    (["+exp=smoke", "+vocab=ring"], "vocab=ring is a tsp option"),
    (["+exp=smoke", "decode_steps=4"], "decode_steps is a `python -m tspbench.verify` key; in an experiment: mode"),
    (["+exp=smoke", "scheme_opts.foo.vocabs=[auto]"], "allowed: scheme_opts.NAME.FIELD with NAME one of"),
    (["+exp=smoke", "+scheme_opts.tp.foo=1"], "scheme_opts.tp.foo is not a key: allowed: scheme_opts.tp.sp_variants"),
    (["+exp=smoke", "faults.kindd=crash"], "faults.kindd is not a key: did you mean faults.kind?"),
    (["+exp=smoke", "faults=boom"], "faults=boom is unknown; allowed: faults=crash | faults=hang"),
    (["+exp=smoke", "model.n_heads=3"], "no grid point can run: model.dim=64 must be divisible by model.n_heads=3"),
    (["+exp=smoke", "scheme=tp_sp", "degrees=[4,8]", "tp=3"], "tp=3: T=3 is not a proper divisor of degree=4"),
    (["+exp=smoke", "mode=decode", "execution=estimate"], "mode=decode cannot be estimated"),
    (["+exp=smoke", "paper_tables=[memroy]"], "paper_tables='memroy' is unknown; allowed: memory, throughput"),
    (["+exp=smoke", "nodes=0"], "nodes=0 must be ≥ 1 (1: this machine; N > 1: a Slurm allocation of N nodes)"),
    (["+exp=smoke", "nodes=2", "gpus_per_node=0"], "gpus_per_node=0 must be ≥ 1"),
    (["+exp=smoke", "nodes=two"], "nodes=two: Value 'two' of type 'str' could not be converted to Integer"),
    (
        ["+exp=smoke", "scheme=tsp", "degree=8", "nodes=2", "gpus_per_node=2"],
        "no grid point can run: dp × degree = 8 ranks neither spans nodes=2 × gpus_per_node=2 = 4 nor fits one node; "
        "allowed: dp × degree = 4, or ≤ 2",
    ),
    (["--config-name", "verify"], "--config-name=verify names a config that is not an experiment; allowed:"),
    (["--config-name=nosuch"], "--config-name=nosuch is unknown in"),
    (["-cn", "config", "+exp=smoke", "degree=0"], "degree=0 must be ≥ 1"),
    (["--config-name", "config", "+exp=smoke", "sheme=tsp"], "sheme is not a key: did you mean scheme?"),
    (["-m", "-cn=config", "+exp=smoke", "seq_len=64,0"], "seq_len=0 must be ≥ 1 (in the sweep's point"),
    (
        ["--config-path", "/nonexistent/conf", "--config-name", "x"],
        "--config-path=/nonexistent/conf is not a directory",
    ),
]


@pytest.mark.parametrize("argv,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_gets_one_line(argv, needle):
    line = precheck_argv(argv)
    assert line is not None and "\n" not in line and needle in line, line


@pytest.mark.parametrize("name", ["smoke", "llama7b", "microbatch", "paper_memory", "paper_throughput", "serving"])
def test_every_shipped_experiment_passes(name):
    assert precheck_argv([f"+exp={name}"]) is None


def test_good_inputs_pass():
    for argv in (
        ["+exp=smoke", "scheme=tsp", "vocab=ring"],
        ["-m", "+exp=smoke", "seq_len=64,128"],
        ["-m", "+exp=smoke", "scheme=tp,tsp"],
        ["+exp=smoke", "scheme=tp_sp", "degrees=[4,6]", "tp=3"],  # T=3 at degree 6; degree 4 runs T = auto
    ):
        assert precheck_argv(argv) is None, argv


def test_refused_on_the_command_line_exit_2_no_dir(tmp_path):
    """A refused command exits 2 with one line on stderr, no traceback, and leaves no results/ dir."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run(
        [sys.executable, "-m", "tspbench", "+exp=smoke", "+seq_lenn=128"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("tspbench: seq_lenn is not a key")
    assert not any(tmp_path.iterdir()), list(tmp_path.iterdir())


@pytest.fixture
def own_configs(tmp_path: Path) -> Path:
    """A user's config folder: one self-contained experiment config with a bad value, one extending conf/config.yaml
    (for --config-dir) with another."""
    (tmp_path / "mine.yaml").write_text("defaults:\n  - experiment_schema\n  - _self_\nschemes: [zig]\ndevice: cpu\n")
    (tmp_path / "ext.yaml").write_text("defaults:\n  - config\n  - _self_\nexp_name: ext\ndegrees: [2, 0]\n")
    (tmp_path / "good.yaml").write_text("defaults:\n  - config\n  - _self_\nexp_name: good\ndevice: cpu\n")
    return tmp_path


def test_config_name_and_path_go_through_the_same_checks(own_configs):
    """--config-name with --config-path (a user's own experiment file) or --config-dir (one extending ours): the
    same one-line refusals as +exp= and plain overrides."""
    d = str(own_configs)
    line = precheck_argv(["--config-path", d, "--config-name", "mine"])
    assert line == "schemes='zig' is unknown; allowed: single, tp, tp_msp, sp, tp_sp, fsdp_sp, tsp", line
    line = precheck_argv(["-cp", d, "-cn", "mine", "schemes=[tp]", "seq_len=0"])
    assert line == "seq_len=0 must be ≥ 1", line
    assert precheck_argv(["-cd", d, "--config-name", "ext"]) == "degrees=[2, 0]: every value must be ≥ 1"
    assert precheck_argv(["-cd", d, "--config-name=ext", "degrees=[2]"]) is None
    assert precheck_argv(["--config-dir", d, "-cn", "good", "+exp=smoke"]) is None
    line = precheck_argv(["-cp", d, "-cn", "nosuch"])
    assert line is not None and line.startswith("--config-name=nosuch is unknown in") and "ext | good | mine" in line


def test_config_name_refused_exit_2_no_dir(own_configs):
    """The command itself: a bad value in a --config-name experiment exits 2 with one line, before Hydra makes a
    directory."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cwd = own_configs / "cwd"
    cwd.mkdir()
    p = subprocess.run(
        [sys.executable, "-m", "tspbench", "--config-path", str(own_configs), "--config-name", "mine"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and p.stderr == "tspbench: schemes='zig' is unknown; allowed: " + (
        "single, tp, tp_msp, sp, tp_sp, fsdp_sp, tsp\n"
    ), p.stderr
    assert not any(cwd.iterdir())


def ids(overrides: list[str]) -> list[str]:
    return [s.run_id for s in expand_grid(compose_experiment(["+exp=smoke", *overrides]))]


def test_verify_spellings_mean_the_grid_axis():
    assert ids(["scheme=tsp"]) == ids(["schemes=[tsp]"])
    assert ids(["scheme=tsp", "vocab=ring"]) == ids(["schemes=[tsp]", "scheme_opts.tsp.vocabs=[ring]"])
    assert ids(["scheme=sp", "sp_variant=ring"]) == ids(["schemes=[sp]", "scheme_opts.sp.sp_variants=[ring]"])
    tp_sp = ["schemes=[tp_sp]", "degree=4", "scheme_opts.tp_sp.tps=[2]"]
    assert ids(["scheme=tp_sp", "degree=4", "tp=2"]) == ids(tp_sp)
    specs = expand_grid(compose_experiment(["+exp=smoke", "scheme=tp", "recompute=selective"]))
    assert [(s.scheme, s.recompute) for s in specs] == [("tp", "selective")]


def test_some_invalid_points_still_run():
    """degree=3 in a grid with single: single can run, so the grid is not refused (tp is recorded invalid)."""
    specs = precheck(compose_experiment(["+exp=smoke", "schemes=[single,tp]", "degree=3"]))
    assert [s.scheme for s in specs] == ["single", "tp"]


def test_memory_check_refuses_what_cannot_fit():
    spec = expand_grid(compose_experiment(["+exp=smoke", "scheme=tsp"]))[0]
    assert memory_refusal(spec, (64 * 2**30, "test")) is None
    no = memory_refusal(spec, (1024.0, "1 KiB test"))
    assert no is not None and no["available_gib_per_rank"] == pytest.approx(1024 / 2**30)
    assert no["estimated_peak_gib_per_rank"] > no["available_gib_per_rank"]
    assert "per rank > " in no["reason"] and "1 KiB test" in no["reason"]


def rec(rid: str, status: str, reason: str | None = None) -> dict:
    return {"run_id": rid, "status": status, "reason": reason}


def test_an_ok_is_never_superseded_by_an_interruption():
    recs = [
        rec("a", "ok"),
        rec("a", "failed", "interrupted (Ctrl-C); rank group killed"),
        rec("b", "failed", "interrupted (Ctrl-C)"),
        rec("b", "ok"),
        rec("c", "ok"),
        rec("c", "oom", "rank 0: OutOfMemoryError"),  # a real re-run (force=true) that failed does supersede
    ]
    assert [(r["run_id"], r["status"]) for r in current_records(recs)] == [("a", "ok"), ("b", "ok"), ("c", "oom")]
    from tspbench.record.tables import latest_by_run_id
    from tspbench.report.frame import dedupe

    assert [r["status"] for r in latest_by_run_id(recs)] == ["ok", "ok", "oom"]
    assert sorted((r["run_id"], r["status"]) for r in dedupe(recs)) == [("a", "ok"), ("b", "ok"), ("c", "oom")]


def specs_of(n: int) -> list[RunSpec]:
    return expand_grid(compose_experiment(["+exp=smoke"]))[:n]


def test_exit_code_counts_grid_points():
    specs = specs_of(3)
    ok = [rec(s.run_id, "ok") for s in specs]
    assert grid_outcome(specs, ok) == (0, "tspbench: 3 grid points: 3 ok → exit 0")
    # a measured run that ran out of memory (a rank's OutOfMemoryError) is a failure
    measured_oom = {**rec(specs[1].run_id, "oom"), "method": "measured", "oom_kind": "measured"}
    mixed = [ok[0], measured_oom, rec(specs[2].run_id, "invalid")]
    code, line = grid_outcome(specs, mixed)
    assert (code, line) == (1, "tspbench: 3 grid points: 1 ok, 1 invalid, 1 oom (ran out of memory) → exit 1")
    assert grid_outcome(specs, mixed, allow_failures=True) == (
        0,
        line.replace("exit 1", "exit 0 (allow_failures=true)"),
    )
    # an estimated point whose modelled twin failed is not ok
    twin = [*ok, rec(specs[0].run_id + "-model", "failed")]
    assert grid_outcome(specs, twin)[0] == 1
    for bad in ("failed", "timeout", "invalid", "implausible"):
        assert grid_outcome(specs, [*ok[:2], rec(specs[2].run_id, bad)])[0] == 1, bad
    assert grid_outcome(specs, ok[:2]) == (1, "tspbench: 3 grid points: 2 ok, 1 missing → exit 1")
    assert grid_outcome(specs[:1], [rec(specs[0].run_id, "failed")]) == (
        1,
        "tspbench: 1 grid points: 0 ok, 1 failed → exit 1",
    )


def test_a_predicted_oom_is_a_result():
    """The issue's case: single at 128K estimated (and modelled) above one GPU's memory is recorded `oom` with
    `oom_kind: predicted`, and the grid exits 0; the memory check's refusal before the ranks start is one too."""
    specs = specs_of(3)
    ok = [rec(s.run_id, "ok") for s in specs]
    est = {**rec(specs[2].run_id, "oom"), "method": "estimated", "oom_kind": "predicted"}
    model = {**rec(specs[2].run_id + "-model", "oom"), "method": "modelled", "oom_kind": "predicted"}
    code, line = grid_outcome(specs, [*ok[:2], est, model])
    assert (code, line) == (0, "tspbench: 3 grid points: 2 ok, 1 oom (predicted; a result) → exit 0")
    refused = {**rec(specs[2].run_id, "oom", "estimated peak 9 GiB per rank > 1 GiB available; not started")}
    assert grid_outcome(specs, [*ok[:2], refused])[0] == 0  # a record from before oom_kind: judged by its reason
    assert grid_outcome(specs, [*ok[:2], {**refused, "oom_kind": "measured"}])[0] == 1
    # a predicted oom beside a failed twin is the failure
    assert grid_outcome(specs, [*ok[:2], est, rec(specs[2].run_id + "-model", "failed")])[0] == 1


def test_sweep_exit_code():
    from tspbench.run.callbacks import sweep_outcome

    assert sweep_outcome([rec("a", "ok")], False) == (0, "tspbench: sweep: 1 grid points: 1 ok → exit 0")
    code, line = sweep_outcome([rec("a", "ok"), rec("b", "timeout")], False)
    assert code == 1 and line == "tspbench: sweep: 2 grid points: 1 ok, 1 timeout → exit 1"
    assert sweep_outcome([rec("a", "ok"), rec("b", "timeout")], True)[0] == 0
    est = {**rec("b", "oom"), "method": "estimated", "oom_kind": "predicted"}
    twin = {**rec("b-model", "oom"), "method": "modelled", "oom_kind": "predicted"}
    assert sweep_outcome([rec("a", "ok"), est, twin], False) == (
        0,
        "tspbench: sweep: 2 grid points: 1 ok, 1 oom (predicted; a result) → exit 0",
    )


def test_help_states_the_exit_code_rule(capsys, monkeypatch):
    import sys

    import tspbench.__main__ as entry

    monkeypatch.setattr(sys, "argv", ["tspbench", "--help"])
    entry.print_help()
    out = " ".join(capsys.readouterr().out.split())
    assert "Exit codes: 0 when every grid point ended ok or was predicted not to fit" in out
    assert "1 when any point crashed (failed), hung (timeout), was invalid or implausible" in out
    assert "2 for refused input" in out and "130 for Ctrl-C" in out


# ------------------------------------------------------------------------------ python -m tspbench.report
def good_line(rid: str = "a") -> str:
    return json.dumps({"run_id": rid, "status": "ok", "scheme": "tp"})


def test_report_refuses_empty_inputs(tmp_path, capsys):
    from tspbench.report.__main__ import main

    empty_dir = tmp_path / "d"
    empty_dir.mkdir()
    empty_file = tmp_path / "e.jsonl"
    empty_file.write_text("")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good_line() + "\nnot json\n" + good_line("b") + "\n")
    out = tmp_path / "r.html"
    for path, needle in (
        (empty_dir, "no *.jsonl files in"),
        (empty_file, "no records in"),
        (bad, f"{bad}:2: not a JSON record"),
    ):
        assert main([str(path), f"out={out}"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, err
    assert not out.exists()


def test_report_warns_on_a_torn_last_line(tmp_path, capsys):
    from tspbench.report.__main__ import check_inputs

    torn = tmp_path / "t.jsonl"
    torn.write_text(good_line() + "\n" + '{"run_id": "b", "sta')
    assert check_inputs([str(torn)]) is None
    err = capsys.readouterr().err
    assert f"warning: {torn}:2: torn last line skipped" in err
