"""Two-rank harness for the micro-benchmarks: the pytest process is rank 0 and times each call with
pytest-benchmark; a spawned mirror process is rank 1 and runs the same operation the same number of times.

Protocol: for every benchmark rank 0 broadcasts one command [op, numel, count, stop]; both ranks then
build the same operation and call it `count` times (warm-up + measured rounds, or 1 when pytest-benchmark
is disabled). Gloo collectives on CPU tensors return when the data has arrived, so rank 0's clock sees
the whole collective; on CUDA each call ends with an explicit synchronize.

Bus bandwidth (nccl-tests doc/PERFORMANCE.md; docs/method.md#collective-cost): algbw = S / t with S the full buffer
(all-gather output, reduce-scatter input, the all-reduced / broadcast / sent tensor); busbw = algbw ×
factor, factor (p−1)/p for all-gather / reduce-scatter, 2(p−1)/p for all-reduce, 1 for broadcast and
point-to-point.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

OPS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "sendrecv", "sharded_linear", "attention")


def bus_factor(op: str, p: int) -> float:
    return {
        "all_gather": (p - 1) / p,
        "reduce_scatter": (p - 1) / p,
        "all_reduce": 2 * (p - 1) / p,
        "broadcast": 1.0,
        "sendrecv": 1.0,
    }.get(op, 1.0)


def device_for(world: int) -> torch.device:
    if torch.cuda.is_available() and torch.cuda.device_count() >= world:
        return torch.device("cuda", dist.get_rank() if dist.is_initialized() else 0)
    return torch.device("cpu")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_op(op: str, numel: int, device: torch.device) -> tuple[Callable[[], None], int]:
    """(one call, bytes S moved by it) for `op` on a float32 buffer of `numel` elements (collectives) or
    a problem of that size (sharded linear: tokens × hidden; attention: tokens)."""
    from tspbench.schemes.comm import Comm

    comm = Comm(dist.group.WORLD)
    p = comm.size
    f32 = dict(dtype=torch.float32, device=device)
    if op == "all_gather":
        x = torch.randn(numel // p, **f32)
        return (lambda: (comm.all_gather(x, 0), sync(device))), numel * 4
    if op == "reduce_scatter":
        x = torch.randn(numel, **f32)
        return (lambda: (comm.reduce_scatter(x, 0), sync(device))), numel * 4
    if op == "all_reduce":
        x = torch.randn(numel, **f32)
        return (lambda: (comm.all_reduce(x), sync(device))), numel * 4
    if op == "broadcast":
        x = torch.randn(numel, **f32)
        return (lambda: (comm.broadcast(x, 0), sync(device))), numel * 4
    if op == "sendrecv":
        send, recv = torch.randn(numel, **f32), torch.empty(numel, **f32)

        def ring():
            comm.start_shift(send, recv).wait()
            sync(device)

        return ring, numel * 4
    if op == "sharded_linear":
        # Megatron row-parallel linear: Y = Σ_r X_r·W_rᵀ, input features split over ranks, then all-reduce.
        h = 256
        tokens = max(1, numel // h)
        x, w = torch.randn(tokens, h // p, **f32), torch.randn(h, h // p, **f32)
        return (lambda: (comm.all_reduce(x @ w.T), sync(device))), tokens * h * 4
    if op == "attention":
        # One SP/TSP attention step: all-gather K and V along the sequence (zigzag shards), then causal
        # attention of the local queries (tspbench.schemes.sp.attend_sequence, forward only).
        from tspbench.schemes.ops.kv_exchange import attend_sequence
        from tspbench.schemes.ops.layout import SeqLayout

        heads, d, seq = 4, 32, max(4 * p, numel)
        layout = SeqLayout(seq, p, comm.rank)
        q, k, v = (torch.randn(1, heads, seq // p, d, **f32) for _ in range(3))
        return (lambda: (attend_sequence(q, k, v, comm, layout), sync(device))), 2 * seq * heads * d * 4
    raise ValueError(op)


def init(rank: int, world: int, init_file: str) -> torch.device:
    torch.set_num_threads(1)
    backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend, init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    return device_for(world)


def command(device: torch.device, op: str = "", numel: int = 0, count: int = 0, stop: bool = False):
    """Rank 0 sends the command; every rank returns it."""
    t = torch.tensor([OPS.index(op) if op else -1, numel, count, int(stop)], dtype=torch.int64, device=device)
    dist.broadcast(t, 0)
    i, n, c, s = t.tolist()
    return (OPS[i] if i >= 0 else ""), n, c, bool(s)


def mirror_main(rank: int, world: int, init_file: str) -> None:
    device = init(rank, world, init_file)
    try:
        while True:
            op, numel, count, stop = command(device)
            if stop:
                break
            fn, _ = make_op(op, numel, device)
            for _ in range(count):
                fn()
    finally:
        dist.destroy_process_group()
