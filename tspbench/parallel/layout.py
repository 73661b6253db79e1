"""The layout and what a scheme is: `Scheme` (everything tspbench asks about one scheme, written down once), the
registry they are entered in (tspbench/parallel/registry.py enters the implemented ones), and `ParallelConfig` (every
layout field once, every derived fact a property, asking the scheme's entry instead of testing its name: torchtitan's
`ParallelDims`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Annotated, Any

from tspbench.config import ConfigError, ModelConfig, Range

SP_VARIANTS = ("allgather", "ring", "ulysses")
"""K/V exchange of token-sharded schemes (docs/method.md#choice-sp-variant, #ulysses)."""
RECOMPUTE = ("none", "selective", "full")
"""none; selective: Megatron's core-attention recompute (the attention kernel re-run in backward, projections
kept); full: every block recomputed in backward (docs/method.md#choice-recompute)."""
VOCAB = ("auto", "replicated", "ring")
"""Embedding / LM-head layouts (ParallelConfig.vocab)."""
MLP_EXCHANGES = ("ring", "biring", "broadcast")
"""How TSP's gated-MLP weight shards reach every rank (ParallelConfig.mlp_exchange; docs/method.md#tsp-mlp)."""


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


@dataclass(frozen=True)
class Divisors:
    """How one scheme divides a replica's work over its `degree` ranks (what the cost model needs)."""

    tp: int  # T: tensor axis (weight/head sharding); D for tsp
    sp: int  # Σ: sequence axis (token sharding); D for tsp
    weight_div: int  # per-layer weights held by a rank = W / weight_div
    seq_div: int  # token-wise tensors hold B·S / seq_div tokens
    head_div: int  # head/channel-sharded activations are further ÷ head_div (1 for tsp: a rank does all heads)
    rep_div: int  # TP-replicated token-wise activations ÷ rep_div (T for Megatron-SP)
    loss_div: int  # the LM head and loss run on B·S / loss_div tokens per rank
    vocab_div: int = 1  # … over V / vocab_div classes (T where the vocabulary is split over the tensor axis)


Check = Callable[[ModelConfig, "ParallelConfig", int], None]


@dataclass(frozen=True)
class Scheme:
    """Everything tspbench asks about one scheme (docs/adding-a-scheme.md lists the files a new one touches)."""

    name: str
    """Registry key: `scheme=NAME` in every CLI, the `scheme` field of records, tspbench/schemes/NAME.py."""
    title: str
    """Display name, as in the paper's notation ("SP" is the paper's token sharding, not Megatron-SP)."""
    summary: str
    """What one rank holds, in a line (the README's scheme table says more)."""
    role: str
    """reference (the single device), baseline (what users run today) or method (the paper's TSP, the one tspbench
    exists to check): the headline and the paper tables put the method against every baseline."""
    axes: str
    """How the degree is written: "" (single device), "T", "Σ", "D", or "T×Σ" (a 2-D mesh)."""
    mesh: tuple[str, ...]
    """The rank mesh's axes, outermost first (dp, then the scheme's: tp, sp, tsp); the tensor axis is innermost
    (fastest-varying ranks), as in Megatron, so a tensor group stays inside one node (schemes/ops/sharding.py)."""
    tensor_degree: Callable[[ParallelConfig], int]
    """T: ranks the block weights and heads are split over."""
    token_degree: Callable[[ParallelConfig], int]
    """Σ: ranks the tokens are split over (zigzag)."""
    divisors: Callable[[ParallelConfig], Divisors]
    """The cost model's divisors (costmodel.params.layout adds vocab_div)."""
    options: tuple[str, ...] = ("vocab",)
    """ParallelConfig fields the scheme takes besides scheme, degree, dp and recompute; a non-default value of any
    other option field is refused with one line."""
    vocabs: tuple[str, ...] = ("auto", "replicated")
    """Allowed values of `vocab`."""
    exchange: bool = False
    """Exchanges K/V over its token axis (takes sp_variant: allgather | ring | ulysses)."""
    vocab_split: bool = False
    """vocab=auto splits the embedding and LM head by vocabulary over the tensor axis (Megatron)."""
    fsdp: bool = False
    """Parameters, gradients and optimizer state sharded by FSDP2 over dp × degree."""
    single_device: bool = False
    """The unsharded reference: runs at degree 1 only."""
    sequence_parallel_norms: Callable[[ParallelConfig], bool] = lambda par: False
    """Megatron-SP on the tensor axis (norms and residuals 1/T of the tokens, all-gather in / reduce-scatter out)."""
    check_layout: Check | None = None
    """Checks of the layout itself, before the shared ones (e.g. tp_sp: T divides the degree)."""
    check_fit: Check | None = None
    """Checks that the model and sequence fit the layout, after the shared ones (divisibility by T, the zigzag's
    2Σ, the vocabulary split, Ulysses' head split)."""

    def shape(self, degree: int | None, tp: int | None = None, sp: int | None = None) -> str:
        """The degree in the scheme's axes, e.g. "D=8", "T=2×Σ=4" ("T·Σ=8" when T is not known)."""
        if not self.axes or degree is None:
            return ""
        if self.axes == "T×Σ":
            return f"T={tp}×Σ={sp}" if tp and sp else f"T·Σ={degree}"
        return f"{self.axes}={degree}"


SCHEME_REGISTRY: dict[str, Scheme] = {}
"""Every implemented scheme by name, in display order (the single-device reference, the baselines, then the method);
filled by tspbench/parallel/registry.py, which the package imports first."""


def register(s: Scheme) -> Scheme:
    """Enter a scheme in the registry (once per name)."""
    if s.name in SCHEME_REGISTRY:
        raise ValueError(f"scheme {s.name!r} is registered twice")
    SCHEME_REGISTRY[s.name] = s
    return s


def scheme(name: str) -> Scheme:
    """The description of scheme `name`; ConfigError naming the allowed schemes for an unknown one."""
    try:
        return SCHEME_REGISTRY[name]
    except KeyError:
        raise ConfigError(f"scheme={name!r} is unknown; allowed: {', '.join(SCHEME_REGISTRY)}") from None


def takers(option: str, value: object = None) -> list[str]:
    """The schemes that take an option field (and, given `value`, allow that value of it)."""
    out = [s for s in SCHEME_REGISTRY.values() if option in s.options]
    if option == "vocab" and value is not None:
        out = [s for s in out if value in s.vocabs]
    return [s.name for s in out]


def takes(name: str, option: str) -> bool:
    """Does scheme `name` take the option field `option`? (False for an unknown scheme.)"""
    s = SCHEME_REGISTRY.get(name)
    return s is not None and option in s.options


# ------------------------------------------------------------------------------------------------ the layout
@dataclass
class ParallelConfig:
    """Which scheme, over how many ranks, and how it is run: every layout field, once. The CLIs' configs
    (verify, estimate) and the runner's RunSpec inherit these fields; `parallel()` takes them back out."""

    scheme: str = "single"
    """One of single | tp | tp_msp | sp | tp_sp | fsdp_sp | tsp (tspbench.parallel.SCHEMES)."""
    degree: Annotated[int, Range(1)] = 1
    """Ranks per model replica (the group size): T for tp/tp_msp, Σ for sp and fsdp_sp, T·Σ for tp_sp, D for
    tsp."""
    tp: Annotated[int, Range(0, note="0: auto")] = 0
    """tp_sp only: tensor degree T (Σ = degree / T). 0 picks the largest T ≤ √degree dividing degree."""
    dp: Annotated[int, Range(1)] = 1
    """Data-parallel replicas; world size = dp × degree."""
    sp_variant: str = "allgather"
    """Schemes with a K/V exchange (sp, tp_sp's Σ axis, fsdp_sp): how attention sees the whole sequence: allgather
    (K/V all-gather, zigzag; default) | ring (peer-to-peer K/V hops, online softmax) | ulysses (DeepSpeed-Ulysses:
    all-to-all from token shards to head shards and back; n_heads and n_kv_heads divisible by Σ, by T·Σ in tp_sp;
    docs/method.md#ulysses)."""
    kv_bucket_heads: Annotated[int, Range(0, note="0: one all-gather per owner")] = 0
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
    Megatron; replicated in sp and tsp; FSDP-sharded in fsdp_sp), replicated (whole on every rank), or ring (tsp
    only: 1/D of the vocabulary per rank, shards passed round the TSP ring with an online-softmax cross-entropy;
    docs/method.md#choice-embedding)."""
    mlp_exchange: str = "ring"
    """tsp only: how the gated MLP's weight shards reach every rank: ring (one hop a step round a ring, default),
    biring (half of each shard each way round the ring: both directions of every link) or broadcast (each owner's
    shard broadcast, as attention's; docs/method.md#tsp-mlp)."""
    regather_kv: bool = True
    """tsp only: backward re-gathers each owner's K/V (true, default: communication, not memory) or keeps the ones
    gathered last (false: under recompute=full the replay's, for the layer being differentiated; otherwise the
    forward's, for every layer) — a memory–communication trade (docs/method.md#choice-backward)."""
    dp_shard: Annotated[int, Range(1)] = 1
    """fsdp_sp only: data-parallel replicas one FSDP shard group spans (HSDP, torchtitan's dp_shard): 1 shards every
    weight within its replica's Σ ranks and replicates across replicas (default); dp shards over all dp × Σ ranks
    (plain FSDP). Must divide dp (docs/method.md#fsdp-sp)."""

    # -- derived facts (every one a property; nothing else tests the scheme name for them) -------------------
    @property
    def spec(self) -> Scheme:
        """This scheme's description (ConfigError naming the allowed schemes for an unknown one)."""
        return scheme(self.scheme)

    @property
    def world_size(self) -> int:
        return self.dp * self.degree

    @property
    def tp_degree(self) -> int:
        """Tensor (weight-sharding) degree T; tsp shards weights D ways too."""
        return self.spec.tensor_degree(self)

    @property
    def sp_degree(self) -> int:
        """Token-sharding degree Σ; tp_msp shards norms/residuals only, so it counts as 1 here."""
        return self.spec.token_degree(self)

    @property
    def vocab_degree(self) -> int:
        """Ranks the embedding / LM-head vocabulary is split over: the tensor axis where the scheme splits it
        (Megatron's vocabulary-parallel embedding and cross-entropy), D with vocab=ring, else 1
        (docs/method.md#choice-embedding)."""
        if self.vocab == "replicated":
            return 1
        if self.vocab == "ring":
            return self.degree
        return self.tp_degree if self.spec.vocab_split else 1

    @property
    def exchange(self) -> str | None:
        """The K/V exchange over the token axis (sp_variant), or None for a scheme without one."""
        return self.sp_variant if self.spec.exchange else None

    @property
    def ulysses(self) -> bool:
        """The exchange is DeepSpeed-Ulysses' all-to-all to head shards."""
        return self.exchange == "ulysses"

    @property
    def megatron_sp(self) -> bool:
        """Megatron-SP on a tensor axis of T > 1 (tp_msp, or tp_sp with msp=true): residual-stream tensors 1/T of
        the group's tokens, all-gathered into attention / MLP and reduce-scattered out."""
        return self.spec.sequence_parallel_norms(self)

    @property
    def fsdp_shards(self) -> int:
        """N = dp_shard·Σ: the ranks FSDP shards every weight over in an FSDP scheme, its shard group (HSDP: replicated
        over the dp / dp_shard groups; docs/method.md#fsdp-sp); 1 else."""
        return self.dp_shard * self.degree if self.spec.fsdp else 1

    def resolved_tp(self) -> int:
        """tp_sp's T: `tp`, or the largest T ≤ √degree dividing the degree when tp = 0."""
        if self.tp:
            return self.tp
        t = 1
        for c in range(1, self.degree + 1):
            if self.degree % c == 0 and c * c <= self.degree:
                t = c
        return t

    def parallel(self) -> ParallelConfig:
        """The layout alone (what the schemes take), from any config that carries the layout fields."""
        return ParallelConfig(**{f.name: getattr(self, f.name) for f in fields(ParallelConfig)})

    def options(self) -> dict[str, Any]:
        """The option fields this scheme takes (sp_variant, msp, vocab, kv_bucket_heads, tp …) with their values."""
        return {name: getattr(self, name) for name in self.spec.options}

    def label(self) -> str:
        """The one display name of a layout, e.g. "TSP D=8", "TP×SP T=2×Σ=4 (ring, no Megatron-SP)",
        "FSDP×SP Σ=8 (ulysses)" (docs/method.md#notation). Data parallelism and recompute are not part of it."""
        s = self.spec
        shape = s.shape(self.degree, self.tp_degree, self.sp_degree)
        extra = [self.exchange] if self.exchange and self.sp_degree > 1 else []
        if "msp" in s.options and not self.msp:
            extra.append("no Megatron-SP")
        if self.vocab != "auto":
            extra.append(f"vocab={self.vocab}")
        if self.kv_bucket_heads:
            extra.append(f"kv_bucket_heads={self.kv_bucket_heads}")
        if self.mlp_exchange != "ring":
            extra.append(f"mlp={self.mlp_exchange}")
        if not self.regather_kv:
            extra.append("K/V kept")
        if self.dp_shard != 1:
            extra.append(f"dp_shard={self.dp_shard}")
        return " ".join(p for p in (s.title, shape, f"({', '.join(extra)})" if extra else "") if p)

    def key(self) -> tuple:
        """The full layout as a hashable key (every field that tells two layouts apart; options a scheme does not
        take are None): group, compare and de-duplicate records by it, never by a subset."""
        return tuple(layout_fields(self).values())

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> ParallelConfig:
        """The layout a record (docs/records.md) describes; KeyError/TypeError/ValueError when it names none."""
        name = str(rec["scheme"])
        takes = scheme(name).options
        return cls(
            scheme=name,
            degree=int(rec["degree"]),
            tp=int(rec.get("tp_degree") or 0) if "tp" in takes else 0,
            dp=int(rec.get("dp") or 1),
            sp_variant=rec.get("sp_variant") or "allgather",
            kv_bucket_heads=int(rec.get("kv_bucket_heads") or 0),
            recompute=rec.get("recompute") or "none",
            msp=True if rec.get("msp") is None else bool(rec["msp"]),
            vocab=rec.get("vocab") or "auto",
            mlp_exchange=rec.get("mlp_exchange") or "ring",
            regather_kv=True if rec.get("regather_kv") is None else bool(rec["regather_kv"]),
            dp_shard=int(rec.get("dp_shard") or 1),
        )


def layout_fields(par: ParallelConfig) -> dict[str, Any]:
    """A layout as record fields (docs/records.md): the resolved degrees, and None for every option the scheme
    does not take (so a tp record never shows an sp_variant it ignores)."""
    tp_degree: int | None
    sp_degree: int | None
    try:
        tp_degree, sp_degree = par.tp_degree, par.sp_degree
    except (ValueError, ZeroDivisionError):  # an invalid layout (a ConfigError) still gets a record
        tp_degree = sp_degree = None
    takes = SCHEME_REGISTRY[par.scheme].options if par.scheme in SCHEME_REGISTRY else ()
    return {
        "scheme": par.scheme,
        "degree": par.degree,
        "tp_degree": tp_degree,
        "sp_degree": sp_degree,
        "dp": par.dp,
        "recompute": par.recompute,
        "sp_variant": par.sp_variant if "sp_variant" in takes else None,
        "msp": par.msp if "msp" in takes else None,
        "vocab": par.vocab,
        "kv_bucket_heads": par.kv_bucket_heads if "kv_bucket_heads" in takes else None,
        "mlp_exchange": par.mlp_exchange if "mlp_exchange" in takes else None,
        "regather_kv": par.regather_kv if "regather_kv" in takes else None,
        "dp_shard": par.dp_shard if "dp_shard" in takes else None,
    }
