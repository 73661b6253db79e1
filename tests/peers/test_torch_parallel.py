"""Our tp, tp_msp and fsdp_sp against PyTorch's own parallel layers on Hugging Face's LlamaForCausalLM
(docs/method.md#peers): torchtitan's tensor-parallel plan through torch's parallelize_module (plain and with
SequenceParallel; tspbench/peers/torch_plans.py) and FSDP2's fully_shard as torchtitan wraps Llama, from the same
weights (tspbench/hf/convert.py), float64 on 2 gloo ranks. Equal: loss, logits and every gradient (DTensor gradients
gathered with full_tensor()), and the collectives of every layer, per phase, in kind, count and bytes (PyTorch's
side counted by CommDebugMode, sized by SizedCommDebugMode). Where the two legitimately differ, the test states the
difference exactly: Megatron-SP's backward re-gather, and the sequence-parallel norms' gradient all-reduce.

Tolerance 1e-10 (normwise relative, tspbench.verify.case.TOL["float64"]): both sides compute the same maths in
float64 (transformers' float32 RoPE, RMSNorm and softmax are run in float64 here, tests/peers/peer_harness.py), so
they differ only by summation order, ≈ n·ε ≲ 1e-13 at these sizes (measured: ~2e-15); a wrong mapping is O(1).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import peer_harness as H
import pytest

pytest.importorskip("transformers", reason="the peer is Hugging Face's LlamaForCausalLM (pip install -e .[hf])")

TOL = 1e-10  # module docstring
BSH = H.B * H.S * H.CFG.dim  # one [B, S, h] activation
ITEM = 8  # float64 bytes
JOBS = [
    ("ours", {"scheme": "tp", "degree": 2}),
    ("torch_tp", {"sequence_parallel": False}),
    ("ours", {"scheme": "tp_msp", "degree": 2}),
    ("torch_tp", {"sequence_parallel": True}),
    ("ours", {"scheme": "fsdp_sp", "degree": 2}),
    ("torch_fsdp", {}),
    ("torch_hf_plan", {}),
    ("torch_tp", {"sequence_parallel": False, "permute_rope": False}),  # broken: q/k rows not permuted
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every job of JOBS in one spawned group of 2 ranks (~20 s on 2 cores), by (name, kwargs)."""
    import torch

    from tspbench.spawn import spawn

    out = Path(tmp_path_factory.mktemp("peers")) / "runs.pt"
    spawn(H.run, 2, str(out), JOBS)
    got = torch.load(out, weights_only=False)
    return {(name, tuple(sorted(kw.items()))): got[f"{name}:{sorted(kw.items())}"] for name, kw in JOBS}


def job(runs: dict, name: str, **kw) -> dict:
    return runs[(name, tuple(sorted(kw.items())))]


def mismatches(a: dict, b: dict) -> list[str]:
    """Loss, logits and every gradient of `a` that differ from `b` by more than TOL (normwise relative)."""
    from tspbench.verify.case import check_tensor

    checks = [check_tensor("loss", a["loss"], b["loss"], TOL), check_tensor("logits", a["logits"], b["logits"], TOL)]
    assert set(a["grads"]) == set(b["grads"])
    checks += [check_tensor(n, a["grads"][n], b["grads"][n], TOL) for n in b["grads"]]
    return [f"{c.name}: {c.max_rel:.2e}" for c in checks if not c.ok]


def layer(comm: list, i: int, phase: str) -> list[tuple[str, int, int]]:
    """(op, numel, bytes) of layer i's collectives in one phase, in issue order: ours by CommLog tag, PyTorch's by the
    module CommDebugMode saw them in."""

    def at(w: str) -> bool:
        return w == f"layer{i}" or f".layers.{i}." in w + "."

    return [(op, n, b) for op, ph, w, n, b in comm if ph == phase and at(w)]


def where(comm: list, names: tuple[str, ...], phase: str) -> list[tuple[str, int, int]]:
    return [(op, n, b) for op, ph, w, n, b in comm if ph == phase and any(x in w for x in names)]


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp_msp"])
def test_values_equal_pytorch_tensor_parallel(runs, sp):
    mine = job(runs, "ours", scheme="tp_msp" if sp else "tp", degree=2)
    assert mismatches(mine, job(runs, "torch_tp", sequence_parallel=sp)) == []


def test_tp_collectives_equal_per_layer(runs):
    """Megatron TP = torchtitan's plan without SequenceParallel: 2 all-reduces of B·S·h per layer forward (the
    row-parallel outputs) and 2 backward (the column-parallel inputs' gradients, one per PrepareModuleInput / one per
    fused column-parallel entry of ours)."""
    mine, theirs = (
        job(runs, "ours", scheme="tp", degree=2)["comm"],
        job(runs, "torch_tp", sequence_parallel=False)["comm"],
    )
    for i in range(H.CFG.n_layers):
        for phase in ("fwd", "bwd"):
            assert layer(mine, i, phase) == layer(theirs, i, phase) == [("all_reduce", BSH, BSH * ITEM)] * 2


