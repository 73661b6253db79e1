"""The planner (issue 13 §3): `python -m tspbench.plan model=llama7b seq_len=131072 gpus=1024 hardware=mi300x`.

Enumerates the layouts the suite implements (tsp at each D; tp and tp_msp at each T; sp with each K/V exchange;
tp_sp at every factorisation T·Σ with each exchange; each recompute mode; micro-batch sizes; the data-parallel
degree that fills the cluster), drops those that fail `validate_parallel` or do not fit the device's memory
(closed-form `memory_breakdown`, training, bf16 + fp32 AdamW), ranks the rest by predicted cluster tokens/s
(`cluster_throughput`, overlap none) and prints the top ones. Closed form only: no fake-tensor estimate.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from tspbench.config import ConfigError, ModelConfig, ParallelConfig, model_preset, validate_parallel
from tspbench.predict.costmodel import cluster_throughput, load_hardware, memory_breakdown

GIB = 2**30
RECOMPUTES = ("none", "selective", "full")


@dataclass
class Layout:
    par: ParallelConfig
    batch: int
    mem_bytes: float
    tokens_per_s: float
    step_s: float
    exposed_comm_s: float

    @property
    def name(self) -> str:
        p = self.par
        t = f" T={p.tp}" if p.scheme == "tp_sp" else ""
        v = f" {p.sp_variant}" if p.scheme in ("sp", "tp_sp") else ""
        return f"{p.scheme} d={p.degree}{t}{v} dp={p.dp} rc={p.recompute} B={self.batch}"


def candidates(gpus: int, max_degree: int, batches: tuple[int, ...]) -> list[tuple[ParallelConfig, int]]:
    """Every (layout, micro-batch) the suite implements with degree | gpus, degree ≤ max_degree."""
    degrees = [d for d in range(1, min(gpus, max_degree) + 1) if gpus % d == 0]
    out: list[tuple[ParallelConfig, int]] = []
    for d in degrees:
        dp = gpus // d
        base: list[ParallelConfig] = []
        if d == 1:
            base.append(ParallelConfig(scheme="single", degree=1, dp=dp))
        else:
            base += [ParallelConfig(scheme=s, degree=d, dp=dp) for s in ("tsp", "tp", "tp_msp")]
            base += [ParallelConfig(scheme="sp", degree=d, dp=dp, sp_variant=v) for v in ("allgather", "ring")]
            for t in range(2, d):
                if d % t == 0:
                    base += [
                        ParallelConfig(scheme="tp_sp", degree=d, tp=t, dp=dp, sp_variant=v)
                        for v in ("allgather", "ring")
                    ]
        for p in base:
            for rc in RECOMPUTES:
                for b in batches:
                    out.append((ParallelConfig(**{**p.__dict__, "recompute": rc}), b))
    return out


def plan(model: ModelConfig, seq_len: int, gpus: int, hardware: str, *, max_degree: int = 64, batches=(1, 2)):
    """(fitting layouts ranked by cluster tokens/s, number enumerated)."""
    hw = load_hardware(hardware)
    fits: list[Layout] = []
    cands = candidates(gpus, max_degree, tuple(batches))
    for par, b in cands:
        try:
            validate_parallel(model, par, seq_len, b)
        except ConfigError:
            continue
        mem = memory_breakdown(model, par, seq_len, b)["total"]
        if mem > hw.mem_bytes:
            continue
        ct = cluster_throughput(model, par, seq_len, b, hw, gpus, mode="train")
        fits.append(Layout(par, b, mem, ct["tokens_per_s"], ct["step_s"], ct["step_s"] - ct["compute_s"]))
    fits.sort(key=lambda x: -x.tokens_per_s)
    return fits, len(cands)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(
            "usage: python -m tspbench.plan model=NAME seq_len=N gpus=N hardware=NAME [top=10] [max_degree=64]\n"
            "Rank every implemented layout that fits the device's memory by predicted cluster tokens/s\n"
            "(closed-form cost model; see `python -m tspbench.validate` for how far to trust it)."
        )
        return 0
    kv = dict(model="llama7b", seq_len="131072", gpus="8", hardware="mi300x", top="10", max_degree="64")
    for a in argv:
        k, sep, v = a.partition("=")
        if not sep or k not in kv:
            print(f"error: {a!r}: expected key=value with key one of {', '.join(kv)}", file=sys.stderr)
            return 2
        kv[k] = v
    try:
        model = model_preset(kv["model"])
        seq_len, gpus, top, max_degree = (int(kv[k]) for k in ("seq_len", "gpus", "top", "max_degree"))
        t0 = time.perf_counter()
        ranked, n = plan(model, seq_len, gpus, kv["hardware"], max_degree=max_degree)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    dt = time.perf_counter() - t0
    print(f"{n} layouts enumerated, {len(ranked)} fit {kv['hardware']} memory ({dt:.2f} s, closed form)")
    print(f"{'layout':52s} {'mem GiB':>8s} {'step s':>8s} {'exp comm s':>10s} {'tok/s':>12s} {'margin':>7s}")
    for i, lay in enumerate(ranked[:top]):
        nxt = ranked[i + 1].tokens_per_s if i + 1 < len(ranked) else None
        margin = f"{100 * (lay.tokens_per_s / nxt - 1):6.1f}%" if nxt else "      -"
        print(
            f"{lay.name:52s} {lay.mem_bytes / GIB:8.1f} {lay.step_s:8.3f} {lay.exposed_comm_s:10.3f} "
            f"{lay.tokens_per_s:12.4g} {margin}"
        )
    print("Trust: see `python -m tspbench.validate` (median |error| of tokens/s on its validation subset).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
