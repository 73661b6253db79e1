"""The link rule of the cost model (docs/method.md#collective-cost): which links a collective of a p-GPU group uses on
each topology (a fully connected mesh, a switch, across nodes), and `Pricing.links="node"` reproducing the rule before
it exactly. Pure arithmetic on the conf/hardware profiles: fast."""

from __future__ import annotations

import pytest
import yaml

from tspbench.config import model_preset
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel import Workload, cluster_throughput
from tspbench.predict.costmodel.collectives import collective_cost_s, collective_time_s, collectives_time_s
from tspbench.predict.costmodel.hardware import CONF_DIR, TOPOLOGIES, load_hardware
from tspbench.predict.costmodel.workload import Pricing

LLAMA7B, S128K = model_preset("llama7b"), 131072
NODE, TOPOLOGY = Pricing(links="node"), Pricing(links="topology")
PROFILES = sorted(p.stem for p in CONF_DIR.glob("*.yaml"))
OPS = ("allgather", "reduce_scatter", "allreduce", "alltoall", "broadcast", "reduce")

# ------------------------------------------------------------------------------------------ "node": the rule before
CASES = [
    ("allreduce", 2, 1e8, 2, 1),
    ("allreduce", 4, 1e8, 4, 2),
    ("allreduce", 8, 1e8, 8, 1),
    ("allgather", 2, 3e7, 8, 1),
    ("reduce_scatter", 4, 3e7, 4, 3),
    ("alltoall", 4, 5e7, 8, 1),
    ("broadcast", 8, 2e7, 8, 8),
    ("reduce", 8, 2e7, 8, 8),
    ("p2p", 2, 4e7, 8, 7),
    ("p2p", 2, 4e7, 16, 7),
    ("allgather", 16, 3e7, 16, 1),
    ("allreduce", 128, 1e9, 1024, 1),
    ("alltoall", 2, 5e7, 8, 1),
]
"""(op, p, elements, span, count), priced in bf16."""
_H100 = (
    0.0006937606837606838, 0.0021112820512820514, 0.0012665811965811965, 0.00010756410256410256,
    0.0005065384615384616, 0.0002714102564102564, 0.0013740170940170942, 0.0013740170940170942,
    0.0019495299145299147, 0.01730076923076923, 0.0018807692307692308, 0.12465538461538461, 0.00017594017094017095,
)  # fmt: skip
GOLDEN = {
    "a100": (
        0.0010356410256410257, 0.003136923076923077, 0.0018648717948717948, 0.00015884615384615386,
        0.0007373076923076923, 0.0003996153846153846, 0.001921025641025641, 0.001921025641025641,
        0.002906794871794872, 0.03453153846153846, 0.0036115384615384616, 0.2467707692307692, 0.0002614102564102564,
    ),
    "cpu": (
        0.061638461538461545, 0.18521538461538462, 0.1083923076923077, 0.009280769230769231, 0.041988461538461544,
        0.02322692307692308, 0.10126153846153846, 0.10126153846153846, 0.17265769230769232, 0.6899307692307692,
        0.07073076923076924, 4.910015384615385, 0.015434615384615385,
    ),
    "h100": _H100,
    "h100_96gb": _H100,
    "h200": _H100,
    "mi300x": (
        0.0006968131868131869, 0.0021204395604395606, 0.001271923076923077, 0.00010802197802197802,
        0.0005085989010989011, 0.00027255494505494505, 0.001378901098901099, 0.001378901098901099,
        0.013496538461538463, 0.01730076923076923, 0.0018807692307692308, 0.12465538461538461, 0.00017670329670329673,
    ),
}  # fmt: skip
"""collectives_time_s of each case, computed by the code before the topology model (HardwareProfile.link by span)."""


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_node_reproduces_the_rule_before_exactly(name):
    hw = load_hardware(name)
    got = tuple(collectives_time_s([c], hw, 2, pricing=NODE) for c in CASES)
    assert got == GOLDEN[name]  # exact: the before column of the before → after table
    # HardwareProfile.link is the same function as before, for the callers that still use it
    assert hw.link(hw.gpus_per_node) == (hw.intra_node_bw * hw.comm_efficiency, hw.intra_node_latency_s)
    assert hw.link(2 * hw.gpus_per_node) == (hw.inter_node_bw * hw.comm_efficiency, hw.inter_node_latency_s)


