"""Ring attention (`sp_variant=ring`) overlaps its K/V hops with the flash kernels in the issue order of the code
(tspbench/schemes/ops/ring_attention.py, docs/method.md#choice-sp-variant).

A real 4-rank gloo training step of `sp` with the ring records when each hop is posted and waited and when each
step's kernels start. Per layer:
forward   the hop that brings step t+1's [K; V] block is posted before step t's kernels and waited after them;
backward  the [dK; dV] accumulator of step s travels back while step s−1's kernel backward runs.
The checker is shown to fail on a synchronous schedule (post, wait, compute).
"""

from __future__ import annotations

import json

import pytest
import torch

from tspbench.config import ModelConfig, ParallelConfig

pytestmark = pytest.mark.xdist_group("ring_overlap")  # one worker: the module fixture spawns the ranks once

TINY = ModelConfig(name="tiny", vocab_size=128, dim=64, n_layers=2, n_heads=8, n_kv_heads=2, ffn_hidden=128)
SIGMA, SEQ = 4, 32


def _step(rank: int, world: int, out_file: str) -> None:
    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh
    from tspbench.schemes.comm import CommLog
    from tspbench.schemes.train import MixedPrecisionAdamW, train_step

    par = ParallelConfig(scheme="sp", degree=SIGMA, sp_variant="ring")
    log = CommLog()
    pm = apply_scheme(TINY, par, ApplyArgs(build_mesh(par, "cpu"), SEQ, 0, torch.float32, "cpu", log))
    tokens = torch.randint(0, TINY.vocab_size, (1, SEQ), generator=torch.Generator().manual_seed(0))
    tok, tgt, pos = pm.local_batch(tokens, tokens.roll(-1, 1))
    train_step(pm, MixedPrecisionAdamW(list(pm.parameters()), lr=1e-3), tok, tgt, pos)
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(log.events, f)


def violations(events: list, layer: str = "layer0") -> list[str]:
    """Every rule of the module docstring that the event list breaks (empty: the schedule overlaps)."""
    ev = [tuple(e) for e in events]
    bad: list[str] = []

    def at(kind: str, label: str) -> int:
        if (kind, label) not in ev:
            bad.append(f"missing {kind} {label}")
            return -1
        return ev.index((kind, label))

    def around(hop: str, step: str) -> None:  # post hop < compute step < wait hop
        p, c, w = at("post", hop), at("compute", step), at("wait", hop)
        if min(p, c, w) >= 0 and not p < c < w:
            bad.append(f"{hop} does not surround {step}")

    fwd, bwd = f"ring_attn:{layer}:fwd", f"ring_attn:{layer}:bwd"
    for t in range(SIGMA - 1):
        around(f"{fwd}:hop{t + 1}", f"{fwd}:step{t}")
    for s in range(1, SIGMA):
        around(f"{bwd}:hop{s}", f"{bwd}:step{s - 1}")
    return bad


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> list:
    from tspbench.spawn import spawn

    out = tmp_path_factory.mktemp("ring_overlap") / "events.json"
    spawn(_step, SIGMA, str(out))
    return json.loads(out.read_text())


def test_ring_attention_hops_overlap_the_kernels(events):
    assert [e for e in events if e[1].startswith("ring_attn:layer0")], "no ring-attention events recorded"
    assert violations(events) == []
    assert violations(events, "layer1") == []


def test_checker_fails_on_a_synchronous_schedule(events):
    sync: list = []
    for kind, label in (tuple(e) for e in events):
        if kind == "post":
            sync += [("post", label), ("wait", label)]
        elif kind == "compute":
            sync.append(("compute", label))
    assert len(violations(sync)) == 2 * (SIGMA - 1)  # every forward and backward hop of layer 0
