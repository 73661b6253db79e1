"""The implemented schemes, each entered once (docs/adding-a-scheme.md): title, axes, K/V exchange, options and their
values, its own layout checks, and the divisors the cost model needs. Nothing outside tspbench/schemes/ and the cost
model's formulas branches on a scheme's name; everything else asks these entries through ParallelConfig."""

from __future__ import annotations

from tspbench.config import ModelConfig
from tspbench.parallel.layout import (
    SCHEME_REGISTRY,
    VOCAB,
    Divisors,
    ParallelConfig,
    Scheme,
    _divisors,
    _need,
    register,
)


def _one(par: ParallelConfig) -> int:
    return 1


def _degree(par: ParallelConfig) -> int:
    return par.degree


def _tp_sp_tensor(par: ParallelConfig) -> int:
    return par.resolved_tp()


def _tp_sp_tokens(par: ParallelConfig) -> int:
    return par.degree // par.resolved_tp()


def _tp_sp_msp(par: ParallelConfig) -> bool:
    return par.msp and par.tp_degree > 1


def _tp_sp_divisors(par: ParallelConfig) -> Divisors:
    t, sig = par.tp_degree, par.sp_degree
    if par.megatron_sp:  # the vocabulary-parallel head gathers shard σ; a replicated one runs on the piece
        return Divisors(t, sig, t, sig, t, t, sig if par.vocab_degree > 1 else sig * t, t)
    return Divisors(t, sig, t, sig, t, 1, sig, t)


def _check_single(m: ModelConfig, p: ParallelConfig, seq_len: int) -> None:
    _need(p.degree == 1, f"degree={p.degree} is not allowed for scheme=single; use degree=1")


def _check_tp_msp(m: ModelConfig, p: ParallelConfig, seq_len: int) -> None:
    t = p.tp_degree
    _need(seq_len % t == 0, f"seq_len={seq_len} must be divisible by degree={t} for scheme=tp_msp")


def _check_tp_sp_mesh(m: ModelConfig, p: ParallelConfig, seq_len: int) -> None:
    t = p.resolved_tp()
    _need(p.degree % t == 0, f"tp={t} must divide degree={p.degree}; allowed: {_divisors(p.degree)}")
    s = p.degree // t
    _need(t >= 1 and s >= 1, f"tp={t} gives Σ={s}; allowed tp: {_divisors(p.degree)}")