def test_the_golden_values_are_not_vacuous():
    hw = load_hardware("mi300x")
    topo = tuple(collectives_time_s([c], hw, 2, pricing=TOPOLOGY) for c in CASES)
    assert topo != GOLDEN["mi300x"] and topo[0] > GOLDEN["mi300x"][0]  # a 2-GPU all-reduce: 1 link, not 7
    with pytest.raises(ValueError, match="links='nope'"):
        collective_cost_s("allreduce", 2, 1e6, 2, hw, pricing=Pricing(links="nope"))


# ------------------------------------------------------------------------------------------ "topology", per fabric
def test_mesh_a_p_gpu_group_gets_p_minus_1_links():
    mi = load_hardware("mi300x")
    assert (mi.topology, mi.links_per_gpu, mi.link_bw) == ("mesh", 7, 64e9)
    link = 64e9 * mi.link_efficiency
    for op in OPS:
        assert mi.group_link(op, 2, 2) == (pytest.approx(1 * link), mi.intra_node_latency_s)  # T = 2: one link
        assert mi.group_link(op, 4, 4)[0] == pytest.approx(3 * link)  # T = 4: three
        assert mi.group_link(op, 4, 8)[0] == pytest.approx(3 * link)  # strided inside the node: still three
        assert mi.group_link(op, 8, 8)[0] == pytest.approx(7 * link)  # the whole node: all seven
    # a ring hop is one transfer to one peer: one link, the same rule as a 2-GPU group; to both neighbours, two
    assert mi.group_link("p2p", 2, 8) == mi.group_link("allgather", 2, 8) == mi.group_link("allreduce", 2, 2)
    assert mi.group_link("p2p", 3, 8)[0] == pytest.approx(2 * link)
    # the published per-link figure: AMD's 45-48 GB/s per direction (conf/hardware/mi300x.yaml)
    assert 45e9 <= link <= 48e9
    # an 8-GPU all-reduce at RCCL's measured bus bandwidth (319 GB/s) within 1%
    assert mi.group_link("allreduce", 8, 8)[0] == pytest.approx(319e9, rel=0.01)
    n = 1e9
    assert collective_cost_s("allreduce", 2, n, 2, mi, pricing=TOPOLOGY) == pytest.approx(
        collective_time_s("allreduce", 2, n, link, mi.intra_node_latency_s)
    )


def test_switch_the_same_bandwidth_for_any_group():
    h100 = load_hardware("h100")
    assert h100.topology == "switch" and h100.links_per_gpu * h100.link_bw == h100.intra_node_bw
    full = h100.intra_node_bw * h100.link_efficiency
    for op in (*OPS, "p2p"):
        for p, span in ((2, 2), (2, 8), (4, 4), (4, 8), (8, 8)):
            if op == "allreduce" and p == 8:
                continue
            assert h100.group_link(op, p, span) == (pytest.approx(full), h100.intra_node_latency_s), (op, p)
    assert full == pytest.approx(370e9, rel=0.01)  # NCCL's effective NVLink bandwidth on H100
    # an all-reduce over the whole node reduces in the switch (NVLS), where the profile has a published figure
    assert h100.group_link("allreduce", 8, 8)[0] == 480e9
    a100 = load_hardware("a100")
    assert a100.nvls_allreduce_busbw is None
    assert a100.group_link("allreduce", 8, 8)[0] == a100.group_link("allgather", 2, 2)[0]


def test_across_nodes_the_nics_of_a_nodes_members():
    for name in ("mi300x", "h100"):
        hw = load_hardware(name)
        nic = hw.inter_node_bw * hw.nic_efficiency
        lat = hw.inter_node_latency_s
        assert hw.group_link("allreduce", 128, 1024) == (pytest.approx(nic), lat)  # DP over replicas of 8: one
        assert hw.group_link("p2p", 2, 16) == (pytest.approx(nic), lat)  # a ring hop that leaves the node
        assert hw.group_link("allgather", 8, 16) == (pytest.approx(4 * nic), lat)  # Σ = 8 over T = 2: 4 a node
        assert hw.group_link("allgather", 16, 16) == (pytest.approx(8 * nic), lat)  # D = 16: 8 a node
    # RCCL's measured two-node all-reduce (2 × 8 MI300X, 8 × 400G NICs a node): ~360 GB/s bus bandwidth
    assert load_hardware("mi300x").group_link("allreduce", 16, 16)[0] == pytest.approx(360e9, rel=0.01)


