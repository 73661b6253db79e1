"""Sequence layouts: which global tokens a rank holds, and causal attention on such a shard.

Zigzag (docs/method.md#choice-zigzag; ring-flash-attention `extract_local`, Megatron CP): split S into 2·D equal
chunks; rank p holds chunks p and 2D−1−p, so every rank gets one early and one late chunk and the causal work is
equal. Contiguous: rank p holds chunk p of D (Megatron-SP's split; causal work unbalanced, which does not matter
there because attention runs on the full, re-gathered sequence).

These helpers are pure (no communication) and are shared by the schemes, the tests and the runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from tspbench.model import causal_attention


@dataclass(frozen=True)
class SeqLayout:
    """Which global tokens a rank holds. Every index tensor lives on `device` and is built once, so a step never
    copies an index from host to device (on CUDA a blocking copy: a stream synchronisation per use)."""

    seq_len: int
    degree: int
    rank: int
    zigzag: bool = True
    device: str | torch.device = "cpu"

    def chunks_of(self, rank: int) -> list[tuple[int, int]]:
        """(global start, length) of each contiguous run of tokens that `rank` holds, in local order."""
        if self.degree == 1:
            return [(0, self.seq_len)]
        if self.zigzag:
            c = self.seq_len // (2 * self.degree)
            return [(rank * c, c), ((2 * self.degree - 1 - rank) * c, c)]
        c = self.seq_len // self.degree
        return [(rank * c, c)]

    @property
    def chunks(self) -> list[tuple[int, int]]:
        return self.chunks_of(self.rank)

    @cached_property
    def _positions_by_rank(self) -> list[torch.Tensor]:
        return [
            torch.cat([torch.arange(s, s + n, device=self.device) for s, n in self.chunks_of(r)])
            for r in range(self.degree)
        ]

    def positions_of(self, rank: int) -> torch.Tensor:
        """Global positions of `rank`'s tokens, on the layout's device."""
        return self._positions_by_rank[rank]

    @property
    def positions(self) -> torch.Tensor:
        """Global positions of this rank's tokens (used for RoPE and masks)."""
        return self.positions_of(self.rank)

    @property
    def local_len(self) -> int:
        return self.seq_len // self.degree

    @cached_property
    def rank_order(self) -> torch.Tensor:
        """The logical positions in rank order (every rank's shard, concatenated).

        rank-ordered = logical[rank_order]."""
        return torch.cat(self._positions_by_rank)

    @cached_property
    def gathered_order(self) -> torch.Tensor:
        """Permutation that turns an all-gather of every rank's shard (rank order) into logical order:
        logical[t] = gathered[gathered_order[t]]."""
        return torch.argsort(self.rank_order)

    def shard(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's tokens of a full-sequence tensor."""
        return x.index_select(dim, self.positions)

    def unshard(self, gathered: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """Logical order from the rank-order concatenation of all shards."""
        return gathered.index_select(dim, self.gathered_order)

    def reshard(self, logical: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """Rank order (ready for a reduce-scatter into the shards) from the logical order (the inverse of unshard)."""
        return logical.index_select(dim, self.rank_order)


def attend_shard(q: torch.Tensor, k_full: torch.Tensor, v_full: torch.Tensor, layout: SeqLayout) -> torch.Tensor:
    """Causal attention of this rank's queries against the whole (logical-order) K/V.

    q: [B, n_q, S/D, d] in local order; k_full, v_full: [B, n_kv, S, d]. Each local chunk is contiguous in
    the global sequence, so it attends to the key prefix that ends at its last token (lower-right causal
    mask); nothing S×S is built. Returns [B, n_q, S/D, d] in local order.
    """
    outs, lo = [], 0
    for start, n in layout.chunks:
        end = start + n
        outs.append(causal_attention(q[:, :, lo : lo + n], k_full[:, :, :end], v_full[:, :, :end], q_offset=start))
        lo += n
    return torch.cat(outs, dim=2)


@dataclass(frozen=True)
class SplitLayout(SeqLayout):
    """Contiguous piece `part` of `parts` of this rank's shard (in local order), for token-wise work only
    (embedding, norms, residuals, LM head): tp_sp with Megatron-SP and a replicated vocabulary, where rank
    (σ, t) holds piece t of zigzag shard σ, i.e. S/(T·Σ) tokens (docs/method.md#choice-tp-sp-msp). `degree` and
    `rank` stay the shard's (Σ, σ); attention uses the shard's SeqLayout, never this one. Over the flattened
    sp × tp group (rank σ·T + t) the pieces concatenate to the shards' rank order, so `unshard` is SeqLayout's."""

    parts: int = 1
    part: int = 0

    @property
    def positions(self) -> torch.Tensor:
        n = self.seq_len // (self.degree * self.parts)
        return self.positions_of(self.rank)[self.part * n : (self.part + 1) * n]

    @property
    def local_len(self) -> int:
        return self.seq_len // (self.degree * self.parts)
