"""The per-rank measured loop (`benchmark`, one function per phase), as tspbench/run/worker.py runs it on every rank:

    setup             the model, the batch, the optimizer; (decode only) the KV-cache prefill of seq_len
                      tokens and the first generated token, timed once with syncs at its edges (prefill_ms, ttft_ms)
    first_steps       step 0, untimed; the CommLog records every collective (comm bytes per layer), then stops;
                      then warmup_steps − 1 more untimed steps
    measured_window   sync → measured_steps steps (no sync, no .item()) → sync; time, peak memory and
                      energy are read together at the edges
    replica_loss      the last step's loss, read on the host only now
    after_window      one more untimed step under MemTracker (per-category peak), replica checksums
    gather            every rank's numbers to rank 0, which builds the one record (docs/records.md)

Injected faults (spec.fault) fire in step 0 on the chosen rank.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from tspbench.config import DTYPES, GIB
from tspbench.measure import energy as energy_mod
from tspbench.measure import memory as memory_mod
from tspbench.measure import timing
from tspbench.record.measured import Gathered, build_record
from tspbench.record.spec import RunSpec
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


@dataclass
class Loop:
    """One rank's run, as set up once: the scheme's model, its local batch, the optimizer (train) and the step
    every phase calls. Built by `setup`."""

    spec: RunSpec
    device: torch.device
    pm: Any
    """The scheme's ParallelModel."""
    log: Any
    """Its CommLog: records step 0's collectives, then is switched off."""
    opt: Any
    """MixedPrecisionAdamW for train, else None."""
    train_step: Callable[..., torch.Tensor]
    """tspbench.schemes.train.train_step: the step tspbench.verify proves."""
    tokens: torch.Tensor
    """The global batch (decode: the prompt plus one token per step the run will decode)."""
    tok: torch.Tensor
    tgt: torch.Tensor
    pos: torch.Tensor
    position: int = 0
    """decode: the position of the next token to decode."""
    steps_taken: int = 0
    """Optimizer steps so far (state_file)."""
    serving: dict = field(default_factory=dict)
    """decode: prefill_ms and ttft_ms (then the KV cache's size, after the window)."""

    @property
    def decode_mode(self) -> bool:
        return self.spec.mode == "decode"

    def step(self) -> torch.Tensor | None:
        """One step of the run's mode; returns the loss tensor (train, forward), never reading it on the host."""
        if self.decode_mode:
            p = self.position
            self.position += 1
            self.pm.decode(self.tokens[:, p : p + 1], p)
            return None
        if self.opt is not None:
            self.steps_taken += 1
            return self.train_step(self.pm, self.opt, self.tok, self.tgt, self.pos)
        with torch.no_grad():
            return self.pm.loss(self.tok, self.tgt, self.pos)[0]


@dataclass
class Window:
    """What the measured window yields on this rank."""

    step_ms: list[float]
    window_s: float
    energy: Any
    """energy.EnergyResult."""
    peaks: dict
    """memory.device_peaks over the window."""
    loss: torch.Tensor | None
    """The last step's loss tensor (still on the device)."""


def benchmark(spec: RunSpec, device: torch.device, rank: int, world: int, strict: bool = False) -> dict | None:
    """Collective over the default group; returns the record on rank 0, None elsewhere. `strict`: NCCL's rules on
    every collective (CommLog.strict; test runs only, run/worker.py)."""
    started = now()
    run = setup(spec, device, strict)
    comm = first_steps(run, Fault(spec.fault, rank))
    n_tokens = timing.tokens_per_step(spec.parallel(), spec.batch, spec.seq_len, spec.mode)
    window = measured_window(run, rank, n_tokens)
    loss = replica_loss(run, window.loss)
    mine = after_window(run, rank, comm, window)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank != 0:
        return None
    launcher = os.environ.get("TSPBENCH_LAUNCHER", "torchrun")
    conf = memory_mod.alloc_conf(os.environ) if device.type == "cuda" else None
    return build_record(spec, Gathered(gathered, loss, n_tokens, started, now(), dist.get_backend(), launcher, conf))


