"""One description of each parallel layout (docs/method.md#naming, docs/adding-a-scheme.md).

    layout.py     Scheme (what tspbench knows about one scheme: title, axes, K/V exchange, options and their
                  values, its own checks, the cost model's divisors), the registry, and ParallelConfig (every layout
                  field once, every derived fact a property; label(), key())
    registry.py   the implemented schemes, each entered once
    checks.py     validate_parallel: one actionable line for a layout a scheme cannot run
    enumerate.py  layouts(): the one enumeration of implemented layouts (grid, planner, headline, paper tables)

Nothing here imports torch; everything outside tspbench/schemes/ asks these instead of testing scheme names.
"""

from tspbench.parallel.registry import SCHEMES  # noqa: I001 - first: it fills the registry the others read
from tspbench.parallel.checks import check_options, kv_replicas, validate_parallel
from tspbench.parallel.enumerate import ALL_EXCHANGES, AXES, LayoutOptions, layouts, tensor_degrees
from tspbench.parallel.layout import (
    MLP_EXCHANGES,
    RECOMPUTE,
    SCHEME_REGISTRY,
    SP_VARIANTS,
    VOCAB,
    Divisors,
    ParallelConfig,
    Scheme,
    layout_fields,
    scheme,
    takers,
    takes,
)

__all__ = [
    "ALL_EXCHANGES",
    "AXES",
    "MLP_EXCHANGES",
    "RECOMPUTE",
    "SCHEMES",
    "SCHEME_REGISTRY",
    "SP_VARIANTS",
    "VOCAB",
    "Divisors",
    "LayoutOptions",
    "ParallelConfig",
    "Scheme",
    "check_options",
    "kv_replicas",
    "layout_fields",
    "layouts",
    "scheme",
    "takers",
    "takes",
    "tensor_degrees",
    "validate_parallel",
]
