"""NCCL's rules for a collective's tensors, held on CPU: strict mode (`CommLog.strict`, docs/method.md#gpu-rules).

Gloo accepts what NCCL refuses or mis-handles: a strided tensor (gloo reads `numel` elements from the data pointer,
the wrong memory; NCCL raises "Tensors must be contiguous"), a tensor on the wrong device for the group, a dtype NCCL
has no type for, a reduce op NCCL lacks, and tensors whose dtype or shape differ between ranks (NCCL moves the wrong
number of bytes, or hangs). `check` refuses all of these on EVERY rank of the group at once, after one small
all-gather of each rank's tensor descriptions, so a refused collective raises everywhere instead of leaving its
peers blocked in it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

NCCL_DTYPES = frozenset(
    {
        torch.uint8,
        torch.int8,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.bool,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    }
)
"""The dtypes ProcessGroupNCCL maps to an ncclDataType_t (int16, the unsigned 16-64 bit and complex ones it has not)."""
NCCL_REDUCE_OPS = frozenset({"sum", "product", "min", "max", "avg"})
"""Reduce ops NCCL has (gloo's band / bor / bxor it has not)."""
_CODES = sorted(NCCL_DTYPES | {torch.int16, torch.complex64, torch.complex128}, key=str)
_DEVICES = ("cpu", "cuda", "meta")
MAX_DIMS = 8  # dims and strides described exactly per tensor; a tensor with more is compared by numel and its first 8
# torch ≥ 2.12's name for the tensor all-gather, else the old one (as schemes/comm.py)
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

# What a tensor (or, the last three, the call) breaks: bit → the rule, as NCCL states it or as it goes wrong.
RULES = {
    1: "is not contiguous (NCCL: 'Tensors must be contiguous'; gloo reads numel elements from the data pointer, "
    "the wrong memory)",
    2: "has a dtype NCCL has no type for (ProcessGroupNCCL raises a TypeError)",
    4: "is on a device the group's backend does not serve (NCCL: 'Tensors must be CUDA and dense'; gloo: CPU)",
    8: "asks for a reduce op NCCL lacks (it has " + ", ".join(sorted(NCCL_REDUCE_OPS)) + ")",
    16: "has an output whose numel does not fit the input's over the group (all-gather p·n, reduce-scatter n/p, "
    "all-to-all n, divisible by p)",
    32: "has its tensors on different devices",
}
_SIZE_RULES = {"all_gather": lambda p: p, "reduce_scatter": lambda p: 1 / p, "all_to_all": lambda p: 1}
"""op → numel of its output over numel of its input, for a group of p ranks."""


class StrictCommError(RuntimeError):
    """A collective that NCCL would refuse or mis-handle, refused on CPU (strict mode)."""


def group_devices(backend: str) -> frozenset[str] | None:
    """Device types a group's tensors may live on: gloo → cpu, nccl → cuda, "cpu:gloo,cuda:nccl" → both; None for
    a backend without a rule (the estimate's fake group)."""
    if ":" in backend:
        return frozenset(part.split(":")[0] for part in backend.split(","))
    return {"gloo": frozenset({"cpu"}), "nccl": frozenset({"cuda"})}.get(backend)


def tensor_problems(t: torch.Tensor, devices: frozenset[str] | None) -> int:
    """The RULES bits (1, 2, 4) one tensor breaks."""
    bits = 1 if t.is_sparse or not t.is_contiguous() else 0
    bits |= 2 if t.dtype not in NCCL_DTYPES else 0
    return bits | (4 if devices is not None and t.device.type not in devices else 0)


def call_problems(op: str, tensors: dict[str, torch.Tensor], size: int, reduce_op: str | None) -> int:
    """The RULES bits (8, 16, 32) the call breaks as a whole."""
    bits = 8 if reduce_op is not None and reduce_op not in NCCL_REDUCE_OPS else 0
    rule = _SIZE_RULES.get(op)
    if rule is not None and "output" in tensors:
        n_in, n_out = tensors["input"].numel(), tensors["output"].numel()
        bits |= 16 if n_out != n_in * rule(size) or (op == "all_to_all" and n_in % size) else 0
    return bits | (32 if len({t.device for t in tensors.values()}) > 1 else 0)


def _pad(xs) -> list[int]:
    xs = list(xs)[:MAX_DIMS]
    return xs + [0] * (MAX_DIMS - len(xs))


def describe(t: torch.Tensor, devices: frozenset[str] | None = None) -> list[int]:
    """One tensor as integers every rank can read: problem bits, dtype, device, ndim, numel, dims, strides."""
    code = _CODES.index(t.dtype) if t.dtype in _CODES else -1
    dev = _DEVICES.index(t.device.type) if t.device.type in _DEVICES else -1
    return [tensor_problems(t, devices), code, dev, t.dim(), t.numel(), *_pad(t.shape), *_pad(t.stride())]


_WIDTH = 5 + 2 * MAX_DIMS


def spell(d: list[int], stride: bool = True) -> str:
    """A `describe` row in words."""
    n = min(d[3], MAX_DIMS)
    dtype = str(_CODES[d[1]]) if d[1] >= 0 else "a dtype outside NCCL's"
    device = _DEVICES[d[2]] if d[2] >= 0 else "another device"
    shape = f"shape {tuple(d[5 : 5 + n])}"
    return (
        f"{shape}, stride {tuple(d[5 + MAX_DIMS : 5 + MAX_DIMS + n])}, {dtype}, {device}"
        if stride
        else (f"{shape}, {dtype}")
    )


def check(
    op: str,
    label: str,
    group: dist.ProcessGroup,
    where: str,
    tensors: dict[str, torch.Tensor],
    *,
    peer_offset: int | None = None,
    reduce_op: str | None = None,
) -> None:
    """Refuse `op` ('label', over `group`; `where` names the group and tag) on every rank if any rank's tensors break
    NCCL's rules (RULES) or the ranks disagree: every role's dtype and shape equal on all ranks (collectives), or a
    receive buffer equal to what its sender sends (`peer_offset`: send to rank + offset, receive from rank − offset;
    roles "send" and "recv"). Collective over `group`: every rank calls it with its own tensors, and every rank
    raises the same error, naming each offending rank's tensor."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    devices = group_devices(dist.get_backend(group))
    roles = list(tensors)
    row = [call_problems(op, tensors, size, reduce_op)] + [x for r in roles for x in describe(tensors[r], devices)]
    on_cuda = devices is not None and "cuda" in devices and "cpu" not in devices
    device = torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device("cpu")
    local = torch.tensor(row, dtype=torch.int64, device=device)
    every = torch.empty(size * local.numel(), dtype=torch.int64, device=device)
    _all_gather_tensor(every, local, group=group)
    table = every.view(size, -1).tolist()  # host sync: strict mode is for tests

    def desc(r: int, role: str) -> list[int]:
        i = 1 + roles.index(role) * _WIDTH
        return table[r][i : i + _WIDTH]

    found = []
    for r in range(size):
        sizes = ", ".join(f"{role} numel {desc(r, role)[4]}" for role in roles)
        found += [f"rank {r}'s call {text} ({sizes})" for bit, text in RULES.items() if table[r][0] & bit]
        for role in roles:
            d = desc(r, role)
            found += [f"rank {r}'s {role} {text}: {spell(d)}" for bit, text in RULES.items() if d[0] & bit]
    if peer_offset is not None:  # every rank's receive buffer against what its sender sends
        for r in range(size):
            sender = (r - peer_offset) % size
            want, got = desc(sender, "send"), desc(r, "recv")
            if want[1:5] + want[5 : 5 + MAX_DIMS] != got[1:5] + got[5 : 5 + MAX_DIMS]:
                found.append(
                    f"rank {r}'s recv buffer ({spell(got, False)}) differs from what rank {sender} sends "
                    f"({spell(want, False)}); NCCL moves the sender's bytes into it"
                )
    else:
        for role in roles:
            seen = [desc(r, role)[1:5] + desc(r, role)[5 : 5 + MAX_DIMS] for r in range(size)]
            if any(s != seen[0] for s in seen):
                ranks = "; ".join(f"rank {r} {spell(desc(r, role), False)}" for r in range(size))
                found.append(f"{role} differs between ranks ({ranks}); NCCL moves the wrong number of bytes or hangs")
    if found:
        raise StrictCommError(
            f"strict comm: {op if label == op else f'{op} {label!r}'} over {where} (raised on rank {rank} of {size}): "
            + "; ".join(found)
        )
