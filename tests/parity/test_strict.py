"""The GPU's rules, held on CPU (docs/method.md#gpu-rules).

Strict comm (CommLog.strict, schemes/nccl_rules.py): every collective and ring hop refuses, on every rank of its group
at once, what NCCL refuses or mis-handles; each rule is exercised here in one 2-rank gloo group, and without strict
mode gloo silently sums the wrong memory for a strided slice (the non-vacuity of the first rule). The two GPU review
findings come back as broken variants that the rules refuse: the decode prefill's strided all-reduce (finding 1) under
strict comm, and the sliced log-sum-exp handed to the attention kernel (finding 2) under the kernel contract
(tspbench/attention.py check_contract), in TSP's owner attention and in ring attention.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from parity_cases import ALL, DECODE, MHA, _vc

from tspbench.schemes import nccl_rules
from tspbench.spawn import spawn
from tspbench.verify.runner import run_cases

pytestmark = pytest.mark.xdist_group("strict")


def _refusal(fn) -> str | None:
    """The StrictCommError message `fn` raised (on this rank), or None if it went through."""
    try:
        fn()
    except nccl_rules.StrictCommError as e:
        return str(e)
    return None


def _rules_worker(rank: int, world: int, out: str) -> None:
    from tspbench.schemes.comm import Comm, CommLog

    comm = Comm(dist.group.WORLD, CommLog(strict=True), axis="world")
    lenient = Comm(dist.group.WORLD, CommLog(strict=False), axis="world")
    logits = torch.arange(24, dtype=torch.float64).reshape(2, 4, 3) * (rank + 1)  # [B, S, V], B = 2
    seen = {
        "strided": _refusal(lambda: comm.all_reduce(logits[:, 1:2])),
        "dtype_differs": _refusal(lambda: comm.all_reduce(torch.ones(4, dtype=(torch.float64, torch.float32)[rank]))),
        "shape_differs": _refusal(lambda: comm.all_reduce(torch.ones(4 + rank))),
        "int16": _refusal(lambda: comm.all_reduce(torch.ones(4, dtype=torch.int16))),
        "device": _refusal(lambda: comm.broadcast(torch.ones(4, device="meta"), 0)),
        "reduce_op": _refusal(lambda: comm.all_reduce(torch.ones(4), op="band")),
        "one_rank_only": _refusal(lambda: comm.all_reduce(logits[:, 1:2] if rank else logits[:, :1].clone())),
        "recv_shape": _refusal(lambda: comm.start_shift(torch.ones(4), torch.empty(4 + rank), label="hop").wait()),
        "recv_strided": _refusal(lambda: comm.start_shift(torch.ones(2, 2), torch.empty(2, 4)[:, :2]).wait()),
        "gather_size": _refusal(lambda: comm.start_all_gather(torch.ones(2), torch.empty(3), label="kv").wait()),
        "fine": _refusal(lambda: comm.all_reduce(logits[:, 1:2].contiguous())),
        "fine_hop": _refusal(lambda: comm.start_shift(torch.ones(4), torch.empty(4)).wait()),
    }
    # strict off: gloo takes the strided slice and sums numel elements from its data pointer (row 0, position 1 and
    # the next position) instead of the slice's own elements, leaving batch row 1 unsummed
    got = logits.clone()
    lenient.all_reduce(got[:, 1:2])
    want = logits[:, 1:2] * 3 / (rank + 1)  # the sum over both ranks of each rank's (rank + 1) · arange
    seen["lenient_wrong"] = bool((got[:, 1:2] != want).any())
    everyone: list = [None] * world
    dist.all_gather_object(everyone, seen)
    if rank == 0:
        Path(out).write_text(json.dumps(everyone))


@pytest.fixture(scope="module")
def refusals() -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rules.json")
        spawn(_rules_worker, 2, out)
        return json.loads(Path(out).read_text())


@pytest.mark.parametrize(
    "case,words",
    [
        ("strided", ["all_reduce", "group world", "input is not contiguous", "stride (12, 3, 1)"]),
        ("dtype_differs", ["input differs between ranks", "rank 0 shape (4,), torch.float64", "torch.float32"]),
        ("shape_differs", ["input differs between ranks", "rank 0 shape (4,)", "rank 1 shape (5,)"]),
        ("int16", ["dtype NCCL has no type for", "torch.int16"]),
        ("device", ["broadcast", "device the group's backend does not serve", "meta"]),
        ("reduce_op", ["reduce op NCCL lacks"]),
        ("one_rank_only", ["rank 1's input is not contiguous"]),
        ("recv_shape", ["send_recv 'hop'", "rank 1's recv buffer (shape (5,)", "differs from what rank 0 sends"]),
        ("recv_strided", ["recv is not contiguous"]),
        ("gather_size", ["all_gather 'kv'", "numel does not fit"]),
    ],
)
def test_strict_comm_refuses_on_every_rank(refusals, case, words):
    """Each rule: every rank raises (none is left blocked in the collective), naming the op, its label and the
    offending rank's tensor."""
    for rank, seen in enumerate(refusals):
        msg = seen[case]
        assert msg is not None, f"rank {rank} let {case} through"
        missing = [w for w in words if w not in msg]
        assert not missing, (missing, msg)


