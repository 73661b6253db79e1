"""Run a script under torchrun as if each rank had a GPU, on CPU ranks (tests/hf/test_hf_example.py): a CPU build
cannot start CUDA, so torch.cuda.is_available() answers True, set_device and Module.cuda() only print what they were
asked (`[mock rank R] ...`, in call order), and init_process_group("nccl") starts gloo. Usage: mock_cuda_run.py
SCRIPT [ARGS...]."""

import os
import runpy
import sys

import torch
import torch.distributed as dist

RANK = os.environ.get("RANK", "?")
current: list[int] = []


def say(msg: str) -> None:
    print(f"[mock rank {RANK}] {msg}", flush=True)


def set_device(device) -> None:
    current[:] = [int(device)]
    say(f"set_device {int(device)}")


def cuda(self, device=None):
    say(f"cuda onto {current[0] if current else 0}")  # torch's default without set_device: cuda:0
    return self


real_init = dist.init_process_group


def init_process_group(backend=None, *args, **kwargs):
    say(f"init_process_group {backend}")
    return real_init("gloo", *args, **kwargs)


torch.cuda.is_available = lambda: True
torch.cuda.set_device = set_device
torch.nn.Module.cuda = cuda  # type: ignore[method-assign]
dist.init_process_group = init_process_group
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
