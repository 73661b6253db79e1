"""Layout checks: `validate_parallel` refuses, with one actionable line naming the field and the allowed values,
every layout a scheme cannot run (the scheme's own checks are hooks of its registry entry)."""

from __future__ import annotations

from dataclasses import fields

from tspbench.config import ConfigError, ModelConfig, validate_model
from tspbench.parallel.layout import (
    MLP_EXCHANGES,
    RECOMPUTE,
    SP_VARIANTS,
    VOCAB,
    ParallelConfig,
    _divisors,
    _need,
    scheme,
    takers,
)

OPTION_VALUES: dict[str, tuple] = {
    "sp_variant": SP_VARIANTS,
    "recompute": RECOMPUTE,
    "vocab": VOCAB,
    "mlp_exchange": MLP_EXCHANGES,
}
"""The fixed value sets of the layout's string fields."""
_OPTION_DEFAULTS = {f.name: f.default for f in fields(ParallelConfig)}


def _kv_degrees(n_kv: int, n_heads: int) -> str:
    """Tensor degrees that fit n_kv KV heads (divisors of n_kv, or multiples of it that divide n_heads)."""
    return ", ".join(str(t) for t in range(2, n_heads + 1) if n_heads % t == 0 and (n_kv % t == 0 or t % n_kv == 0))


