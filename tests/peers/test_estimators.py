"""Our predictions beside the peers' estimators (tspbench/peers/estimators.py, docs/method.md#peers): the section
ends `python -m tspbench.validate`; for one configuration llm-analysis's and DeepSpeed's numbers equal a hand
computation of their formulas (so the adapters feed them what they say); without llm-analysis the section still
prints, saying why its column is empty."""

from __future__ import annotations

import sys

import pytest

from tspbench.config import GIB, ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.paths import conf_dir
from tspbench.peers.cases import PeerCase

GPT22B = ModelConfig(vocab_size=51200, dim=6144, n_layers=48, n_heads=64, n_kv_heads=64, ffn_hidden=16384)
"""Korthikanti et al.'s 22B GPT (conf/published/measurements.yaml), MHA."""
LLAMA3_8B = ModelConfig(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_hidden=14336)


def tp_case(recompute: str = "full") -> PeerCase:
    """TP T = 8 on 8 A100s, B = 4, S = 2048 (Korthikanti et al.'s 22B row, written out here so that the test does
    not move with the data file)."""
    par = ParallelConfig(scheme="tp", degree=8, dp=1, recompute=recompute)
    return PeerCase(
        id="gpt22b_tp8",
        model=GPT22B,
        hardware="a100",
        gpus=8,
        par=par,
        mem_par=par,
        seq_len=2048,
        micro_batch=4,
        recompute=recompute,
        tp=8,
        megatron_sp=False,
        zero3_over=0,
        context_parallel=1,
    )


def test_llm_analysis_latency_equals_its_formula_by_hand():
    """llm_analysis/analysis.py (0.2.2): forward FLOPs per layer 4BSh² + 4BSh²/g (Q, O; K, V) + 4BS²h (scores) +
    16BSh² (MLP as two 4h matrices), the logits 2BShV; backward 2× forward; full recompute one more forward; time =
    FLOPs / (tp · peak · efficiency); tokens/s per GPU = B·S / time / tp. Exact up to float rounding (rel 1e-12)."""
    pytest.importorskip(
        "llm_analysis.analysis", reason="llm-analysis not installed (pip install --no-deps llm-analysis fire)"
    )
    from tspbench.peers import llm_analysis
    from tspbench.predict.costmodel.hardware import shared_profile

    case, hw = tp_case(), shared_profile("a100")
    B, S, h, L, V = case.micro_batch, case.seq_len, GPT22B.dim, GPT22B.n_layers, GPT22B.vocab_size
    g = GPT22B.n_heads / GPT22B.n_kv_heads
    fwd = L * (4 * B * S * h**2 + 4 * B * S * h**2 / g + 4 * B * S**2 * h + 16 * B * S * h**2) + 2 * B * S * h * V
    step = (fwd + 2 * fwd + fwd) / (case.tp * hw.peak_flops_bf16 * hw.matmul_efficiency)
    got = llm_analysis.quantities(case, llm_analysis.analyse(case))
    assert got["step_s"] == pytest.approx(step, rel=1e-12)
    assert got["tokens_per_s_per_gpu"] == pytest.approx(B * S / step / case.tp, rel=1e-12)
    halved = step - L * 2 * B * S**2 * h * 4 / (case.tp * hw.peak_flops_bf16 * hw.matmul_efficiency)
    assert got["step_s"] != pytest.approx(halved, rel=1e-3)  # a causally halved S² term: not what it computes


def test_deepspeed_zero3_equals_its_formula_by_hand():
    """deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs, no offload: 4·Ψ_layer + ⌊18·Ψ/N⌋
    bytes, Ψ every parameter (untied embedding and head), Ψ_layer the largest module's (the V×h embedding). Exact."""
    pytest.importorskip("deepspeed.runtime.zero.stage3", reason="deepspeed not installed")
    from tspbench.peers import zero

    m = LLAMA3_8B
    d = m.dim // m.n_heads
    block = (2 * m.n_heads * d + 2 * m.n_kv_heads * d) * m.dim + 3 * m.ffn_hidden * m.dim + 2 * m.dim
    psi = 2 * m.vocab_size * m.dim + m.n_layers * block + m.dim
    assert zero.total_params(m) == psi
    assert zero.zero3_gpu_gib(m, 8) * GIB == 4 * m.vocab_size * m.dim + int(18 * psi / 8)
    assert zero.zero2_gpu_gib(m, 8) * GIB == 2 * psi + int(18 * psi / 8)


def test_section_ends_validate(tmp_path, capsys):
    """`python -m tspbench.validate` prints the section last, one line per row and quantity, with our number. Without
    either peer (the `peers` extra absent) the section is its one `skipped` line: the table part then skips."""
    from tspbench import validate
    from tspbench.peers import llm_analysis, zero

    assert validate.main([str(conf_dir() / "published" / "measurements.yaml"), f"out={tmp_path / 'v.jsonl'}"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("Peer estimators") :]
    assert out.index("wrote ") < out.index("Peer estimators")
    if llm_analysis.available() and zero.available():  # each says why it is absent, or None when installed
        assert section.startswith("Peer estimators: skipped (")
        pytest.skip(f"the peers extra is not installed: {llm_analysis.available()}; {zero.available()}")
    assert "paper_tp_8_128k" in section and "tokens/s per GPU" in section and "why they differ" in section


def test_records_and_table_without_llm_analysis(monkeypatch):
    """llm-analysis absent (its modules made unimportable): its column is empty, every record says why, the table
    still prints; with DeepSpeed absent too the section is one line saying what to install."""
    from tspbench.peers import estimators, llm_analysis, zero

    for mod in ("llm_analysis", "llm_analysis.analysis"):
        monkeypatch.setitem(sys.modules, mod, None)  # `import` of a None entry raises ImportError
    assert "not installed" in (llm_analysis.available() or "")
    recs = estimators.peer_records([conf_dir() / "published" / "measurements.yaml"])
    assert recs and all(r["llm_analysis"] is None and "not installed" in r["llm_analysis_note"] for r in recs)
    assert all(r["ours"] is not None for r in recs if r["quantity"] == "tokens_per_s_per_gpu")
    assert "not installed" in estimators.render(recs)
    monkeypatch.setattr(zero, "available", lambda: "deepspeed is not installed")
    assert estimators.section().startswith("Peer estimators: skipped")
