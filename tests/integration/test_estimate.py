"""The fake-tensor estimate (tspbench.predict.estimate) against real runs and against the closed-form cost model.

(a) estimate vs real: the same driver and tracker on real tensors (gloo ranks) and on fake tensors under the
    fake process group give the same peak memory, breakdown and FLOPs (±5%; in practice byte-exact except
    for buffers gloo holds a little longer);
(b) the collectives the estimate counts for layer 0 are exactly those of the real run (CommLog records);
(c) costmodel.memory_breakdown is within ±5% of the estimate, in total and per category (a category's error
    is measured against the total: a 0.4 GB buffer in a 22 GB peak cannot be held to ±5% of itself), for
    every scheme on a GQA model at 2K tokens and for llama7b at 128K, D = 8 (the paper setting);
(d) llama7b at 128K, D = 8 estimates in seconds; the 3+4-layer extrapolation equals tracing every layer.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from tspbench.config import ModelConfig
from tspbench.paper.tables import LLAMA7B, PAPER_MEMORY_SETTING
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel import Workload, memory_breakdown, params_per_device
from tspbench.predict.costmodel.hardware import load_hardware
from tspbench.predict.costmodel.memory import memory_phases
from tspbench.predict.estimate import CATEGORIES, EstimateOptions, estimate
from tspbench.predict.realrun import estimate_summary, measure

TINY = ModelConfig()  # dim 64, 2 layers, 4 heads, vocab 256
GQA = ModelConfig(name="gqa", vocab_size=2000, dim=256, n_layers=6, n_heads=8, n_kv_heads=4, ffn_hidden=1024)
S128K = 131072
REAL_CASES = [("tp", "none"), ("tsp", "none"), ("tsp", "full"), ("sp", "none"), ("tp_msp", "full")]


def test_slice_param_holds_only_its_shard():
    """A regression the estimate found: a view of a chunk kept the full unsharded weight alive per rank."""
    from tspbench.schemes.ops.sharding import slice_param

    p = slice_param("layers.0.attention.wq", (8, 4), 0, 1, 2, 0, torch.float32, "cpu")
    assert p.untyped_storage().nbytes() == p.numel() * p.element_size()


def _within(model: dict, est: dict, tol: float = 0.05, slack: float = 0.0) -> list[str]:
    """The total and the categories whose model/estimate difference exceeds tol × the estimated total
    (+ `slack` bytes)."""
    keys = ("total", *CATEGORIES)
    return [
        f"{k} {model[k] / 1e9:.4f} vs {est[k] / 1e9:.4f} GB"
        for k in keys
        if abs(model[k] - est[k]) > tol * est["total"] + slack
    ]


def _gloo_slack(real: dict, par: ParallelConfig) -> float:
    """A real gloo run may free one collective's buffer a little later than the fake process group (gloo's
    worker thread drops its reference asynchronously): on a 3 MB tiny-model step that one buffer can exceed
    5% of the total, so the real-run comparison allows the largest collective buffer of the step on top (a
    layer's, or the gradient-sync bucket's; float32)."""
    from tspbench.predict.costmodel import grad_sync_bucket_elems

    layer = max((op[5] for op in real["comm_ops"]), default=0)
    return float(max(layer, 4 * grad_sync_bucket_elems(TINY, par)))


# ---------------------------------------------------------------------------------------------- (a), (b)
@pytest.fixture(scope="module")
def real_runs():
    cases = [
        (ParallelConfig(scheme=s, degree=2, recompute=rc), Workload(TINY, 64, 1, dtype="float32"))
        for s, rc in REAL_CASES
    ]
    return dict(zip(REAL_CASES, measure(cases)))


@pytest.mark.parametrize("scheme,recompute", REAL_CASES)
@pytest.mark.xdist_group("estimate-real-runs")  # real_runs is spawned once, on one worker
def test_estimate_matches_real_run(real_runs, scheme, recompute):
    real = real_runs[(scheme, recompute)]
    par = ParallelConfig(scheme=scheme, degree=2, recompute=recompute)
    est = json.loads(json.dumps(estimate_summary(par, Workload(TINY, 64, 1, dtype="float32"), attention="native")))
    slack = _gloo_slack(real, par)
    assert not _within(real["mem"], est["mem"], slack=slack), _within(real["mem"], est["mem"], slack=slack)
    assert est["mem"]["params"] == real["mem"]["params"] and est["mem"]["optimizer"] == real["mem"]["optimizer"]
    assert est["flops"] == pytest.approx(real["flops"], rel=0.05) and est["flops"] > 0
    # (b) the collectives of layer 0, one by one: op, phase, group, numel, received, bytes, recompute
    assert est["comm_ops"] == real["comm_ops"] and est["comm"] == real["comm"]
    assert est["comm"]["comm_elems_per_layer_fwd"] > 0


FSDP_CASES = [("fsdp_sp", 1, "none"), ("fsdp_sp", 1, "full"), ("fsdp_sp", 2, "selective")]


@pytest.fixture(scope="module")
def real_runs_fsdp():
    """FSDP2 on gloo: Σ = 2 (and Σ = 2 × dp = 2, four ranks), the estimate's FSDP bookkeeping against real storage."""
    out = {}
    for dp in (1, 2):  # one spawned group per world size
        keys = [c for c in FSDP_CASES if c[1] == dp]
        pars = [ParallelConfig(scheme=s, degree=2, dp=dp, recompute=rc) for s, _, rc in keys]
        cases = [(par, Workload(TINY, 64, 1, dtype="float32")) for par in pars]
        out.update(zip(keys, measure(cases)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("scheme,dp,recompute", FSDP_CASES)
def test_estimate_matches_real_run_fsdp(real_runs_fsdp, scheme, dp, recompute):
    real = real_runs_fsdp[(scheme, dp, recompute)]
    par = ParallelConfig(scheme=scheme, degree=2, dp=dp, recompute=recompute)
    est = json.loads(json.dumps(estimate_summary(par, Workload(TINY, 64, 1, dtype="float32"), attention="native")))
    slack = _gloo_slack(real, par)
    assert not _within(real["mem"], est["mem"], slack=slack), _within(real["mem"], est["mem"], slack=slack)
    assert est["mem"]["params"] == real["mem"]["params"] and est["mem"]["optimizer"] == real["mem"]["optimizer"]
    assert est["flops"] == pytest.approx(real["flops"], rel=0.05) and est["flops"] > 0
    assert est["comm_ops"] == real["comm_ops"] and est["comm"] == real["comm"]


REAL_CASES_4 = [("tp_sp", 2, "none"), ("tsp", 0, "full")]


@pytest.fixture(scope="module")
def real_runs_4():
    """Four ranks: the 2-D mesh (T = Σ = 2) and TSP at D = 4."""
    cases = [
        (ParallelConfig(scheme=s, degree=4, tp=t, recompute=rc), Workload(TINY, 64, 1, dtype="float32"))
        for s, t, rc in REAL_CASES_4
    ]
    return dict(zip(REAL_CASES_4, measure(cases)))


@pytest.mark.parametrize("scheme,tp,recompute", REAL_CASES_4)
@pytest.mark.slow
def test_estimate_matches_real_run_4_ranks(real_runs_4, scheme, tp, recompute):
    real = real_runs_4[(scheme, tp, recompute)]
    par = ParallelConfig(scheme=scheme, degree=4, tp=tp, recompute=recompute)
    est = json.loads(json.dumps(estimate_summary(par, Workload(TINY, 64, 1, dtype="float32"), attention="native")))
    slack = _gloo_slack(real, par)
    assert not _within(real["mem"], est["mem"], slack=slack), _within(real["mem"], est["mem"], slack=slack)
    assert est["flops"] == pytest.approx(real["flops"], rel=0.05) and est["flops"] > 0
    assert est["comm_ops"] == real["comm_ops"] and est["comm"] == real["comm"]


@pytest.mark.xdist_group("estimate-real-runs")
def test_comm_counts_are_not_vacuous(real_runs):
    # tsp's layer 0 issues D broadcasts, D all-gathers and D−1 ring hops forward (docs/method.md#communication)
    ops = [tuple(o) for o in real_runs[("tsp", "none")]["comm_ops"] if o[1] == "fwd" and not o[6]]
    assert [o[0] for o in ops].count("broadcast") == 2 and [o[0] for o in ops].count("all_gather") == 2
    assert [o[0] for o in ops].count("send_recv") == 1


# ---------------------------------------------------------------------------------------------- (c)
@pytest.mark.parametrize(
    "scheme,tp,recompute,vocab",
    [
        ("tsp", 0, "full", "auto"),
        ("tp", 0, "full", "auto"),
        ("tp_msp", 0, "full", "auto"),
        ("sp", 0, "full", "auto"),
        ("tp_sp", 2, "full", "auto"),
        ("tsp", 0, "none", "auto"),
        ("tp_msp", 0, "none", "auto"),
        ("tp_sp", 2, "none", "auto"),
        ("tsp", 0, "full", "ring"),
        ("tsp", 0, "none", "ring"),
        ("tp", 0, "full", "replicated"),
        ("tp_msp", 0, "full", "replicated"),
        ("tp", 0, "selective", "auto"),
        ("sp", 0, "selective", "auto"),
        ("tp_sp", 2, "selective", "auto"),
        ("fsdp_sp", 0, "none", "auto"),
        ("fsdp_sp", 0, "selective", "auto"),
        ("fsdp_sp", 0, "full", "auto"),
    ],
)
def test_costmodel_matches_estimate_gqa(scheme, tp, recompute, vocab):
    par = ParallelConfig(scheme=scheme, degree=4, tp=tp, recompute=recompute, vocab=vocab)
    est = estimate(par, Workload(GQA, 2048, 1, dtype="bfloat16"))
    model = memory_breakdown(par, Workload(GQA, 2048, 1, dtype="bfloat16"))
    assert est["provenance"]["extrapolated"]  # 6 layers: traced 3 and 4
    assert not _near_tie_mismatch(GQA, par, model, est["mem_bytes"]), _within(model, est["mem_bytes"])


@pytest.mark.parametrize("recompute,mlp_exchange", [("none", "biring"), ("full", "broadcast")])
def test_costmodel_matches_estimate_tsp_kept_kv(recompute, mlp_exchange):
    """TSP with the K/V kept for backward (regather_kv=false) and each other MLP exchange: the cost model's kept K/V
    (every layer's under recompute=none; under full the replayed layer's, alive in its backward) and buffers agree
    with the estimate, at the peak and at the first and last layers' backward (where full recompute's kept K/V
    live: the peak here is the loss backward)."""
    par = ParallelConfig(scheme="tsp", degree=4, recompute=recompute, mlp_exchange=mlp_exchange, regather_kv=False)
    work = Workload(GQA, 2048, 1, dtype="bfloat16")
    est, model = estimate(par, work), memory_breakdown(par, work)
    assert not _near_tie_mismatch(GQA, par, model, est["mem_bytes"]), _within(model, est["mem_bytes"])
    phases = memory_phases(par, work)
    for phase in ("bwd_first", "bwd_last"):
        assert phases[phase]["total"] == pytest.approx(est["phase_peak_bytes"][phase], rel=0.05), phase
    kept = 2 * 2048 * GQA.n_kv_heads * GQA.head_dim * 2  # one layer's gathered K and V, bf16
    regathered = memory_phases(replace(par, regather_kv=True), work)
    stored = GQA.n_layers if recompute == "none" else 1  # alive at the first layer's backward
    assert phases["bwd_first"]["total"] - regathered["bwd_first"]["total"] == pytest.approx(stored * kept)


@pytest.mark.parametrize(
    "scheme,degree,tp,recompute,n_kv",
    [("tsp", 4, 0, "none", 2), ("tp", 4, 0, "selective", 1), ("tp_msp", 4, 0, "none", 2), ("tp_sp", 8, 4, "none", 1)],
)
def test_costmodel_matches_estimate_kv_replicated(scheme, degree, tp, recompute, n_kv):
    """GQA with fewer KV heads than the tensor degree: the real scheme code (each rank slicing one KV head,
    replicated over T/n_kv ranks) and the cost model's n_kv_local = max(n_kv/T, 1) agree."""
    cfg = replace(GQA, n_kv_heads=n_kv)
    par = ParallelConfig(scheme=scheme, degree=degree, tp=tp, recompute=recompute)
    est = estimate(par, Workload(cfg, 2048, 1, dtype="bfloat16"))
    model = memory_breakdown(par, Workload(cfg, 2048, 1, dtype="bfloat16"))
    assert model["params"] == est["mem_bytes"]["params"]
    assert not _near_tie_mismatch(cfg, par, model, est["mem_bytes"]), _within(model, est["mem_bytes"])


@pytest.mark.parametrize(
    "tp,recompute,vocab,msp",
    [
        (2, "none", "replicated", True),
        (2, "full", "replicated", True),
        (4, "none", "auto", True),
        (2, "none", "auto", False),
        (2, "full", "auto", False),
        (2, "selective", "auto", False),
    ],
)
def test_costmodel_matches_estimate_tp_sp(tp, recompute, vocab, msp):
    """tp_sp with Megatron-SP on T (default; the replicated-vocabulary piece layout, Σ = 1) and the plain ablation."""
    par = ParallelConfig(scheme="tp_sp", degree=4, tp=tp, recompute=recompute, vocab=vocab, msp=msp)
    est = estimate(par, Workload(GQA, 2048, 1, dtype="bfloat16"))
    model = memory_breakdown(par, Workload(GQA, 2048, 1, dtype="bfloat16"))
    assert not _near_tie_mismatch(GQA, par, model, est["mem_bytes"]), _within(model, est["mem_bytes"])


@pytest.mark.slow
@pytest.mark.parametrize("scheme,tp", [("tp_msp", 0), ("tp_sp", 4)])
def test_megatron_sp_saves_pieces_llama7b_128k(scheme, tp):
    """Megatron's column-parallel linear keeps its input's piece and re-gathers it in backward
    (schemes/ops/tensor_parallel.py): llama7b, 128K, 8 ranks, no recompute, the model agrees with the estimate of the
    code, and tp_msp T = 8 needs ≈ 124 GB, not the 184.5 GB of the gathered inputs kept
    (docs/method.md#choice-tp-sp-msp)."""
    par = ParallelConfig(scheme=scheme, degree=8, tp=tp, recompute="none")
    rec = estimate(par, Workload(LLAMA7B, S128K, 1), EstimateOptions(hardware="mi300x"))
    model = memory_breakdown(par, Workload(LLAMA7B, S128K, 1))
    assert not _within(model, rec["mem_bytes"]), _within(model, rec["mem_bytes"])
    if scheme == "tp_msp":
        assert model["total"] == pytest.approx(124.3e9, rel=0.01)


@pytest.mark.parametrize("scheme,tp", [("sp", 0), ("tp_sp", 2)])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_costmodel_matches_estimate_ulysses(scheme, tp, recompute):
    """sp_variant=ulysses (docs/method.md#ulysses): head shards of the whole sequence are the local K/V's bytes, so
    the model keeps no full-sequence K/V; the estimate traces the all-to-alls under the fake process group."""
    par = ParallelConfig(scheme=scheme, degree=4, tp=tp, recompute=recompute, sp_variant="ulysses")
    est = estimate(par, Workload(GQA, 2048, 1, dtype="bfloat16"))
    model = memory_breakdown(par, Workload(GQA, 2048, 1, dtype="bfloat16"))
    assert not _near_tie_mismatch(GQA, par, model, est["mem_bytes"]), _within(model, est["mem_bytes"])
    t, sig = par.tp_degree, par.sp_degree
    n, h, g = 2048 / sig, GQA.dim, GQA.gqa_ratio  # two all-to-alls of (h + 2h/g)/T and h/T per local token
    tp_ar = 4 * n * h * (t - 1) / t  # tp_sp: the T axis's two all-reduces
    want = tp_ar + n * (2 * h + 2 * h / g) / t * (sig - 1) / sig
    assert est["metrics"]["comm_elems_per_layer_fwd"] == pytest.approx(want)


@pytest.mark.parametrize("scheme,tp", [("sp", 0), ("tp_sp", 2)])
def test_costmodel_matches_estimate_ulysses_forward(scheme, tp):
    """Forward with an attention-dominated layer (MHA, small vocabulary and MLP): the model's Ulysses working set
    (local Q, K, V, their received and un-zigzagged head shards, the output twice) is the estimate's peak. tp_sp is
    checked in its plain form: the forward working set of Ulysses under Megatron-SP (the all-gathered input beside
    the head shards) is not modelled yet — 21% low on this shape (training peaks are checked in the test above)."""
    cfg = replace(GQA, vocab_size=64, n_kv_heads=8, ffn_hidden=512)
    par = ParallelConfig(scheme=scheme, degree=4, tp=tp, sp_variant="ulysses", msp=scheme != "tp_sp")
    est = estimate(par, Workload(cfg, 2048, 1, mode="forward", dtype="bfloat16"))["mem_bytes"]
    model = memory_breakdown(par, Workload(cfg, 2048, 1, mode="forward", dtype="bfloat16"), kv_cache=False)
    assert model["total"] == pytest.approx(est["total"], rel=0.02)


def test_estimate_matches_real_run_ulysses():
    """(a) and (b) for sp_variant=ulysses at D = 2: the real gloo all-to-alls and the fake process group's agree."""
    par = ParallelConfig(scheme="sp", degree=2, sp_variant="ulysses")
    (real,) = measure([(par, Workload(TINY, 64, 1, dtype="float32"))])
    est = json.loads(json.dumps(estimate_summary(par, Workload(TINY, 64, 1, dtype="float32"), attention="native")))
    slack = _gloo_slack(real, par)
    assert not _within(real["mem"], est["mem"], slack=slack), _within(real["mem"], est["mem"], slack=slack)
    assert est["comm_ops"] == real["comm_ops"] and est["comm"] == real["comm"]
    assert [o[0] for o in est["comm_ops"] if o[1] == "fwd"] == ["all_to_all"] * 4  # Q, K, V in, O out


def _near_tie_mismatch(cfg, par, model: dict, est: dict, tol: float = 0.05) -> list[str]:
    """The breakdown check, where the peak can fall at either of two moments whose totals are within tol of each
    other (e.g. tp_msp, full recompute, replicated vocabulary: the LM-head backward and the last layer's backward
    differ by 1 kB in the model): the estimate's breakdown must match the model's at one of its near-peak
    moments, and the totals must agree."""
    if not _within(model, est):
        return []
    phases = memory_phases(par, Workload(cfg, 2048, 1, dtype="bfloat16"))
    near = [p for p in phases.values() if p["total"] >= model["total"] * (1 - tol)]
    if any(not _within({**p, "total": model["total"]}, est, tol) for p in near):
        return []
    return _within(model, est, tol)


@pytest.mark.parametrize("scheme,tp", [("tp", 0), ("tp_msp", 0), ("tp_sp", 2), ("sp", 0), ("tsp", 0), ("fsdp_sp", 0)])
def test_costmodel_matches_estimate_forward(scheme, tp):
    """Forward only (serving prefill without a cache): the LM head / cross-entropy moment or one layer. The
    total only: the forward phases lump a layer's working set into temporaries (the estimate files TP's
    1 MB all-reduce output under comm_buffers), which is 10% of this tiny model's 11 MB peak."""
    par = ParallelConfig(scheme=scheme, degree=4, tp=tp)
    est = estimate(par, Workload(GQA, 2048, 1, mode="forward", dtype="bfloat16"))["mem_bytes"]
    model = memory_breakdown(par, Workload(GQA, 2048, 1, mode="forward", dtype="bfloat16"), kv_cache=False)
    assert model["total"] == pytest.approx(est["total"], rel=0.05)
    assert model["params"] == est["params"] and est["grads"] == est["optimizer"] == 0


@pytest.fixture(scope="module")
def llama_128k():
    """The paper setting (bf16, AdamW with fp32 master/m/v, full recompute, B = 1), D = 8, 128K tokens."""
    out = {}
    for scheme in ("tsp", "tp", "sp", "fsdp_sp"):
        par = ParallelConfig(scheme=scheme, degree=8, recompute=PAPER_MEMORY_SETTING.recompute)
        t0 = time.perf_counter()
        rec = estimate(par, Workload(LLAMA7B, S128K, PAPER_MEMORY_SETTING.batch), EstimateOptions(hardware="h100"))
        out[scheme] = (par, rec, time.perf_counter() - t0)
    return out


@pytest.mark.parametrize("scheme", ["tsp", "tp", "sp", "fsdp_sp"])
@pytest.mark.slow
def test_costmodel_matches_estimate_llama7b_128k(llama_128k, scheme):
    par, rec, _ = llama_128k[scheme]
    model = memory_breakdown(par, Workload(LLAMA7B, S128K, 1))
    assert not _within(model, rec["mem_bytes"]), _within(model, rec["mem_bytes"])


@pytest.mark.slow
def test_llama7b_128k_record_and_speed(llama_128k):
    par, rec, wall = llama_128k["tsp"]
    m = rec["metrics"]
    # seconds, not minutes: tsp is the slowest scheme to trace (D owner steps per layer). CPU time of this
    # process, so other jobs on a loaded CI machine do not fail it (wall time is in the message).
    assert m["estimate_cpu_s"] < 30, f"llama7b 128K D=8 tsp: {m['estimate_cpu_s']:.1f} CPU s, {wall:.1f} s wall"
    assert rec["method"] == "estimated" and rec["status"] in ("ok", "oom") and rec["world_size"] == 8
    assert (rec["scheme"], rec["degree"], rec["tp_degree"], rec["sp_degree"], rec["seq_len"]) == ("tsp", 8, 8, 8, S128K)
    assert rec["model_cfg"]["dim"] == 4096 and rec["recompute"] == "full" and rec["dtype"] == "bfloat16"
    assert m["mem_total_gib"] == pytest.approx(sum(m[f"mem_{c}_gib"] for c in CATEGORIES))
    # the optimizer holds fp32 master + m + v = 12 B for each of this rank's parameters
    assert m["mem_optimizer_gib"] * 2**30 == pytest.approx(12 * params_per_device(LLAMA7B, par))
    # one layer's forward traffic is the formula (docs/method.md#communication): weights (D−1)/D·W + K/V
    # 2·S·h/g·(D−1)/D, bf16
    w = 16 * 4096**2
    assert m["comm_elems_per_layer_fwd"] == pytest.approx(w * 7 / 8 + 2 * S128K * 4096 * 7 / 8)
    assert m["comm_bytes_per_layer_fwd"] == pytest.approx(2 * m["comm_elems_per_layer_fwd"])
    assert m["flops_per_token"] == pytest.approx(m["flops_per_step"] * 8 / S128K)
    # SP replicates all 8.6B weights with their AdamW state: 148 GB > an H100's 80 GB, recorded as oom with
    # the reason; TP (vocabulary-parallel head, 69 GB) fits
    sp, tp = llama_128k["sp"][1], llama_128k["tp"][1]
    assert sp["status"] == "oom" and "h100" in sp["reason"] and sp["metrics"]["mem_total_gib"] * 2**30 > 80e9
    assert tp["status"] == "ok" and tp["metrics"]["mem_total_gib"] * 2**30 < 80e9
    assert not dist.is_initialized()  # the fake process group is gone


# ---------------------------------------------------------------------------------------------- (d)
@pytest.mark.parametrize("scheme,recompute", [("tsp", "full"), ("tp_msp", "none")])
def test_layer_extrapolation_is_exact(scheme, recompute):
    model = replace(GQA, n_layers=5)  # > 4 layers: "auto" traces 3 and 4 and extrapolates
    par = ParallelConfig(scheme=scheme, degree=2, recompute=recompute)
    auto = estimate(par, Workload(model, 256, 1), EstimateOptions(layers="auto"))
    full = estimate(par, Workload(model, 256, 1), EstimateOptions(layers="all"))
    assert auto["provenance"]["extrapolated"] and not full["provenance"]["extrapolated"]
    assert auto["mem_bytes"] == full["mem_bytes"] and auto["peak_phase"] == full["peak_phase"]
    assert auto["metrics"]["flops_per_step"] == full["metrics"]["flops_per_step"]
    assert auto["comm_ops_layer0"] == full["comm_ops_layer0"]


def test_estimate_rejects_bad_input():
    with pytest.raises(ValueError, match="mode"):
        estimate(ParallelConfig(scheme="tp", degree=2), Workload(TINY, 64, 1, mode="decode"))
    with pytest.raises(ValueError, match="divisible"):
        estimate(ParallelConfig(scheme="tsp", degree=3), Workload(TINY, 64, 1))


def test_one_rank_of_an_8way_scheme_runs_alone_with_real_tensors():
    """tspbench.predict.gpu_check's premise, on CPU: rank 0 of D = 8 under the fake process group, with REAL tensors,
    allocates exactly what the fake-tensor estimate says (on a lent GPU the same run is set beside
    torch.cuda.max_memory_allocated)."""
    from tspbench.predict.gpu_check import check

    model = replace(GQA, n_layers=4, n_heads=16, n_kv_heads=8)
    rec = check(model, ParallelConfig(scheme="tsp", degree=8, recompute="full"), 256, "cpu")
    assert rec["tracked_real_gib"] > 0 and rec["cuda_max_allocated_gib"] is None
    assert rec["estimated_gib"] == pytest.approx(rec["tracked_real_gib"], rel=1e-6)
    assert rec["modelled_gib"] == pytest.approx(rec["tracked_real_gib"], rel=0.05)


# ---------------------------------------------------------------------------------------------- FLOPs
FLOP_MODEL = ModelConfig(name="flops", vocab_size=512, dim=128, n_layers=2, n_heads=8, n_kv_heads=4, ffn_hidden=256)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize(
    "scheme,degree,tp", [("single", 1, 0), ("tp", 2, 0), ("tp_msp", 2, 0), ("sp", 2, 0), ("tp_sp", 4, 2), ("tsp", 2, 0)]
)
def test_hardware_flops_model_equals_counter(scheme, degree, tp, recompute):
    """The cost model's executed FLOPs (HFU numerator, time model) equal what the estimate's FLOP counter sees in
    the scheme's real step, for every scheme × recompute mode (costmodel.flops.hardware_flops_per_token). The
    residual is the causal diagonal: a square causal block of L tokens computes L(L+1)/2 entries, the model's
    c = ½ counts L²/2 (+1/L of the attention term: 0.2% of it at S = 512)."""
    from tspbench.predict.costmodel.flops import hardware_flops_per_token

    s = 512
    par = ParallelConfig(scheme=scheme, degree=degree, tp=tp, recompute=recompute)
    got = estimate(par, Workload(FLOP_MODEL, s, 1, dtype="bfloat16"))["metrics"]["flops_per_token"]
    assert got == pytest.approx(hardware_flops_per_token(par, Workload(FLOP_MODEL, s, mode="train")), rel=2e-3)


@pytest.mark.parametrize("scheme,degree,tp", [("tp_msp", 2, 0), ("tp_sp", 4, 2), ("tp", 2, 0)])
def test_hardware_flops_with_a_replicated_head_equal_counter(scheme, degree, tp):
    """vocab=replicated: the LM head runs on the tokens the rank holds when it reaches it (Megatron-SP: its sequence
    piece, B·S/T; plain TP: every token) over every class; the model's FLOPs equal the counter's (a head charged on
    all B·S tokens under Megatron-SP would be T× too many head FLOPs). The time model's per-device FLOPs
    (time.compute_time_s, every rank the same), summed over the ranks, are what the counter sees over the replica."""
    from tspbench.predict.costmodel.time import compute_time_s

    s = 512
    par = ParallelConfig(scheme=scheme, degree=degree, tp=tp, vocab="replicated")
    work = Workload(FLOP_MODEL, s, 1, dtype="bfloat16")
    got = estimate(par, work)["metrics"]["flops_per_token"]
    per_device, _ = compute_time_s(par, Workload(FLOP_MODEL, s, 1, mode="train"), load_hardware("h100"))
    assert got == pytest.approx(per_device * degree / s, rel=2e-3)