def setup(spec: RunSpec, device: torch.device, strict: bool = False) -> Loop:
    """The scheme's model from the seed, the batch, the optimizer; decode: the prompt's prefill, timed once."""
    from tspbench.model import synthetic_batch
    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh
    from tspbench.schemes.comm import CommLog
    from tspbench.schemes.train import MixedPrecisionAdamW, train_step

    cfg, par = spec.model_config(), spec.parallel()
    decode = spec.mode == "decode"
    log = CommLog(strict=strict)
    pm = apply_scheme(
        cfg, par, ApplyArgs(build_mesh(par, device.type), spec.seq_len, spec.seed, DTYPES[spec.dtype], device, log)
    )
    # decode: the prompt, then one new token per step (warm-up, window, breakdown and step 0 included)
    extra = spec.warmup_steps + spec.measured_steps + 2 if decode else 0
    tokens, targets = synthetic_batch(cfg, par.dp * spec.batch, spec.seq_len + extra, spec.seed, device)
    s = spec.seq_len
    tok, tgt, pos = pm.local_batch(tokens[:, :s], targets[:, :s])
    opt = MixedPrecisionAdamW(list(pm.parameters()), lr=spec.lr) if spec.mode == "train" else None
    run = Loop(spec, device, pm, log, opt, train_step, tokens, tok, tgt, pos)
    if decode:
        run.serving = prefill(pm, tok, pos, device, new_tokens=extra, seq_len=s)
        run.position = s
    return run


def first_steps(run: Loop, fault: Fault) -> dict:
    """Step 0 (untimed; the CommLog records every collective, then stops; an injected fault fires here) and the
    rest of the warm-up, the last of them from an empty allocator cache (memory.release_cached). Returns layer 0's
    communication (comm_per_layer)."""
    fault.fire()
    if run.spec.warmup_steps <= 1:
        memory_mod.release_cached(run.device)
    run.step()
    comm = comm_per_layer(run.log)
    run.log.enabled = False
    for i in range(run.spec.warmup_steps - 1):
        if i == run.spec.warmup_steps - 2:
            memory_mod.release_cached(run.device)
        run.step()
    return comm


def measured_window(run: Loop, rank: int, n_tokens: int) -> Window:
    """barrier → sync → measured_steps steps → sync: timer.start() and timer.stop() are the window's only syncs.
    The barrier first, as the prefill's: every rank starts its clock once all have left warm-up, so skew between
    ranks is not timed in the first step (nor in window_s, the slowest rank's). Inside it nothing calls .item() or
    otherwise waits on the device (the progress line reads the host clock only); the loss stays a device tensor
    until `replica_loss`. Time, peak memory and energy are read together at the edges."""
    n, device = run.spec.measured_steps, run.device
    memory_mod.reset_peaks(device)
    timer, meter = timing.StepTimer(device), energy_mod.EnergyMeter(device, run.spec.power_sample_s)
    last_print = 0.0
    loss = None
    dist.barrier()
    timer.start()
    meter.start()
    for i in range(n):
        loss = run.step()
        timer.step()
        if rank == 0 and (time.perf_counter() - last_print > 0.5 or i == n - 1):
            last_print = time.perf_counter()  # host clock only: a progress line, not a measurement
            print(f"{PROGRESS_PREFIX} step {i + 1}/{n} {n_tokens * (i + 1) / timer.elapsed_s():.0f} tok/s", flush=True)
    step_ms = timer.stop()
    energy = meter.stop()
    return Window(step_ms, timer.window_s, energy, memory_mod.device_peaks(device), loss)


def replica_loss(run: Loop, loss: torch.Tensor | None) -> float | None:
    """After the window: the last step's loss, averaged over the data-parallel replicas (None for decode)."""
    if loss is None:
        return None
    loss_t = run.pm.replica_loss(loss).float()
    if run.pm.dp is not None:
        run.pm.dp.check("all_reduce", "replica_loss", loss_t, reduce_op="sum")
        dist.all_reduce(loss_t, group=run.pm.dp.group)
        loss_t /= run.pm.dp.size
    return float(loss_t.item())


