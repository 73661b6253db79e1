"""tspbench: reference implementations, measurements and models of Tensor and Sequence Parallelism (TSP,
arXiv 2604.26294) and its baselines (tp, tp_msp, sp, tp_sp), proven equal to a single-device model."""

__version__ = "0.1.0"
