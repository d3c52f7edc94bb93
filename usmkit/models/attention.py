"""Multi-head self-attention with rotary positions (or a relative-position bias) under the chunk-wise mask.

Shapes: B batch, T frames, D model dim, H heads, Dh = D / H head dim.

Pre-norm LayerNorm -> fused q/k/v projection -> rotary on q and k (``project_qkv``) -> attention
-> output projection -> dropout (``project_out``). The three steps are separate methods, called by
``ConformerBlock``: over a whole sequence the attention is ``attend`` (``chunk_attention``: one
signature, several implementations, ``usmkit.kernels.chunk_attention.api``); a streaming step
attends over the cached keys and values of the left chunks instead, with the same weights.

``position="relative_key"`` (w2v-BERT 2.0): q and k are not rotated; a learned embedding ``E`` of each key -
query distance clipped to [-left, right] adds ``q . E[d] / sqrt(Dh)`` to the scores (``relative_bias``).

``position="rel_pos_xl"`` (Transformer-XL, NeMo's ``RelPositionMultiHeadAttention``; NEST): the score of query
``i`` and key ``j`` is ``((q_i + u) . k_j + (q_i + v) . P(i - j)) / sqrt(Dh)``, where ``u``, ``v`` (H, Dh) are
learned per layer and ``P(r)`` is ``linear_pos`` of the sinusoidal encoding of distance ``r``
(``xl_sinusoids``). ``project_qkv`` returns ``q + u`` as the query; the second term is a ``RelativeKeyBias``
whose table covers every distance of the keys at hand, so it never clips.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from usmkit.kernels.chunk_attention.api import Impl, chunk_attention
from usmkit.kernels.chunk_attention.bias import RelativeKeyBias
from usmkit.models.dropout import Dropout
from usmkit.models.rotary import RotaryTable, apply_rotary


class MultiHeadSelfAttention(nn.Module):
    """The attention's weights and its steps; ``ConformerBlock`` calls them (the module has no ``forward``)."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float,
        impl: Impl,
        rotary_base: float = 10000.0,
        position: str = "rotary",
        relative_left: int = 64,
        relative_right: int = 8,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} must be divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.impl = impl
        self.rotary_base = rotary_base
        self.position = position
        self.relative_left, self.relative_right = relative_left, relative_right
        if position == "relative_key":  # one embedding per clipped distance, shared by the heads
            self.distance_embedding = nn.Embedding(relative_left + relative_right + 1, d_model // num_heads)
        if position == "rel_pos_xl":  # Transformer-XL: a projection of the sinusoids, two biases per head
            self.linear_pos = nn.Linear(d_model, d_model, bias=False)
            self.pos_bias_u = nn.Parameter(torch.zeros(num_heads, d_model // num_heads))
            self.pos_bias_v = nn.Parameter(torch.zeros(num_heads, d_model // num_heads))
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = Dropout(dropout)

    def project_qkv(
        self, x: torch.Tensor, positions: torch.Tensor | RotaryTable
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, D), positions (T,) or (B, T) absolute frame indices (or their ``RotaryTable``) ->
        rotated q, k and v, each (B, H, T, Dh) (not rotated with ``position="relative_key"``)."""
        B, T, D = x.shape
        qkv = self.qkv(self.norm(x)).view(B, T, 3, self.num_heads, D // self.num_heads)  # (B, T, 3, H, Dh)
        qkv = qkv.permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
        if self.position == "rel_pos_xl":
            return qkv[0] + self.pos_bias_u.to(x.dtype)[:, None, :], qkv[1], qkv[2]  # q + u
        if self.position != "rotary":
            return qkv[0], qkv[1], qkv[2]
        q, k = apply_rotary(qkv[:2], positions, self.rotary_base).unbind(0)  # q and k in one go: (B, H, T, Dh) each
        return q, k, qkv[2]

    def relative_bias(self, q: torch.Tensor, key_offset: int = 0) -> RelativeKeyBias | None:
        """The score bias of queries q (B, H, Tq, Dh) whose keys start ``key_offset`` frames before them; None
        for rotary positions."""
        if self.position == "rel_pos_xl":
            return self._xl_bias(q, key_offset)
        if self.position != "relative_key":
            return None
        table = torch.matmul(q, self.distance_embedding.weight.to(q.dtype).t()) * q.shape[-1] ** -0.5  # (B, H, Tq, W)
        return RelativeKeyBias(table, self.relative_left, self.relative_right, key_offset)

    def _xl_bias(self, q: torch.Tensor, key_offset: int) -> RelativeKeyBias:
        """Transformer-XL's position term for queries ``q + u`` (B, H, Tq, Dh) over ``key_offset + Tq`` keys: its
        table has one column per key - query distance ``d`` in [-(key_offset + Tq - 1), Tq - 1], the sinusoid of
        ``r = -d`` (NeMo's ``RelPositionalEncoding`` order, from the largest ``r`` down)."""
        B, H, Tq, Dh = q.shape
        left, right = key_offset + Tq - 1, Tq - 1
        r = torch.arange(left, -right - 1, -1, device=q.device, dtype=torch.float32)  # (W,) query - key distances
        p = self.linear_pos(xl_sinusoids(r, H * Dh).to(q.dtype)).view(-1, H, Dh).transpose(0, 1)  # (H, W, Dh)
        qv = q + (self.pos_bias_v - self.pos_bias_u).to(q.dtype)[:, None, :]  # (B, H, Tq, Dh): q + v
        table = torch.matmul(qv, p.transpose(1, 2)) * Dh**-0.5  # (B, H, Tq, W)
        return RelativeKeyBias(table, left, right, key_offset)

    def project_out(self, attn: torch.Tensor) -> torch.Tensor:
        """attn (B, H, T, Dh) -> residual branch (B, T, D)."""
        B, H, T, Dh = attn.shape
        y = attn.transpose(1, 2).reshape(B, T, H * Dh)  # (B, T, D)
        return self.dropout(self.out(y))

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        lengths: torch.Tensor,
        chunk_size: int | None,
        left_chunks: int,
    ) -> torch.Tensor:
        """q, k, v (B, H, T, Dh), lengths (B,) -> (B, H, T, Dh) under the chunk mask, with this module's
        implementation; padded queries give 0."""
        bias = self.relative_bias(q)
        return chunk_attention(q, k, v, lengths, chunk_size, left_chunks, impl=self.impl, bias=bias)


def xl_sinusoids(r: torch.Tensor, d_model: int) -> torch.Tensor:
    """Transformer-XL's sinusoidal encoding of distances ``r`` (W,) float32 -> (W, d_model): ``sin`` in the even
    channels, ``cos`` in the odd ones, frequencies ``10000^(-2c / d_model)`` (NeMo's ``PositionalEncoding.create_pe``).

    >>> xl_sinusoids(torch.tensor([0.0]), 4).tolist()
    [[0.0, 1.0, 0.0, 1.0]]
    """
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32, device=r.device) * -(math.log(10000.0) / d_model))
    pe = torch.zeros(r.shape[0], d_model, device=r.device)
    pe[:, 0::2] = torch.sin(r[:, None] * div)
    pe[:, 1::2] = torch.cos(r[:, None] * div)
    return pe