def after_window(run: Loop, rank: int, comm: dict, window: Window) -> dict:
    """The memory breakdown (one more untimed step under MemTracker), the KV cache's size (decode), the replica
    checksums and optimizer state (train), the trained state for tests (state_file), and this rank's numbers for
    the gather (record.measured.RankNumbers)."""
    spec, pm, opt = run.spec, run.pm, run.opt
    mem = (
        memory_mod.breakdown(run.step, pm, opt.optimizers if opt is not None else [], run.device)
        if spec.memory_breakdown
        else {}
    )
    if run.decode_mode:
        run.serving["kv_cache_gib"] = pm.kv_cache_bytes() / GIB
        run.serving["kv_cache_allocated_gib"] = pm.kv_cache_bytes(allocated=True) / GIB
    sync = replica_checksums(pm) if opt is not None else {}
    if spec.state_file and opt is not None:  # tests: the trained parameters, back to full shape, on rank 0
        full = {k: v.cpu() for k, v in pm.full_state(grads=False).items()}
        if rank == 0:
            torch.save({"params": full, "optimizer_steps": run.steps_taken}, spec.state_file)
    return {
        "optimizer_state_bytes": opt.state_bytes() if opt is not None else None,
        "replicas": sync,
        "step_ms": window.step_ms,
        "window_s": window.window_s,
        "peaks": window.peaks,
        "mem": mem,
        "serving": run.serving,
        "energy": window.energy.__dict__,
        "comm": comm,
        "device_name": device_name(run.device),
    }


def prefill(pm, tok: torch.Tensor, pos: torch.Tensor, device: torch.device, new_tokens: int, seq_len: int) -> dict:
    """Serving: fill empty KV caches with the prompt (this scheme's token layout, room reserved for the
    tokens the run will decode), timed once. Two clocks from the same start: `prefill_ms` stops after the
    forward; `ttft_ms` (time to first token) stops once every rank holds the first generated token, the greedy
    choice at the prompt's last position (its logits taken on the rank that holds that position, summed over
    the sequence group, the vocabulary gathered where it is split)."""
    pm.start_kv_cache(new_tokens)
    at = last_index(pos, seq_len)  # host sync, outside the timed window
    dist.barrier()
    timing.sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        logits = pm(tok, pos)
        timing.sync(device)
        prefill_ms = (time.perf_counter() - t0) * 1e3
        first_token_logits(pm, logits, at).argmax(-1)
    timing.sync(device)
    return {"prefill_ms": prefill_ms, "ttft_ms": (time.perf_counter() - t0) * 1e3}


def last_index(pos: torch.Tensor, seq_len: int) -> int | None:
    """Where the prompt's last position S − 1 is among this rank's tokens (None: another rank holds it). Syncs."""
    last = (pos == seq_len - 1).nonzero()
    return int(last[0, 0]) if last.numel() else None


def first_token_logits(pm, logits: torch.Tensor, at: int | None) -> torch.Tensor:
    """The prefill's logits at the prompt's last position, [B, 1, V] on every rank: taken on the rank that holds it
    (local index `at`, None elsewhere), summed over the sequence group (the others add zeros), the vocabulary
    gathered where it is split. A contiguous copy: NCCL refuses the strided slice and gloo reduced the wrong memory
    at B > 1 (docs/method.md#gpu-rules, GPU review finding 1; tspbench.verify checks these logits)."""
    first = logits[:, at : at + 1].contiguous() if at is not None else logits.new_zeros(logits[:, :1].shape)
    if pm.seq is not None:
        pm.seq.check("all_reduce", "prefill:first_token", first, reduce_op="sum")
        dist.all_reduce(first, group=pm.seq.group)
    return pm.full_decode_logits(first)
