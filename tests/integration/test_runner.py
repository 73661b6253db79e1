"""The benchmark runner end to end on CPU: grid, config errors, invalid runs, Ctrl-C + resume, multirun.

Kept small (tiny model, 1 layer, S = 32, 1 warm-up + 2 measured steps); each measured run costs one
torchrun launch (a few seconds on 2 cores).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proc_util import worker_pids

from tspbench.record.store import load, read_records
from tspbench.run.dispatch import run_all
from tspbench.run.experiment import compose_experiment
from tspbench.run.grid import expand_grid

ROOT = Path(__file__).resolve().parents[2]
FAST = [
    "model.n_layers=1",
    "seq_len=32",
    "warmup_steps=1",
    "measured_steps=2",
    "progress=false",
    "memory_breakdown=false",
    "report=false",  # tests never write into the user's reports/
]


def cli(args: list[str], **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HYDRA_FULL_ERROR="0")
    return subprocess.Popen(
        [sys.executable, "-m", "tspbench", *args],
        cwd=kw.pop("cwd", ROOT),
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,
    )


def run_cli(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    p = cli(args)
    out, err = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def records(path: Path) -> list[dict]:
    return read_records([path])


# ------------------------------------------------------------------------------------- composition
def test_smoke_grid_has_all_six_schemes_single_at_degree_1():
    specs = expand_grid(compose_experiment(["+exp=smoke"]))
    assert [s.scheme for s in specs] == ["single", "tp", "tp_msp", "sp", "tp_sp", "tsp"]
    assert {s.scheme: s.degree for s in specs}["single"] == 1
    assert all(s.degree == 2 for s in specs if s.scheme != "single")
    assert all(s.device == "cpu" for s in specs)
    assert len({s.run_id for s in specs}) == 6
    # run_id is a pure function of the workload: same overrides, same ids
    assert [s.run_id for s in expand_grid(compose_experiment(["+exp=smoke"]))] == [s.run_id for s in specs]


def test_microbatch_experiment_sweeps_b_on_16_gpus():
    specs = expand_grid(compose_experiment(["+exp=microbatch"]))
    assert {s.batch for s in specs} == {1, 2, 4, 8, 16} and {s.world_size for s in specs} == {16}
    # tp, tp_msp, tp_sp (T = 2, 4) × (Megatron-SP on, off), fsdp_sp × (allgather, ring, ulysses), tsp
    assert len(specs) == 10 * 5 and {s.mode for s in specs} == {"train"}


def test_serving_experiment_is_a_decode_grid():
    specs = expand_grid(compose_experiment(["+exp=serving"]))
    assert len(specs) == 6 * 4 * 2 and {s.mode for s in specs} == {"decode"}  # 6 layouts × 4 S × 2 B
    assert {s.degree for s in specs} == {8} and {s.execution for s in specs} == {"auto"}


def test_scalar_overrides_replace_grid_axes():
    specs = expand_grid(
        compose_experiment(
            ["+exp=smoke", "seq_lens=[32,64]", "seq_len=128", "schemes=[tp,tsp]", "modes=[train,forward]"]
        )
    )
    assert {(s.scheme, s.seq_len, s.mode) for s in specs} == {
        (sc, 128, m) for sc in ("tp", "tsp") for m in ("train", "forward")
    }


def test_composition_error_is_one_line_saying_what_to_type():
    r = run_cli(["+exp=smoke", "seq_lenz=3"], timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "seq_lenz is not a key: did you mean seq_len?" in r.stderr
    r = run_cli(["+exp=smoke", "seq_len=abc"], timeout=60)
    assert r.returncode == 2 and "could not be converted to Integer; seq_len expects an integer" in r.stderr


def test_invalid_runs_are_recorded_and_the_grid_continues(tmp_path, capsys):
    # tp at degree 3 cannot split 8 heads; execution=measure on cuda needs devices this host lacks.
    exp = compose_experiment(["+exp=smoke", *FAST, "schemes=[tp]", "degree=3"])
    specs = expand_grid(exp)
    exp_cuda = compose_experiment(["+exp=smoke", *FAST, "schemes=[tp]", "device=cuda", "execution=measure"])
    specs += expand_grid(exp_cuda)
    recs = run_all(specs, tmp_path, progress=False)
    assert recs[0]["status"] == "invalid"
    assert "n_heads=8 must be divisible by the tensor degree 3" in recs[0]["reason"]
    import torch

    if not torch.cuda.is_available():
        assert recs[1]["status"] == "invalid" and recs[1]["reason"].startswith("needs 2 cuda devices")
    assert not list(tmp_path.glob("*.log")), "nothing may be spawned for an invalid run"
    err = capsys.readouterr().err
    assert "invalid  tp d3" in err


def test_auto_without_devices_estimates_and_models(tmp_path):
    """execution=auto on a host without the GPUs: an estimated record and its modelled twin, no ranks."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA devices: auto would measure")
    exp = compose_experiment(["+exp=smoke", *FAST, "schemes=[tsp]", "device=cuda", "hardware=h100"])
    recs = run_all(expand_grid(exp), tmp_path, progress=False)
    assert [(r["method"], r["status"]) for r in recs] == [("estimated", "ok"), ("modelled", "ok")]
    est, mod = recs
    assert mod["run_id"] == est["run_id"] + "-model"
    assert est["metrics"]["mem_total_gib"] > 0 and mod["metrics"]["predicted_tokens_per_s"] > 0
    assert mod["hardware"] == "h100" and not list(tmp_path.glob("*.log"))


