"""No host synchronisation inside a step (issue: TSP at accelerator speed, §1 "Host synchronisation").

On CUDA a host→device copy of an index, or a device→host read (`.item()`, `bool(tensor)`), blocks the host
until the stream drains: one synchronisation per use, hundreds per step if it sits in a per-owner loop. This
machine has no GPU, and a CPU build of torch cannot run autograd on fake CUDA tensors, so the step runs on the
`meta` device — a non-host device that holds no data — under the estimate's fake process group. There:
- a host tensor (not a 0-dim scalar) meeting a device tensor is either a device-mismatch error or, for an
  explicit copy (`.to(device)`), an op the tracker records (`MemoryTracker.host_transfers`);
- a read of a device value on the host (`.item()`) is `aten._local_scalar_dense`, also recorded (and on meta
  tensors an error).
Excluded, and why: the optimizer update (torch's fused AdamW, elementwise, no indices; its fp32→bf16 copy has no
meta kernel path in a CPU build) and the P2P transport itself (`batch_isend_irecv` has no meta backend in the fake
process group; the ring's indexing and bookkeeping around it still run). The same detector catches a layout whose
indices live on the host (the broken variant below).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from unittest import mock

import pytest
import torch

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel import Workload
from tspbench.predict.memtrack import MemoryTracker
from tspbench.predict.trace import Tracing, fake_patches, fake_process_group, trace_step

TINY = ModelConfig(name="tiny", vocab_size=128, dim=64, n_layers=2, n_heads=8, n_kv_heads=8, ffn_hidden=128)
LAYOUTS = [
    ("tp", 2, {}),
    ("tp_msp", 2, {}),
    ("sp", 2, {}),
    ("sp", 2, {"sp_variant": "ring"}),
    ("tp_sp", 4, {"tp": 2}),
    ("tsp", 2, {}),
    ("tsp", 4, {"kv_bucket_heads": 1}),
    ("tsp", 2, {"vocab": "ring"}),
]


@contextlib.contextmanager
def _meta_step():
    with (
        mock.patch("tspbench.schemes.train.MixedPrecisionAdamW.step", lambda self: None),
        mock.patch("torch.distributed.batch_isend_irecv", lambda ops: []),
    ):
        yield


def _train_transfers(par: ParallelConfig, mode: str, cfg: ModelConfig = TINY) -> list[str]:
    with _meta_step(), fake_process_group(par.world_size, 0):
        tr = trace_step(
            par, Workload(cfg, 64, 1, mode=mode, dtype="bfloat16"), Tracing(device="meta", fake=True, attention="gpu")
        )
    return tr.tracker.host_transfers


def _decode_transfers(par: ParallelConfig, cfg: ModelConfig = TINY) -> list[str]:
    """Prefill 64 tokens, then two decode steps, with the tracker watching the decode steps only."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh

    tracker = MemoryTracker()
    with _meta_step(), fake_process_group(par.world_size, 0):
        mesh = build_mesh(par, "cpu")
        with FakeTensorMode(), fake_patches(), torch.no_grad(), tracker:
            pm = apply_scheme(cfg, par, ApplyArgs(mesh, 64, 0, torch.bfloat16, "meta"))
            pm.start_kv_cache(2)
            tokens = torch.zeros((par.dp, 66), dtype=torch.long, device="meta")
            tok, _, pos = pm.local_batch(tokens[:, :64], tokens[:, :64])
            pm(tok, pos)
            tracker.counting = True
            for t in (64, 65):
                pm.decode(tokens[:, t : t + 1], t)
            tracker.counting = False
    return tracker.host_transfers


@pytest.mark.parametrize("scheme,degree,extra", LAYOUTS)
@pytest.mark.parametrize("mode", ["train", "forward"])
def test_step_has_no_host_transfer(scheme, degree, extra, mode):
    par = ParallelConfig(scheme=scheme, degree=degree, **extra)
    assert _train_transfers(par, mode) == []


@pytest.mark.parametrize("scheme,degree,extra", [c for c in LAYOUTS if c[2].get("vocab") != "ring"])
def test_decode_step_has_no_host_transfer(scheme, degree, extra):
    par = ParallelConfig(scheme=scheme, degree=degree, **extra)
    assert _decode_transfers(par) == []


@pytest.mark.parametrize("scheme,degree", [("tsp", 2), ("tp", 2)])
def test_sliding_window_model_has_no_host_read(scheme, degree):
    """A Mistral config with a window (here 66 ≥ the 64 prompt tokens and the 2 decoded): the window is checked
    on host integers (Transformer.check_window), not by reading the positions' maximum in every forward."""
    windowed = replace(TINY, sliding_window=66)
    par = ParallelConfig(scheme=scheme, degree=degree)
    assert _train_transfers(par, "train", windowed) == []
    assert _decode_transfers(par, windowed) == []


