"""`python -m tspbench.verify scheme=tsp degree=4 ...`: prove a scheme equal to the single-device model.

Builds the reference and the sharded model from one seed, runs the same global batch through both
(forward, backward, one AdamW step), gathers the sharded logits, every parameter gradient and every
updated parameter back to full shape, prints the max abs and relative error per tensor and exits non-zero
on any mismatch. Ranks are spawned here (gloo on CPU, NCCL on CUDA); bad configurations stop with one
line before any rank starts.

Tolerance. The error measure is normwise: max|got − ref| / max|ref| per tensor. Sharding only reorders
floating-point sums (split GEMMs, all-reduced partial sums, the online-softmax merge), so the difference
is bounded by ≈ n·ε relative with n ≲ 10³ terms at test sizes: ≈ 2e-13 in float64. TOL[float64] = 1e-10
leaves a wide margin and is still ~10⁸ below what a real sharding bug produces (O(1e-2 … 1): a missing
all-reduce, a skipped ring hop or a wrong zigzag order changes values at the scale of the values).
float32 (ε ≈ 1.2e-7) gets 2e-4; bfloat16 (ε ≈ 7.8e-3, smoke only) 5e-2.

The AdamW-step comparison runs in float64 only. Adam's first update is ≈ lr·sign(g) wherever |g| ≫ its ε,
so an element whose gradient sits near ε moves by up to lr on a last-bit difference of g: that is the
optimiser's conditioning, not the scheme's, and float32/bfloat16 rounding reaches it. float64 rounding
does not, so the optimiser path is checked there.
"""
from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from tspbench.config import DTYPES, ConfigError, ModelConfig, ParallelConfig, validate_parallel
from tspbench.model import build_model, synthetic_batch, token_loss_sum

TOL = {"float64": 1e-10, "float32": 2e-4, "bfloat16": 5e-2}


@dataclass
class VerifyConfig:
    """Flat so the CLI reads like the issue: `scheme=tsp degree=4 dp=2 model.n_kv_heads=2 seq_len=64`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Model dimensions (a `model=` preset from conf/model or `model.dim=...` overrides)."""
    scheme: str = "tsp"
    """single | tp | tp_msp | sp | tp_sp | tsp."""
    degree: int = 2
    """Ranks per replica (T, Σ, T·Σ or D)."""
    tp: int = 0
    """tp_sp: tensor degree T (0 = auto)."""
    dp: int = 1
    """Data-parallel replicas; world = dp × degree."""
    sp_variant: str = "allgather"
    """sp / tp_sp K/V exchange: allgather | ring."""
    recompute: str = "none"
    """none | full."""
    vocab: str = "auto"
    """Embedding / LM head: auto | replicated | ring (tsp only); see ParallelConfig.vocab."""
    seq_len: int = 32
    """Sequence length S (zigzag needs S divisible by 2·Σ)."""
    batch: int = 2
    """Micro-batch per replica."""
    dtype: str = "float64"
    """float64 (parity), float32, bfloat16 (smoke)."""
    seed: int = 0
    """Seed for weights and data."""
    device: str = "cpu"
    """cpu (gloo) | cuda (nccl)."""
    optimizer_step: bool = True
    """Also compare parameters after one AdamW step (float64 only; see the module docstring)."""
    decode_steps: int = 0
    """Serving instead of training: prefill seq_len tokens into a KV cache, then decode this many tokens one
    at a time, comparing the prefill and every decode step's logits with the reference (tspbench/verify_decode.py)."""

    def parallel(self) -> ParallelConfig:
        return ParallelConfig(scheme=self.scheme, degree=self.degree, tp=self.tp, dp=self.dp,
                              sp_variant=self.sp_variant, recompute=self.recompute, vocab=self.vocab)

    def validate(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype={self.dtype!r} is unknown; allowed: {', '.join(DTYPES)}")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device={self.device!r} is unknown; allowed: cpu, cuda")
        if self.decode_steps < 0:
            raise ConfigError(f"decode_steps={self.decode_steps} must be ≥ 0 (0: training parity)")
        if self.device == "cuda" and torch.cuda.device_count() < self.parallel().world_size:
            raise ConfigError(f"device=cuda needs {self.parallel().world_size} GPUs (dp × degree), "
                              f"found {torch.cuda.device_count()}; use device=cpu")
        validate_parallel(self.model, self.parallel(), self.seq_len, self.batch)


