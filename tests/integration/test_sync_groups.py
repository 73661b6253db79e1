"""The gradient sync runs on communicators of its own (docs/method.md#gpu-review, finding 9): NCCL runs one
process group's collectives in order on one stream, so a sync group that IS the scheme's collective group (TSP at
dp = 1 before this change: the LM head's all-reduce queued ahead of the last layer's broadcasts) serialises the
two. Four real gloo ranks build each layout; every sync group must be a process group no shard and no mesh axis
uses, over the ranks of the group the gradient is summed over (× dp)."""

from __future__ import annotations

import json

import pytest
from overlap_events import record_sync_groups

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig

TINY = ModelConfig(name="tiny", vocab_size=64, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=64)
PARS = {
    "tsp_d4": ParallelConfig(scheme="tsp", degree=4),
    "tsp_d2_dp2": ParallelConfig(scheme="tsp", degree=2, dp=2),
    "sp_d4": ParallelConfig(scheme="sp", degree=4),
    "tp_d4_kv_replicated": ParallelConfig(scheme="tp", degree=4),  # T = 4 > n_kv = 2: a block group
    "tp_sp_t2_s2": ParallelConfig(scheme="tp_sp", degree=4, tp=2),
}


@pytest.fixture(scope="module")
def groups(tmp_path_factory) -> dict:
    from tspbench.spawn import spawn

    out = tmp_path_factory.mktemp("sync") / "groups.json"
    spawn(record_sync_groups, 4, TINY, PARS, str(out))
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", PARS)
def test_every_sync_group_is_a_communicator_of_its_own(groups, name):
    assert groups[name], f"{name}: no gradient sync group"
    assert all(own for _, own, _ in groups[name]), groups[name]  # a636d6c: the scheme's own group at dp = 1


def test_sync_groups_span_the_ranks_they_sum_over(groups):
    by_key = {name: {k: ranks for k, _, ranks in rows} for name, rows in groups.items()}
    assert by_key["tsp_d4"]["tsp"] == [0, 1, 2, 3]  # replicated weights: summed over the TSP axis
    assert sorted(len(r) for r in by_key["tsp_d2_dp2"].values()) == [2, 4]  # dp alone; dp × tsp
    assert by_key["tp_d4_kv_replicated"]["tp/2"] == [0, 1]  # the two tensor ranks sharing KV head 0