def test_decode_mode_measures_prefill_decode_and_kv_cache(tmp_path):
    """Serving: a KV-cache prefill (timed once) then one token per step; tokens per step = dp·B."""
    exp = compose_experiment(["+exp=smoke", *FAST, "schemes=[tp,tsp]", "mode=decode"])
    recs = run_all(expand_grid(exp), tmp_path, progress=False)
    assert [(r["scheme"], r["mode"], r["status"]) for r in recs] == [("tp", "decode", "ok"), ("tsp", "decode", "ok")]
    for r in recs:
        m = r["metrics"]
        assert m["tokens_per_step"] == 1 and m["tokens_per_s"] > 0 and m["loss"] is None
        assert m["prefill_ms"] > 0 and m["prefill_tokens_per_s"] > 0
        assert m["decode_ms_per_token_p50"] == m["step_time_ms_p50"]
        assert m["prefill_ms"] <= m["ttft_ms"] and m["decode_ms_per_token_p99"] >= m["decode_ms_per_token_p50"]
        assert m["decode_ms_per_token_p99"] in [t for ts in r["per_rank"]["step_time_ms"] for t in ts]
    # 1 layer, B = 1, 8 KV heads of 8 dims, fp32; 32 prompt tokens + 3 decoded (step 0 and the 2-step window).
    # tp: every token, 4 of the 8 heads; tsp: every head of its 16 prompt tokens + positions 32 and 34 (rank 0
    # owns the even ones); the record keeps the largest rank's cache
    kv = {r["scheme"]: r["metrics"]["kv_cache_gib"] * 2**30 for r in recs}
    assert kv == {"tp": 2 * 35 * 4 * 8 * 4, "tsp": 2 * (16 + 2) * 8 * 8 * 4}
    # storage is reserved with the prefill for the run's decode steps (5 here; tsp: ⌈5/2⌉ per rank)
    alloc = {r["scheme"]: r["metrics"]["kv_cache_allocated_gib"] * 2**30 for r in recs}
    assert alloc == {"tp": 2 * 37 * 4 * 8 * 4, "tsp": 2 * (16 + 3) * 8 * 8 * 4}


