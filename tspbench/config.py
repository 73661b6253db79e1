"""Typed configuration: the single schema for the model, the parallel layout and one run.

Every field has an attribute docstring. `validate_*` raise `ConfigError` (a `ValueError`) with one
actionable line naming the field and the allowed values; callers (verify, the runner) catch it and
print that line before any rank is spawned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SCHEMES = ("single", "tp", "tp_msp", "sp", "tp_sp", "tsp", "fsdp_sp")
"""Scheme names used by configs, results and reports (docs/method.md#naming)."""

SP_VARIANTS = ("allgather", "ring", "ulysses")
"""K/V exchange of token-sharded schemes (docs/method.md#choice-sp-variant, #ulysses)."""
RECOMPUTE = ("none", "selective", "full")
"""none; selective: Megatron's core-attention recompute (the attention kernel re-run in backward, projections
kept); full: every block recomputed in backward (docs/method.md#choice-recompute)."""
VOCAB = ("auto", "replicated", "ring")
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
GRAD_BUCKET_ELEMS = 2**25
"""Gradient all-reduce bucket (schemes/base.py ParallelModel.finish_grad_sync): at most 32M elements are
concatenated at once (Megatron's DDP default is 40M), so the sync never holds a second copy of all the gradients.
Here, not in schemes/, so that the cost model reads it without importing torch.distributed."""
MODES = ("train", "forward", "decode")
"""train: forward + backward + AdamW; forward: one forward (prefill without a cache); decode: serving, a
KV-cache prefill of seq_len tokens, then one new token per step (schemes/ops/decode.py)."""


class ConfigError(ValueError):
    """A user mistake in the configuration; its message is one actionable line."""


@dataclass
class ModelConfig:
    """Llama-style decoder (docs/method.md#published; SwiGLU + RMSNorm + RoPE per docs/method.md#choice-activation)."""

    name: str = "tiny"
    """Label used in results and reports."""
    vocab_size: int = 256
    """Vocabulary size V (the paper does not state one; llama7b uses Llama-2's 32000)."""
    dim: int = 64
    """Hidden size h."""
    n_layers: int = 2
    """Number of decoder blocks L."""
    n_heads: int = 4
    """Query heads n_h; head dim d = dim / n_heads."""
    n_kv_heads: int = 4
    """Key/value heads n_kv (GQA ratio g = n_heads / n_kv_heads; equal to n_heads for MHA)."""
    ffn_hidden: int = 256
    """Intermediate size of the gated MLP (F·h; the paper's F = 4 gives 4·h)."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    rope_theta: float = 10000.0
    """RoPE base."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def gqa_ratio(self) -> int:
        return self.n_heads // self.n_kv_heads


@dataclass
class ParallelConfig:
    """Which scheme, over how many ranks, and how it is run."""

    scheme: str = "single"
    """One of single | tp | tp_msp | sp | tp_sp | tsp | fsdp_sp."""
    degree: int = 1
    """Ranks per model replica (the group size): T for tp/tp_msp, Σ for sp and fsdp_sp, T·Σ for tp_sp, D for
    tsp."""
    tp: int = 0
    """tp_sp only: tensor degree T (Σ = degree / T). 0 picks the largest T ≤ √degree dividing degree."""
    dp: int = 1
    """Data-parallel replicas; world size = dp × degree."""
    sp_variant: str = "allgather"
    """sp: how attention sees the whole sequence: allgather (K/V all-gather, zigzag; default) | ring
    (peer-to-peer K/V hops, online softmax) | ulysses (DeepSpeed-Ulysses: all-to-all from token shards to head
    shards and back; n_heads and n_kv_heads divisible by Σ, by T·Σ in tp_sp; docs/method.md#ulysses); the same
    three for tp_sp's Σ axis and for fsdp_sp."""
    kv_bucket_heads: int = 0
    """tsp only: KV heads per K/V all-gather in the attention owner loop (head buckets: bucket b+1's all-gather is in
    flight while bucket b's attention runs; smaller buckets bound the gathered K/V buffer). 0: all of an owner's
    KV heads in one all-gather (docs/method.md#tsp-attention)."""
    recompute: str = "none"
    """Activation recompute: none; selective (Megatron's core-attention recompute: the attention kernel is re-run
    in backward from the saved q, k, v); or full (each block recomputed in backward)."""
    msp: bool = True
    """tp_sp only: Megatron sequence parallelism on the tensor axis (true, default, as Megatron runs TP + CP with
    --sequence-parallel): norms, residuals and checkpointed block inputs hold 1/(T·Σ) of the tokens, all-gathered
    over T into attention / MLP and reduce-scattered out. false: the plain TP × SP ablation (f/g all-reduces on
    the S/Σ local tokens, which are replicated T times; docs/method.md#choice-tp-sp-msp)."""
    vocab: str = "auto"
    """Embedding and LM head: auto (split by vocabulary over the tensor axis in tp, tp_msp and tp_sp, as in
    Megatron; replicated in sp and tsp), replicated (whole on every rank, every scheme), or ring (tsp only:
    1/D of the vocabulary per rank, shards passed round the TSP ring with an online-softmax cross-entropy;
    docs/method.md#choice-embedding)."""

    @property
    def world_size(self) -> int:
        return self.dp * self.degree

    @property
    def tp_degree(self) -> int:
        """Tensor (weight-sharding) degree of the scheme; tsp shards weights D ways too."""
        if self.scheme in ("tp", "tp_msp", "tsp"):
            return self.degree
        if self.scheme == "tp_sp":
            return self.resolved_tp()
        return 1

    @property
    def vocab_degree(self) -> int:
        """Ranks the embedding / LM-head vocabulary is split over: the tensor axis of tp, tp_msp and tp_sp
        (Megatron's vocabulary-parallel embedding and cross-entropy); 1 (replicated) for sp and tsp
        (docs/method.md#choice-embedding); D with vocab=ring; 1 with vocab=replicated."""
        if self.vocab == "replicated":
            return 1
        if self.vocab == "ring":
            return self.degree
        return self.tp_degree if self.scheme in ("tp", "tp_msp", "tp_sp") else 1

    @property
    def sp_degree(self) -> int:
        """Token-sharding degree; tp_msp shards norms/residuals only, so it counts as 1 here."""
        if self.scheme in ("sp", "tsp", "fsdp_sp"):
            return self.degree
        if self.scheme == "tp_sp":
            return self.degree // self.resolved_tp()
        return 1

    def resolved_tp(self) -> int:
        if self.tp:
            return self.tp
        t = 1
        for c in range(1, self.degree + 1):
            if self.degree % c == 0 and c * c <= self.degree:
                t = c
        return t


def model_preset(name: str) -> ModelConfig:
    """A model preset, conf/model/<name>.yaml, as a ModelConfig (the same file Hydra's `model=<name>` reads)."""
    import yaml

    from tspbench.paths import conf_dir

    path = conf_dir() / "model" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ConfigError(f"model={name!r} is unknown; allowed: {', '.join(known)}")
    data = {k: v for k, v in yaml.safe_load(path.read_text()).items() if k != "defaults"}
    return ModelConfig(**data)


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def validate_model(m: ModelConfig) -> None:
    for f in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden"):
        _need(getattr(m, f) >= 1, f"model.{f}={getattr(m, f)} must be a positive integer")
    _need(m.dim % m.n_heads == 0, f"model.dim={m.dim} must be divisible by model.n_heads={m.n_heads}")
    _need(m.n_heads % m.n_kv_heads == 0, f"model.n_kv_heads={m.n_kv_heads} must divide model.n_heads={m.n_heads} (GQA)")
    _need(m.head_dim % 2 == 0, f"model.dim/n_heads={m.head_dim} must be even for RoPE")


def validate_parallel(
    m: ModelConfig, p: ParallelConfig, seq_len: int, batch: int = 1, world_size: int | None = None
) -> None:
    """Check that the scheme can shard this model and sequence; raise one actionable line if not."""
    validate_model(m)
    _need(p.scheme in SCHEMES, f"scheme={p.scheme!r} is unknown; allowed: {', '.join(SCHEMES)}")
    _need(p.sp_variant in SP_VARIANTS, f"sp_variant={p.sp_variant!r} is unknown; allowed: {', '.join(SP_VARIANTS)}")
    _need(p.recompute in RECOMPUTE, f"recompute={p.recompute!r} is unknown; allowed: {', '.join(RECOMPUTE)}")
    _need(p.vocab in VOCAB, f"vocab={p.vocab!r} is unknown; allowed: {', '.join(VOCAB)}")
    _need(
        p.vocab != "ring" or p.scheme == "tsp",
        f"vocab=ring is a TSP option (scheme=tsp); scheme={p.scheme} allows vocab=auto|replicated",
    )
    _need(
        p.msp or p.scheme == "tp_sp",
        f"msp=false is a tp_sp option (the plain TP × SP ablation); scheme={p.scheme} allows msp=true only",
    )
    _need(p.degree >= 1, f"degree={p.degree} must be ≥ 1")
    _need(p.dp >= 1, f"dp={p.dp} must be ≥ 1")
    _need(p.kv_bucket_heads >= 0, f"kv_bucket_heads={p.kv_bucket_heads} must be ≥ 0 (0: one all-gather per owner)")
    _need(
        p.kv_bucket_heads == 0 or p.scheme == "tsp",
        f"kv_bucket_heads is a TSP option (scheme=tsp); scheme={p.scheme} takes kv_bucket_heads=0",
    )
    _need(seq_len >= 1 and batch >= 1, f"seq_len={seq_len} and batch={batch} must be ≥ 1")
    if p.scheme == "single":
        _need(p.degree == 1, f"degree={p.degree} is not allowed for scheme=single; use degree=1")
    elif p.degree == 1:
        raise ConfigError(f"degree=1 makes scheme={p.scheme} the single-device model; use scheme=single or degree ≥ 2")
    if world_size is not None:
        _need(
            world_size == p.world_size,
            f"world size {world_size} ≠ dp × degree = {p.dp} × {p.degree}; set dp={world_size // max(p.degree, 1)} "
            f"or degree so that dp × degree = {world_size}",
        )
    t, s = p.tp_degree, p.sp_degree
    if p.scheme == "tp_sp":
        _need(p.degree % t == 0, f"tp={t} must divide degree={p.degree}; allowed: {_divisors(p.degree)}")
        _need(t >= 1 and s >= 1, f"tp={t} gives Σ={s}; allowed tp: {_divisors(p.degree)}")
    if t > 1:
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
    v = p.vocab_degree
    if v > 1:
        _need(
            m.vocab_size % v == 0,
            f"model.vocab_size={m.vocab_size} must be divisible by the degree {v} "
            f"(scheme={p.scheme} vocab={p.vocab} splits the embedding and LM head by vocabulary); e.g. "
            f"model.vocab_size={v * -(-m.vocab_size // v)}",
        )
    if s > 1:
        _need(
            seq_len % (2 * s) == 0,
            f"seq_len={seq_len} must be divisible by 2×(sequence degree {s}) = {2 * s} "
            f"for the zigzag layout (scheme={p.scheme}); e.g. seq_len={2 * s * max(1, seq_len // (2 * s))}",
        )
    if p.scheme == "fsdp_sp":
        n = p.dp * p.degree
        _need(
            p.vocab == "auto",
            f"vocab={p.vocab}: scheme=fsdp_sp shards the embedding and LM head with FSDP; allowed: vocab=auto",
        )
        _need(
            m.dim % n == 0,
            f"model.dim={m.dim} must be divisible by dp × degree = {n} (scheme=fsdp_sp shards every weight's rows "
            f"over dp × degree); allowed dp × degree: {_divisors(m.dim)}",
        )
    if p.scheme == "tp_sp" and p.msp and t > 1 and s >= 1 and p.degree % t == 0:
        step = s * t * (2 if s > 1 else 1)  # the zigzag shard (S/Σ tokens) splits into T equal pieces
        _need(
            seq_len % s == 0 and (seq_len // s) % t == 0,
            f"seq_len={seq_len} must be divisible by Σ·T = {s * t} (scheme=tp_sp msp=true splits each token shard "
            f"over the tensor axis); e.g. seq_len={step * max(1, seq_len // step)}, or msp=false",
        )
    if p.sp_variant == "ulysses" and p.scheme in ("sp", "tp_sp", "fsdp_sp"):
        split = f"T·Σ={t * s}" if p.scheme == "tp_sp" else f"the sequence degree Σ={s}"  # tp_sp: n/T heads over Σ
        allowed = _divisors(m.n_kv_heads).removeprefix("1, ")
        for f in ("n_heads", "n_kv_heads"):
            _need(
                getattr(m, f) % (t * s) == 0,
                f"sp_variant=ulysses splits heads over {split}: model.{f}={getattr(m, f)} must be divisible by it; "
                f"allowed {'T·Σ' if p.scheme == 'tp_sp' else 'degrees'}: {allowed}",
            )
    if p.scheme == "tp_msp":
        _need(seq_len % t == 0, f"seq_len={seq_len} must be divisible by degree={t} for scheme=tp_msp")


def _kv_degrees(n_kv: int, n_heads: int) -> str:
    """Tensor degrees that fit n_kv KV heads (divisors of n_kv, or multiples of it that divide n_heads)."""
    return ", ".join(str(t) for t in range(2, n_heads + 1) if n_heads % t == 0 and (n_kv % t == 0 or t % n_kv == 0))


def kv_replicas(n_kv_heads: int, tensor_degree: int) -> int:
    """Ranks sharing one KV head: T/n_kv when the tensor degree exceeds the KV heads (GQA/MQA, Megatron's
    replication), else 1 (each rank holds n_kv/T KV heads of its own)."""
    return max(tensor_degree // n_kv_heads, 1)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


@dataclass
class RunShape:
    """The workload of one run (shared by verify, the runner and the estimator)."""

    seq_len: int = 64
    """Tokens per sequence S."""
    batch: int = 1
    """Micro-batch B per replica (sequences per step per model replica)."""
    dtype: str = "float32"
    """Parameter/compute dtype: float64 | float32 | bfloat16."""
    seed: int = 0
    """Seed for the weights and the synthetic batch (same for every scheme)."""
