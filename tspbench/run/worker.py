"""The per-rank benchmark loop: `python -m torch.distributed.run ... -m tspbench.run.worker --spec FILE`.

Reads a frozen RunSpec (JSON, written by the parent launcher), joins the default process group from the
torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK; gloo on CPU, NCCL on CUDA), builds the scheme's model
from the seed, and runs:

    (decode only)     the KV-cache prefill of seq_len tokens and the first generated token, timed once with
                      syncs at its edges (prefill_ms, ttft_ms)
    step 0            untimed; the CommLog records every collective (comm bytes per layer), then stops
    warm-up           warmup_steps − 1 more untimed steps
    measured window   sync → measured_steps steps (no sync, no .item()) → sync; time, peak memory and
                      energy are read together at the edges
    breakdown         one more untimed step under MemTracker (per-category peak)
    gather            every rank's numbers to rank 0, which appends the one record (docs/records.md)

Hydra is never involved here, so the same command runs under a cluster's own
`torchrun --nnodes N ...` given a spec file whose dp × degree matches the world size.

Failures: an OOM (torch.OutOfMemoryError) or any other exception writes `<status_dir>/rank<R>.json`
for the parent to turn into an `oom` / `failed` record, and exits non-zero so torchrun tears the group
down. Injected faults (spec.fault) fire in step 0 on the chosen rank.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tspbench.config import DTYPES
from tspbench.measure import energy as energy_mod
from tspbench.measure import memory as memory_mod
from tspbench.measure import timing
from tspbench.record.measured import build_record
from tspbench.record.spec import RunSpec
from tspbench.record.store import append_record
from tspbench.schemes.base import local_tensor

PROGRESS_PREFIX = "[tspbench]"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def setup_device(kind: str, local_rank: int) -> torch.device:
    if kind == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    # One intra-op thread per rank unless OMP_NUM_THREADS says otherwise: ranks share the host's cores,
    # and OpenMP spin-waits under oversubscription can slow a step down by 10-50x.
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS") or 1)))
    return torch.device("cpu")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()})"


class Fault:
    """spec.fault = {kind, rank}: misbehave in step 0 on that rank (tests of the runner's fault handling)."""

    def __init__(self, fault: dict, rank: int):
        self.kind = fault.get("kind", "none") if fault.get("rank", 0) == rank else "none"
        self.rank = rank

    def fire(self) -> None:
        if self.kind == "crash":
            raise RuntimeError(f"injected crash (faults.kind=crash) on rank {self.rank}")
        if self.kind == "oom":
            raise torch.OutOfMemoryError(f"injected OOM (faults.kind=oom) on rank {self.rank}")
        if self.kind == "hang":
            print(f"rank {self.rank}: injected hang (faults.kind=hang)", flush=True)
            while True:  # the peers block in their next collective
                time.sleep(60)


def comm_per_layer(log, tag: str = "layer0") -> dict:
    """Bytes received by this rank in one layer's collectives, forward and backward (recompute's
    replayed forward collectives count as backward)."""
    out = {"fwd": 0.0, "bwd": 0.0, "ops": 0}
    for r in log.records:
        if r.tag == tag:
            out[r.phase] = out.get(r.phase, 0.0) + r.recv_numel * (r.bytes // max(r.numel, 1))
            out["ops"] += 1
    out["max_buffer_bytes"] = max((r.bytes for r in log.records), default=0)
    return out


def replica_checksums(pm) -> dict[str, tuple[int, float, float]]:
    """Per parameter: (which slice this rank holds, float64 sum, float64 sum of squares), computed on the
    device. Ranks holding the same slice must hold bit-identical copies after any number of steps (the gradient
    sync and the optimizer are deterministic and identical on every rank); record.measured compares them."""
    out = {}
    with torch.no_grad():
        for name, p in pm.named_local_params():
            shard = pm.shards[name]
            t = local_tensor(p.detach()).double()  # fsdp_sp: this rank's shard of the DTensor
            out[name] = (shard.comm.rank if shard.comm is not None else 0, float(t.sum()), float((t * t).sum()))
    return out


def benchmark(spec: RunSpec, device: torch.device, rank: int, world: int) -> dict | None:
    """Collective over the default group; returns the record on rank 0, None elsewhere."""
    from tspbench.model import synthetic_batch
    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh
    from tspbench.schemes.comm import CommLog
    from tspbench.schemes.train import MixedPrecisionAdamW, train_step

    started = now()
    cfg, par = spec.model_config(), spec.parallel()
    train, decode = spec.mode == "train", spec.mode == "decode"
    log = CommLog()
    pm = apply_scheme(
        cfg, par, ApplyArgs(build_mesh(par, device.type), spec.seq_len, spec.seed, DTYPES[spec.dtype], device, log)
    )
    # decode: the prompt, then one new token per step (warm-up, window, breakdown and step 0 included)
    extra = spec.warmup_steps + spec.measured_steps + 2 if decode else 0
    tokens, targets = synthetic_batch(cfg, par.dp * spec.batch, spec.seq_len + extra, spec.seed, device)
    s = spec.seq_len
    tok, tgt, pos = pm.local_batch(tokens[:, :s], targets[:, :s])
    opt = MixedPrecisionAdamW(list(pm.parameters()), lr=spec.lr) if train else None
    fault = Fault(spec.fault, rank)
    serving: dict = {}
    if decode:
        serving = prefill(pm, tok, pos, device, new_tokens=extra, seq_len=s)
        position = [s]

    steps_taken = [0]

    def step() -> torch.Tensor | None:
        if decode:
            p = position[0]
            position[0] += 1
            pm.decode(tokens[:, p : p + 1], p)
            return None
        if opt is not None:
            steps_taken[0] += 1
            return train_step(pm, opt, tok, tgt, pos)  # the step tspbench.verify proves
        else:
            with torch.no_grad():
                loss = pm.loss(tok, tgt, pos)[0]
        return loss

    # -- step 0 (accounting) and warm-up ------------------------------------------------------------
    fault.fire()
    step()
    comm = comm_per_layer(log)
    log.enabled = False
    for _ in range(spec.warmup_steps - 1):
        step()

    # -- measured window -------------------------------------------------------------------------------
    n = spec.measured_steps
    n_tokens = timing.tokens_per_step(par, spec.batch, spec.seq_len, spec.mode)
    memory_mod.reset_peaks(device)
    timer, meter = timing.StepTimer(device), energy_mod.EnergyMeter(device, spec.power_sample_s)
    last_print = 0.0
    timer.start()
    meter.start()
    for i in range(n):
        loss = step()
        timer.step()
        if rank == 0 and (time.perf_counter() - last_print > 0.5 or i == n - 1):
            last_print = time.perf_counter()  # host clock only: a progress line, not a measurement
            print(f"{PROGRESS_PREFIX} step {i + 1}/{n} {n_tokens * (i + 1) / timer.elapsed_s():.0f} tok/s", flush=True)
    step_ms = timer.stop()
    energy = meter.stop()
    peaks = memory_mod.device_peaks(device)

    # -- after the window: loss value, memory breakdown ------------------------------------------------
    loss_value = None
    if loss is not None:
        loss_t = pm.replica_loss(loss).float()
        if pm.dp is not None:
            dist.all_reduce(loss_t, group=pm.dp.group)
            loss_t /= pm.dp.size
        loss_value = float(loss_t.item())
    mem = memory_mod.breakdown(step, pm, opt.opt if opt is not None else None, device) if spec.memory_breakdown else {}
    if decode:
        serving["kv_cache_gib"] = pm.kv_cache_bytes() / memory_mod.GIB
        serving["kv_cache_allocated_gib"] = pm.kv_cache_bytes(allocated=True) / memory_mod.GIB
    sync = replica_checksums(pm) if opt is not None else {}
    if spec.state_file and opt is not None:  # tests: the trained parameters, back to full shape, on rank 0
        full = {k: v.cpu() for k, v in pm.full_state(grads=False).items()}
        if rank == 0:
            torch.save({"params": full, "optimizer_steps": steps_taken[0]}, spec.state_file)
    mine = {
        "optimizer_state_bytes": opt.state_bytes() if opt is not None else None,
        "replicas": sync,
        "step_ms": step_ms,
        "window_s": timer.window_s,
        "peaks": peaks,
        "mem": mem,
        "serving": serving,
        "energy": energy.__dict__,
        "comm": comm,
        "device_name": device_name(device),
    }
    gathered: list = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank != 0:
        return None
    return build_record(
        spec,
        gathered,
        loss_value,
        n_tokens,
        started,
        now(),
        dist.get_backend(),
        os.environ.get("TSPBENCH_LAUNCHER", "torchrun"),
    )


def prefill(pm, tok: torch.Tensor, pos: torch.Tensor, device: torch.device, new_tokens: int, seq_len: int) -> dict:
    """Serving: fill empty KV caches with the prompt (this scheme's token layout, room reserved for the
    tokens the run will decode), timed once. Two clocks from the same start: `prefill_ms` stops after the
    forward; `ttft_ms` (time to first token) stops once every rank holds the first generated token, the greedy
    choice at the prompt's last position (its logits taken on the rank that holds that position, summed over
    the sequence group, the vocabulary gathered where it is split)."""
    pm.start_kv_cache(new_tokens)
    last = (pos == seq_len - 1).nonzero()  # host sync, outside the timed window: where position S − 1 is
    at = int(last[0, 0]) if last.numel() else None
    dist.barrier()
    timing.sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        logits = pm(tok, pos)
        timing.sync(device)
        prefill_ms = (time.perf_counter() - t0) * 1e3
        first = logits[:, at : at + 1] if at is not None else torch.zeros_like(logits[:, :1])
        if pm.seq is not None:
            dist.all_reduce(first, group=pm.seq.group)  # one rank holds position S − 1, the others add zeros
        pm.full_decode_logits(first).argmax(-1)
    timing.sync(device)
    return {"prefill_ms": prefill_ms, "ttft_ms": (time.perf_counter() - t0) * 1e3}


def write_status(spec: RunSpec, rank: int, status: str, reason: str, tb: str = "") -> None:
    """`<status_dir>/rank<R>.json`: how this rank ended, for the parent (time orders root cause first)."""
    if not spec.status_dir:
        return
    d = Path(spec.status_dir)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".rank{rank}.json.tmp"
    tmp.write_text(
        json.dumps({"rank": rank, "status": status, "reason": reason, "time": time.time(), "traceback": tb[-6000:]})
    )
    tmp.replace(d / f"rank{rank}.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tspbench.run.worker", description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True, help="RunSpec JSON written by the launcher")
    ap.add_argument("--results", default=None, help="override the spec's results file (JSONL)")
    args = ap.parse_args(argv)
    spec = RunSpec.from_json(Path(args.spec).read_text())
    if args.results:
        spec.results_file = args.results
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world != spec.world_size:
        print(
            f"tspbench.run.worker: WORLD_SIZE={world} but the spec needs dp × degree = {spec.world_size}",
            file=sys.stderr,
        )
        return 2
    spec.nodes = max(1, world // max(1, local_world))
    device = setup_device(spec.device, local_rank)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        timeout=timedelta(seconds=max(60.0, spec.timeout_s)),
        device_id=device if device.type == "cuda" else None,
    )
    try:
        record = benchmark(spec, device, rank, world)
        if record is not None:
            append_record(spec.results_file, record)
    except torch.OutOfMemoryError as e:
        _die(spec, rank, "oom", e)
    except BaseException as e:  # noqa: BLE001 - anything else: tell the parent which rank and why
        _die(spec, rank, "failed", e)
    dist.destroy_process_group()
    return 0


def _die(spec: RunSpec, rank: int, status: str, e: BaseException) -> None:
    """Record this rank's failure and leave at once: peers may be blocked in a collective, so no
    destroy_process_group; torchrun sees the exit code and tears the group down."""
    tb = traceback.format_exc()
    print(tb, file=sys.stderr)
    first = (str(e).strip().splitlines() or [""])[0]
    write_status(spec, rank, status, f"rank {rank}: {type(e).__name__}: {first}"[:500], tb)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
