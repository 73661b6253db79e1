"""`python -m tspbench.estimate scheme=tsp degree=8 seq_len=131072 ...`: one rank's peak memory (by category),
FLOPs and layer-0 collectives of one step, from the scheme code itself on fake tensors and a fake process
group at the target shapes; no devices needed (docs/method.md#estimate). Prints the record's metrics as JSON.

The command line only (the estimate is tspbench/predict/estimate.py). Composed like `python -m tspbench.verify`
(Hydra, conf/estimate.yaml): the same override means the same thing, and a bad one stops with one line and exit
code 2. `--help` lists every option.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Annotated, Any

from tspbench import cli
from tspbench.config import ConfigError, ModelConfig, Range
from tspbench.parallel import ParallelConfig

EXAMPLES = [
    "python -m tspbench.estimate                                         # llama7b, TSP D = 8, 4K tokens",
    "python -m tspbench.estimate scheme=tp seq_len=131072 hardware=mi300x recompute=full",
    "python -m tspbench.estimate model=llama3_8b scheme=tp_sp degree=8 tp=2 mode=forward",
]


@dataclass
class EstimateConfig(ParallelConfig):
    """One estimated step; the layout fields are ParallelConfig's."""

    scheme: str = "tsp"
    degree: Annotated[int, Range(1)] = 8
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model: a preset (`model=llama7b|llama3_8b|small|tiny`, conf/model) or field overrides (`model.n_layers=4`)."""
    seq_len: Annotated[int, Range(1)] = 4096
    """Tokens per sequence S."""
    batch: Annotated[int, Range(1)] = 1
    """Micro-batch B per replica."""
    mode: str = "train"
    """train (forward + backward + AdamW) | forward."""
    dtype: str = "bfloat16"
    """Parameter/compute dtype: float64 | float32 | bfloat16 (16-bit: AdamW on fp32 master copies, k = 16 B/param)."""
    rank: Annotated[int, Range(0)] = 0
    """The rank traced (ranks of one scheme are symmetric)."""
    hardware: Any = None
    """Hardware profile (`hardware=mi300x|h100|h200|cpu`, conf/hardware): its capacity decides `oom`, and `cpu`
    selects the CPU attention kernels."""
    attention: str = "auto"
    """Attention kernels: auto (gpu, or native for hardware=cpu) | gpu (flash / memory-efficient, as a GPU
    allocates) | native (the CPU kernels)."""
    layers: str = "auto"
    """auto (trace 3 and 4 layers, extrapolate exactly) | all (trace every layer)."""


def compose(overrides: list[str]) -> EstimateConfig:
    cli.register().store(name="estimate_schema", node=EstimateConfig)
    return cli.compose("estimate", overrides)


def main(argv: list[str] | None = None) -> int:
    from tspbench.predict.costmodel import Workload
    from tspbench.predict.estimate import EstimateOptions, estimate

    argv = sys.argv[1:] if argv is None else argv
    if cli.wants_help(argv):
        print(
            cli.help_text(
                "tspbench.estimate",
                compose([]),
                __doc__.split("\n\n")[0],
                EXAMPLES,
                {"model": f"presets: {cli.presets('model')}", "hardware": f"profiles: {cli.presets('hardware')}"},
            )
        )
        return 0
    try:
        ec = compose(argv)
        rec = estimate(
            ec.parallel(),
            Workload(ec.model, ec.seq_len, ec.batch, mode=ec.mode, dtype=ec.dtype),
            EstimateOptions(
                attention=ec.attention, layers=ec.layers, rank=ec.rank, hardware=cli.hardware_name(ec.hardware)
            ),
        )
    except (ConfigError, ValueError) as e:
        print(f"tspbench.estimate: {e}", file=sys.stderr)
        return 2
    print(
        json.dumps(
            {"status": rec["status"], "reason": rec["reason"], "peak_phase": rec["peak_phase"], **rec["metrics"]},
            indent=1,
            default=str,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
