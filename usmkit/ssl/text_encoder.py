"""MOST's text encoder: text tokens -> frames in the space of the speech encoder's block-k input.

Shapes: B batch, U tokens, T encoder frames (40 ms), D model dim (the speech encoder's), V vocabulary.

    tokens (B, U) -> embedding -> token Conformer blocks -> states (B, U, D)
    states -> DurationPredictor -> log durations (B, U)                   (trained on CTC alignments)
    states, durations -> upsample (+ offset-in-token embedding) -> frame Conformer blocks -> (B, T, D)

The blocks are the speech encoder's ``ConformerBlock`` with its width, heads and convolution; token
blocks attend over the whole sentence, frame blocks use the speech encoder's chunk mask (the shared
blocks that follow see text frames as they see speech frames). The output ends in the block's
LayerNorm, as the speech encoder's block outputs do.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from usmkit.kernels.masks import lengths_to_padding_mask
from usmkit.models.config import ConformerConfig
from usmkit.models.conformer import ConformerBlock
from usmkit.models.rotary import RotaryTable
from usmkit.ssl.duration import DurationPredictor, upsample


def run_blocks(
    blocks: nn.ModuleList, x: torch.Tensor, lengths: torch.Tensor, cfg: ConformerConfig, chunk_size: int | None
) -> torch.Tensor:
    """x (B, L, D) with (B,) valid positions through ``blocks`` -> (B, L, D), padded positions set to 0."""
    L = x.shape[1]
    valid = ~lengths_to_padding_mask(lengths, L)  # (B, L)
    rotary = RotaryTable.build(torch.arange(L, device=x.device), cfg.head_dim, cfg.rotary_base)
    for block in blocks:
        x = block(x, lengths, valid, rotary, chunk_size, cfg.left_chunks)
    return x.masked_fill(~valid[:, :, None], 0.0)


class TextEncoder(nn.Module):
    """Token embedding, token blocks, duration model, upsampler and frame blocks (see the module docstring)."""

    def __init__(
        self, vocab_size: int, cfg: ConformerConfig, token_blocks: int, frame_blocks: int, max_token_frames: int
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.max_token_frames = max_token_frames
        self.embed = nn.Embedding(vocab_size, cfg.d_model)
        self.token_blocks = nn.ModuleList(ConformerBlock(cfg) for _ in range(token_blocks))
        self.duration = DurationPredictor(cfg.d_model)
        # Frames of one token start equal; where a frame lies inside its token (clipped) tells them apart.
        self.offset = nn.Embedding(max_token_frames, cfg.d_model)
        self.frame_blocks = nn.ModuleList(ConformerBlock(cfg) for _ in range(frame_blocks))
        nn.init.normal_(self.embed.weight, std=1.0)
        nn.init.zeros_(self.offset.weight)

    def encode_tokens(self, tokens: torch.Tensor, token_lens: torch.Tensor) -> torch.Tensor:
        """tokens (B, U) padded with -1, token_lens (B,) -> token states (B, U, D), padding 0."""
        x = self.embed(tokens.clamp(min=0))  # (B, U, D)
        if torch.is_autocast_enabled(x.device.type):
            x = x.float()  # the residual stream in fp32, as in the speech encoder
        return run_blocks(self.token_blocks, x, token_lens, self.cfg, chunk_size=None)

    def log_durations(self, states: torch.Tensor) -> torch.Tensor:
        """Token states (B, U, D) -> predicted log durations (B, U) in encoder frames."""
        return self.duration(states)

    def frames(
        self,
        states: torch.Tensor,
        durations: torch.Tensor,
        num_frames: int | None = None,
        round_up: Callable[[int], int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token states (B, U, D), durations (B, U) int64 (0 at padded tokens) -> frames (B, T, D) and
        lengths (B,) = durations.sum(1); T = ``num_frames`` when given (e.g. the speech's padded length),
        else the longest row's frames, raised to ``round_up`` of them when given (``upsample``)."""
        x, lengths, _, offset = upsample(states, durations, num_frames, round_up)  # (B, T, D), (B,), _, (B, T)
        x = x + self.offset(offset.clamp(max=self.max_token_frames - 1))
        return run_blocks(self.frame_blocks, x, lengths, self.cfg, self.cfg.chunk_size), lengths