@dataclass
class TensorCheck:
    name: str
    max_abs: float
    max_rel: float
    tol: float
    ok: bool


@dataclass
class CaseResult:
    case: dict
    checks: list[TensorCheck]
    comm_layer0: dict          # recv elements per phase, layer 0, one forward+backward
    comm_ops_layer0: list      # (op, phase, numel, recv_numel) for layer 0
    comm_edges: dict           # recv elements per phase of the embedding ("embed") and LM head + loss ("head")
    param_bytes: list[int]     # per rank
    activation_bytes: list[int]  # per rank: bytes saved for backward by one forward (params excluded)
    breakage: str | None = None
    kv_cache_bytes: list[int] = field(default_factory=list)  # per rank, after prefill + decode (serving)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def _check(name: str, got: torch.Tensor, ref: torch.Tensor, tol: float) -> TensorCheck:
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    if got.shape != ref.shape:
        return TensorCheck(name, float("inf"), float("inf"), tol, False)
    abs_err = (got - ref).abs().max().item()
    scale = ref.abs().max().item()
    rel = abs_err / scale if scale > 0 else abs_err
    return TensorCheck(name, abs_err, rel, tol, bool(rel <= tol))


def run_case(vc: VerifyConfig, breakage: str | None = None) -> CaseResult | None:
    """Collective over the default process group (world = dp × degree). Returns the result on rank 0."""
    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh
    from tspbench.measure.memory import saved_tensor_bytes
    from tspbench.schemes.comm import CommLog

    par = vc.parallel()
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == par.world_size, (world, par.world_size)
    dtype, tol = DTYPES[vc.dtype], TOL[vc.dtype]
    device = torch.device("cuda", torch.cuda.current_device()) if vc.device == "cuda" else torch.device("cpu")
    tokens, targets = synthetic_batch(vc.model, par.dp * vc.batch, vc.seq_len, vc.seed, device)

    # -- sharded model ---------------------------------------------------------------------------------
    log = CommLog()
    mesh = build_mesh(par, device.type)
    breaker = _breakage(breakage)
    with breaker:
        pm = apply_scheme(vc.model, par, ApplyArgs(mesh, vc.seq_len, vc.seed, dtype, device, log))
        tok, tgt, pos = pm.local_batch(tokens, targets)
        saved = [0]
        param_keys = {p.untyped_storage().data_ptr() for p in pm.parameters()}
        with saved_tensor_bytes(param_keys, saved):
            loss, logits = pm.loss(tok, tgt, pos)
        loss.backward()
        comm_layer0 = log.summary("layer0")
        ops0 = [(r.op, r.phase, r.numel, r.recv_numel) for r in log.records if r.tag == "layer0"]
        edges = {tag: log.summary(tag) for tag in ("embed", "head")}
        pm.finish_grad_sync()
    replica_loss = pm.replica_loss(loss)
    full_logits = pm.full_logits(logits.detach())
    if pm.dp is not None:  # every replica's logits, in replica order
        full_logits = pm.dp.all_gather(full_logits.contiguous(), 0)
        dist.all_reduce(replica_loss, group=pm.dp.group)
        replica_loss /= pm.dp.size
    grads = pm.full_state(grads=True)
    opt_step = vc.optimizer_step and vc.dtype == "float64"
    if opt_step:
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-2, weight_decay=0.1)
        opt.step()
        params = pm.full_state(grads=False)
    sizes = [None] * world
    dist.all_gather_object(sizes, (pm.param_bytes(), saved[0]))
    if rank != 0:
        return None

    # -- reference, same seed, same global batch -------------------------------------------------------
    ref = build_model(vc.model, vc.seed, dtype, device, recompute="none")
    ref_logits = ref(tokens)
    ref_loss = token_loss_sum(ref_logits, targets) / targets.numel()
    ref_loss.backward()
    checks = [_check("loss", replica_loss, ref_loss, tol), _check("logits", full_logits, ref_logits, tol)]
    ref_params = dict(ref.named_parameters())
    checks += [_check(f"grad/{n}", grads[n], p.grad, tol) for n, p in ref_params.items()]
    if opt_step:
        torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1).step()
        checks += [_check(f"param/{n}", params[n], p, tol) for n, p in ref_params.items()]
    return CaseResult(asdict(vc), checks, comm_layer0, ops0, edges, [s[0] for s in sizes], [s[1] for s in sizes],
                      breakage)


