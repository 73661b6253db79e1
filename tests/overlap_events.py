"""The issue-order record the overlap tests read (tests/integration/test_overlap.py, test_ring_overlap.py): one real
training step of a scheme on spawned gloo ranks, with rank 0's CommLog events (post / wait / compute, in order)
written as JSON; the synchronous rewrite of such a record that every overlap checker must reject; and the rewrite
that posts chosen collectives only where they are waited (the order of the code before a pipeline)."""

from __future__ import annotations

import json
from collections.abc import Callable

import torch

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig


def _step_events(model: ModelConfig, par: ParallelConfig, seq: int) -> list[tuple[str, str]]:
    """One training step of `par` on this rank (inside a spawned group): its CommLog events."""
    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh
    from tspbench.schemes.comm import CommLog
    from tspbench.schemes.train import MixedPrecisionAdamW, train_step

    log = CommLog()
    pm = apply_scheme(model, par, ApplyArgs(build_mesh(par, "cpu"), seq, 0, torch.float32, "cpu", log))
    tokens = torch.randint(0, model.vocab_size, (1, seq), generator=torch.Generator().manual_seed(0))
    tok, tgt, pos = pm.local_batch(tokens, tokens.roll(-1, 1))
    train_step(pm, MixedPrecisionAdamW(list(pm.parameters()), lr=1e-3), tok, tgt, pos)
    return log.events


def record_step_events(rank: int, world: int, model: ModelConfig, par: ParallelConfig, seq: int, out_file: str) -> None:
    """Spawned per rank (tspbench.spawn): one training step; rank 0 writes its event list to `out_file`."""
    events = _step_events(model, par, seq)
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(events, f)


def record_steps_events(
    rank: int, world: int, model: ModelConfig, pars: dict[str, ParallelConfig], seq: int, out_file: str
) -> None:
    """Spawned per rank: one training step of each layout in `pars` (one rank group for all of them, spawning is the
    slow part); rank 0 writes {name: its event list} to `out_file`."""
    events = {name: _step_events(model, par, seq) for name, par in pars.items()}
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(events, f)


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


def posted_at_wait(events: list, moved: Callable[[str], bool]) -> list[tuple[str, str]]:
    """The same record with every collective whose label `moved` accepts posted only where it is waited (right
    before its wait): the order of code that posts such a collective when it needs its result, e.g. TSP's owner
    loop before the K/V pipeline, whose first bucket's all-gather was posted and waited at once."""
    ev = [(str(kind), str(label)) for kind, label in (tuple(e) for e in events)]
    out: list[tuple[str, str]] = []
    for kind, label in ev:
        if kind == "post" and moved(label):
            continue
        if kind == "wait" and moved(label):
            out.append(("post", label))
        out.append((kind, label))
    return out


def record_grad_sync_events(
    rank: int, world: int, model: ModelConfig, par: ParallelConfig, seq: int, bucket: int, out_file: str
) -> None:
    """Spawned per rank: one training step with gradient-sync buckets of at most `bucket` elements; rank 0 writes its
    event list (the buckets' posts and waits, each block's backward start, the end of layer 0's) to `out_file`."""
    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh
    from tspbench.schemes.comm import CommLog
    from tspbench.schemes.train import MixedPrecisionAdamW, train_step

    log = CommLog()
    pm = apply_scheme(model, par, ApplyArgs(build_mesh(par, "cpu"), seq, 0, torch.float32, "cpu", log))
    pm.grad_bucket_elems = bucket
    tokens = torch.randint(0, model.vocab_size, (par.dp, seq), generator=torch.Generator().manual_seed(0))
    tok, tgt, pos = pm.local_batch(tokens, tokens.roll(-1, 1))
    train_step(pm, MixedPrecisionAdamW(list(pm.parameters()), lr=1e-3), tok, tgt, pos)
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(log.events, f)


def after_backward(events: list, prefix: str) -> list[tuple[str, str]]:
    """The same record with every collective whose label starts with `prefix` posted and waited after all of the
    step's compute: a synchronous gradient sync (all-reduces after backward, as before the overlap)."""
    ev = [tuple(e) for e in events]
    moved = [e for e in ev if e[1].startswith(prefix)]
    posted = [label for kind, label in moved if kind == "post"]
    return [e for e in ev if not e[1].startswith(prefix)] + [(k, lb) for lb in posted for k in ("post", "wait")]


def record_p2p_batches(rank: int, world: int, model: ModelConfig, par: ParallelConfig, seq: int, out_file: str) -> None:
    """Spawned per rank: one training step of `par` with `dist.batch_isend_irecv` counted; rank 0 writes the list of
    (peer, tag) pairs of each call's ops, in call order, to `out_file`."""
    import torch.distributed as dist

    calls: list[list[tuple[int, int]]] = []
    real = dist.batch_isend_irecv

    def counting(ops):
        calls.append([(op.peer, op.tag) for op in ops])
        return real(ops)

    dist.batch_isend_irecv = counting
    try:
        _step_events(model, par, seq)
    finally:
        dist.batch_isend_irecv = real
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(calls, f)


def record_sync_groups(
    rank: int, world: int, model: ModelConfig, pars: dict[str, ParallelConfig], out_file: str
) -> None:
    """Spawned per rank: for each layout, whether every gradient-sync group is a process group of its own (no
    shard's collective group and no mesh axis' group is the same object) over the ranks it should span; rank 0
    writes {name: [(sync key, own group?, its ranks), ...]} to `out_file`."""
    import torch.distributed as dist

    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh

    out = {}
    for name, par in pars.items():
        mesh = build_mesh(par, "cpu")
        pm = apply_scheme(model, par, ApplyArgs(mesh, 16, 0, torch.float32, "cpu"))
        used = {id(mesh.get_group(a)) for a in mesh.mesh_dim_names or ()}
        used |= {id(c.group) for s in pm.shards.values() for c in (s.comm, s.grad_sum) if c is not None}
        out[name] = [
            (str(key), id(comm.group) not in used, dist.get_process_group_ranks(comm.group))
            for key, (comm, _) in pm.sync_groups.items()
        ]
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(out, f)
