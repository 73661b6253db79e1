"""Hardware profiles: one accelerator and its node, read from conf/hardware/<name>.yaml (every number with
its source in the yaml; the link and NIC efficiencies are published measurements, latencies and the matmul and
comm_efficiency figures stated assumptions, none of them fits). `HardwareProfile.group_link` is the link rule of
docs/method.md#collective-cost: what a collective's group of GPUs gets on a switch, a fully connected mesh, or
across nodes."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from tspbench.measure.flops import pattern_length
from tspbench.paths import conf_dir
from tspbench.predict.costmodel.workload import BYTES

CONF_DIR = conf_dir() / "hardware"
TOPOLOGIES = ("switch", "mesh")
"""Intra-node fabrics `HardwareProfile.topology` names (docs/method.md#collective-cost)."""


@dataclass
class HardwareProfile:
    """One accelerator and its node (fields are the keys of conf/hardware/<name>.yaml)."""

    name: str = "generic"
    peak_flops_bf16: float = 1e15
    """Dense bf16 matrix peak, FLOP/s."""
    peak_flops_fp32: float = 1e14
    """fp32 peak, FLOP/s."""
    peak_flops_fp8: float | None = None
    """Dense fp8 matrix peak, FLOP/s (float8 GEMMs of a published row's stack); None: the device has no fp8."""
    float8_linear_speedup: float | None = None
    """A float8 linear's forward + backward time (its casts and scales included) ÷ the bf16 linear's, inverted: the
    published speed-up of float8 training GEMMs for large LLM shapes on this device (tspbench/predict/published.py
    stack_hardware); None: not published, the float8 GEMM runs at the bf16 GEMM's fraction of `peak_flops_fp8`."""
    mem_bytes: float = 80e9
    """Device memory capacity, bytes (decimal)."""
    mem_bw: float = 3e12
    """Device memory bandwidth, bytes/s."""
    intra_node_bw: float = 450e9
    """Per-GPU unidirectional bandwidth into the intra-node fabric, bytes/s (used by collectives)."""
    intra_node_latency_s: float = 5e-6
    """Per-step latency α inside a node (assumption; see the yaml)."""
    inter_node_bw: float = 50e9
    """Per-GPU unidirectional NIC bandwidth, bytes/s."""
    inter_node_latency_s: float = 10e-6
    """Per-step latency α across nodes (assumption; see the yaml)."""
    gpus_per_node: int = 8
    matmul_efficiency: float = 0.5
    """Fraction of peak reached by the GEMMs: the device's published best-shape GEMM throughput ÷ its peak (the MAMF
    ceiling each conf/hardware profile cites, docs/method.md#gemm-ceiling); the default 0.5 is an assumption for a
    profile that cites none (cpu). Never fitted here (tspbench/predict/fit.py scales it per stack, apart)."""
    comm_efficiency: float = 0.65
    """Fraction of link bandwidth reached by collectives (Calculon's A100 profile uses 0.65)."""
    intra_node_p2p_bw: float | None = None
    """Bandwidth of one point-to-point transfer between two GPUs of a node; None = intra_node_bw (switched
    fabrics such as NVSwitch). On a fully connected mesh (MI300X) a single peer link carries it."""
    topology: str = "switch"
    """The intra-node fabric (docs/method.md#collective-cost): switch (NVSwitch: every GPU's links all reach the
    switches, so a group of any size, and a single peer, gets the GPU's whole link bandwidth) or mesh (fully
    connected, one link per peer, as MI300X's xGMI: a p-GPU group reaches its p − 1 peers over p − 1 links, a
    point-to-point transfer over one)."""
    links_per_gpu: int = 18
    """Intra-node links per GPU: NVLinks into the switches (switch), links to the peers, one each (mesh)."""
    link_bw: float = 25e9
    """One link's line rate per direction, bytes/s."""
    link_efficiency: float = 0.65
    """Fraction of the links' line rate the library's collectives and peer copies reach inside a node: published bus
    bandwidth (nccl-tests / rccl-tests convention) ÷ line rate, as the yaml cites it."""
    nvls_allreduce_busbw: float | None = None
    """Bus bandwidth, bytes/s (nccl-tests convention), of an all-reduce over the whole node reduced inside the switch
    (NCCL's NVLS, NVSwitch with NVLink SHARP), as published; None: no in-switch reduction (the ring prices it)."""
    nic_efficiency: float = 0.65
    """Fraction of the NIC line rate (`inter_node_bw`) a collective across nodes reaches, as the yaml cites it."""
    sources: list[str] = field(default_factory=list)
    """Where every number comes from."""
    device_names: list[str] = field(default_factory=list)
    """Substrings of `torch.cuda.get_device_name()` this profile describes (case-insensitive; the longest matching
    pattern of any profile wins; a "!"-prefixed entry names what it never describes): how a measured record finds its
    `hardware` and MFU peak (tspbench.measure.flops.match_profile), and which calibration and shapes files it takes.
    Empty: no device maps to it (cpu)."""
    attention_forward_efficiency: float | None = None
    """Fraction of peak the attention kernel reaches in forward; None = matmul_efficiency (the datasheet assumption).
    Set by the profile from a published figure of the kernel PyTorch's SDPA runs there (cited beside it), or by a
    calibration file (`calibration`), which replaces it."""
    attention_backward_efficiency: float | None = None
    """The same for the attention kernel's backward."""
    calibration: str | None = None
    """The calibration file whose measured efficiencies replaced the assumptions (conf/hardware/<name>.calibration.json,
    written by `python -m tspbench.gpu_check time=true` on that device), or None: datasheet assumptions."""
    compute_units: int | None = None
    """CUs (AMD) / SMs (NVIDIA) the kernels' output tiles are spread over: the wave quantisation of
    `Pricing.kernels="shape"` (costmodel/kernels.py); None: no wave quantisation (cpu)."""
    attention_fwd_points: dict[str, list[list[float]]] | None = None
    """Published flash-attention forward throughput, {"causal" | "unmasked": [[sequence length, TFLOP/s], …]} at the
    benchmark shape `attention_points_shape` (q = k = sequence length), each point cited in the yaml; None: none found
    (kernels.py falls back to matmul_efficiency)."""
    attention_bwd_points: dict[str, list[list[float]]] | None = None
    """The same for the flash backward (TFLOP/s counting the backward as 2.5 forwards)."""
    attention_points_shape: dict[str, int] | None = None
    """{batch, heads, head_dim} of the runs the attention points come from."""
    gemm_points: list[list[float]] | None = None
    """Published square bf16 GEMM throughput [[M = N = K, TFLOP/s], …]; None: none found (matmul_efficiency)."""
    measured_shapes: dict[tuple, tuple[float, float]] | None = None
    """Kernel calls timed on this device (conf/hardware/<name>.shapes.jsonl, the lines `python -m tspbench.gpu_check
    shapes=true` prints, `apply_shapes`): call key → (measured, modelled-at-measurement) fraction of the bf16 peak.
    Where present they replace the published curves (costmodel/kernels.py `measured_or`); None: no file."""
    shapes: str | None = None
    """The shapes file applied, or None."""

    @property
    def efficiency_source(self) -> str:
        """What the time model's compute efficiencies are: 'calibrated (<file>)' or 'datasheet assumption'."""
        return f"calibrated ({self.calibration})" if self.calibration else "datasheet assumption"

    def peak_flops(self, dtype: str) -> float:
        return self.peak_flops_fp32 if BYTES[dtype] >= 4 else self.peak_flops_bf16

    def link(self, span: int, p2p: bool = False) -> tuple[float, float]:
        """(effective bytes/s, α seconds) for a group spanning `span` consecutive ranks, by the span alone: the rule
        before the topology model (`Pricing.links="node"`; `group_link` is the rule the hardware has)."""
        if span <= self.gpus_per_node:
            bw = (self.intra_node_p2p_bw or self.intra_node_bw) if p2p else self.intra_node_bw
            return bw * self.comm_efficiency, self.intra_node_latency_s
        return self.inter_node_bw * self.comm_efficiency, self.inter_node_latency_s

    def group_link(self, op: str, p: int, span: int) -> tuple[float, float]:
        """(effective bytes/s, α seconds) of collective `op` over a group of p ranks spanning `span` consecutive
        ranks, on the links that group has (docs/method.md#collective-cost); "p2p" is one transfer to one peer
        (p = 2), as a ring hop is.

        Inside a node (span ≤ gpus_per_node): a switch gives every group, of any size, each GPU's links_per_gpu
        links (an all-reduce over the whole node takes NVLS's bus bandwidth where the profile has one); a fully
        connected mesh gives a p-GPU group its p − 1 peer links, a point-to-point transfer one. Across nodes: the
        NICs, one per GPU, of the group's members on a node (k = p ÷ the nodes it spans, at least 1: a ring leaves
        each node once per channel, and the channels spread over those k NICs)."""
        g = self.gpus_per_node
        if span > g:
            k = max(1, min(g, p // -(-span // g)))
            return k * self.inter_node_bw * self.nic_efficiency, self.inter_node_latency_s
        links = self.links_per_gpu if self.topology == "switch" else min(max(p - 1, 1), self.links_per_gpu)
        bw = links * self.link_bw * self.link_efficiency
        if op == "allreduce" and self.nvls_allreduce_busbw and self.topology == "switch" and p == g:
            bw = max(bw, self.nvls_allreduce_busbw)
        return bw, self.intra_node_latency_s


def load_hardware(name: str, conf_dir: str | Path | None = None) -> HardwareProfile:
    """Read conf/hardware/<name>.yaml (a Hydra `hardware` group file) into a HardwareProfile."""
    path = Path(conf_dir or CONF_DIR) / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in Path(conf_dir or CONF_DIR).glob("*.yaml"))
        raise ValueError(f"hardware={name!r} has no {path}; known profiles: {', '.join(known)}")
    data = yaml.safe_load(path.read_text())
    allowed = {f.name for f in fields(HardwareProfile)}
    unknown = set(data) - allowed
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")
    for key in (
        "peak_flops_bf16",
        "peak_flops_fp32",
        "mem_bytes",
        "mem_bw",
        "intra_node_bw",
        "inter_node_bw",
        "intra_node_latency_s",
        "inter_node_latency_s",
        "matmul_efficiency",
        "comm_efficiency",
    ):
        data[key] = float(data[key])  # YAML 1.1 reads "1e12" (no sign, no dot) as a string
    for key in ("link_bw", "link_efficiency", "nic_efficiency", "nvls_allreduce_busbw"):  # the link model's
        if data.get(key) is not None:
            data[key] = float(data[key])
    if data.get("topology", "switch") not in TOPOLOGIES:
        raise ValueError(f"{path}: topology={data['topology']!r} is unknown; allowed: {', '.join(TOPOLOGIES)}")
    data["device_names"] = [str(s) for s in data.get("device_names") or []]
    _check_kernel_keys(path, data)
    profile = HardwareProfile(**data)
    calib = path.with_name(f"{name}.calibration.json")
    if calib.exists():
        apply_calibration(profile, calib)
    shapes = path.with_name(f"{name}.shapes.jsonl")
    if shapes.exists():
        apply_shapes(profile, shapes)
    return profile


def shape_key(call: str, shape: list | tuple, what: str) -> tuple:
    """The key of one timed kernel call: ("attention", q, k, heads, head_dim, mask, batch, fwd | bwd) or ("gemm", m,
    n, k) (a GEMM's time does not depend on which projection it is)."""
    return ("attention", *shape, what) if call == "attention" else ("gemm", *shape)


def apply_shapes(profile: HardwareProfile, path: Path) -> None:
    """Read the kernel calls timed on this device (one JSON object per line as `gpu_check shapes=true` prints them:
    call, what, shape, measured_efficiency, modelled_efficiency) into `measured_shapes`. A malformed line is an
    error naming the line, never skipped."""
    import json

    table: dict[tuple, tuple[float, float]] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            call, eff, model = rec["call"], float(rec["measured_efficiency"]), float(rec["modelled_efficiency"])
            shape, what = list(rec["shape"]), str(rec["what"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(
                f"{path}:{n}: needs call, what, shape, measured_efficiency, modelled_efficiency ({e})"
            ) from None
        refuse_other_device(profile, f"{path}:{n}", rec.get("device"), rec.get("hardware"))
        if call not in ("attention", "gemm") or not (0 < eff <= 1) or not (0 < model <= 1):
            raise ValueError(f"{path}:{n}: call must be attention or gemm and both efficiencies in (0, 1]; got {rec}")
        table[shape_key(call, shape, what)] = (eff, model)
    if not table:
        raise ValueError(f"{path}: no timed kernel call; delete it or fill it from `gpu_check shapes=true`")
    profile.measured_shapes = table
    profile.shapes = path.name
    profile.sources.append(f"kernel calls timed on the device: {path.name} ({len(table)} call shapes)")


POINT_MASKS = ("causal", "unmasked")


@functools.cache
def shared_profile(name: str) -> HardwareProfile:
    """`load_hardware(name)` from conf/hardware, read once per process: for callers that price one profile many
    times (validation rows, the verdict's scenarios). Never mutate it: overrides `replace` a copy."""
    return load_hardware(name)


def _check_points(path: Path, key: str, points: object, peak_tflops: float) -> None:
    """[[x > 0, TFLOP/s in (0, peak]], …] with x strictly increasing, else one actionable ValueError."""
    ok = isinstance(points, list) and len(points) > 0
    last = 0.0
    for p in points if isinstance(points, list) else []:
        good = isinstance(p, list) and len(p) == 2 and all(isinstance(v, (int, float)) for v in p)
        ok = ok and good and p[0] > last and 0 < p[1] <= peak_tflops
        last = p[0] if good else last
    if not ok:
        raise ValueError(
            f"{path}: {key} = {points!r}: needs a list of [size > 0, TFLOP/s in (0, {peak_tflops:g}]] pairs in "
            "increasing size, each cited on its line"
        )


def _check_kernel_keys(path: Path, data: dict) -> None:
    """The optional keys of shape pricing (costmodel/kernels.py): refused with one line naming key and fix."""
    units = data.get("compute_units")
    if units is not None and (not isinstance(units, int) or isinstance(units, bool) or units <= 0):
        raise ValueError(f"{path}: compute_units={units!r}: needs a positive integer (CUs / SMs of the device)")
    peak = float(data["peak_flops_bf16"]) / 1e12
    attention = [k for k in ("attention_fwd_points", "attention_bwd_points") if data.get(k) is not None]
    for key in attention:
        table = data[key]
        if not isinstance(table, dict) or not table or set(table) - set(POINT_MASKS):
            raise ValueError(f"{path}: {key} needs a mapping with keys among {POINT_MASKS}; got {table!r}")
        for mask, points in table.items():
            _check_points(path, f"{key}.{mask}", points, peak)
    if data.get("gemm_points") is not None:
        _check_points(path, "gemm_points", data["gemm_points"], peak)
    shape = data.get("attention_points_shape")
    if attention and not (
        isinstance(shape, dict)
        and set(shape) == {"batch", "heads", "head_dim"}
        and all(isinstance(v, int) and v > 0 for v in shape.values())
    ):
        raise ValueError(f"{path}: attention_points_shape={shape!r}: needs {{batch, heads, head_dim}} positive ints")
    if (attention or data.get("gemm_points") is not None) and units is None:
        raise ValueError(f"{path}: kernel points need compute_units (the wave quantisation divides them out)")


CALIBRATION_KEYS = ("gemm", "attention_forward", "attention_backward")


def refuse_other_device(profile: HardwareProfile, where: str, device: object, hardware: object) -> None:
    """A calibration or shapes file measured on another part is refused (one line naming the file, its device and the
    profile's device_names): its `device` must match the profile's device_names; a shapes line without a device
    (before gpu_check wrote one) must name the profile in `hardware` (gpu_check resolves it from the device)."""
    if device is not None:
        if pattern_length(profile.device_names, str(device)):
            return
        what = f"device {device!r}"
    elif hardware is not None:
        if hardware == profile.name:
            return
        what = f"no device and hardware {hardware!r}"
    else:
        what = "no device (and no hardware)"
    raise ValueError(
        f"{where}: {what} is not {profile.name}'s (conf/hardware/{profile.name}.yaml device_names: "
        f"{profile.device_names}); keep it beside the profile that names its device"
    )


def apply_calibration(profile: HardwareProfile, path: Path) -> None:
    """Replace the assumed efficiencies by measured ones: {"device", "torch", "driver", "date", "source",
    "efficiency": {"gemm", "attention_forward", "attention_backward"}} (fractions of the profile's bf16 peak, as
    `tspbench.gpu_check time=true` measures them on one device; attention efficiencies are relative to the FLOPs
    costmodel.flops.hardware_flops_per_token counts: causal c = ½, the flash backward as 2.5 forwards). A malformed
    file is an error, never ignored."""
    import json

    data = json.loads(path.read_text())
    refuse_other_device(profile, str(path), data.get("device"), None)
    eff = data.get("efficiency", {})
    missing = [k for k in CALIBRATION_KEYS if not isinstance(eff.get(k), (int, float))]
    if missing or not all(0 < eff[k] <= 1 for k in CALIBRATION_KEYS if k not in missing):
        raise ValueError(f"{path}: efficiency needs {', '.join(CALIBRATION_KEYS)} in (0, 1]; got {eff}")
    profile.matmul_efficiency = float(eff["gemm"])
    profile.attention_forward_efficiency = float(eff["attention_forward"])
    profile.attention_backward_efficiency = float(eff["attention_backward"])
    profile.calibration = path.name
    profile.sources.append(
        f"calibration {path.name}: {data.get('device', '?')}, torch {data.get('torch', '?')}, "
        f"driver {data.get('driver', '?')}, {data.get('date', '?')}"
    )