# ------------------------------------------------------------------------------------------ profiles, the step
@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_states_its_links(name):
    data = yaml.safe_load((CONF_DIR / f"{name}.yaml").read_text())
    assert {"topology", "links_per_gpu", "link_bw", "link_efficiency", "nic_efficiency"} <= set(data)
    hw = load_hardware(name)
    assert hw.topology in TOPOLOGIES and hw.links_per_gpu >= 1
    assert 0 < hw.link_efficiency <= 1 and 0 < hw.nic_efficiency <= 1
    assert hw.links_per_gpu * hw.link_bw == pytest.approx(hw.intra_node_bw)  # the links add up to the datasheet's


def test_unknown_topology_is_refused(tmp_path):
    data = yaml.safe_load((CONF_DIR / "h100.yaml").read_text())
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({**data, "name": "bad", "topology": "torus"}))
    with pytest.raises(ValueError, match="topology='torus' is unknown; allowed: switch, mesh"):
        load_hardware("bad", conf_dir=tmp_path)


def test_the_links_decide_the_tp_sp_layouts_on_the_mesh():
    """TP×SP's T = 2 and T = 4 tensor collectives have 1 and 3 of MI300X's 7 links: slower than the node rule, which
    gave them all 7; TP T = 8 has all 7 under both rules."""
    mi, work = load_hardware("mi300x"), Workload(LLAMA7B, S128K, mode="train")

    def tps(par, pricing):
        return cluster_throughput(par, work, mi, 1024, overlap="schedule", pricing=pricing)["tokens_per_s_per_device"]

    for t in (2, 4):
        par = ParallelConfig(scheme="tp_sp", degree=8, tp=t, recompute="full")
        assert tps(par, TOPOLOGY) < 0.9 * tps(par, NODE)
    tp = ParallelConfig(scheme="tp", degree=8, recompute="full")
    assert tps(tp, TOPOLOGY) >= tps(tp, NODE)  # 7 links either way; the measured efficiency is above 0.65


def test_every_ring_by_the_same_rule_ring_attention_hops_are_point_to_point():
    """Ring attention (sp_variant=ring) is Σ−1 point-to-point hops of one [K; V] block forward and Σ−1 of its dK/dV
    backward (schemes/ops/ring_attention.py), priced as TSP's MLP ring hops are: one peer link on the MI300X mesh,
    where the all-gather variant's collectives get the group's Σ − 1 links. Same volume either way; under `schedule`
    each hop is hidden up to one step's kernel (time._ring_hidden_s), and a hop is hidden only because the code posts
    it before that step (tests/integration/test_ring_overlap.py)."""
    from tspbench.predict.costmodel import comm_per_layer
    from tspbench.predict.costmodel.collectives import layer_collectives
    from tspbench.predict.costmodel.time import schedule_exposed_comm_s

    hw, sig = load_hardware("mi300x"), 8
    ring = ParallelConfig(scheme="sp", degree=sig, sp_variant="ring")
    gather = ParallelConfig(scheme="sp", degree=sig, sp_variant="allgather")
    work = Workload(LLAMA7B, S128K, mode="train")
    hops = [c for c in layer_collectives(ring, work) if c[0] == "p2p"]
    assert hops and all(c[1] == 2 and c[4] == sig - 1 for c in hops)
    got, want = comm_per_layer(ring, work), comm_per_layer(gather, work)
    assert (got["fwd_total"], got["bwd_total"]) == pytest.approx((want["fwd_total"], want["bwd_total"]))
    volume = sum(c[2] * c[4] for c in hops)  # each hop receives its block
    assert volume == pytest.approx(got["fwd_total"] + got["bwd_total"])
    _, p, n, span, _ = hops[0]
    hop_s = collective_cost_s("p2p", p, n * 2, span, hw, pricing=TOPOLOGY)  # bf16: 2 bytes per element
    assert hop_s == pytest.approx(
        collective_time_s("p2p", 2, n * 2, hw.link_bw * hw.link_efficiency, hw.intra_node_latency_s)
    )
    exposed_all = collectives_time_s(layer_collectives(ring, work), hw, 2, pricing=TOPOLOGY)
    exposed = schedule_exposed_comm_s(ring, work, hw, pricing=TOPOLOGY)
    assert 0.0 <= exposed < exposed_all  # the hops hidden behind the steps' kernels (at 128K: all of them)
    short = Workload(LLAMA7B, 2048, mode="train")  # a step's kernel shorter than a hop: part of each hop exposed
    assert schedule_exposed_comm_s(ring, short, hw, pricing=TOPOLOGY) > 0.0