def _breakage(name: str | None):
    if name is None:
        return contextlib.nullcontext()
    from tspbench.verify.broken import BREAKAGES
    return BREAKAGES[name]()


def _worker(rank: int, world: int, cases: list[tuple[VerifyConfig, str | None]], out_file: str) -> None:
    from tspbench.verify.serve import run_decode_case

    results = []
    for vc, breakage in cases:
        res = (run_decode_case if vc.decode_steps else run_case)(vc, breakage)
        if res is not None:
            results.append(res)
        dist.barrier()
    if rank == 0:
        Path(out_file).write_text(json.dumps([_to_json(r) for r in results]))


def _to_json(r: CaseResult) -> dict:
    d = asdict(r)
    d["ok"] = r.ok
    return d


def run_cases(cases: list[tuple[VerifyConfig, str | None]], world: int, device: str = "cpu") -> list[dict]:
    """Spawn one rank group of size `world` and run every case in it (all cases share the world size)."""
    from tspbench.spawn import spawn

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "results.json")
        spawn(_worker, world, cases, out, device=device)
        return json.loads(Path(out).read_text())


def format_result(r: dict) -> str:
    c = r["case"]
    head = (f"scheme={c['scheme']} degree={c['degree']} dp={c['dp']} tp={c['tp']} variant={c['sp_variant']} "
            f"recompute={c['recompute']} dtype={c['dtype']} S={c['seq_len']} B={c['batch']} "
            f"n_heads={c['model']['n_heads']} n_kv_heads={c['model']['n_kv_heads']}")
    lines = [head, f"{'tensor':44s} {'max_abs':>11s} {'max_rel':>11s} {'tol':>8s}"]
    for t in r["checks"]:
        flag = "ok" if t["ok"] else "MISMATCH"
        lines.append(f"{t['name']:44s} {t['max_abs']:11.3e} {t['max_rel']:11.3e} {t['tol']:8.0e}  {flag}")
    n_bad = sum(not t["ok"] for t in r["checks"])
    lines.append(f"{'PASS' if r['ok'] else 'FAIL'}: {len(r['checks']) - n_bad}/{len(r['checks'])} tensors "
                 f"within tolerance; param bytes per rank {r['param_bytes']}"
                 + (f"; KV-cache bytes per rank {r['kv_cache_bytes']}" if r.get("kv_cache_bytes") else ""))
    return "\n".join(lines)


def compose(overrides: list[str]) -> VerifyConfig:
    """Hydra compose (no output dirs, no @hydra.main) into the typed VerifyConfig."""
    from hydra import compose as hcompose, initialize_config_dir
    from omegaconf import OmegaConf

    from tspbench.cli import CONF_DIR

    from tspbench.cli import register
    register().store(name="verify_schema", node=VerifyConfig)
    # Its own root (conf/verify, with conf/model linked in): there `scheme=` is a value, not the runner's
    # conf/scheme group.
    with initialize_config_dir(str(CONF_DIR / "verify"), version_base=None):
        cfg = hcompose("verify", overrides=overrides)
    obj = OmegaConf.to_object(cfg)
    return obj


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        vc = compose(argv)
        vc.validate()
    except ConfigError as e:
        print(f"tspbench.verify: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # Hydra's own composition errors (misspelt key, wrong type): one line
        if type(e).__module__.startswith(("hydra", "omegaconf")):
            print(f"tspbench.verify: {str(e).splitlines()[0]}", file=sys.stderr)
            return 2
        raise
    results = run_cases([(vc, None)], vc.parallel().world_size, vc.device)
    for r in results:
        print(format_result(r))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
