"""The closed-form cost model, in layers that each import only the ones before it:

    workload     what a step runs (Workload: model, tokens, mode, dtype) and how it trains (Training)
    params       parameters per layer and per device, how each scheme divides them, bytes per parameter
    comm         elements received per device: per layer, at the embedding / LM head, decode, gradient sync
    activations  what one rank runs on (geometry) and saves: per layer, at the head, ring buffers, KV cache
    memory       the peak of one step per device, phase by phase, by category
    flops        FLOPs per token (model and hardware), the one set of formulas in tspbench
    hardware     hardware profiles (conf/hardware/*.yaml)
    collectives  the collectives of a layer, the edges and a decode step, and their α–β time
    time         roofline + collectives: the overlap schedule, step time and cluster throughput

Every function takes the layout (tspbench.parallel.ParallelConfig) and a Workload, and a Training setting or a
HardwareProfile where it needs one. Nothing here is fitted to the paper (docs/method.md#memory, #communication,
#collective-cost). The package re-exports every public name, so `from tspbench.predict.costmodel import
memory_breakdown` works.
"""

from tspbench.predict.costmodel.activations import *  # noqa: F403
from tspbench.predict.costmodel.collectives import *  # noqa: F403
from tspbench.predict.costmodel.comm import *  # noqa: F403
from tspbench.predict.costmodel.flops import *  # noqa: F403
from tspbench.predict.costmodel.hardware import *  # noqa: F403
from tspbench.predict.costmodel.memory import *  # noqa: F403
from tspbench.predict.costmodel.params import *  # noqa: F403
from tspbench.predict.costmodel.time import *  # noqa: F403
from tspbench.predict.costmodel.workload import *  # noqa: F403
