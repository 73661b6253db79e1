"""GPU parity (NCCL): the same comparison on CUDA devices. Skips cleanly without enough GPUs.

On GPU the check runs in float32 (spawned ranks disable TF32 so float32 GEMMs keep their precision).
"""

from __future__ import annotations

import pytest
import torch
from parity_cases import GQA, MHA

from tspbench.verify.case import VerifyConfig
from tspbench.verify.runner import run_cases

pytestmark = pytest.mark.gpu

N_GPU = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(N_GPU < 2, reason="needs ≥ 2 CUDA devices (NCCL parity)")
@pytest.mark.parametrize("scheme", ["tp", "tp_msp", "sp", "tsp"])
@pytest.mark.parametrize("model", [MHA, GQA], ids=["mha", "gqa"])
def test_nccl_parity(scheme, model):
    vc = VerifyConfig(model=model, scheme=scheme, degree=2, dtype="float32", device="cuda", seq_len=64)
    (res,) = run_cases([(vc, None)], 2, device="cuda")
    bad = [c for c in res["checks"] if not c["ok"]]
    assert res["ok"], bad


@pytest.mark.skipif(N_GPU < 1, reason="needs a CUDA device")
def test_reference_model_runs_bf16_on_gpu():
    from tspbench.model import build_model, synthetic_batch, token_loss_sum

    m = MHA
    model = build_model(m, 0, torch.bfloat16, "cuda")
    tok, tgt = synthetic_batch(m, 2, 64, 0, "cuda")
    loss = token_loss_sum(model(tok), tgt) / tgt.numel()
    loss.backward()
    assert torch.isfinite(loss)