def test_strict_comm_lets_nccl_legal_calls_through(refusals):
    assert all(seen["fine"] is None and seen["fine_hop"] is None for seen in refusals)


def test_without_strict_gloo_sums_the_wrong_memory(refusals):
    """Non-vacuity of the contiguity rule: what strict comm refuses, gloo alone gets silently wrong at B = 2."""
    assert all(seen["lenient_wrong"] for seen in refusals)


def test_a_cpu_tensor_on_a_cuda_group_breaks_the_device_rule():
    """The device rule both ways, without a GPU: a CPU tensor on an NCCL group, a CUDA-typed one on a gloo group."""
    cuda, cpu = nccl_rules.group_devices("nccl"), nccl_rules.group_devices("gloo")
    assert nccl_rules.tensor_problems(torch.ones(2), cuda) == 4
    assert nccl_rules.tensor_problems(torch.ones(2, device="meta"), cpu) == 4
    assert nccl_rules.tensor_problems(torch.ones(2), cpu) == 0
    assert nccl_rules.group_devices("cpu:gloo,cuda:nccl") == {"cpu", "cuda"}


def test_strict_comm_is_on_in_the_parity_matrix():
    """Every parity case runs under NCCL's rules except the lenient non-vacuity cases, which are broken variants."""
    lenient = [cid for cid, (_w, vc, b) in {**ALL, **DECODE}.items() if not vc.strict]
    assert lenient and all("-lenient-BROKEN_" in cid for cid in lenient)


def test_strided_first_token_is_refused_by_strict_comm():
    """GPU finding 1 as a broken variant: the prefill's first-token all-reduce of `logits[:, at:at+1]` at B = 2. Under
    strict comm every rank refuses it (the lenient case in parity_cases shows the wrong first token gloo gives)."""
    vc = replace(_vc(MHA, "tsp", 2), decode_steps=1)
    assert vc.batch == 2 and vc.strict
    with pytest.raises(Exception, match=r"StrictCommError: strict comm: all_reduce 'prefill:first_token'") as e:
        run_cases([(vc, "strided_first_token")], 2)
    assert "input is not contiguous" in str(e.value) and "shape (2, 1, 128)" in str(e.value)


@pytest.mark.parametrize("scheme,variant", [("tsp", "allgather"), ("sp", "ring")])
def test_sliced_lse_is_refused_by_the_kernel_contract(scheme, variant):
    """GPU finding 2 as a broken variant: a zigzag chunk's slice of the log-sum-exp handed to the kernel as it is (TSP's
    owner attention, ring attention). The CPU kernel follows the strides and would give the right numbers; the
    contract refuses what the CUDA flash backward would misread."""
    with pytest.raises(
        Exception, match=r"KernelContractError: attention kernel contract \(cpu\): lse must be a contig"
    ):
        run_cases([(_vc(MHA, scheme, 2, variant), "sliced_lse_to_kernel")], 2)
