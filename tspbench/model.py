"""The single-device reference: a Llama-style decoder (docs/method.md#published, docs/method.md#choice-activation).

Token embedding → L × [RMSNorm → causal GQA attention with RoPE → residual → RMSNorm → SwiGLU MLP →
residual] → RMSNorm → LM head → cross-entropy.

This file imports nothing from torch.distributed. Schemes replace `Block.attention` / `Block.mlp` with
sharded modules of the same call signature, and feed the model *local* tokens with their *global*
positions; everything token-wise here (norms, residuals, RoPE, embedding, LM head) is then correct on
any token shard unchanged.

Shape legend: B batch, S sequence (S_loc: this rank's tokens), h = dim, n_h / n_kv heads, d head dim,
V vocabulary, F·h = ffn_hidden.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import typing
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tspbench.attention import causal_attention
from tspbench.config import ModelConfig, Rope


# ---------------------------------------------------------------------------------------------------
# Deterministic initialisation: each full parameter is a pure function of (seed, name, shape), so a
# scheme can materialise just the slice it needs without building the whole model first, and every
# scheme starts from bit-identical weights.
# ---------------------------------------------------------------------------------------------------
def init_full_param(
    name: str, shape: tuple[int, ...], seed: int, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype, device=device)
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    gen = torch.Generator(device="cpu").manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    fan_in = shape[-1]
    std = 1.0 if name == "embed.weight" else 1.0 / math.sqrt(fan_in)
    # Generated on CPU in float32 so the values do not depend on the target device or dtype.
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * std).to(device=device, dtype=dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_inv_freq(head_dim: int, rope: float | Rope, device: torch.device | str = "cpu") -> torch.Tensor:
    """RoPE's inverse frequencies [d/2] in float64: θ^(−2i/d), with Llama 3.1's `llama3` scaling when `rope` has
    one (Hugging Face's _compute_llama3_parameters, the same formula, in float64 rather than float32)."""
    theta, scaling = (rope.theta, rope.scaling) if isinstance(rope, Rope) else (rope, None)
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim))
    if scaling is None:
        return inv
    old = scaling.original_max_position_embeddings
    low_wavelen, high_wavelen = old / scaling.low_freq_factor, old / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / scaling.factor, inv)  # long wavelengths: divided by factor
    smooth = (old / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)  # between the two: interpolated
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float | Rope, dtype: torch.dtype):
    """cos/sin tables [S_loc, d/2] for the given *global* token positions. `theta`: the RoPE base, or a Rope
    (ModelConfig.rope: base and scaling)."""
    inv = rope_inv_freq(head_dim, theta, positions.device)
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, S_loc, heads, d]; rotate interleaved pairs (Llama convention)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


