"""The chunk-wise-attention Conformer encoder (USM's encoder).

Shapes: B batch, T feature frames (10 ms), F feature bins, T' encoder frames (40 ms at 4x subsampling,
80 ms at 8x), D model dim.

features (B, T, F) -> 4x or 8x conv2d subsampling -> num_layers x ConformerBlock -> (B, T', D).
Block (pre-norm, macaron): x + 0.5 FF(x); x + MHSA(x); x + Conv(x); x + 0.5 FF(x); LayerNorm. The
streaming step (``usmkit.streaming.step``) runs the same block body chunk by chunk.
Attention sees only what the chunk mask allows (``usmkit.kernels.masks``); convolution crosses chunk
edges. Padded frames never influence valid ones: attention masks padded keys, the convolution
zeroes them first, the rest works frame by frame. The forward has no data-dependent Python control
flow (no ``.item()``), so ``torch.compile(fullgraph=True)`` can trace it.

Packed rows (several utterances per row, ``forward_packed``): the blocks take the encoder frames'
``Segments`` in place of lengths; attention stays inside each utterance with chunks and rotary positions
counted from its start, the depthwise convolution's taps stop at its edges, and the rest is per frame, so
every utterance gets the output it gets alone (``usmkit.models.packing`` says why the front end may run on
the packed rows as they are).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from usmkit.data.packing import Packing
from usmkit.kernels.masks import Frames, Segments, check_chunk_args, lengths_to_padding_mask
from usmkit.models.attention import MultiHeadSelfAttention
from usmkit.models.config import ConformerConfig
from usmkit.models.convolution import ConvolutionModule
from usmkit.models.feedforward import FeedForward
from usmkit.models.packing import encoder_segments, unpack
from usmkit.models.rotary import RotaryTable
from usmkit.models.subsampling import Conv2dSubsampling, DwStridingSubsampling, StackingFrontEnd


class ConformerBlock(nn.Module):
    """One Conformer layer, written once for the full forward and the streaming step.

    Its body is two halves around the attention itself, as in torchaudio's Emformer layer: the full
    forward attends over the whole sequence under the chunk mask (``mhsa.attend``), while
    ``usmkit.streaming.step`` attends over the cached keys and values of the left chunks and
    passes the cached convolution inputs as ``conv_context``. Everything else is these two methods::

        x, q, k, v = block.before_attention(x, positions)  # x + 0.5 FF(x); rotated q, k, v
        attn = ...                                          # (B, H, T', Dh): attention of q over k, v
        x, conv_in = block.after_attention(x, attn, valid, conv_context)  # + MHSA, + Conv, + 0.5 FF, norm
    """

    def __init__(self, cfg: ConformerConfig) -> None:
        super().__init__()
        act, eps = cfg.activation, cfg.layer_norm_eps
        self.ff1 = FeedForward(cfg.d_model, cfg.ff_mult, cfg.dropout, act, eps)
        self.mhsa = MultiHeadSelfAttention(
            cfg.d_model, cfg.num_heads, cfg.dropout, impl=cfg.attention_impl, rotary_base=cfg.rotary_base,
            position=cfg.position, relative_left=cfg.relative_left, relative_right=cfg.relative_right, eps=eps,
        )  # fmt: skip
        self.conv = ConvolutionModule(
            cfg.d_model, cfg.conv_kernel, cfg.causal_conv, cfg.dropout, impl=cfg.conv_impl, activation=act, eps=eps,
            norm=cfg.conv_norm,
        )  # fmt: skip
        self.ff2 = FeedForward(cfg.d_model, cfg.ff_mult, cfg.dropout, act, eps)
        self.norm = nn.LayerNorm(cfg.d_model, eps=eps)

    def before_attention(
        self, x: torch.Tensor, positions: torch.Tensor | RotaryTable
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T', D), positions (T',) or their ``RotaryTable`` -> x after the first half feed-forward
        (B, T', D) and the attention's rotated q, k, v, each (B, H, T', Dh)."""
        x = x + 0.5 * self.ff1(x)
        q, k, v = self.mhsa.project_qkv(x, positions)
        return x, q, k, v

    def after_attention(
        self,
        x: torch.Tensor,
        attn: torch.Tensor,
        valid: torch.Tensor,
        conv_context: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, T', D) from ``before_attention``, attn (B, H, T', Dh), valid (B, T') bool, conv_context
        (B, Kc - 1, D) or None (zero padding), segment_ids (B, T') of packed rows or None -> the block's
        output (B, T', D) and the depthwise convolution's input (B, T', D), whose last frames are the next
        chunk's ``conv_context``; None without ``conv_context`` (the full forward), where the convolution module
        runs whole (fused where ``conv_impl`` says so)."""
        x = x + self.mhsa.project_out(attn)
        if conv_context is None:
            conv_in = None
            x = x + self.conv(x, valid, segment_ids)
        else:
            conv_in = self.conv.pointwise_in(x, valid)
            x = x + self.conv.pointwise_out(self.conv.depthwise(conv_in, conv_context, segment_ids))
        x = x + 0.5 * self.ff2(x)
        return self.norm(x), conv_in

    def forward(
        self,
        x: torch.Tensor,
        lengths: Frames,
        valid: torch.Tensor,
        positions: torch.Tensor | RotaryTable,
        chunk_size: int | None,
        left_chunks: int,
    ) -> torch.Tensor:
        """x (B, T', D), lengths (B,) or packed rows' ``Segments``, valid (B, T') bool, positions (T',) or
        (B, T') or their ``RotaryTable`` -> (B, T', D)."""
        x, q, k, v = self.before_attention(x, positions)
        attn = self.mhsa.attend(q, k, v, lengths, chunk_size, left_chunks)  # (B, H, T', Dh)
        segment_ids = lengths.ids if isinstance(lengths, Segments) else None
        return self.after_attention(x, attn, valid, segment_ids=segment_ids)[0]


class ConformerEncoder(nn.Module):
    """Chunk-wise-attention Conformer: (B, T, F) features, (B,) lengths -> (B, T', D), (B,) lengths."""

    def __init__(self, cfg: ConformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.subsampling: Conv2dSubsampling | StackingFrontEnd | DwStridingSubsampling
        if cfg.front_end == "dw_striding":
            self.subsampling = DwStridingSubsampling(
                cfg.input_dim, cfg.conv_channels, cfg.d_model, cfg.dropout, factor=cfg.subsampling_factor
            )
        elif cfg.front_end == "stack":
            self.subsampling = StackingFrontEnd(
                cfg.input_dim, cfg.subsampling_factor, cfg.d_model, cfg.dropout, eps=cfg.layer_norm_eps
            )
        else:
            self.subsampling = Conv2dSubsampling(
                cfg.input_dim, cfg.conv_channels, cfg.d_model, cfg.dropout, factor=cfg.subsampling_factor
            )
        self.blocks = nn.ModuleList(ConformerBlock(cfg) for _ in range(cfg.num_layers))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform linear projections with zero bias; convolutions and norms keep PyTorch's defaults.

        With ``zero_init_residual`` the last projection of every residual branch (both feed-forwards,
        the attention output, the convolution module's second pointwise) starts at zero, so each block
        starts as its final LayerNorm of the identity.
        """
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:  # rel_pos_xl's linear_pos has none
                    nn.init.zeros_(module.bias)
        if self.cfg.zero_init_residual:
            for block in self.blocks:
                for last in (block.ff1.down, block.ff2.down, block.mhsa.out, block.conv.pointwise2):
                    nn.init.zeros_(last.weight)

    @property
    def output_dim(self) -> int:
        return self.cfg.d_model

    @property
    def feature_context(self) -> int:
        """Feature frames two consecutive streaming chunks both read (3 at 4x conv subsampling, 0 stacked)."""
        return self.subsampling.feature_context

    @property
    def subsampling_factor(self) -> int:
        """Feature frames per encoder frame (4 or 8)."""
        return self.cfg.subsampling_factor

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Encoder frames for ``lengths`` feature frames, (B,) -> (B,)."""
        return self.subsampling.output_lengths(lengths)

    def forward(
        self,
        features: torch.Tensor,
        lengths: torch.Tensor,
        chunk_size: int | None | Literal["config"] = "config",
        left_chunks: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode a padded batch.

        features (B, T, F) zero-padded, lengths (B,) valid feature frames -> (B, T', D) with padded
        frames set to 0, and (B,) valid encoder frames. ``chunk_size`` / ``left_chunks`` default to the
        config's; pass them to evaluate the same weights under another mask (``chunk_size=None`` is full
        attention).
        """
        x, lengths, _ = self.forward_with_intermediate(features, lengths, (), chunk_size, left_chunks)
        return x, lengths

    def forward_with_intermediate(
        self,
        features: torch.Tensor,
        lengths: torch.Tensor,
        layers: tuple[int, ...],
        chunk_size: int | None | Literal["config"] = "config",
        left_chunks: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """``forward``, also returning the outputs of the blocks numbered ``layers`` (1 = the first
        block's output), each (B, T', D) with padded frames set to 0 (for intermediate CTC)."""
        if lengths.dim() != 1 or lengths.shape[0] != features.shape[0]:
            raise ValueError(
                f"lengths must be (batch,) = ({features.shape[0]},) valid frames per row, got {tuple(lengths.shape)}"
            )
        if any(not 1 <= k <= len(self.blocks) for k in layers):
            raise ValueError(f"intermediate layers {layers} must lie in 1..{len(self.blocks)} (the encoder's blocks)")
        x, lengths = self.front_end(features, lengths)  # (B, T', D), (B,)
        x, kept = self.run_blocks(x, lengths, 0, len(self.blocks), layers, chunk_size, left_chunks)
        return x, lengths, kept

    def forward_packed(
        self, features: torch.Tensor, lengths: torch.Tensor, packing: Packing, layers: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """``forward_with_intermediate`` of a packed batch, one utterance per row again at the end.

        features (R, N, F) packed rows, lengths (U,) valid feature frames per utterance -> (U, T', D) with
        utterance u's frames first in row u and zeros after them, (U,) valid encoder frames, and the blocks
        numbered ``layers`` likewise. Equal to ``forward_with_intermediate`` on the same utterances one per
        row, up to the padding length (tests/models/test_packed_encoder.py).
        """
        x, segments, kept = self.encode_packed(features, lengths, packing, layers)
        enc_lens = self.output_lengths(lengths)  # (U,)
        factor = self.subsampling_factor
        return unpack(x, packing, enc_lens, factor), enc_lens, [unpack(k, packing, enc_lens, factor) for k in kept]

    def encode_packed(
        self,
        features: torch.Tensor,
        lengths: torch.Tensor,
        packing: Packing,
        layers: tuple[int, ...] = (),
        chunk_size: int | None | Literal["config"] = "config",
        left_chunks: int | None = None,
    ) -> tuple[torch.Tensor, Segments, list[torch.Tensor]]:
        """Packed rows in, packed rows out: features (R, N, F), lengths (U,) -> (R, T', D) with padding set to
        0, the encoder frames' ``Segments`` (R, T'), and the outputs of the blocks numbered ``layers``."""
        if self.cfg.front_end == "dw_striding":
            raise ValueError(
                "front_end='dw_striding' (an imported NEST / FastConformer) reads across utterance edges in packed "
                "rows: train it without packing (data.pack_to_frames=0)"
            )
        if packing.align % self.subsampling_factor:
            raise ValueError(
                f"packed utterances start at multiples of {packing.align} feature frames, which the encoder's "
                f"{self.subsampling_factor}x subsampling does not stride to: pack with pack_align="
                f"{self.subsampling_factor}"
            )
        # The front end gets each row's frames, not each utterance's: its output lengths are not used here, and
        # (R,) keeps the compiled front end's inputs one shape whatever the number of utterances (U varies per
        # batch; with CUDA graphs each new U would record a new graph).
        rows = torch.full((features.shape[0],), features.shape[1], dtype=lengths.dtype, device=lengths.device)
        x, _ = self.front_end(features, rows)  # (R, T', D)
        segments = encoder_segments(packing, lengths, self.subsampling_factor, x.shape[1], self.cfg.front_end)
        x, kept = self.run_blocks(x, segments, 0, len(self.blocks), layers, chunk_size, left_chunks)
        return x, segments, kept

    # The encoder in two parts, for a second modality that enters at block k (MOST's text injection,
    # usmkit/ssl/most.py): front_end + run_blocks(0, k) for speech, run_blocks(k, num_layers) for both.
    # ``forward_with_intermediate`` is front_end + run_blocks(0, num_layers).

    def front_end(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features (B, T, F), lengths (B,) -> the first block's input (B, T', D) and valid encoder frames (B,)."""
        x, lengths = self.subsampling(features, lengths)  # (B, T', D), (B,)
        if torch.is_autocast_enabled(x.device.type):
            # Under CUDA's autocast each block returns its LayerNorm's fp32, while the front end's
            # projection returns bf16: start the residual stream in fp32 too, so every block sees one
            # dtype (compiled blocks: one graph per length, not two).
            x = x.float()
        return x, lengths

    def run_blocks(
        self,
        x: torch.Tensor,
        lengths: Frames,
        start: int,
        stop: int,
        layers: tuple[int, ...] = (),
        chunk_size: int | None | Literal["config"] = "config",
        left_chunks: int | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Blocks ``start .. stop - 1`` (0-based) on x (B, T', D) with (B,) valid frames (or, packed rows, the
        frames' ``Segments``).

        Returns their output (B, T', D) with padded frames set to 0, and the outputs of the blocks
        numbered ``layers`` (1 = the first block's output) among them, likewise. Padded input frames
        never reach valid output frames, so ``run_blocks(run_blocks(x, l, 0, k)[0], l, k, n)`` equals
        ``run_blocks(x, l, 0, n)`` (tests/models/test_conformer.py).
        """
        if isinstance(chunk_size, str):
            if chunk_size != "config":
                raise ValueError(f"chunk_size must be an int, None (full attention) or 'config', got {chunk_size!r}")
            chunk_size = self.cfg.chunk_size
        left_chunks = self.cfg.left_chunks if left_chunks is None else left_chunks
        check_chunk_args(chunk_size, left_chunks)
        if not 0 <= start <= stop <= len(self.blocks):
            raise ValueError(f"blocks {start}..{stop} must satisfy 0 <= start <= stop <= {len(self.blocks)}")
        T = x.shape[1]
        if isinstance(lengths, Segments):  # packed rows: rotary positions restart at every utterance
            valid, positions = lengths.valid, lengths.positions  # (B, T'), (B, T')
        else:
            valid = ~lengths_to_padding_mask(lengths, T)  # (B, T')
            positions = torch.arange(T, device=x.device)  # (T',) absolute frame indices for rotary
        rotary: torch.Tensor | RotaryTable = positions  # relative_key, rel_pos_xl: the attention takes no positions
        if self.cfg.position == "rotary":
            rotary = RotaryTable.build(positions, self.cfg.head_dim, self.cfg.rotary_base)  # shared by all layers
        padded = ~valid[:, :, None]  # (B, T', 1)
        kept = []
        for i in range(start, stop):
            x = self.blocks[i](x, lengths, valid, rotary, chunk_size, left_chunks)
            if i + 1 in layers:
                kept.append(x.masked_fill(padded, 0.0))
        return x.masked_fill(padded, 0.0), kept