def _check_tp_sp_msp(m: ModelConfig, p: ParallelConfig, seq_len: int) -> None:
    """After the shared checks: Megatron-SP splits each token shard over the tensor axis."""
    t, s = p.tp_degree, p.sp_degree
    if p.msp and t > 1:
        step = s * t * (2 if s > 1 else 1)  # the zigzag shard (S/Σ tokens) splits into T equal pieces
        _need(
            seq_len % s == 0 and (seq_len // s) % t == 0,
            f"seq_len={seq_len} must be divisible by Σ·T = {s * t} (scheme=tp_sp msp=true splits each token shard "
            f"over the tensor axis); e.g. seq_len={step * max(1, seq_len // step)}, or msp=false",
        )


def _check_fsdp_sp(m: ModelConfig, p: ParallelConfig, seq_len: int) -> None:
    n = p.fsdp_shards
    _need(
        m.dim % n == 0,
        f"model.dim={m.dim} must be divisible by dp_shard × degree = {n} (scheme=fsdp_sp shards every weight's rows "
        f"over its shard group of dp_shard × degree ranks); allowed dp_shard × degree: {_divisors(m.dim)}",
    )


for _s in (
    Scheme(
        name="single",
        title="single device",
        summary="the unsharded reference model (optionally data-parallel)",
        role="reference",
        axes="",
        mesh=("dp",),
        tensor_degree=_one,
        token_degree=_one,
        divisors=lambda par: Divisors(1, 1, 1, 1, 1, 1, 1),
        single_device=True,
        check_layout=_check_single,
    ),
    Scheme(
        name="tp",
        title="TP",
        summary="Megatron tensor parallelism: 1/T of every block weight and head, every token",
        role="baseline",
        axes="T",
        mesh=("dp", "tp"),
        tensor_degree=_degree,
        token_degree=_one,
        divisors=lambda par: Divisors(par.degree, 1, par.degree, 1, par.degree, 1, 1, par.degree),
        vocab_split=True,
    ),
    Scheme(
        name="tp_msp",
        title="TP+Megatron-SP",
        summary="TP with norms and residuals sequence-sharded (all-gather in, reduce-scatter out)",
        role="baseline",
        axes="T",
        mesh=("dp", "tp"),
        tensor_degree=_degree,
        token_degree=_one,
        # the vocabulary-parallel head gathers the sequence: all B·S tokens over V/T classes; a replicated head
        # runs on the rank's sequence piece, B·S/T tokens over every class
        divisors=lambda par: Divisors(
            par.degree, 1, par.degree, 1, par.degree, par.degree, 1 if par.vocab_degree > 1 else par.degree, par.degree
        ),
        vocab_split=True,
        sequence_parallel_norms=lambda par: par.degree > 1,
        check_fit=_check_tp_msp,
    ),
    Scheme(
        name="sp",
        title="SP",
        summary="token sharding (context parallelism): weights replicated, 1/Σ of the tokens, K/V exchanged",
        role="baseline",
        axes="Σ",
        mesh=("dp", "sp"),
        tensor_degree=_one,
        token_degree=_degree,
        divisors=lambda par: Divisors(1, par.degree, 1, par.degree, 1, 1, par.degree),
        options=("sp_variant", "vocab"),
        exchange=True,
    ),
    Scheme(
        name="tp_sp",
        title="TP×SP",
        summary="a T × Σ mesh: TP (with Megatron-SP by default) on T, token sharding on Σ",
        role="baseline",
        axes="T×Σ",
        mesh=("dp", "sp", "tp"),
        tensor_degree=_tp_sp_tensor,
        token_degree=_tp_sp_tokens,
        divisors=_tp_sp_divisors,
        options=("tp", "sp_variant", "msp", "vocab"),
        exchange=True,
        vocab_split=True,
        sequence_parallel_norms=_tp_sp_msp,
        check_layout=_check_tp_sp_mesh,
        check_fit=_check_tp_sp_msp,
    ),
    Scheme(
        name="fsdp_sp",
        title="FSDP×SP",
        summary="token sharding as sp, with weights, gradients and optimizer state sharded by FSDP2",
        role="baseline",
        axes="Σ",
        mesh=("dp_replicate", "dp_shard", "sp"),  # HSDP: dp = replicas of shard groups × replicas within one
        tensor_degree=_one,
        token_degree=_degree,
        # sp's tokens; every weight (norms, embedding and head too) ÷ N = dp_shard·Σ by FSDP
        divisors=lambda par: Divisors(1, par.degree, par.fsdp_shards, par.degree, 1, 1, par.degree),
        options=("sp_variant", "dp_shard", "vocab"),
        vocabs=("auto",),
        exchange=True,
        fsdp=True,
        check_fit=_check_fsdp_sp,
    ),
    Scheme(
        name="tsp",
        title="TSP",
        summary="the paper's folded axis: 1/D of every weight and 1/D of the tokens",
        role="method",
        axes="D",
        mesh=("dp", "tsp"),
        tensor_degree=_degree,
        token_degree=_degree,
        divisors=lambda par: Divisors(par.degree, par.degree, par.degree, par.degree, 1, 1, par.degree),
        options=("kv_bucket_heads", "mlp_exchange", "regather_kv", "vocab"),
        vocabs=VOCAB,
    ),
):  # display order: the single-device reference, the baselines, then the method
    register(_s)

SCHEMES: tuple[str, ...] = tuple(SCHEME_REGISTRY)
"""Scheme names used by configs, results and reports, in display order (docs/method.md#naming)."""