def test_transformers_own_plan(runs):
    """transformers' base_model_tp_plan (colwise / rowwise projections only, no PrepareModuleInput): the same values,
    the same 2 forward all-reduces per layer, but backward one all-reduce of B·S·h per column-parallel projection
    (each ColwiseParallel turns its own input's Partial gradient into a Replicate one): 3 for Q, K, V and 2 for gate,
    up, 5 per layer against our (and torchtitan's plan's) 2. Its embedding, head and loss are replicated: no
    collective outside the layers."""
    mine, theirs = job(runs, "ours", scheme="tp", degree=2), job(runs, "torch_hf_plan")
    assert mismatches(mine, theirs) == []
    ar = ("all_reduce", BSH, BSH * ITEM)
    for i in range(H.CFG.n_layers):
        assert layer(theirs["comm"], i, "fwd") == layer(mine["comm"], i, "fwd") == [ar] * 2
        assert layer(theirs["comm"], i, "bwd") == [ar] * 5 and layer(mine["comm"], i, "bwd") == [ar] * 2
    assert all(".layers." in where for _op, _ph, where, _n, _b in theirs["comm"])


def test_tp_embedding_head_and_loss_equal(runs):
    """Vocabulary-parallel embedding (one all-reduce forward), LM head (its input's gradient all-reduced) and
    cross-entropy (ours: 3 all-reduces of B·S scalars; PyTorch's loss_parallel: the same 3, outside any module)."""
    mine, theirs = (
        job(runs, "ours", scheme="tp", degree=2)["comm"],
        job(runs, "torch_tp", sequence_parallel=False)["comm"],
    )
    bs = H.B * H.S
    assert where(mine, ("embed",), "fwd") == where(theirs, ("embed_tokens",), "fwd") == [("all_reduce", BSH, BSH * 8)]
    assert (
        where(mine, ("head",), "fwd") == where(theirs, ("lm_head", "Global"), "fwd") == [("all_reduce", bs, bs * 8)] * 3
    )
    assert where(mine, ("head",), "bwd") == where(theirs, ("lm_head",), "bwd") == [("all_reduce", BSH, BSH * 8)]
    assert where(mine, ("embed",), "bwd") == where(theirs, ("embed_tokens",), "bwd") == []


def test_tp_msp_collectives_per_layer(runs):
    """Megatron-SP = torchtitan's plan with SequenceParallel. Forward equal: all-gather in, reduce-scatter out, for
    attention and MLP. Backward: PyTorch's DTensor keeps the gathered input for the weight gradient, ours (Megatron's
    LinearWithGradAccumulationAndAsyncCommunication) keeps the rank's piece and re-gathers it: exactly 2 more
    all-gathers of B·S·h per layer on our side (the memory model charges PyTorch's way 2 gathered [B, S, h] kept per
    layer instead); every other backward collective equal."""
    mine = job(runs, "ours", scheme="tp_msp", degree=2)["comm"]
    theirs = job(runs, "torch_tp", sequence_parallel=True)["comm"]
    ag, rs = ("all_gather", BSH, BSH * ITEM), ("reduce_scatter", BSH, BSH * ITEM)
    for i in range(H.CFG.n_layers):
        assert layer(mine, i, "fwd") == layer(theirs, i, "fwd") == [ag, rs, ag, rs]
        extra = Counter(layer(mine, i, "bwd"))
        extra.subtract(Counter(layer(theirs, i, "bwd")))
        assert +extra == Counter({ag: 2}) and -extra == Counter()
        assert layer(theirs, i, "bwd") == [ag, rs, ag, rs]


