"""Bad input stops before any rank is spawned, with one actionable line naming the field and the allowed
values, and no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tspbench.config import ConfigError, ModelConfig
from tspbench.parallel import ParallelConfig, validate_parallel
from tspbench.verify.__main__ import main

BAD = [
    (["scheme=tsp", "degree=3"], "model.n_heads=8 must be divisible"),
    (
        ["scheme=tp", "degree=4", "model.n_heads=12", "model.dim=96", "model.n_kv_heads=3"],
        "model.n_kv_heads=3 and the tensor degree 4 (scheme=tp) must divide one another",
    ),
    (
        ["scheme=tp_sp", "degree=8", "tp=4", "model.n_heads=12", "model.dim=96", "model.n_kv_heads=3"],
        "allowed degrees: 3, 6, 12",
    ),
    (["scheme=tsp", "degree=4", "seq_len=36"], "seq_len=36 must be divisible by 2×"),
    (["scheme=sp", "degree=2", "seq_len=30"], "zigzag"),
    (["scheme=zigzag"], "allowed: single, tp, tp_msp, sp, tp_sp, fsdp_sp, tsp"),
    (["scheme=tsp", "degree=1"], "use scheme=single or degree ≥ 2"),
    (["scheme=single", "degree=2"], "use degree=1"),
    (["scheme=tp_sp", "degree=4", "tp=3"], "tp=3 must divide degree=4"),
    (["scheme=sp", "sp_variant=swap"], "allowed: allgather, ring, ulysses"),
    (["scheme=sp", "degree=3", "seq_len=36", "sp_variant=ulysses"], "sp_variant=ulysses splits heads"),
    (["scheme=sp", "degree=4", "model.n_kv_heads=2", "sp_variant=ulysses"], "model.n_kv_heads=2 must be divisible"),
    (["scheme=tp_sp", "degree=8", "tp=2", "model.n_kv_heads=4", "sp_variant=ulysses"], "T·Σ=8: model.n_kv_heads=4"),
    (["scheme=tp", "recompute=partial"], "allowed: none, selective, full"),
    (["dtype=float16"], "allowed: float64, float32, bfloat16"),
    (["model.n_kv_heads=3"], "model.n_kv_heads=3 must divide model.n_heads=8"),
    (["scheme=tp_msp", "degree=4", "model.vocab_size=130"], "model.vocab_size=130 must be divisible by the degree 4"),
    (["scheme=tp", "vocab=ring"], "vocab=ring is a tsp option"),
    (["scheme=tsp", "vocab=sharded"], "allowed: auto, replicated, ring"),
    (["scheme=fsdp_sp", "degree=3", "seq_len=36"], "model.dim=64 must be divisible by dp_shard × degree = 3"),
    (["scheme=fsdp_sp", "degree=2", "dp=3", "dp_shard=3"], "model.dim=64 must be divisible by dp_shard × degree = 6"),
    (["scheme=fsdp_sp", "degree=2", "dp=3", "dp_shard=2"], "dp_shard=2 must divide dp=3"),
    (["scheme=fsdp_sp", "vocab=replicated"], "scheme=fsdp_sp allows vocab=auto"),
    (["scheme=fsdp_sp", "degree=4", "model.n_kv_heads=2", "sp_variant=ulysses"], "n_kv_heads=2 must be divisible"),
    (["scheme=tp", "degree=2", "msp=false"], "msp=false is a tp_sp option"),
    (["scheme=tp_sp", "degree=8", "tp=4", "seq_len=36"], "seq_len=36 must be divisible by Σ·T = 8"),
]


@pytest.mark.parametrize("argv,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_one_line(argv, needle, capsys, monkeypatch):
    import tspbench.verify.__main__ as v

    monkeypatch.setattr(v, "run_cases", lambda *a, **k: pytest.fail("ranks spawned for bad input"))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_hydra_rejects_misspelt_key(capsys):
    assert main(["scheem=tsp"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "scheem" in err


def test_world_size_mismatch_names_fields():
    with pytest.raises(ConfigError, match=r"dp × degree"):
        validate_parallel(ModelConfig(), ParallelConfig(scheme="tsp", degree=2, dp=1), 32, world_size=4)


def test_cli_exit_code_and_no_traceback():
    p = subprocess.run(
        [sys.executable, "-m", "tspbench.verify", "scheme=tsp", "degree=3"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1
