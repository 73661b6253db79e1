"""The one enumeration of implemented layouts: the experiment grid, the planner, the headline and the paper tables
all ask `layouts` (each with its own option axes), so a new scheme or option appears in every one of them."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tspbench.parallel.layout import SP_VARIANTS, ParallelConfig, scheme
from tspbench.parallel.registry import SCHEMES


@dataclass(frozen=True)
class LayoutOptions:
    """The option axes one enumeration runs for one scheme; an axis a scheme does not take is ignored (it runs the
    default). `tps` (tp_sp's T): see `tensor_degrees`."""

    sp_variants: Sequence[str] = ("allgather",)
    tps: Sequence[int] = ()
    msps: Sequence[bool] = (True,)
    vocabs: Sequence[str] = ("auto",)
    kv_bucket_heads: Sequence[int] = (0,)
    mlp_exchanges: Sequence[str] = ("ring",)
    regather_kvs: Sequence[bool] = (True,)
    dp_shards: Sequence[int] = (1,)


AXES = {
    "tp": "tps",
    "sp_variant": "sp_variants",
    "vocab": "vocabs",
    "msp": "msps",
    "kv_bucket_heads": "kv_bucket_heads",
    "mlp_exchange": "mlp_exchanges",
    "regather_kv": "regather_kvs",
    "dp_shard": "dp_shards",
}
"""Each option field of ParallelConfig and the LayoutOptions axis that lists its values, in the enumeration's
nesting order (outermost first)."""


ALL_EXCHANGES = LayoutOptions(sp_variants=SP_VARIANTS, msps=(True, False))
"""Every K/V exchange and Megatron-SP on/off (the planner's and the headline's default)."""


def tensor_degrees(degree: int, tps: Sequence[int] = ()) -> list[int]:
    """tp_sp's tensor degrees at this degree: every proper divisor 1 < T < degree when `tps` is empty, else the values
    of `tps` that divide the degree (0: auto, the largest T ≤ √degree), each once."""
    if not tps:
        return [t for t in range(2, degree) if degree % t == 0]
    auto = ParallelConfig(scheme="tp_sp", degree=degree).resolved_tp()
    return list(dict.fromkeys(auto if t == 0 else t for t in tps if t == 0 or degree % t == 0))


def layouts(
    degree: int,
    *,
    dp: int = 1,
    schemes: Iterable[str] = SCHEMES,
    options: LayoutOptions | Mapping[str, LayoutOptions] = LayoutOptions(),
    recompute: str = "none",
) -> list[ParallelConfig]:
    """Every implemented layout of a `degree`-rank group (replicated dp times), scheme by scheme in `schemes`' order,
    each over its option axes (`options`: one LayoutOptions for all, or one per scheme name). The single-device
    scheme appears at degree 1 only, every other scheme at degree ≥ 2. Nothing is validated here
    (validate_parallel decides what a model and sequence allow)."""
    out: list[ParallelConfig] = []
    for name in schemes:
        s = scheme(name)
        if s.single_device != (degree == 1):
            continue
        opts = options.get(name, LayoutOptions()) if isinstance(options, Mapping) else options
        base = ParallelConfig(scheme=name, degree=degree, dp=dp, recompute=recompute)
        axes: dict[str, Sequence[Any]] = {}
        for field_name, axis in AXES.items():  # an option the scheme does not take runs its default only
            values = getattr(opts, axis) if field_name in s.options else [getattr(base, field_name)]
            if field_name == "tp" and field_name in s.options:
                values = tensor_degrees(degree, opts.tps)
            elif field_name == "vocab":
                values = [v for v in values if v in s.vocabs] or ["auto"]
            elif field_name == "dp_shard":
                values = [k for k in values if dp % k == 0] or [1]  # a shard group spans whole replicas
            axes[field_name] = values
        for combo in itertools.product(*axes.values()):  # in AXES' nesting order
            out.append(replace(base, **dict(zip(axes, combo))))
    return out
