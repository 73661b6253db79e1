"""Measurement: what the worker reads off the devices around its measured window.

The worker knows steps and windows; this package knows devices. A CPU run and a GPU run differ only in
which measurers return `None` with a reason.

    timing   step times (CUDA events on GPU, perf_counter on CPU), unique tokens per step, throughput
    memory   peak allocated / reserved / device-used (CUDA), per-category breakdown (MemTracker; fallback:
             tensor accounting + saved-tensor hooks)
    energy   NVML energy counter, validated amdsmi counter, background power timeline; None on CPU
    flops    peak FLOP/s by device name (conf/hardware/ profiles' device_names), MFU / HFU (the FLOP formulas:
             tspbench.predict.costmodel.flops)
"""