class _SiluMul(torch.autograd.Function):
    """silu(g) ⊙ u, saving only its inputs g and u and recomputing the activation in backward: Megatron's fused
    `bias_swiglu` (and torchtitan's compiled SwiGLU) keep the same two tensors, not four."""

    @staticmethod
    def forward(ctx, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(g, u)
        return F.silu(g) * u

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        # In place where possible, so at most three intermediate-sized temporaries live at once (the memory
        # model's MLP-backward moment counts them): sig, du, and dsilu turned into dg.
        g, u = ctx.saved_tensors
        sig = torch.sigmoid(g)
        du = torch.mul(g, sig).mul_(dy)  # silu(g)·dy
        dg = torch.sub(1, sig).mul_(g).add_(1).mul_(sig)  # silu'(g) = σ(g)·(1 + g·(1 − σ(g)))
        del sig
        return dg.mul_(dy).mul_(u), du


def silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return _SiluMul.apply(g, u)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x·Wᵀ for x [B, S, in] → [B, S, out], in x's storage order. A sequence-first x (a [B, S, h] view of a
    contiguous [S, B, h] tensor: what an all-gather along the sequence hands back at B > 1, Megatron's [S, B, h]
    layout) is multiplied as [S, B, h], so the GEMM neither copies its input nor saves a copy for backward, and the
    output keeps the sequence-first order for the next token-wise op. F.linear on that view would make (and save) a
    contiguous copy per projection."""
    if x.dim() == 3 and not x.is_contiguous() and x.transpose(0, 1).is_contiguous():
        return F.linear(x.transpose(0, 1), w).transpose(0, 1)
    return F.linear(x, w)


def swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """(silu(x·W_gateᵀ) ⊙ x·W_upᵀ)·W_downᵀ — linear in each intermediate channel, so channel shards sum. Saves x,
    the gate and up projections and the product (W_down's input): 3 intermediate-sized tensors per token."""
    return linear(silu_mul(linear(x, w_gate), linear(x, w_up)), w_down)


class LayerKV:
    """One layer's KV cache: K and V of the tokens seen so far, [B, n_kv, L, d] each (a scheme keeps its own
    heads and/or tokens), grown by `append` along the token dimension. Serving only (no autograd).

    Storage is preallocated: the first append (the prefill) reserves room for `reserve` more tokens, so a
    decode step writes one token in place instead of copying the whole cache; past the reserve the buffer
    doubles (amortised O(1) copies per token). `k` / `v` are views of the filled part."""

    def __init__(self, reserve: int = 0):
        self.reserve = reserve
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self.length = 0

    @property
    def k(self) -> torch.Tensor | None:
        return None if self._k is None else self._k[:, :, : self.length]

    @property
    def v(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[:, :, : self.length]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add new tokens' K/V (dim 2); returns the whole cache (views)."""
        end = self.length + k.shape[2]
        if self._k is None or end > self._k.shape[2]:
            cap = end + self.reserve if self._k is None else max(end, 2 * self._k.shape[2])
            bufs = []
            for old, new in ((self._k, k), (self._v, v)):
                buf = new.new_empty((*new.shape[:2], cap, new.shape[3]))
                if old is not None:
                    buf[:, :, : self.length] = old[:, :, : self.length]
                bufs.append(buf)
            self._k, self._v = bufs
        assert self._k is not None and self._v is not None
        self._k[:, :, self.length : end] = k.detach()
        self._v[:, :, self.length : end] = v.detach()
        self.length = end
        return self._k[:, :, :end], self._v[:, :, :end]

    def nbytes(self) -> int:
        """Bytes of the cached tokens (the cache's contents)."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)

    def capacity_bytes(self) -> int:
        """Bytes allocated, reserve included (what the device holds)."""
        return sum(t.numel() * t.element_size() for t in (self._k, self._v) if t is not None)


class CoreAttention:
    """Modules whose core attention may be recomputed (`recompute=selective`, Megatron's
    recompute_granularity=selective): only the attention kernel is checkpointed, so its own saved tensors (the
    output, the log-sum-exp, a zigzag shard's concatenation) are rebuilt in backward from q, k, v, which the
    projections keep anyway. Set by the Transformer (and ParallelModel) from the recompute mode."""

    recompute_core: bool = False
    rerun_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    """Entered around the kernel, in forward and in its recompute (a scheme puts its layer's communication
    tag back there: a recompute in backward runs no module hook)."""

    def core(self, fn, *args):
        def run(*a):
            with self.rerun_context():
                return fn(*a)

        if self.recompute_core and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(run, *args, use_reentrant=False)
        return run(*args)


class Attention(nn.Module, CoreAttention):
    """Causal GQA attention with RoPE. Local head counts come from the weight shapes, never a config,
    so a scheme can hand this math sharded weights. With `kv` set (serving), each call appends its tokens'
    K/V to the cache and attends against everything cached: prefill, then one token per decode step."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, d = cfg.dim, cfg.head_dim
        self.head_dim = d
        self.rope = cfg.rope  # base and scaling
        self.kv: LayerKV | None = None
        self.wq = nn.Parameter(torch.empty(cfg.n_heads * d, h))  # [n_h·d, h]
        self.wk = nn.Parameter(torch.empty(cfg.n_kv_heads * d, h))  # [n_kv·d, h]
        self.wv = nn.Parameter(torch.empty(cfg.n_kv_heads * d, h))  # [n_kv·d, h]
        self.wo = nn.Parameter(torch.empty(h, cfg.n_heads * d))  # [h, n_h·d]

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: [B, S, h]; positions: [S] = arange(S) for the reference
        q, k, v = project_qkv(x, self.wq, self.wk, self.wv, positions, self.head_dim, self.rope)
        offset = 0
        if self.kv is not None:  # serving: attend to the cache too
            offset = self.kv.length
            k, v = self.kv.append(k, v)
        o = self.core(causal_attention, q, k, v, offset)  # [B, n_h, S, d]
        return F.linear(o.transpose(1, 2).flatten(2), self.wo)


def project_qkv(x, wq, wk, wv, positions, head_dim: int, theta: float | Rope):
    """Q, K, V for the heads whose weight rows are given, RoPE'd at the given global positions.
    Returns q [B, n_q, S_loc, d], k, v [B, n_kv, S_loc, d]."""
    return rope_heads(linear(x, wq), linear(x, wk), linear(x, wv), positions, head_dim, theta)


def rope_heads(xq, xk, xv, positions, head_dim: int, theta: float | Rope):
    """The projections' outputs [B, S_loc, heads·d] as heads: q, k RoPE'd at the given global positions, v as is
    (a scheme that computes the projections itself, e.g. Megatron's column-parallel linear, continues here).
    Returns q [B, n_q, S_loc, d], k, v [B, n_kv, S_loc, d]."""
    cos, sin = rope_cos_sin(positions, head_dim, theta, xq.dtype)
    q = apply_rope(xq.unflatten(-1, (-1, head_dim)), cos, sin)  # unflatten: a view in either order
    k = apply_rope(xk.unflatten(-1, (-1, head_dim)), cos, sin)
    v = xv.unflatten(-1, (-1, head_dim))
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_gate = nn.Parameter(torch.empty(cfg.ffn_hidden, cfg.dim))  # [F·h, h]
        self.w_up = nn.Parameter(torch.empty(cfg.ffn_hidden, cfg.dim))  # [F·h, h]
        self.w_down = nn.Parameter(torch.empty(cfg.dim, cfg.ffn_hidden))  # [h, F·h]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.w_gate, self.w_up, self.w_down)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention: nn.Module = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp: nn.Module = MLP(cfg)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attn_norm(x), positions)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """The reference model. `recompute="full"` checkpoints each block (activations recomputed in
    backward, so only block inputs are stored)."""

    def __init__(self, cfg: ModelConfig, recompute: str = "none"):
        super().__init__()
        self.cfg = cfg
        self.recompute = recompute
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:  # one parameter (named embed.weight), as Hugging Face's tie_word_embeddings
            self.lm_head.weight = self.embed.weight
        self.set_recompute(recompute)

    def set_recompute(self, recompute: str) -> None:
        """none | selective (core attention recomputed) | full (every block recomputed)."""
        self.recompute = recompute
        for m in self.modules():
            if isinstance(m, CoreAttention):
                m.recompute_core = recompute == "selective"

    @property
    def blocks(self) -> list[Block]:
        """The decoder blocks, typed (ModuleList iteration is typed as plain Modules)."""
        return typing.cast(list[Block], list(self.layers))

    def start_kv_cache(self, reserve: int = 0) -> list[LayerKV]:
        """Give every attention an empty KV cache: the next forward is the prefill, each later one decodes
        (call with the new tokens and their global positions, under torch.no_grad). `reserve`: room for that
        many more tokens per layer, allocated with the prefill."""
        caches = [LayerKV(reserve) for _ in self.layers]
        for block, kv in zip(self.blocks, caches):
            block.attention.kv = kv  # type: ignore[assignment]  # a plain attribute; Module.__setattr__ is typed for tensors
        return caches

    @torch.no_grad()
    def init_weights(self, seed: int) -> Transformer:
        for name, p in self.named_parameters():
            p.copy_(init_full_param(name, tuple(p.shape), seed, p.dtype, p.device))
        return self

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """tokens: [B, S_loc] → logits [B, S_loc, V]. positions: global position of each local token
        (defaults to 0…S−1)."""
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            self.check_window(tokens.shape[1] - 1)
        x = self.embed(tokens)
        for block in self.layers:
            if self.recompute == "full" and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, positions, use_reentrant=False)
            else:
                x = block(x, positions)
        return self.lm_head(self.norm(x))

    def check_window(self, last: int) -> None:
        """Refuse a position at or past Mistral's sliding window: attention here is full causal, equal to the window
        only inside it. On host integers, so that no forward reads a device value: the forward's own positions,
        ParallelModel.local_batch's token layout and ParallelModel.decode's position; explicit `positions` given to
        forward are the caller's to check."""
        window = self.cfg.sliding_window
        if window is not None and last >= window:
            raise ValueError(
                f"position {last} is beyond model.sliding_window={window}: sliding-window attention is not "
                f"implemented; use sequences of at most {window} tokens"
            )


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of per-token cross-entropy in at least fp32 (float64 runs stay float64, so parity is not limited
    by fp32 rounding). Schemes divide by the global token count so a shard's loss is its share of the mean."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")


def build_model(
    cfg: ModelConfig,
    seed: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    recompute: str = "none",
) -> Transformer:
    with torch.device(device):
        m = Transformer(cfg, recompute)
    return m.to(dtype).init_weights(seed)


def synthetic_batch(cfg: ModelConfig, batch: int, seq_len: int, seed: int, device="cpu"):
    """Random tokens and next-token targets [B, S] (a systems benchmark needs no real data)."""
    gen = torch.Generator().manual_seed(seed + 1)
    seq = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), generator=gen)
    return seq[:, :-1].to(device), seq[:, 1:].to(device)
