"""Offline encoding of an input of any length in flat memory: the full forward's output, window by window.

Shapes: t feature frames, F feature bins, T' encoder frames, C chunk size (encoder frames), K left
chunks, D model dim, s subsampling factor, W window (chunks).

The full forward over T' frames holds a (T', T') attention mask and per-head score matrices: memory
grows with the square of the input's length (a 30-minute file needs tens of GB). Under chunk-wise
attention (``chunk_size=C``, ``left_chunks=K >= 0``) each output frame depends on a bounded stretch of
input instead. In one block, a frame of chunk j:

- attends to the keys of its own chunk and of the K before it (``usmkit.kernels.masks``);
- goes through the depthwise convolution, which reads ``lc`` frames back and ``rc`` ahead (``rc = 0``
  when causal), i.e. the attention outputs of chunks ``j - cl .. j + cr`` with
  ``cl = ceil(lc / C)``, ``cr = ceil(rc / C)``;

so block i's output for chunks ``[j0, j1)`` is a function of block i's input for chunks
``[j0 - cl - K, j1 + cr)`` alone. A window that starts on a chunk boundary has the same chunk grid,
and with absolute rotary positions the same rotations, as the full forward; the frames it gets wrong
(edges without their left keys or convolution context) are exactly those outside ``[j0, j1)``, which
are dropped. Each block runs over windows of W output chunks with that context, one block behind the
other, and keeps only the context the next window needs. The convolution front end reads feature
frames ``s j .. s j + 2 s - 2`` for encoder frame j (no padding), so it windows the same way.

``WindowedEncoder.accept`` / ``flush`` therefore give the full forward's frames (to float rounding:
the attention sums over fewer masked keys) while holding about ``L (W + K + cl + cr + 1) C`` encoder
frames whatever the input's length. Full attention (``chunk_size=None``) and unbounded history
(``left_chunks=-1``) have no such bound: they are encoded whole (``usmkit.streaming.pipeline``).

>>> enc = ConformerEncoder(ConformerConfig(d_model=32, num_layers=2, num_heads=2, chunk_size=4, dropout=0.0)).eval()
>>> w = WindowedEncoder(enc, chunk_size=4, left_chunks=0, window_chunks=1)
>>> feats = torch.randn(1, 300, 80)
>>> out = torch.cat([w.accept(feats[:, :130]), w.accept(feats[:, 130:]), w.flush()], dim=1)
>>> torch.allclose(out, enc(feats, torch.tensor([300]))[0], atol=1e-5)
True
"""

from __future__ import annotations

import math

import torch

from usmkit.models.conformer import ConformerEncoder
from usmkit.models.rotary import RotaryTable

WINDOW_FRAMES = 512  # encoder frames a window aims at (20 s at 40 ms): whole chunks, at least one


