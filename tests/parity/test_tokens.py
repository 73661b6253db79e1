"""Tokens per step are counted once per scheme: dp × B × S, never × T, × Σ or × D (docs/method.md#tokens).

Peers over-count by the TP degree (huggingface/trl#7100: "32× the truth") or the CP degree
(pytorch/torchtitan#2983) and under-count by dividing by it (PrimeIntellect-ai/prime-rl#2424). The runner's
`tokens_per_step` is checked here against what every scheme actually feeds its ranks: the union of the
(row, position) coordinates of all ranks' local batches, gathered over a 4-rank gloo world.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch.distributed as dist

from tspbench.config import ModelConfig
from tspbench.measure.timing import throughput, tokens_per_step
from tspbench.parallel import ParallelConfig, validate_parallel
from tspbench.spawn import spawn

# one worker runs this module: its module-scoped fixture (a spawned rank group / a build) then runs once, not per worker
pytestmark = pytest.mark.xdist_group("tokens")

WORLD = 4
SEQ, BATCH = 32, 2
MODEL = dict(name="tiny", vocab_size=128, dim=64, n_layers=1, n_heads=8, n_kv_heads=8, ffn_hidden=128)
# Every scheme at world 4, pure and with data parallelism.
LAYOUTS = [
    ("single", 1, 4),
    ("tp", 4, 1),
    ("tp", 2, 2),
    ("tp_msp", 4, 1),
    ("tp_msp", 2, 2),
    ("sp", 4, 1),
    ("sp", 2, 2),
    ("tp_sp", 4, 1),
    ("tsp", 4, 1),
    ("tsp", 2, 2),
]


@pytest.mark.parametrize("scheme,degree,dp", LAYOUTS)
def test_formula_ignores_the_degree(scheme, degree, dp):
    par = ParallelConfig(scheme=scheme, degree=degree, dp=dp)
    assert tokens_per_step(par, BATCH, SEQ) == dp * BATCH * SEQ
    # The per-device figure divides the global one by the world size, whatever the scheme.
    t = throughput(tokens_per_step(par, BATCH, SEQ), steps=10, window_s_per_rank=[1.0, 2.0], world_size=dp * degree)
    assert t["tokens_per_s"] == pytest.approx(dp * BATCH * SEQ * 10 / 2.0)  # slowest rank's window
    assert t["tokens_per_s_per_device"] == pytest.approx(t["tokens_per_s"] / (dp * degree))


def _worker(rank: int, world: int, out: str) -> None:
    from tspbench.model import synthetic_batch
    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh

    cfg = ModelConfig(**MODEL)
    found = {}
    for scheme, degree, dp in LAYOUTS:
        par = ParallelConfig(scheme=scheme, degree=degree, dp=dp)
        validate_parallel(cfg, par, SEQ, BATCH, world_size=world)
        pm = apply_scheme(cfg, par, ApplyArgs(build_mesh(par, "cpu"), SEQ, seed=0))
        tokens, targets = synthetic_batch(cfg, dp * BATCH, SEQ, seed=0)
        tok, _, pos = pm.local_batch(tokens, targets)
        replica = pm.dp.rank if pm.dp is not None else 0
        rows = range(replica * BATCH, replica * BATCH + tok.shape[0])
        # (global row, global position) → token id, for every token this rank computes on
        mine = {(r, int(p)): int(tok[i, j]) for i, r in enumerate(rows) for j, p in enumerate(pos.tolist())}
        allm: list = [None] * world
        dist.all_gather_object(allm, mine)
        if rank == 0:
            union: dict = {}
            for m in allm:
                union.update(m)
            ok_ids = all(tokens[r, p].item() == t for (r, p), t in union.items())
            found[f"{scheme}/{degree}/{dp}"] = {
                "unique": len(union),
                "ids_match": ok_ids,
                "counted": tokens_per_step(par, BATCH, SEQ),
            }
        dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps(found))


@pytest.fixture(scope="module")
def gathered():
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "tokens.json")
        spawn(_worker, WORLD, out)
        return json.loads(Path(out).read_text())


@pytest.mark.parametrize("scheme,degree,dp", LAYOUTS)
def test_runner_count_equals_unique_tokens_fed(gathered, scheme, degree, dp):
    g = gathered[f"{scheme}/{degree}/{dp}"]
    assert g["ids_match"], "a rank's local tokens differ from the global batch at the same coordinates"
    assert g["unique"] == dp * BATCH * SEQ
    assert g["counted"] == g["unique"], (
        f"tokens_per_step={g['counted']} but the ranks of {scheme} (degree {degree}, dp {dp}) together "
        f"consume {g['unique']} unique tokens per step"
    )


def test_non_vacuous():
    """The count a TP-multiplying peer would report differs from ours, so the check above can fail."""
    par = ParallelConfig(scheme="tp", degree=4, dp=1)
    assert tokens_per_step(par, BATCH, SEQ) * par.tp_degree != BATCH * SEQ
