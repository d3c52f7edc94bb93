"""LAS head: an autoregressive attention decoder over the encoder output.

Shapes: B batch (N = batch x beam in search), T encoder frames, E encoder dim, D decoder dim,
L decoder positions, U target tokens, V vocabulary, H heads, Dh = D / H, S cache slots, K layers.

Why a Transformer decoder rather than the LSTM of the original LAS paper: it trains all positions
in parallel under teacher forcing (one pass, no Python loop over tokens), and scoring a whole
hypothesis in one pass is exactly what the attention rescoring of CTC n-best lists needs
(``usmkit.decoding.rescoring``). Search uses ``step()`` with a key/value cache: each new token costs
one query against cached keys instead of recomputing the prefix (O(L) instead of O(L^2) per token);
the cross-attention keys/values of the encoder output are computed once per utterance.

Layers are pre-norm (LayerNorm before each sublayer, residual around it): causal self-attention,
cross-attention to the encoder output under the encoder padding mask, feed-forward. Positions are
sinusoidal (no length limit, nothing to learn; the cache only needs the step index).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from usmkit.kernels.masks import lengths_to_padding_mask

BOS_ID = 2
EOS_ID = 3


@dataclass(frozen=True)
class LASConfig:
    """Attention-decoder hyper-parameters. ``dim=None``: decoder width = encoder width."""

    num_layers: int = 2  # decoder blocks: a small decoder over the encoder's output
    num_heads: int = 4
    ff_mult: int = 4
    dropout: float = 0.1
    label_smoothing: float = 0.1
    dim: int | None = None  # decoder width; null = the encoder width
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise ValueError(f"LASConfig.num_layers must be >= 1, got {self.num_layers}")
        if self.num_heads < 1 or self.ff_mult < 1:
            raise ValueError(f"LASConfig.num_heads and ff_mult must be >= 1, got {self.num_heads}, {self.ff_mult}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LASConfig.dropout must be in [0, 1), got {self.dropout}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"LASConfig.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.dim is not None and self.dim % self.num_heads != 0:
            raise ValueError(f"LASConfig.dim={self.dim} must be divisible by num_heads={self.num_heads}")


@dataclass
class DecoderState:
    """Everything ``LASDecoder.step`` needs between tokens, as explicit data.

    The self-attention cache is preallocated for ``S`` tokens and filled in place (no concatenation
    per token); ``length`` tokens have been consumed so far.
    """

    self_k: torch.Tensor  # (K, N, H, S, Dh)
    self_v: torch.Tensor  # (K, N, H, S, Dh)
    cross_k: torch.Tensor  # (K, N, H, T, Dh): encoder output projected once per utterance
    cross_v: torch.Tensor  # (K, N, H, T, Dh)
    memory_mask: torch.Tensor  # (N, 1, 1, T) bool, True where a frame may be attended to
    length: int = 0

    def reorder(self, index: torch.Tensor, memory_too: bool = True) -> DecoderState:
        """Select rows ``index`` (N',) of the batch, e.g. the surviving beams after a search step.

        ``memory_too=False`` keeps the encoder-side tensors as they are: correct (and cheaper) when
        ``index`` only permutes rows that share the same encoder output, as beams of one utterance do.
        """
        out = replace(self, self_k=self.self_k.index_select(1, index), self_v=self.self_v.index_select(1, index))
        if memory_too:
            out.cross_k = self.cross_k.index_select(1, index)
            out.cross_v = self.cross_v.index_select(1, index)
            out.memory_mask = self.memory_mask.index_select(0, index)
        return out


def sinusoid_positions(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """positions (L,) -> (L, dim) sinusoidal encoding of Vaswani et al."""
    half = dim // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, device=positions.device, dtype=torch.float32) / half)
    angle = positions.float()[:, None] * freq[None, :]  # (L, half)
    pe = torch.cat([angle.sin(), angle.cos()], dim=-1)  # (L, 2 * half)
    return F.pad(pe, (0, dim - 2 * half))  # (L, dim)


class _Attention(nn.Module):
    """Multi-head attention with separate query and key/value projections (so keys/values can be cached)."""

    def __init__(self, dim: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)
        self.dropout = dropout

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, L, D) -> k, v each (B, H, L, Dh)."""
        B, L, D = x.shape
        kv = self.kv(x).view(B, L, 2, self.num_heads, D // self.num_heads)  # (B, L, 2, H, Dh)
        k, v = kv.permute(2, 0, 3, 1, 4)  # each (B, H, L, Dh)
        return k, v

    def attend(
        self,
        x: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        causal: bool = False,
    ) -> torch.Tensor:
        """Queries from x (B, L, D) against k, v (B, H, S, Dh); mask broadcastable to (B, H, L, S)."""
        B, L, D = x.shape
        q = self.q(x).view(B, L, self.num_heads, D // self.num_heads).transpose(1, 2)  # (B, H, L, Dh)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=causal
        )  # (B, H, L, Dh)
        return self.out(y.transpose(1, 2).reshape(B, L, D))  # (B, L, D)


class _DecoderLayer(nn.Module):
    def __init__(self, dim: int, num_heads: int, ff_mult: int, dropout: float) -> None:
        super().__init__()
        self.norm_self = nn.LayerNorm(dim)
        self.self_attn = _Attention(dim, num_heads, dropout)
        self.norm_cross = nn.LayerNorm(dim)
        self.cross_attn = _Attention(dim, num_heads, dropout)
        self.norm_ff = nn.LayerNorm(dim)
        self.ff = nn.Sequential(
            nn.Linear(dim, ff_mult * dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(ff_mult * dim, dim)
        )
        self.drop = nn.Dropout(dropout)

    def _cross_and_ff(
        self, x: torch.Tensor, cross_k: torch.Tensor, cross_v: torch.Tensor, memory_mask: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.drop(self.cross_attn.attend(self.norm_cross(x), cross_k, cross_v, mask=memory_mask))
        return x + self.drop(self.ff(self.norm_ff(x)))

    def forward(
        self, x: torch.Tensor, cross_k: torch.Tensor, cross_v: torch.Tensor, memory_mask: torch.Tensor
    ) -> torch.Tensor:
        """All positions at once (teacher forcing): x (B, L, D) -> (B, L, D)."""
        h = self.norm_self(x)
        k, v = self.self_attn.project_kv(h)  # (B, H, L, Dh)
        x = x + self.drop(self.self_attn.attend(h, k, v, causal=True))
        return self._cross_and_ff(x, cross_k, cross_v, memory_mask)

    def step(
        self,
        x: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        pos: int,
        cross_k: torch.Tensor,
        cross_v: torch.Tensor,
        memory_mask: torch.Tensor,
    ) -> torch.Tensor:
        """One new position: x (N, 1, D); writes its key/value into cache_k/v (N, H, S, Dh) at ``pos``."""
        h = self.norm_self(x)
        k, v = self.self_attn.project_kv(h)  # (N, H, 1, Dh)
        cache_k[:, :, pos : pos + 1] = k
        cache_v[:, :, pos : pos + 1] = v
        # The cache holds only positions <= pos, so no causal mask is needed.
        x = x + self.drop(self.self_attn.attend(h, cache_k[:, :, : pos + 1], cache_v[:, :, : pos + 1]))
        return self._cross_and_ff(x, cross_k, cross_v, memory_mask)


class LASDecoder(nn.Module):
    """Transformer attention decoder (the LAS head). See the module docstring for the design."""

    def __init__(
        self, encoder_dim: int, vocab_size: int, cfg: LASConfig, bos_id: int = BOS_ID, eos_id: int = EOS_ID
    ) -> None:
        super().__init__()
        dim = cfg.dim or encoder_dim
        if dim % cfg.num_heads != 0:
            raise ValueError(
                f"LAS decoder dim {dim} (encoder dim unless LASConfig.dim is set) must be divisible by num_heads={cfg.num_heads}"
            )
        if not (0 <= bos_id < vocab_size and 0 <= eos_id < vocab_size):
            raise ValueError(f"bos_id={bos_id} and eos_id={eos_id} must be inside the vocabulary of {vocab_size}")
        self.cfg = cfg
        self.dim = dim
        self.vocab_size = vocab_size
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.memory_proj = nn.Linear(encoder_dim, dim) if dim != encoder_dim else nn.Identity()
        self.embed = nn.Embedding(vocab_size, dim)
        nn.init.normal_(self.embed.weight, std=dim**-0.5)  # x sqrt(dim) at the input -> unit variance
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(
            [_DecoderLayer(dim, cfg.num_heads, cfg.ff_mult, cfg.dropout) for _ in range(cfg.num_layers)]
        )
        self.norm = nn.LayerNorm(dim)
        self.out = None if cfg.tie_embeddings else nn.Linear(dim, vocab_size)

    # ----------------------------------------------------------------- shared pieces
    def _embed(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """tokens (N, L) at positions start..start+L-1 -> (N, L, D)."""
        pos = sinusoid_positions(torch.arange(start, start + tokens.shape[1], device=tokens.device), self.dim)
        return self.drop(self.embed(tokens) * math.sqrt(self.dim) + pos.to(self.embed.weight.dtype))

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        return x @ self.embed.weight.t() if self.out is None else self.out(x)  # (N, L, V)

    def _memory(
        self, enc: torch.Tensor, enc_lens: torch.Tensor
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """Per-layer cross-attention keys/values ((B, H, T, Dh) each) and the (B, 1, 1, T) memory mask."""
        if enc.dim() != 3 or enc_lens.shape != enc.shape[:1]:
            raise ValueError(
                f"enc must be (B, T, E) and enc_lens (B,), got {tuple(enc.shape)} and {tuple(enc_lens.shape)}"
            )
        memory = self.memory_proj(enc)  # (B, T, D)
        mask = ~lengths_to_padding_mask(enc_lens.to(enc.device), enc.shape[1])[:, None, None, :]  # (B, 1, 1, T)
        return [layer.cross_attn.project_kv(memory) for layer in self.layers], mask

    # ----------------------------------------------------------------- teacher forcing
    def forward(self, enc: torch.Tensor, enc_lens: torch.Tensor, ys_in: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits: ys_in (B, L) starts with <s>; returns (B, L, V).

        Right padding of ``ys_in`` needs no mask: under the causal mask a valid position never sees a
        later (padded) one. Every row needs ``enc_lens >= 1``.
        """
        memory_kv, mask = self._memory(enc, enc_lens)
        x = self._embed(ys_in, start=0)
        for layer, (ck, cv) in zip(self.layers, memory_kv, strict=True):
            x = layer(x, ck, cv, mask)
        return self._logits(x)

    def make_targets(self, tokens: torch.Tensor, token_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (B, U) padded with -1 -> ys_in (B, U+1) = <s> y, ys_out (B, U+1) = y </s>, padded with -1.

        Tensor ops only (no ``.item()``), so it traces under ``torch.compile``.
        """
        B, U = tokens.shape
        valid = torch.arange(U, device=tokens.device)[None, :] < token_lens[:, None]  # (B, U)
        bos = torch.full((B, 1), self.bos_id, dtype=tokens.dtype, device=tokens.device)
        ys_in = torch.cat([bos, torch.where(valid, tokens, self.eos_id)], dim=1)  # (B, U+1), pad with any valid id
        pad = torch.full((B, 1), -1, dtype=tokens.dtype, device=tokens.device)
        ys_out = torch.cat([torch.where(valid, tokens, -1), pad], dim=1)  # (B, U+1)
        ys_out = ys_out.scatter(1, token_lens[:, None].long(), self.eos_id)  # </s> right after the last token
        return ys_in, ys_out

    def loss(
        self, enc: torch.Tensor, enc_lens: torch.Tensor, tokens: torch.Tensor, token_lens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Label-smoothed cross-entropy (summed over tokens incl. </s>, divided by B) and token accuracy.

        Same normalization as ``usmkit.models.ctc.ctc_loss`` so the two mix on one scale.
        """
        ys_in, ys_out = self.make_targets(tokens, token_lens)
        logits = self(enc, enc_lens, ys_in).float()  # (B, U+1, V)
        loss = F.cross_entropy(
            logits.reshape(-1, self.vocab_size),  # (B * (U+1), V)
            ys_out.reshape(-1),
            ignore_index=-1,
            label_smoothing=self.cfg.label_smoothing,
            reduction="sum",
        )
        target = ys_out != -1  # (B, U+1): at least the </s> of every row
        correct = (logits.argmax(dim=-1) == ys_out) & target
        acc = correct.sum().float() / target.sum().float()
        return loss / tokens.shape[0], acc.detach()

    def score(self, enc: torch.Tensor, enc_lens: torch.Tensor, hyps: list[tuple[int, ...]]) -> torch.Tensor:
        """Sum of log p(token | prefix) over each hypothesis plus </s>: (N,) for N hypotheses.

        enc (N, T, E) and enc_lens (N,) hold the encoder output of each hypothesis's utterance.
        """
        if len(hyps) != enc.shape[0]:
            raise ValueError(f"got {len(hyps)} hypotheses for {enc.shape[0]} encoder rows; pass one row per hypothesis")
        U = max((len(h) for h in hyps), default=0)
        tokens = torch.full((len(hyps), U), -1, dtype=torch.long)
        for i, h in enumerate(hyps):
            tokens[i, : len(h)] = torch.tensor(h, dtype=torch.long)
        tokens = tokens.to(enc.device)
        token_lens = torch.tensor([len(h) for h in hyps], dtype=torch.long, device=enc.device)
        ys_in, ys_out = self.make_targets(tokens, token_lens)
        log_probs = self(enc, enc_lens, ys_in).float().log_softmax(dim=-1)  # (N, U+1, V)
        target = ys_out != -1
        picked = log_probs.gather(-1, ys_out.clamp(min=0)[..., None]).squeeze(-1)  # (N, U+1)
        return (picked * target).sum(dim=1)

    # ----------------------------------------------------------------- incremental decoding
    def init_state(self, enc: torch.Tensor, enc_lens: torch.Tensor, max_steps: int) -> DecoderState:
        """Empty cache for up to ``max_steps`` tokens (including the <s> fed at step 0)."""
        memory_kv, mask = self._memory(enc, enc_lens)
        N, T = enc.shape[:2]
        H = self.cfg.num_heads
        cross_k = torch.stack([k for k, _ in memory_kv])  # (K, N, H, T, Dh)
        cross_v = torch.stack([v for _, v in memory_kv])  # (K, N, H, T, Dh)
        self_k = cross_k.new_zeros(len(self.layers), N, H, max_steps, self.dim // H)  # (K, N, H, S, Dh)
        return DecoderState(self_k, torch.zeros_like(self_k), cross_k, cross_v, mask, length=0)

    def step(self, tokens: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, DecoderState]:
        """Feed one token per row: tokens (N,) -> log-probs (N, V) of the next token, and the new state.

        Inference only (no autograd through the cache): the cache buffers are written in place, so the
        state passed in must not be reused afterwards.
        """
        pos = state.length
        if pos >= state.self_k.shape[3]:
            raise ValueError(f"decoder cache is full ({pos} steps); call init_state with a larger max_steps")
        x = self._embed(tokens[:, None], start=pos)  # (N, 1, D)
        for i, layer in enumerate(self.layers):
            x = layer.step(
                x, state.self_k[i], state.self_v[i], pos, state.cross_k[i], state.cross_v[i], state.memory_mask
            )
        log_probs = self._logits(x)[:, 0].float().log_softmax(dim=-1)  # (N, V)
        return log_probs, replace(state, length=pos + 1)
