"""A score bias from a learned table of clipped relative distances (w2v-BERT 2.0's ``relative_key`` positions).

Shapes: B batch, H heads, Tq queries, Tk keys, W = left + right + 1 distances.

The bias of query ``i`` and key ``j`` is ``table[b, h, i, clamp(j - i, -left, right) + left]``: the table
holds each query's dot product with every distance embedding (``q . E[d]``, already scaled), so the bias
is a gather, never a (B, H, Tq, Tk, Dh) product. Keys are counted from ``key_offset`` frames before the
first query: a streaming step's keys start with the cached left chunks (``key_offset`` = their number of
frames), the full forward's keys are its queries (``key_offset=0``). Packed rows need no positions of their
own: inside one utterance the distance of two frames of a row is their distance in the utterance, and pairs
of two utterances are masked anyway.

The SDPA and reference paths add ``dense()`` (B, H, Tq, Tk) to the scores; FlexAttention adds the same
entries in its ``score_mod`` without materializing them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RelativeKeyBias:
    """``table`` (B, H, Tq, left + right + 1) scaled ``q . E[d]`` per clipped distance ``d`` in [-left, right]."""

    table: torch.Tensor
    left: int
    right: int
    key_offset: int = 0  # keys before the first query (a streaming step's cached frames)

    def __post_init__(self) -> None:
        if self.table.dim() != 4 or self.table.shape[-1] != self.left + self.right + 1:
            raise ValueError(
                f"RelativeKeyBias.table must be (B, H, Tq, left + right + 1 = {self.left + self.right + 1}), "
                f"got {tuple(self.table.shape)}"
            )

    def index(self, Tk: int) -> torch.Tensor:
        """(Tq, Tk) long: the table column of every (query, key) pair.

        >>> t = torch.zeros(1, 1, 3, 4)
        >>> RelativeKeyBias(t, left=2, right=1).index(3).tolist()
        [[2, 3, 3], [1, 2, 3], [0, 1, 2]]
        """
        Tq = self.table.shape[2]
        q = torch.arange(Tq, device=self.table.device)[:, None] + self.key_offset  # (Tq, 1) query's key index
        k = torch.arange(Tk, device=self.table.device)[None, :]  # (1, Tk)
        return (k - q).clamp(-self.left, self.right) + self.left  # (Tq, Tk)

    def dense(self, Tk: int) -> torch.Tensor:
        """(B, H, Tq, Tk) bias of every (query, key) pair."""
        B, H, Tq, W = self.table.shape
        idx = self.index(Tk).expand(B, H, Tq, Tk)  # (B, H, Tq, Tk)
        return torch.gather(self.table, 3, idx)

    def score_mod(self):
        """FlexAttention's ``score_mod`` adding this bias (full forward: ``key_offset`` 0)."""
        table, left, right, offset = self.table, self.left, self.right, self.key_offset

        def add_bias(score, b, h, q_idx, kv_idx):
            d = torch.clamp(kv_idx - q_idx - offset, -left, right) + left
            return score + table[b, h, q_idx, d]

        return add_bias