def test_tp_msp_edges_and_norm_gradients(runs):
    """Embedding: reduce-scatter into the sequence shards forward, all-gather backward; head: all-gather of the final
    norm's output forward, reduce-scatter backward; the same 3 loss all-reduces. The sequence-parallel norms'
    weight gradients: ours all-reduces them once after backward (Megatron's all-reduce of sequence-parallel
    gradients, 2·L·h + h elements in one bucket); PyTorch leaves them Partial DTensors and reduces them only when
    they are read (full_tensor() here, the optimizer's redistribute in a trainer): none during backward."""
    mine = job(runs, "ours", scheme="tp_msp", degree=2)["comm"]
    theirs = job(runs, "torch_tp", sequence_parallel=True)["comm"]
    bs, full = H.B * H.S, (BSH, BSH * ITEM)
    assert where(mine, ("embed",), "fwd") == where(theirs, ("embed_tokens",), "fwd") == [("reduce_scatter", *full)]
    assert where(mine, ("embed",), "bwd") == where(theirs, ("embed_tokens",), "bwd") == [("all_gather", *full)]
    head = [("all_gather", *full)] + [("all_reduce", bs, bs * ITEM)] * 3
    assert where(mine, ("head",), "fwd") == where(theirs, ("lm_head", "Global"), "fwd") == head
    assert where(mine, ("head",), "bwd") == where(theirs, ("lm_head",), "bwd") == [("reduce_scatter", *full)]
    norms = (2 * H.CFG.n_layers + 1) * H.CFG.dim
    assert [(op, n) for op, ph, *_, n, _b in mine if ph == "grad_sync"] == [("all_reduce", norms)]
    assert [r for r in theirs if r[0] == "all_reduce" and r[3] == norms] == []


def fsdp_units() -> dict[int, str]:
    """FSDP unit sizes (elements; no padding at these shapes over 2 ranks): a block (its 7 weights and 2 norms), the
    embedding, the final norm + LM head."""
    m = H.CFG
    block = (2 * m.n_heads * m.head_dim + 2 * m.n_kv_heads * m.head_dim) * m.dim + 3 * m.ffn_hidden * m.dim + 2 * m.dim
    return {block: "block", m.vocab_size * m.dim: "embed", m.vocab_size * m.dim + m.dim: "head"}


def fsdp_ops(comm: list) -> list[tuple[str, str, str, int]]:
    """FSDP's collectives (unit-sized all-gathers and reduce-scatters) as (op, phase, unit, bytes), in issue order;
    fsdp_sp's K/V exchange over Σ (a different size) left out."""
    units = fsdp_units()
    return [(op, ph, units[n], b) for op, ph, _w, n, b in comm if n in units and op in ("all_gather", "reduce_scatter")]


def test_fsdp_values_equal_fully_shard(runs):
    """Our fsdp_sp at Σ = 2 (FSDP over the 2 sequence ranks; fsdp_sp refuses Σ = 1, which is the single-device token
    layout) against FSDP2 data parallelism over 2 ranks, each with its own row: the same mean token loss, so the same
    loss, logits and gradients."""
    assert mismatches(job(runs, "ours", scheme="fsdp_sp", degree=2), job(runs, "torch_fsdp")) == []


def test_fsdp_collectives_equal(runs):
    """Every FSDP all-gather and reduce-scatter, in issue order, with its phase and bytes: per block unit one
    all-gather forward, one backward and one gradient reduce-scatter; embedding: all-gather forward and backward,
    reduce-scatter; head (kept gathered after forward): one all-gather, one reduce-scatter. PyTorch's CommDebugMode
    attributes a prefetched all-gather to the module running when it is issued (block i+1's to block i), so units
    are told apart by size, not by module."""
    mine, theirs = (
        fsdp_ops(job(runs, "ours", scheme="fsdp_sp", degree=2)["comm"]),
        fsdp_ops(job(runs, "torch_fsdp")["comm"]),
    )
    assert mine == theirs
    per = Counter((op, ph) for op, ph, unit, _ in theirs if unit == "block")
    L = H.CFG.n_layers
    assert per == Counter({("all_gather", "fwd"): L, ("all_gather", "bwd"): L, ("reduce_scatter", "bwd"): L})


def test_broken_mapping_fails(runs):
    """Weights mapped without the q/k row permutation (our interleaved RoPE pairs read by transformers' rotate_half):
    logits and gradients no longer equal."""
    broken = job(runs, "torch_tp", sequence_parallel=False, permute_rope=False)
    assert "logits" in " ".join(mismatches(job(runs, "ours", scheme="tp", degree=2), broken))


def test_broken_counts_fail(runs):
    """Non-vacuity of the collective comparison: our CommLog with one collective dropped, and the plan without
    SequenceParallel held to our tp_msp, both differ."""
    mine = job(runs, "ours", scheme="tp", degree=2)["comm"]
    theirs = job(runs, "torch_tp", sequence_parallel=False)["comm"]
    dropped = [r for k, r in enumerate(mine) if k != next(j for j, x in enumerate(mine) if x[2] == "layer0")]
    assert layer(dropped, 0, "fwd") != layer(theirs, 0, "fwd")
    msp = job(runs, "ours", scheme="tp_msp", degree=2)["comm"]
    assert layer(msp, 0, "fwd") != layer(theirs, 0, "fwd")
    fsdp = fsdp_ops(job(runs, "ours", scheme="fsdp_sp", degree=2)["comm"])
    assert fsdp[:-1] != fsdp_ops(job(runs, "torch_fsdp")["comm"])  # the last reduce-scatter dropped
