"""Column/row-parallel attention and gated MLP over a tensor group (Megatron; Shoeybi et al. 2019), shared by
tp, tp_msp and tp_sp. Each module holds this rank's head / channel slice; `enter` and `exit` are the region
mappings around the GEMMs (tp: f and g; tp_msp and tp_sp with Megatron-SP: all-gather / reduce-scatter along
the sequence; tp_sp with msp=false: f and g on the local tokens), the only thing the schemes change.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from tspbench.config import ModelConfig
from tspbench.model import CoreAttention, LayerKV, causal_attention, project_qkv, swiglu
from tspbench.schemes.comm import (
    Comm,
    copy_to_region,
    gather_from_sequence,
    reduce_from_region,
    reduce_scatter_to_sequence,
)
from tspbench.schemes.ops.decode import Decodable, decode_attend


class TPAttention(nn.Module, Decodable, CoreAttention):
    """Heads split over the tensor group. `enter`/`exit` are the region mappings; tp_msp and tp_sp
    subclass this and change only them. Serving (schemes/ops/decode.py): `kv` caches this rank's heads during
    the prefill; with `decoding` set, one replicated token attends to the cache (Megatron's f and g)."""

    kv: LayerKV | None = None

    def __init__(self, w: dict[str, nn.Parameter], comm: Comm | None, cfg: ModelConfig):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = w["wq"], w["wk"], w["wv"], w["wo"]
        self.comm, self.head_dim, self.theta = comm, cfg.head_dim, cfg.rope_theta

    seq_comm: Comm | None = None
    """The group the cache's tokens are sharded over (tp_sp: sp); None: this rank caches every token."""

    def enter(self, x, positions):
        return copy_to_region(x, self.comm), positions  # f: identity fwd, all-reduce bwd

    def exit(self, y):
        return reduce_from_region(y, self.comm)  # g: all-reduce fwd, identity bwd

    def attend(self, q, k, v):
        return self.core(causal_attention, q, k, v, 0)  # full sequence: plain causal

    def forward(self, x, positions):
        if self.decoding:
            return self.decode(x, positions)
        x, positions = self.enter(x, positions)  # [B, S, h]
        q, k, v = project_qkv(x, self.wq, self.wk, self.wv, positions, self.head_dim, self.theta)
        if self.kv is not None:  # prefill: cache what this rank computed
            self.kv.append(k, v)
        o = self.attend(q, k, v)  # [B, n_h/T, S, d]
        return self.exit(F.linear(o.transpose(1, 2).flatten(2), self.wo))  # partial sum over head shards

    def decode(self, x, positions):
        """x: [B, 1, h], the same on every rank; positions: [position]."""
        x = copy_to_region(x, self.comm)
        q, k, v = project_qkv(x, self.wq, self.wk, self.wv, positions, self.head_dim, self.theta)
        o = decode_attend(q, k, v, self.kv, self.seq_comm, self.decode_state.position)  # [B, n_h/T, 1, d]
        y = F.linear(o.transpose(1, 2).flatten(2), self.wo)
        return reduce_from_region(y, self.comm)


class TPMLP(nn.Module, Decodable):
    def __init__(self, w: dict[str, nn.Parameter], comm: Comm | None):
        super().__init__()
        self.w_gate, self.w_up, self.w_down = w["w_gate"], w["w_up"], w["w_down"]
        self.comm = comm

    def enter(self, x):
        return copy_to_region(x, self.comm)

    def exit(self, y):
        return reduce_from_region(y, self.comm)

    def forward(self, x):
        return self.exit(swiglu(self.enter(x), self.w_gate, self.w_up, self.w_down))  # partial over F·h/T


class SeqParallelMLP(TPMLP):
    """Megatron-SP's MLP (tp_msp; tp_sp's tensor axis): all-gather the sequence shards in, reduce-scatter the
    row-parallel partial sums out (dim 1 of [B, S_loc, h]). Decoding one replicated token: plain TP."""

    comm: Comm  # Megatron-SP needs a tensor group of T ≥ 2 ranks

    def enter(self, x):
        return super().enter(x) if self.decoding else gather_from_sequence(x, self.comm, dim=1)

    def exit(self, y):
        return super().exit(y) if self.decoding else reduce_scatter_to_sequence(y, self.comm, dim=1)
