"""Spawn a local rank group for verification and tests (no torchrun needed).

The benchmark runner uses torch's elastic launcher instead (tspbench/run/supervise.py); this is the light-weight path
for correctness checks: `torch.multiprocessing` spawn, a file rendezvous (no ports to collide), gloo on
CPU and NCCL on CUDA.
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def _entry(rank: int, world: int, init_file: str, device: str, fn, args) -> None:
    torch.set_num_threads(1)  # ranks share 2 cores in CI; oversubscription only slows things down
    if device.startswith("cuda"):
        torch.cuda.set_device(rank % torch.cuda.device_count())
        # Parity checks compare float32 at float32 tolerance: TF32 GEMMs (10-bit mantissa) would not.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group(
        backend_for(device),
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=300),
    )
    try:
        fn(rank, world, *args)
        # no rank tears its gloo pairs down while a peer still finishes a collective with it (a rank exiting early
        # aborted its peer once under CI load: "terminate called without an active exception"); a rank that raised
        # skips it, and spawn's join then terminates the others
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(fn, world: int, *args, device: str = "cpu") -> None:
    """Run fn(rank, world, *args) on `world` fresh processes; raises if any rank fails."""
    fd, init_file = tempfile.mkstemp(prefix="tspbench-rdzv-")
    os.close(fd)
    os.unlink(init_file)  # the file store must not exist yet
    try:
        mp.start_processes(
            _entry, args=(world, init_file, device, fn, args), nprocs=world, start_method="spawn", join=True
        )
    finally:
        if os.path.exists(init_file):
            os.unlink(init_file)
