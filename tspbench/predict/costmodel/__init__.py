"""The closed-form cost model, in layers that each import only the ones before it:

    params     parameters per layer and per device, how each scheme divides them, bytes per parameter
    comm       elements received per device: per layer, at the embedding / LM head, decode, gradient sync
    memory     the peak of one step per device, phase by phase, by category
    flops      FLOPs per token (model and hardware), the one set of formulas in tspbench
    hardware   hardware profiles (conf/hardware/*.yaml)
    time       α–β collectives + roofline: step time and cluster throughput

Nothing here is fitted to the paper (docs/method.md#memory, #communication, #collective-cost). The package
re-exports every public name, so `from tspbench.predict.costmodel import memory_breakdown` works.
"""

from tspbench.predict.costmodel.comm import *  # noqa: F403
from tspbench.predict.costmodel.flops import *  # noqa: F403
from tspbench.predict.costmodel.hardware import *  # noqa: F403
from tspbench.predict.costmodel.memory import *  # noqa: F403
from tspbench.predict.costmodel.params import *  # noqa: F403
from tspbench.predict.costmodel.time import *  # noqa: F403
