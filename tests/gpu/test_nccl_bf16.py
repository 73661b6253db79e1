"""NCCL parity in bf16 (≥ 2 GPUs): the flash kernels' paths the fp32 parity test cannot reach.

bf16 selects the CUDA flash kernels, whose backward reads the log-sum-exp slices TSP's owner loop and ring attention
pass (docs/method.md#gpu-review, finding 2), and a B = 2 decode whose prefill all-reduces the last position's logits
(finding 1: NCCL refuses a non-contiguous tensor). Tolerance: tspbench.verify.case.TOL["bfloat16"] (5e-2 relative,
against the single-device model run in the same dtype). Skips without two CUDA devices."""

from __future__ import annotations

import pytest
import torch
from parity_cases import GQA, MHA

from tspbench.verify.case import VerifyConfig
from tspbench.verify.runner import run_cases

pytestmark = pytest.mark.gpu

N_GPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
CASES = [
    {"scheme": "tsp"},
    {"scheme": "tsp", "kv_bucket_heads": 1},
    {"scheme": "sp", "sp_variant": "ring"},
]


@pytest.mark.skipif(N_GPU < 2, reason="needs ≥ 2 CUDA devices (NCCL parity)")
@pytest.mark.parametrize("opts", CASES, ids=lambda o: "-".join(map(str, o.values())))
@pytest.mark.parametrize("model", [MHA, GQA], ids=["mha", "gqa"])
@pytest.mark.parametrize("decode_steps", [0, 2], ids=["train", "decode"])
def test_nccl_parity_bf16(opts, model, decode_steps):
    vc = VerifyConfig(
        model=model, degree=2, dtype="bfloat16", device="cuda", seq_len=128, batch=2, decode_steps=decode_steps, **opts
    )
    (res,) = run_cases([(vc, None)], 2, device="cuda")
    bad = [c for c in res["checks"] if not c["ok"]]
    assert res["ok"], bad
