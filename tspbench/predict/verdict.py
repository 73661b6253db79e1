"""The verdict: one modelled ratio between two layouts, with its band, and one of three answers.

Every modelled number rests on inputs the model cannot pin down (docs/method.md#verdict): the GEMM efficiency, the
attention kernel's efficiency, how much of the links' rate the collectives reach, and how much communication the
runtime really hides (between what the code's issue order lets it hide, `schedule`, and the bound, `ideal`). Each has
a documented range (`RANGES`). A ratio between two layouts is computed under the SAME assumptions for both sides, for
every combination of the ranges' low, central and high values (`scenarios`: 3 × 3 × 3 × 2 × 2 = 108 shared
scenarios),
never the low of one side over the high of the other; its band is the least and the greatest of those ratios, its
central value the ratio under the central assumptions (the hardware profile as it is, `schedule`: the number every
table prints). Then

    ahead                     the whole band is above 1 (by more than RESOLUTION, 2%)
    behind                    the whole band is below 1 (by more than RESOLUTION)
    within the model's error  otherwise

`compare` is the one function that computes it; the README headline, the report's first screen (from the verdict
records an experiment writes), `+exp=paper_throughput`, the claims table and the planner all print its result
(`Comparison.sentence`). `sensitivity` says which input moves the ratio most (each varied alone over its range).
The layouts compared are fixed (each side's choice under the central assumptions); the band is how sure that
comparison is, not a re-planning per scenario.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel import PRICING, Pricing, Workload, cluster_throughput
from tspbench.predict.costmodel.hardware import HardwareProfile, shared_profile
from tspbench.predict.planner import Layout

VERDICTS = ("ahead", "behind", "within the model's error")
"""The three answers, for the first side against the second."""

RESOLUTION = 0.02
"""A band that clears 1 by less than this is still within the model's error: the α–β + roofline model leaves out
effects of that order (collectives of one rank sharing a link, kernel-shape effects; docs/method.md#verdict), so
its ranges alone do not resolve a difference below 2% (a stated assumption)."""
LINK_MAX = 0.95
"""No collective reaches more than 95% of the line rate (the best published bus bandwidths in conf/hardware are
0.71–0.96 of it): the high link factor is capped there."""


@dataclass(frozen=True)
class Range:
    """One uncertain input: its low and high values (the central one is the profile's own, or `central`)."""

    name: str
    """What it is, as printed."""
    low: Any
    """The low end of the documented range."""
    high: Any
    """The high end."""
    central: Any = None
    """The central value; None: the hardware profile's own figure."""
    source: str = ""
    """Where the range comes from."""


RANGES: tuple[Range, ...] = (
    Range(
        "GEMM efficiency (× the profile's)",
        0.80,
        1.15,
        central=1.0,
        source="factor on the profile's matmul_efficiency, the best-shape GEMM ceiling measured with mamf-finder "
        "(stas00/ml-engineering's MAMF table, conf/hardware): low, the calibration fits' lowest GEMM multipliers "
        "(eager 0.90, eager+triton_attention 0.86 × the ceiling, python -m tspbench.validate) rounded down for a "
        "step's smaller and power-capped GEMMs; high, the same table's spread between software releases on one device "
        "(MI300X 60.1% with ROCm 6.2 vs 51.4% with ROCm 6.3: × 1.17) and the deepspeed fit (× 1.04); capped at 1",
    ),
    Range(
        "attention efficiency",
        0.15,
        0.75,
        source="fraction of the bf16 peak the attention kernel reaches in a training step: fitted on calibration "
        "rows only (tspbench/predict/fit.py, each stack's attention multiplier × the profile's FlashAttention-2 "
        "figure) ≈ 0.13 of H100's peak for eager SDPA (4K–8K rows, attention a small share), 0.20 for llm-foundry's "
        "Triton kernel, 0.24 for SDPA under context parallelism at 64K, 0.47 of A100's for XTuner's DeepSpeed runs "
        "at 32K–1M; FlashAttention-2 ≈ 35% of H100's peak, FlashAttention-3 up to 75% in BF16 forward (Shah et al. "
        "2024, arXiv:2407.08608, abstract); central: the profile's attention efficiency (its GEMM ceiling where it "
        "cites none)",
    ),
    Range(
        "link efficiency (× the profile's)",
        0.85,
        1.10,
        central=1.0,
        source="± the spread of the published per-link and bus-bandwidth figures the profiles cite (MI300X: "
        "TransferBench 45–48 GB/s per 64 GB/s link, 0.70–0.75, beside all-reduce's 0.71); capped at LINK_MAX",
    ),
    Range(
        "overlap",
        "schedule",
        "ideal",
        central="schedule",
        source="between what the code's issue order hides (`schedule`, docs/method.md#choice-overlap) and the bound "
        "max(compute, communication) (`ideal`)",
    ),
    Range(
        "kernel pricing",
        "flat",
        "shape",
        central="flat",
        source="one efficiency per kernel class (`flat`) or each call at its own shape's published efficiency with "
        "wave quantisation (`shape`, tspbench/predict/costmodel/kernels.py: TSP's per-owner chunks and K/V buckets, "
        "ring's hop blocks, Ulysses' full-length calls priced apart)",
    ),
)
"""The uncertain inputs and their documented ranges (docs/method.md#verdict)."""


@dataclass(frozen=True)
class Scenario:
    """One shared set of assumptions: both sides of a ratio are priced under it."""

    gemm: float | None
    """Factor on the profile's matmul_efficiency (capped at 1); None: the profile's own."""
    attention: float | None
    """The attention kernel's efficiency (forward and backward); None: the GEMM efficiency."""
    link: float
    """Factor on the profile's link, NIC and collective efficiencies (capped at LINK_MAX)."""
    overlap: str
    """The overlap rule: schedule or ideal."""
    kernels: str = "flat"
    """Pricing.kernels: flat or shape."""

    def hardware(self, hw: HardwareProfile) -> HardwareProfile:
        """The profile under these assumptions."""
        out = hw if self.gemm is None else replace(hw, matmul_efficiency=min(1.0, hw.matmul_efficiency * self.gemm))
        if self.attention is not None:
            a = self.attention
            out = replace(out, attention_forward_efficiency=a, attention_backward_efficiency=a)
        if self.link != 1.0:
            out = replace(
                out,
                link_efficiency=min(LINK_MAX, hw.link_efficiency * self.link),
                nic_efficiency=min(LINK_MAX, hw.nic_efficiency * self.link),
                comm_efficiency=min(LINK_MAX, hw.comm_efficiency * self.link),
            )
        return out


CENTRAL = Scenario(None, None, 1.0, "schedule")
"""The assumptions every table prints: the profile as it is, the `schedule` rule."""


def scenarios() -> list[Scenario]:
    """Every combination of each range's low, central and high (overlap: schedule, ideal; kernel pricing: flat,
    shape): 3 × 3 × 3 × 2 × 2 = 108 shared scenarios."""
    gemm, attn, link, overlap, kernels = RANGES
    return [
        Scenario(g, a, k, o, kp)
        for g, a, k, o, kp in itertools.product(
            (gemm.low, None, gemm.high),
            (attn.low, None, attn.high),
            (link.low, 1.0, link.high),
            (overlap.low, overlap.high),
            (kernels.low, kernels.high),
        )
    ]


def _alone() -> dict[str, list[Scenario]]:
    """Each input varied alone over its range, the others central (for `sensitivity`)."""
    gemm, attn, link, overlap, kernels = RANGES
    return {
        gemm.name: [replace(CENTRAL, gemm=v) for v in (gemm.low, gemm.high)],
        attn.name: [replace(CENTRAL, attention=v) for v in (attn.low, attn.high)],
        link.name: [replace(CENTRAL, link=v) for v in (link.low, link.high)],
        overlap.name: [replace(CENTRAL, overlap=overlap.high)],
        kernels.name: [replace(CENTRAL, kernels=kernels.high)],
    }


@dataclass(frozen=True)
class Side:
    """One side of a comparison: a layout, its micro-batch, the workload and the cluster."""

    par: ParallelConfig
    """The layout."""
    batch: int
    """Sequences per micro-batch per replica."""
    work: Workload
    """Model, sequence length, mode (the batch is `batch`)."""
    hardware: str
    """conf/hardware profile."""
    gpus: int
    """Devices in the cluster (dp = gpus / degree)."""
    pricing: Pricing = PRICING
    """The time model's priced mechanisms."""

    def tokens_per_s_per_gpu(self, s: Scenario = CENTRAL) -> float:
        """Modelled tokens/s per GPU under scenario `s`."""
        hw = s.hardware(shared_profile(self.hardware))
        work = replace(self.work, batch=self.batch)
        pricing = replace(self.pricing, kernels=s.kernels)
        ct = cluster_throughput(self.par, work, hw, self.gpus, overlap=s.overlap, pricing=pricing)
        return ct["tokens_per_s_per_device"]


def side_of(lay: Layout, model: ModelConfig, seq_len: int, mode: str, hardware: str, gpus: int) -> Side:
    """The Side of a planner's Layout on a cluster."""
    return Side(lay.par, lay.batch, Workload(model, seq_len, lay.batch, mode=mode), hardware, gpus)


@dataclass(frozen=True)
class Band:
    """A modelled quantity's low, central and high values."""

    low: float
    central: float
    high: float

    def __str__(self) -> str:
        return f"{self.central:.2f}× (band {self.low:.2f}–{self.high:.2f})"


def verdict(band: Band) -> str:
    """ahead (the whole band above 1 + RESOLUTION), behind (below 1 − RESOLUTION), or within the model's error."""
    if band.low > 1.0 + RESOLUTION:
        return VERDICTS[0]
    if band.high < 1.0 - RESOLUTION:
        return VERDICTS[1]
    return VERDICTS[2]


def ratio_band(a: Side, b: Side) -> Band:
    """a's tokens/s per GPU ÷ b's, each scenario pricing both sides (`scenarios`)."""
    ratios = [a.tokens_per_s_per_gpu(s) / b.tokens_per_s_per_gpu(s) for s in scenarios()]
    central = a.tokens_per_s_per_gpu() / b.tokens_per_s_per_gpu()
    return Band(min(ratios), central, max(ratios))


def sensitivity(a: Side, b: Side) -> dict[str, tuple[float, float]]:
    """Input → (least, greatest) ratio as it alone moves over its range (the central ratio included)."""
    central = a.tokens_per_s_per_gpu() / b.tokens_per_s_per_gpu()
    out = {}
    for name, group in _alone().items():
        rs = [central] + [a.tokens_per_s_per_gpu(s) / b.tokens_per_s_per_gpu(s) for s in group]
        out[name] = (min(rs), max(rs))
    return out


@dataclass(frozen=True)
class Comparison:
    """The verdict of a against b: the ratio's band, the answer, what moves it most, and the setting."""

    a: str
    """The first side, as printed (TSP)."""
    b: str
    """The second side (the strongest baseline)."""
    band: Band
    """a's tokens/s per GPU ÷ b's."""
    verdict: str
    """One of VERDICTS."""
    moves_most: str
    """The input whose range alone moves the ratio most, and how far."""
    setting: str
    """What was compared: workload, cluster, overlap rule, each side's options."""

    def sentence(self) -> str:
        """One line: the ratio, its band, the answer, what moves it most."""
        return (
            f"{self.a} ÷ {self.b} = {self.band}: {self.verdict} over {len(scenarios())} shared scenarios "
            f"(docs/method.md#verdict); {self.moves_most}"
        )

    def record(self) -> dict[str, Any]:
        """As a verdict record (docs/records.md#verdict-records)."""
        return {
            "kind": "verdict",
            "method": "modelled",
            "a": self.a,
            "b": self.b,
            "ratio_low": self.band.low,
            "ratio_central": self.band.central,
            "ratio_high": self.band.high,
            "verdict": self.verdict,
            "moves_most": self.moves_most,
            "setting": self.setting,
            "scenarios": len(scenarios()),
        }


def compare(a: Side, b: Side, a_name: str, b_name: str, setting: str) -> Comparison:
    """The one verdict function: the band of a ÷ b over the shared scenarios, its answer and its sensitivity."""
    band = ratio_band(a, b)
    sens = sensitivity(a, b)
    name, (lo, hi) = max(sens.items(), key=lambda kv: kv[1][1] - kv[1][0])
    moves = f"{name} moves it most ({lo:.2f}–{hi:.2f} over its range alone)"
    return Comparison(a_name, b_name, band, verdict(band), moves, setting)


def ratio_under(a: Side, b: Side, s: Scenario) -> float:
    """a's tokens/s per GPU ÷ b's under one scenario (both sides priced under it)."""
    return a.tokens_per_s_per_gpu(s) / b.tokens_per_s_per_gpu(s)
