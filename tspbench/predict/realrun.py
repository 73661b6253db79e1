"""What the fake-tensor estimate is tested against: the same driver and tracker on real CPU ranks.

`measure(cases)` runs (layout, workload) cases on gloo, one process per rank, with tspbench.predict.trace.trace_step
on real tensors and returns rank 0's `summary` per case; `estimate_summary(par, work)` is the same summary of a
fake-tensor trace of every layer under the fake process group (tests/integration/test_estimate.py compares the two).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel import Workload
from tspbench.predict.trace import StepTrace, Tracing, comm_layer0, comm_ops_layer0, fake_process_group, trace_step


def summary(tr: StepTrace) -> dict[str, Any]:
    """What the estimate-vs-real comparison looks at: memory at the peak, FLOPs, layer-0 collectives."""
    return {
        "mem": tr.memory(),
        "flops": tr.flops,
        "comm": comm_layer0(tr.comm_records),
        "comm_ops": comm_ops_layer0(tr.comm_records),
    }


def _measure_worker(rank: int, world: int, cases: list, out_file: str) -> None:
    import json

    from tspbench.model import synthetic_batch

    results = []
    for par, work in cases:
        tokens, targets = synthetic_batch(work.model, par.dp * work.batch, work.seq_len, seed=0)
        tr = trace_step(par, work, Tracing(fake=False, attention="native"), (tokens, targets))
        results.append(summary(tr))
        dist.barrier()
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(results, f)


def measure(cases: list[tuple[ParallelConfig, Workload]]) -> list[dict[str, Any]]:
    """Real CPU runs (gloo, one process per rank) of (layout, workload) cases with the estimate's driver and
    tracker (`trace_step` on real tensors): rank 0's `summary` per case. All cases share one world size. This is
    what the estimate is tested against."""
    import json
    import tempfile
    from pathlib import Path

    from tspbench.spawn import spawn

    worlds = {par.world_size for par, _ in cases}
    assert len(worlds) == 1, worlds
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "measured.json")
        spawn(_measure_worker, worlds.pop(), cases, out)
        return json.loads(Path(out).read_text())


def estimate_summary(par: ParallelConfig, work: Workload, attention: str = "native", rank: int = 0) -> dict[str, Any]:
    """`summary` of a fake-tensor trace of every layer (the counterpart of `measure` for one case)."""
    with fake_process_group(par.world_size, rank):
        tr = trace_step(par, work, Tracing(fake=True, attention=attention))
    return summary(tr)
