"""The issue-order record the overlap tests read (tests/integration/test_overlap.py, test_ring_overlap.py): one real
training step of a scheme on spawned gloo ranks, with rank 0's CommLog events (post / wait / compute, in order)
written as JSON; and the synchronous rewrite of such a record that every overlap checker must reject."""

from __future__ import annotations

import json

import torch

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig


def record_step_events(rank: int, world: int, model: ModelConfig, par: ParallelConfig, seq: int, out_file: str) -> None:
    """Spawned per rank (tspbench.spawn): one training step; rank 0 writes its event list to `out_file`."""
    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh
    from tspbench.schemes.comm import CommLog
    from tspbench.schemes.train import MixedPrecisionAdamW, train_step

    log = CommLog()
    pm = apply_scheme(model, par, ApplyArgs(build_mesh(par, "cpu"), seq, 0, torch.float32, "cpu", log))
    tokens = torch.randint(0, model.vocab_size, (1, seq), generator=torch.Generator().manual_seed(0))
    tok, tgt, pos = pm.local_batch(tokens, tokens.roll(-1, 1))
    train_step(pm, MixedPrecisionAdamW(list(pm.parameters()), lr=1e-3), tok, tgt, pos)
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(log.events, f)


def index_of(events: list[tuple[str, str]], kind: str, label: str, bad: list[str]) -> int:
    """Position of (kind, label) in the event list, or −1 with "missing …" appended to `bad`."""
    if (kind, label) not in events:
        bad.append(f"missing {kind} {label}")
        return -1
    return events.index((kind, label))


def synchronous(events: list) -> list[tuple[str, str]]:
    """The same record as a synchronous schedule: every collective waited right after it is posted, before any
    compute that followed the post."""
    sync: list[tuple[str, str]] = []
    for kind, label in (tuple(e) for e in events):
        if kind == "post":
            sync += [("post", label), ("wait", label)]
        elif kind == "compute":
            sync.append(("compute", label))
    return sync