class WindowedEncoder:
    """Feature frames (1, t, F) in, in pieces of any size; the full forward's encoder frames (1, n, D) out,
    encoded in windows of ``window_chunks`` chunks (default: about ``WINDOW_FRAMES`` frames).

    Batch size 1; the encoder in eval mode; ``left_chunks >= 0`` and ``chunk_size`` not None.
    """

    def __init__(
        self, encoder: ConformerEncoder, chunk_size: int, left_chunks: int, window_chunks: int | None = None
    ) -> None:
        if chunk_size is None or chunk_size <= 0 or left_chunks < 0:
            raise ValueError(
                f"windowed encoding needs chunk-wise attention with bounded history (chunk_size > 0, "
                f"left_chunks >= 0), got chunk_size={chunk_size}, left_chunks={left_chunks}"
            )
        self.encoder = encoder
        self.C, self.K = chunk_size, left_chunks
        self.W = window_chunks or max(1, WINDOW_FRAMES // chunk_size)
        if self.W < 1:
            raise ValueError(f"window_chunks must be >= 1, got {window_chunks}")
        conv = encoder.blocks[0].conv if len(encoder.blocks) else None
        lc = conv.left_context if conv is not None else 0
        rc = conv.kernel_size - 1 - lc if conv is not None else 0
        self.cl, self.cr = math.ceil(lc / chunk_size), math.ceil(rc / chunk_size)
        self.s = encoder.subsampling_factor
        self.receptive_field = encoder.subsampling.receptive_field  # 2 s - 1 feature frames per encoder frame
        self._feats: torch.Tensor | None = None  # (1, t, F) feature frames from feature frame s * front_done on
        self._feats_seen = 0
        self._front_done = 0  # encoder frames the front end made so far
        L = len(encoder.blocks)
        self._inputs: list[torch.Tensor | None] = [None] * L  # block i's input frames from _starts[i] on, (1, n, D)
        self._starts = [0] * L
        self._done = [0] * L  # block i's output frames made so far

    @property
    def held_frames(self) -> int:
        """Encoder frames (all blocks) and feature frames held between calls: bounded, whatever the input's length."""
        held = sum(x.shape[1] for x in self._inputs if x is not None)
        return held + (self._feats.shape[1] if self._feats is not None else 0)

    def accept(self, features: torch.Tensor) -> torch.Tensor:
        """features (1, t, F), t >= 0 -> the encoder frames (1, n, D) that became final (n >= 0)."""
        self._feats = features if self._feats is None else torch.cat([self._feats, features], dim=1)
        self._feats_seen += features.shape[1]
        return self._run(final=False)

    def flush(self) -> torch.Tensor:
        """End of the input: the remaining encoder frames (1, r, D)."""
        return self._run(final=True)

    def _run(self, final: bool) -> torch.Tensor:
        with torch.no_grad():
            x = self._front_end(final)
            for i, block in enumerate(self.encoder.blocks):
                x = self._block(i, block, x, final)
        return x

    def _front_end(self, final: bool) -> torch.Tensor:
        """The front end's new frames (1, n, D), in windows of W chunks (all that is left when ``final``)."""
        total = int(self.encoder.output_lengths(torch.tensor([self._feats_seen]))[0])  # frames the features make
        outs = []
        while total - self._front_done >= (1 if final else self.W * self.C):
            n = min(total - self._front_done, self.W * self.C)
            need = self.s * (n - 1) + self.receptive_field  # feature frames of encoder frames [done, done + n)
            feats = self._feats[:, :need]
            x, _ = self.encoder.front_end(feats, torch.tensor([need], device=feats.device))  # (1, n, D)
            outs.append(x[:, :n])
            self._front_done += n
            self._feats = self._feats[:, self.s * n :]
        return torch.cat(outs, dim=1) if outs else self._empty()

    def _block(self, i: int, block, x: torch.Tensor, final: bool) -> torch.Tensor:
        """Block ``i`` on its new input frames x (1, n, D) -> its new final output frames (1, m, D)."""
        buf = x if self._inputs[i] is None else torch.cat([self._inputs[i], x], dim=1)  # frames [start, have)
        start, C = self._starts[i], self.C
        have = start + buf.shape[1]
        ready = have if final else (have // C - self.cr) * C  # output frames whose inputs are all here
        outs = []
        while ready - self._done[i] >= (1 if final else self.W * C):
            j0 = self._done[i] // C  # a chunk boundary: windows advance by whole chunks
            out_end = min(self._done[i] + self.W * C, ready)
            first = max(0, j0 - self.cl - self.K) * C  # window: [first, last) of the block's input
            last = min(have, (math.ceil(out_end / C) + self.cr) * C)
            window = buf[:, first - start : last - start]  # (1, T_w, D)
            T_w = window.shape[1]
            lengths = torch.tensor([T_w], device=window.device)
            valid = torch.ones(1, T_w, dtype=torch.bool, device=window.device)
            cfg = self.encoder.cfg
            rotary = RotaryTable.build(torch.arange(first, last, device=window.device), cfg.head_dim, cfg.rotary_base)
            y = block(window, lengths, valid, rotary, C, self.K)  # (1, T_w, D)
            outs.append(y[:, self._done[i] - first : out_end - first])
            self._done[i] = out_end
        keep = max(0, self._done[i] // C - self.cl - self.K) * C  # the next window's first input frame
        self._inputs[i], self._starts[i] = buf[:, keep - start :], keep
        return torch.cat(outs, dim=1) if outs else self._empty()

    def _empty(self) -> torch.Tensor:
        param = next(self.encoder.parameters())
        return param.new_zeros(1, 0, self.encoder.cfg.d_model)