def kv_replicas(n_kv_heads: int, tensor_degree: int) -> int:
    """Ranks sharing one KV head: T/n_kv when the tensor degree exceeds the KV heads (GQA/MQA, Megatron's
    replication), else 1 (each rank holds n_kv/T KV heads of its own)."""
    return max(tensor_degree // n_kv_heads, 1)


def check_options(p: ParallelConfig) -> None:
    """Every option field holds an allowed value, and a non-default one only where the scheme takes it (an option
    a scheme ignores is refused, never dropped silently)."""
    s = scheme(p.scheme)
    for name, allowed in OPTION_VALUES.items():
        _need(getattr(p, name) in allowed, f"{name}={getattr(p, name)!r} is unknown; allowed: {', '.join(allowed)}")
    _need(p.degree >= 1, f"degree={p.degree} must be ≥ 1")
    _need(p.dp >= 1, f"dp={p.dp} must be ≥ 1")
    _need(p.kv_bucket_heads >= 0, f"kv_bucket_heads={p.kv_bucket_heads} must be ≥ 0 (0: one all-gather per owner)")
    _need(p.tp >= 0, f"tp={p.tp} must be ≥ 0 (0: the largest T ≤ √degree)")
    _need(
        p.dp_shard >= 1 and p.dp % p.dp_shard == 0,
        f"dp_shard={p.dp_shard} must divide dp={p.dp} (replicas one FSDP shard group spans); allowed: "
        f"{_divisors(p.dp)}",
    )
    if p.vocab not in s.vocabs:
        raise ConfigError(
            f"vocab={p.vocab} is a {'|'.join(takers('vocab', p.vocab))} option; scheme={p.scheme} allows "
            f"vocab={'|'.join(s.vocabs)}"
        )
    for name in ("msp", "kv_bucket_heads", "sp_variant", "tp", "mlp_exchange", "regather_kv", "dp_shard"):
        default = _OPTION_DEFAULTS[name]
        if name not in s.options and getattr(p, name) != default:
            shown = str(getattr(p, name)).lower()
            raise ConfigError(
                f"{name}={shown} is a {'|'.join(takers(name))} option ({OPTION_WHAT[name]}); scheme={p.scheme} "
                f"allows {name}={str(default).lower()} only"
            )


OPTION_WHAT = {
    "msp": "false: the plain TP × SP ablation",
    "kv_bucket_heads": "KV heads per K/V all-gather",
    "sp_variant": "the K/V exchange",
    "tp": "the tensor degree T of the T × Σ mesh",
    "mlp_exchange": "how the MLP's weight shards travel: ring | biring | broadcast",
    "regather_kv": "false: backward keeps the K/V gathered last",
    "dp_shard": "replicas one FSDP shard group spans (HSDP)",
}
"""What each scheme-specific option is, for the one-line refusal of a scheme that does not take it."""


def validate_parallel(
    m: ModelConfig, p: ParallelConfig, seq_len: int, batch: int = 1, world_size: int | None = None
) -> None:
    """Check that the scheme can shard this model and sequence; raise one actionable line if not."""
    validate_model(m)
    check_options(p)
    s = scheme(p.scheme)
    _need(seq_len >= 1 and batch >= 1, f"seq_len={seq_len} and batch={batch} must be ≥ 1")
    if not s.single_device and p.degree == 1:
        raise ConfigError(f"degree=1 makes scheme={p.scheme} the single-device model; use scheme=single or degree ≥ 2")
    if world_size is not None:
        _need(
            world_size == p.world_size,
            f"world size {world_size} ≠ dp × degree = {p.dp} × {p.degree}; set dp={world_size // max(p.degree, 1)} "
            f"or degree so that dp × degree = {world_size}",
        )
    if s.check_layout is not None:
        s.check_layout(m, p, seq_len)
    _check_tensor_axis(m, p)
    _check_vocabulary(m, p)
    _check_token_axis(p, seq_len)
    _check_hf_fields(m, p, seq_len)
    if s.check_fit is not None:
        s.check_fit(m, p, seq_len)
    if p.ulysses:
        _check_ulysses(m, p)


def _check_hf_fields(m: ModelConfig, p: ParallelConfig, seq_len: int) -> None:
    """What the community's configs add (tspbench/hf/convert.py), refused before any rank starts: tied embeddings
    where the embedding and the LM head are sharded apart (a vocabulary split or ring, or FSDP's row shards), and a
    sequence longer than Mistral's sliding window (the model attends over the whole causal prefix)."""
    if m.tie_embeddings:
        apart = p.scheme == "fsdp_sp" or p.vocab_degree > 1 or p.vocab == "ring"
        _need(
            not apart,
            f"model.tie_embeddings=true with scheme={p.scheme} vocab={p.vocab}: the embedding and LM head are "
            "sharded apart; allowed: vocab=replicated with scheme=single|tp|tp_msp|sp|tp_sp|tsp, or "
            "model.tie_embeddings=false",
        )
    if m.sliding_window is not None:
        _need(
            seq_len <= m.sliding_window,
            f"seq_len={seq_len} exceeds model.sliding_window={m.sliding_window} (the model attends over the whole "
            f"causal prefix, equal to the window only up to it); allowed: seq_len ≤ {m.sliding_window}",
        )


def _check_tensor_axis(m: ModelConfig, p: ParallelConfig) -> None:
    t = p.tp_degree
    if t <= 1:
        return
    _need(
        m.n_heads % t == 0,
        f"model.n_heads={m.n_heads} must be divisible by the tensor degree {t} "
        f"(scheme={p.scheme}); allowed degrees: {_divisors(m.n_heads)}",
    )
    # GQA with fewer KV heads than T: each KV head is replicated over T/n_kv consecutive ranks (Megatron)
    _need(
        m.n_kv_heads % t == 0 or t % m.n_kv_heads == 0,
        f"model.n_kv_heads={m.n_kv_heads} and the tensor degree {t} (scheme={p.scheme}) must divide one "
        f"another (KV heads split, or each replicated over T/n_kv ranks); allowed degrees: "
        f"{_kv_degrees(m.n_kv_heads, m.n_heads)}",
    )
    _need(
        m.ffn_hidden % t == 0,
        f"model.ffn_hidden={m.ffn_hidden} must be divisible by the tensor degree {t} (scheme={p.scheme})",
    )


def _check_vocabulary(m: ModelConfig, p: ParallelConfig) -> None:
    v = p.vocab_degree
    if v > 1:
        _need(
            m.vocab_size % v == 0,
            f"model.vocab_size={m.vocab_size} must be divisible by the degree {v} "
            f"(scheme={p.scheme} vocab={p.vocab} splits the embedding and LM head by vocabulary); e.g. "
            f"model.vocab_size={v * -(-m.vocab_size // v)}",
        )


def _check_token_axis(p: ParallelConfig, seq_len: int) -> None:
    s = p.sp_degree
    if s > 1:
        _need(
            seq_len % (2 * s) == 0,
            f"seq_len={seq_len} must be divisible by 2×(sequence degree {s}) = {2 * s} "
            f"for the zigzag layout (scheme={p.scheme}); e.g. seq_len={2 * s * max(1, seq_len // (2 * s))}",
        )


def _check_ulysses(m: ModelConfig, p: ParallelConfig) -> None:
    t, s = p.tp_degree, p.sp_degree
    mesh = p.spec.axes == "T×Σ"  # a 2-D mesh: the n/T local heads are split over Σ
    split = f"T·Σ={t * s}" if mesh else f"the sequence degree Σ={s}"
    allowed = _divisors(m.n_kv_heads).removeprefix("1, ")
    for f in ("n_heads", "n_kv_heads"):
        _need(
            getattr(m, f) % (t * s) == 0,
            f"sp_variant=ulysses splits heads over {split}: model.{f}={getattr(m, f)} must be divisible by it; "
            f"allowed {'T·Σ' if mesh else 'degrees'}: {allowed}",
        )
