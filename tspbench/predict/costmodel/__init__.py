"""The closed-form cost model: memory per device, communication per layer, FLOPs, and time.

Re-exports the public names of its modules, so `from tspbench.predict.costmodel import memory_breakdown`
works whichever module holds the formula.
"""
from tspbench.predict.costmodel.comm import *  # noqa: F401,F403
from tspbench.predict.costmodel.memory import *  # noqa: F401,F403
from tspbench.predict.costmodel.time import *  # noqa: F401,F403