def test_positions_past_the_window_are_still_refused():
    """The host-integer checks refuse what the per-forward read refused: a token layout longer than the window
    (local_batch) and a decode step at the window (decode), with the one-line message naming the field."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh

    par = ParallelConfig(scheme="tsp", degree=2)
    with _meta_step(), fake_process_group(par.world_size, 0):
        mesh = build_mesh(par, "cpu")
        with FakeTensorMode(), fake_patches(), torch.no_grad(), MemoryTracker():  # as _decode_transfers
            tokens = torch.zeros((1, 65), dtype=torch.long, device="meta")
            short = apply_scheme(replace(TINY, sliding_window=32), par, ApplyArgs(mesh, 64, 0, torch.bfloat16, "meta"))
            with pytest.raises(ValueError, match=r"position 63 is beyond model\.sliding_window=32"):
                short.local_batch(tokens[:, :64], tokens[:, :64])
            pm = apply_scheme(replace(TINY, sliding_window=64), par, ApplyArgs(mesh, 64, 0, torch.bfloat16, "meta"))
            pm.start_kv_cache(1)
            tok, _, pos = pm.local_batch(tokens[:, :64], tokens[:, :64])
            pm(tok, pos)
            with pytest.raises(ValueError, match=r"position 64 is beyond model\.sliding_window=64"):
                pm.decode(tokens[:, 64:65], 64)


def _hf_transfers(inputs_on: str) -> list[str]:
    """tspbench.parallelize's module (HFParallel around TSP's ParallelModel on meta), one forward with labels (and,
    on the device, an all-ones attention_mask) handed in on `inputs_on`, and its backward, with the tracker
    watching."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tspbench.hf.parallelize import HFParallel
    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh

    par = ParallelConfig(scheme="tsp", degree=2)
    tracker = MemoryTracker()
    with _meta_step(), fake_process_group(par.world_size, 0):
        mesh = build_mesh(par, "cpu")
        with FakeTensorMode(), fake_patches(), tracker:
            model = HFParallel(apply_scheme(TINY, par, ApplyArgs(mesh, 64, 0, torch.bfloat16, "meta")), TINY, 64)
            ids = torch.zeros((1, 64), dtype=torch.long, device=inputs_on)
            tracker.counting = True
            mask = torch.ones_like(ids) if inputs_on != "cpu" else None  # a fake host tensor has no values to read
            out = model(ids, labels=ids, attention_mask=mask)
            assert out.loss is not None and out.logits.device.type == "meta"
            out.loss.backward()
            tracker.counting = False
    return tracker.host_transfers


def test_hf_step_has_no_host_sync():
    """GPU review finding 3: the label count stays a device tensor and the mask is not read on the host."""
    assert _hf_transfers("meta") == []


def test_hf_forward_moves_host_inputs_to_the_model():
    """Inputs on the host (the README's loop): the forward copies input_ids and labels to the model's device once
    each (the old forward handed host tokens to device positions: a device mismatch)."""
    found = _hf_transfers("cpu")
    assert len(found) == 2 and all("_to_copy" in f for f in found), found


def test_hf_mask_check_reads_host_tensors_only():
    """`refuse`: a host tensor's value is checked on the host (one actionable line); a device tensor's is not read."""
    from tspbench.hf.parallelize import refuse

    with pytest.raises(ValueError, match="padding"):
        refuse(torch.tensor([1, 0]).bool().all(), "attention_mask with padding is not supported")
    refuse(torch.tensor([1, 1]).bool().all(), "not raised")
    refuse(torch.zeros(2, device="meta").bool().all(), "a meta tensor has no value: not read, not raised")


def test_host_indices_are_caught():
    """Broken variant: the zigzag layout builds its indices on the host and copies them to the device per use (what
    `SeqLayout.unshard` did before)."""
    from tspbench.schemes.ops.layout import SeqLayout

    real = SeqLayout.gathered_order.func  # type: ignore[attr-defined]

    def on_host(self):
        return real(self).cpu()

    def unshard(self, gathered, dim=1):
        return gathered.index_select(dim, self.gathered_order.to(gathered.device))

    broken = SeqLayout.__dict__["gathered_order"]
    with mock.patch.object(broken, "func", on_host), mock.patch.object(SeqLayout, "unshard", unshard):
        found = _train_transfers(ParallelConfig(scheme="tsp", degree=2), "train")
    assert found and all("_to_copy" in f or "copy" in f for f in found), found


def test_host_read_is_caught():
    """Broken variant: a host read of a device value inside the step (`.item()`): on the meta device it cannot
    pass silently — the tracker records it or the read itself fails."""
    from tspbench.schemes import base

    real = base.ParallelModel.forward

    def forward(self, tokens, positions):
        out = real(self, tokens, positions)
        out.sum().item()
        return out

    with mock.patch.object(base.ParallelModel, "forward", forward):
        try:
            found = _train_transfers(ParallelConfig(scheme="tp", degree=2), "forward")
        except RuntimeError as err:
            found = [str(err)]
    assert any("_local_scalar_dense" in f or "item" in f for f in found), found