def test_auto_decode_without_devices_is_modelled(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA devices: auto would measure")
    exp = compose_experiment(["+exp=smoke", *FAST, "schemes=[tsp]", "device=cuda", "hardware=mi300x", "mode=decode"])
    recs = run_all(expand_grid(exp), tmp_path, progress=False)
    assert [(r["method"], r["status"], r["mode"]) for r in recs] == [("modelled", "ok", "decode")]
    m = recs[0]["metrics"]
    assert m["kv_cache_gib"] > 0 and m["predicted_tokens_per_s"] > 0 and m["decode_ms_per_token_p50"] > 0
    assert not list(tmp_path.glob("*.log"))


# (fate, overrides, whether it needs a host without CUDA, the records' (method, status)); the refused points run
# in a grid with `single`, so the grid itself is not refused (a refused point's record says `measured`: what
# execution=auto / measure asked for)
FATES = [
    ("measure", ["schemes=[single]"], False, [("measured", "ok")]),
    ("estimate", ["schemes=[tsp]", "execution=estimate"], False, [("estimated", "ok")]),
    ("model", ["schemes=[tsp]", "execution=model"], False, [("modelled", "ok")]),
    (
        "estimate+model",
        ["schemes=[tsp]", "device=cuda", "hardware=h100"],
        True,
        [("estimated", "ok"), ("modelled", "ok")],
    ),
    ("model", ["schemes=[tsp]", "device=cuda", "hardware=h100", "mode=decode"], True, [("modelled", "ok")]),
    ("refused", ["schemes=[single,tp]", "degree=3"], False, [("measured", "invalid")]),
]


@pytest.mark.parametrize(
    "kind,overrides,no_cuda,methods",
    FATES,
    ids=["measure", "estimate", "model", "estimate+model", "decode-model", "refused-layout"],
)
def test_each_fate_is_what_the_spec_carries_and_the_record_says(tmp_path, kind, overrides, no_cuda, methods):
    """compose → precheck → run_all: the fate the pre-check gave the spec is what happens, and the records (method,
    status, provenance.config.fate) say so."""
    import torch

    from tspbench.run.checks import precheck

    if no_cuda and torch.cuda.is_available():
        pytest.skip("this host has CUDA devices: auto would measure")
    specs = precheck(compose_experiment(["+exp=smoke", *FAST, *overrides]))
    spec = specs[-1]  # the point under test (after `single` in the refused grid)
    assert spec.fate is not None and spec.fate.kind == kind
    if kind == "refused":
        assert spec.fate.reason.startswith("model.n_heads=8 must be divisible by the tensor degree 3")
    elif no_cuda:  # execution=auto without the devices: why it is not measured
        assert spec.fate.reason.startswith("needs 2 cuda devices, found 0 (execution=auto")
    else:
        assert spec.fate.reason is None
    recs = [r for r in run_all(specs, tmp_path, progress=False) if r["run_id"].startswith(spec.run_id)]
    assert [(r["method"], r["status"]) for r in recs] == methods
    for r in recs:
        assert r["provenance"]["config"]["fate"] == {"kind": kind, "reason": spec.fate.reason}
    if kind == "refused":
        assert recs[0]["reason"] == spec.fate.reason
    # ranks started (a log) for exactly the points decided `measure`
    assert {p.stem for p in tmp_path.glob("*.log")} == {s.run_id for s in specs if s.fate.kind == "measure"}


def test_refused_devices_exit_2_with_the_decisions_reason(tmp_path):
    """execution=measure without the devices: every point refused, so the pre-check refuses the grid with the first
    point's reason; run anyway (the specs as decided), each is recorded `invalid` with that same reason."""
    import torch

    from tspbench.config import ConfigError
    from tspbench.run.checks import precheck
    from tspbench.run.fate import decide_all

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA devices")
    exp = compose_experiment(["+exp=smoke", *FAST, "schemes=[tp,tsp]", "device=cuda", "execution=measure"])
    with pytest.raises(ConfigError) as e:
        precheck(exp)
    specs = expand_grid(exp)
    fates = decide_all(specs)
    assert [f.kind for f in fates] == ["refused", "refused"]
    assert str(e.value) == f"no grid point can run: {fates[0].reason} (and 1 more grid point(s) refused)"
    recs = run_all(specs, tmp_path, progress=False)
    assert [(r["status"], r["reason"]) for r in recs] == [("invalid", f.reason) for f in fates]
    assert not list(tmp_path.glob("*.log"))


def test_decode_cannot_be_estimated():
    from tspbench.config import ConfigError
    from tspbench.run.experiment import validate_experiment

    with pytest.raises(ConfigError, match="mode=decode cannot be estimated"):
        validate_experiment(compose_experiment(["+exp=smoke", "mode=decode", "execution=estimate"]))


# -------------------------------------------------------------------------------- Ctrl-C and resume
@pytest.mark.slow
def test_interrupt_keeps_finished_runs_and_resume_skips_them(tmp_path):
    run_dir = tmp_path / "run"
    args = ["+exp=smoke", *FAST, "schemes=[single,tp]", f"hydra.run.dir={run_dir}"]
    results = run_dir / "results.jsonl"

    # 1. Interrupt during the second run (tp), once the first (single) is recorded: tp's rank 0 hangs in step 0
    # (faults=hang) until then, so the interrupt lands in the run whatever the machine's speed.
    p = cli([*args, "faults=hang", "faults.scheme=tp"])
    deadline = time.time() + 300
    while (
        time.time() < deadline
        and p.poll() is None
        and "injected hang" not in "".join(f.read_text() for f in run_dir.glob("tp-*.log"))
    ):
        time.sleep(0.1)
    assert p.poll() is None and time.time() < deadline, "the second run never reached its hang"
    p.send_signal(signal.SIGINT)
    _out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    recs = records(results)
    assert [(r["scheme"], r["status"]) for r in recs] == [("single", "ok"), ("tp", "failed")]
    assert recs[1]["reason"].startswith("interrupted")
    assert "resume_dir=" in err
    time.sleep(0.5)
    assert not worker_pids(str(run_dir)), "the interrupted rank group survived"

    # 2. Resume: only tp runs again; single's ok record is not redone.
    r = run_cli(args)
    assert r.returncode == 0, r.stderr
    assert "skip     single" in r.stderr
    recs = records(results)
    assert [(x["scheme"], x["status"]) for x in recs] == [("single", "ok"), ("tp", "failed"), ("tp", "ok")]
    assert "2/2 runs ok" in r.stdout and f"results: {results}" in r.stdout

    # 3. Everything ok: a third invocation spawns nothing.
    r = run_cli(args)
    assert r.returncode == 0 and len(records(results)) == 3
    assert r.stderr.count("skip") == 2

    # The ok records carry the schema's fields (README.md, "Result records").
    ok = [x for x in records(results) if x["status"] == "ok"]
    for x in ok:
        m = x["metrics"]
        assert x["method"] == "measured" and x["device"] == "cpu" and x["cpu_note"]
        assert m["tokens_per_s_per_device"] == pytest.approx(m["tokens_per_s"] / x["world_size"])
        assert m["tokens_per_step"] == x["dp"] * x["batch"] * x["seq_len"]
        assert m["step_time_ms_min"] <= m["step_time_ms_p50"] <= m["step_time_ms_max"]
        assert m["energy_j_per_token"] is None and m["energy_reason"]  # never 0 on CPU
        assert m["mfu_causal_pct"] is None and m["flops_per_token_causal"] < m["flops_per_token_noncausal"]
        assert len(x["per_rank"]["step_time_ms"]) == x["world_size"]
        assert x["provenance"]["config"]["run_id"] == x["run_id"]
        assert x["provenance"]["warmup_steps"] == 1 and x["provenance"]["measured_steps"] == 2
    tp = next(x for x in ok if x["scheme"] == "tp")
    # TP: 2 all-reduces of B·S·h fp32 per layer forward, each receiving (T−1)/T·2·n elements
    assert tp["metrics"]["comm_bytes_per_layer_fwd"] == 2 * 2 * (1 / 2) * 32 * 64 * 4
    df = load(results)
    assert len(df) == 3 and "metrics.tokens_per_s" in df.columns


# ------------------------------------------------------------------------------------------ multirun
@pytest.mark.slow
def test_multirun_sweep_writes_one_combined_jsonl(tmp_path):
    sweep = tmp_path / "sweep"
    r = run_cli(
        [
            "-m",
            "+exp=smoke",
            *[a for a in FAST if not a.startswith("seq_len")],
            "schemes=[single]",
            "seq_len=32,64",
            f"hydra.sweep.dir={sweep}",
        ],
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    combined = sweep / "results.jsonl"
    recs = records(combined)
    assert sorted((x["seq_len"], x["status"]) for x in recs) == [(32, "ok"), (64, "ok")]
    assert (sweep / "0" / "results.jsonl").exists() and (sweep / "1" / "results.jsonl").exists()
    assert f"results (combined): {combined}" in r.stdout
    assert "2/2 runs ok" in r.stdout


def test_submitit_local_sweep_writes_records_and_report(tmp_path):
    """The same `-m` sweep through hydra-submitit-launcher (`hydra/launcher=submitit_local`: each job a
    submitit subprocess, as on Slurm): per-job records, the combined JSONL and the report where a local run
    puts them."""
    sweep = tmp_path / "sweep"
    p = cli(
        [
            "-m",
            "+exp=smoke",
            *[a for a in FAST if not a.startswith("seq_len")],
            "report=true",  # written under the working directory: tmp_path here, never the user's reports/
            "schemes=[single]",
            "seq_len=32,64",
            "hydra/launcher=submitit_local",
            "hydra.launcher.timeout_min=5",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
    )
    out, err = p.communicate(timeout=240)
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    assert r.returncode == 0, r.stderr
    recs = records(sweep / "results.jsonl")
    assert sorted((x["seq_len"], x["status"]) for x in recs) == [(32, "ok"), (64, "ok")]
    assert (sweep / "0" / "results.jsonl").exists() and (sweep / "1" / "results.jsonl").exists()
    assert list(sweep.glob(".submitit/*")), "the jobs did not go through submitit"
    assert "2/2 runs ok" in r.stdout
    # the report: where a local multirun writes it (reports/<exp_name>-multirun-<time>.html under the cwd)
    assert list((tmp_path / "reports").glob("smoke-multirun-*.html")), r.stdout


# ------------------------------------------------------------------------------ measurers (no ranks)
def test_flops_conventions_and_peak_table():
    from tspbench.config import ModelConfig
    from tspbench.measure import flops as fl
    from tspbench.parallel import ParallelConfig
    from tspbench.predict import costmodel as cf

    llama = ModelConfig(
        name="llama7b", vocab_size=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_hidden=16384
    )
    assert llama.n_layers * cf.layer_weight_params(llama) == 8_589_934_592  # docs/method.md#memory
    s = 131072
    n = llama.n_layers * cf.layer_weight_params(llama) + llama.vocab_size * llama.dim
    palm = 6 * n + 12 * llama.n_layers * llama.n_heads * llama.head_dim * s  # PaLM App. B
    assert cf.flops_per_token(llama, s, mode="train", causal_halved=False) == palm
    attn = 12 * llama.n_layers * llama.dim * s
    assert cf.flops_per_token(llama, s, mode="train", causal_halved=True) == palm - attn / 2  # Megatron
    full = cf.hardware_flops_per_token(ParallelConfig(recompute="full"), cf.Workload(llama, s, mode="train"))
    assert full > cf.flops_per_token(llama, s, mode="train")
    # the profiles' bf16 peaks (conf/hardware/, tests/unit/test_peak_flops.py); no profile, no peak
    assert fl.peak_flops("NVIDIA H100 80GB HBM3", "cuda")[0] == 989.4e12
    assert fl.peak_flops("NVIDIA H100 PCIe", "cuda")[0] == 756.0e12  # its own profile (h100_pcie.yaml)
    assert fl.peak_flops("NVIDIA H100 NVL", "cuda")[0] is None
    assert fl.peak_flops("NVIDIA H200", "cuda")[0] == 989.4e12
    assert fl.peak_flops("AMD Instinct MI300X", "cuda")[0] == 1307.4e12
    assert fl.peak_flops("x86_64", "cpu")[0] is None and "CPU" in fl.peak_flops("x86_64", "cpu")[1]
    assert fl.peak_flops("Some New GPU", "cuda")[0] is None
    assert fl.mfu_pct(1e9, 1e5, 1e15, 2) == pytest.approx(5.0)


def test_energy_is_none_on_cpu_and_counter_validation():
    import torch

    from tspbench.measure.energy import EnergyMeter, _integrate, validate_counter

    m = EnergyMeter(torch.device("cpu"))
    m.start()
    r = m.stop()
    assert r.energy_j is None and r.reason and "CPU" in r.reason  # never 0
    # Zeus-style check: a counter that tracks power × time is trusted, a frozen one is not.
    clock = {"mj": 0.0}

    def good():
        clock["mj"] += 300.0 * 0.01 * 1e3 / 2  # two reads per window → 300 W over 10 ms
        return clock["mj"]

    assert validate_counter(good, lambda: 300.0, wait_s=0.01)[0]
    assert not validate_counter(lambda: 5.0, lambda: 300.0, wait_s=0.01)[0]
    assert _integrate([[0.0, 100.0], [1.0, 100.0]], 2.0) == pytest.approx(200.0)


# ------------------------------------------------------------------------ the measured path is the proven path
@pytest.mark.parametrize(
    "scheme,extra",
    [
        ("tsp", ["degree=2", "dp=2"]),
        ("tp_sp", ["degree=4", "'scheme_opts.tp_sp.tps=[2]'"]),
        ("fsdp_sp", ["degree=2", "dp=2"]),
    ],
)
def test_measured_steps_keep_replicas_in_sync_and_equal_the_reference(tmp_path, scheme, extra):
    """The worker trains with tspbench.schemes.train.train_step, the step verify proves: after its steps every
    rank holding the same slice of a parameter holds the same bits (replicas_in_sync), and the trained
    parameters equal the single-device model trained the same number of steps (float64, 1e-10)."""
    import torch

    from tspbench.model import build_model, synthetic_batch, token_loss_sum
    from tspbench.schemes.train import MixedPrecisionAdamW

    exp = compose_experiment(
        ["+exp=smoke", *FAST, f"schemes=[{scheme}]", "dtype=float64", *[e.strip("'") for e in extra]]
    )
    (spec,) = expand_grid(exp)
    spec.state_file = str(tmp_path / "state.pt")
    (rec,) = run_all([spec], tmp_path, progress=False)
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["metrics"]["replicas_in_sync"] is True and rec["metrics"]["replica_mismatch"] == []
    state = torch.load(spec.state_file)
    steps = state["optimizer_steps"]
    assert steps == spec.warmup_steps + spec.measured_steps  # step 0 + the rest of warm-up + the window

    cfg = spec.model_config()
    ref = build_model(cfg, spec.seed, torch.float64)
    tokens, targets = synthetic_batch(cfg, spec.dp * spec.batch, spec.seq_len, spec.seed)
    opt = MixedPrecisionAdamW(list(ref.parameters()), lr=spec.lr)
    for _ in range(steps):
        (token_loss_sum(ref(tokens), targets) / targets.numel()).backward()
        opt.step()
        opt.zero_grad()
    for name, p in ref.named_parameters():
        got = state["params"][name]
        assert (got - p.detach()).abs().max() <= 1e-10 * p.detach().abs().max(), name


def test_replica_check_can_fail():
    """Non-vacuity of replicas_in_sync: a rank whose copy of a slice differs is named."""
    from tspbench.record.measured import replicas_in_sync

    same = {"w": (0, 1.0, 2.0), "v": (1, 3.0, 4.0)}
    assert replicas_in_sync([same, dict(same)]) == (True, [])
    drifted = {"w": (0, 1.0, 2.0000001), "v": (1, 3.0, 4.0)}
    assert replicas_in_sync([same, drifted]) == (False, ["w[0]"])
    assert replicas_in_sync([same, {"w": (1, 9.0, 9.0), "v": (0, 8.0, 8.0)}])[0]  # other slices: no comparison


def test_measured_optimizer_state_equals_the_estimate(tmp_path):
    """The worker's optimizer is the estimate's: bf16 parameters get fp32 master copies, m and v (12 B/param),
    so the bytes a measured run holds equal what the fake-tensor estimate counts, byte for byte."""
    from tspbench.record.offline import estimated_record

    exp = compose_experiment(["+exp=smoke", *FAST, "schemes=[tsp]", "dtype=bfloat16"])
    (spec,) = expand_grid(exp)
    (rec,) = run_all([spec], tmp_path, progress=False)
    assert rec["status"] == "ok", rec.get("reason")
    measured = rec["metrics"]["optimizer_state_gib"] * 2**30
    est = estimated_record(
        expand_grid(compose_experiment(["+exp=smoke", *FAST, "schemes=[tsp]", "dtype=bfloat16", "execution=estimate"]))[
            0
        ]
    )
    assert measured > 0 and measured == est["metrics"]["mem_optimizer_gib"] * 2**30
    # 12 B per bf16 parameter (2 B) this rank holds, plus AdamW's per-parameter step counters (a few bytes)
    params = est["metrics"]["mem_params_gib"] * 2**30
    assert 6 * params <= measured < 6 * params + 1024
