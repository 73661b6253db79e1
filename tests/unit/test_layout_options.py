"""Every layout option reaches every entry point: each CLI's config, the worker's RunSpec, every kind of record and
the scheme itself receive every ParallelConfig field unchanged (docs/adding-a-scheme.md). Before tspbench.parallel,
`verify` and `estimate` rebuilt the layout from eight named fields and dropped `kv_bucket_heads`, so `verify
scheme=tsp kv_bucket_heads=1` proved the unbucketed path.

Three layouts set every field to a non-default value between them (no scheme takes every option): a T × Σ mesh with
the plain ablation, ring attention and a replicated vocabulary; TSP with K/V buckets, the vocabulary ring, the
bidirectional MLP ring and kept K/V; FSDP×SP sharded across both replicas; all data-parallel and recomputing."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig, layout_fields, validate_parallel

MODEL = ModelConfig(name="tiny")  # conf/model/tiny.yaml: 4 heads, 4 KV heads, dim 64, vocabulary 256
SEQ = 128
LAYOUTS = [
    ParallelConfig(
        scheme="tp_sp", degree=4, tp=2, dp=2, sp_variant="ring", recompute="selective", msp=False, vocab="replicated"
    ),
    ParallelConfig(
        scheme="tsp",
        degree=2,
        dp=2,
        kv_bucket_heads=1,
        recompute="full",
        vocab="ring",
        mlp_exchange="biring",
        regather_kv=False,
    ),
    ParallelConfig(scheme="fsdp_sp", degree=2, dp=2, dp_shard=2, sp_variant="ring", recompute="selective"),
]
DEFAULTS = ParallelConfig()


def _overrides(par: ParallelConfig) -> list[str]:
    return [f"{f.name}={str(getattr(par, f.name)).lower()}" for f in fields(ParallelConfig)]


def test_the_layouts_set_every_field_to_a_non_default_value():
    for f in fields(ParallelConfig):
        assert any(getattr(p, f.name) != getattr(DEFAULTS, f.name) for p in LAYOUTS), f.name
    for p in LAYOUTS:
        validate_parallel(MODEL, p, SEQ, 1)


@pytest.mark.parametrize("par", LAYOUTS, ids=lambda p: p.scheme)
def test_verify_and_estimate_configs(par):
    from tspbench.estimate import compose as estimate_compose
    from tspbench.verify.__main__ import compose as verify_compose

    assert verify_compose(_overrides(par)).parallel() == par
    assert estimate_compose([*_overrides(par), "model=tiny"]).parallel() == par


@pytest.mark.parametrize("par", LAYOUTS, ids=lambda p: p.scheme)
def test_experiment_spec_and_records(par):
    from tspbench.record.offline import estimated_record, modelled_record
    from tspbench.record.schema import base_record
    from tspbench.record.spec import RunSpec
    from tspbench.run.experiment import compose_experiment
    from tspbench.run.grid import expand_grid

    # the experiment's singular keys replace a grid axis; those of an option refuse a grid without a scheme taking it
    taken = ("scheme=", "dp=", "recompute=", *(f"{k}=" for k in par.options()))
    keys = [o for o in _overrides(par) if o.startswith(taken)]
    cfg = compose_experiment(["+exp=smoke", f"seq_len={SEQ}", f"degree={par.degree}", "hardware=h100", *keys])
    (spec,) = expand_grid(cfg)
    assert spec.parallel() == par
    assert RunSpec.from_json(spec.to_json()).parallel() == par  # what the worker reads
    want = layout_fields(par)
    for rec in (base_record(spec, "failed", "x"), modelled_record(spec), estimated_record(spec)):
        assert {k: rec[k] for k in want} == want, rec["method"]
        assert json.loads(json.dumps(rec["provenance"]["config"]))["kv_bucket_heads"] == par.kv_bucket_heads


@pytest.mark.parametrize("par", LAYOUTS, ids=lambda p: p.scheme)
def test_plan_records(par, tmp_path):
    from tspbench import plan

    out = tmp_path / "plan.jsonl"
    argv = [
        "model=tiny",
        f"seq_len={SEQ}",
        f"gpus={par.world_size}",
        "hardware=h100",
        f"schemes={par.scheme}",
        f"sp_variants={par.sp_variant}",
        f"msps={str(par.msp).lower()}",
        f"vocabs={par.vocab}",
        f"kv_bucket_heads={par.kv_bucket_heads}",
        f"mlp_exchanges={par.mlp_exchange}",
        f"regather_kvs={str(par.regather_kv).lower()}",
        f"dp_shards={par.dp_shard}",
        "batches=1",
        f"out={out}",
    ]
    assert plan.main(argv) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    want = layout_fields(par)
    assert any({k: r[k] for k in want} == want for r in recs), [r["layout"] for r in recs]


def test_the_scheme_receives_every_option():
    """The scheme runs what the layout says: the collectives of its layer 0 (fake tensors, fake process group) show
    the options at work."""
    from tspbench.predict.costmodel import Workload
    from tspbench.predict.estimate import estimate

    mesh, tsp, _fsdp = LAYOUTS
    ops = [(o[0], o[1]) for o in estimate(mesh, Workload(MODEL, SEQ, 1, dtype="float32"))["comm_ops_layer0"]]
    fwd = [op for op, phase in ops if phase == "fwd"]
    assert "send_recv" in fwd and "all_reduce" in fwd  # ring attention hops; plain TP (msp=false) all-reduces
    assert "reduce_scatter" not in fwd  # Megatron-SP (msp=true) would reduce-scatter
    rec = estimate(tsp, Workload(MODEL, SEQ, 1, dtype="float32"))
    fwd = [o[0] for o in rec["comm_ops_layer0"] if o[1] == "fwd"]
    per_owner = MODEL.n_kv_heads // tsp.degree  # 2 KV heads per owner, buckets of 1: 2 all-gathers per owner
    assert fwd.count("all_gather") == tsp.degree * per_owner
    # (op, phase, group, numel, received, bytes, recompute) of layer 0's collectives
    ops, shard = rec["comm_ops_layer0"], 3 * MODEL.dim * MODEL.ffn_hidden // tsp.degree  # one MLP shard
    hops = [o for o in ops if o[0] == "send_recv" and o[1] == "fwd"]
    assert len(hops) == 2 * (tsp.degree - 1) and {o[3] for o in hops} == {shard // 2}  # biring: half a shard each way
    # regather_kv=false: backward gathers no K/V; its only all-gathers are the full-recompute replay's
    assert not [o for o in ops if o[0] == "all_gather" and o[1] == "bwd" and not o[6]]
    assert sum(o[0] == "all_gather" and o[6] for o in ops) == tsp.degree * per_owner
    plain = replace(tsp, kv_bucket_heads=0, mlp_exchange="ring", regather_kv=True)  # every TSP option at its default
    ops = estimate(plain, Workload(MODEL, SEQ, 1, dtype="float32"))["comm_ops_layer0"]
    assert [o[0] for o in ops if o[1] == "fwd"].count("all_gather") == tsp.degree
    hops = [o for o in ops if o[0] == "send_recv" and o[1] == "fwd"]
    assert len(hops) == tsp.degree - 1 and {o[3] for o in hops} == {shard}  # the ring: one whole shard one way
    assert sum(o[0] == "all_gather" and o[1] == "bwd" and not o[6] for o in ops) == tsp.degree  # re-gathered


def test_a_dropped_option_is_caught():
    """Non-vacuity: a config that rebuilds the layout from a subset of its fields (the old bug) fails the check."""
    par = LAYOUTS[1]
    dropped = ParallelConfig(**{k: getattr(par, k) for k in ("scheme", "degree", "dp", "recompute", "vocab")})
    assert dropped != par and layout_fields(dropped) != layout_fields(par)
