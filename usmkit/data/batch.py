"""The typed batch every training task and evaluator consumes.

Shapes: B batch, T feature frames, F feature bins (80), U tokens.

A packed batch (``DataConfig.pack_to_frames``, training only) holds several utterances per row: ``features``
is then (R, N, F) rows, the per-utterance fields (``feature_lens``, ``tokens``, texts, ids) list its B
utterances, and ``packing`` says where each sits (``usmkit.data.packing``). Tasks that take packed batches
read ``packing``; ``packing is None`` is one utterance per row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from usmkit.data.packing import Packing


@dataclass
class Batch:
    features: torch.Tensor  # (B, T, F) float32, normalized log-mel, zero-padded; packed: (R, N, F) rows
    feature_lens: torch.Tensor  # (B,) int64, valid frames per utterance
    tokens: torch.Tensor  # (B, U) int64 sentencepiece ids, padded with -1 (empty (B, 0) for audio-only)
    token_lens: torch.Tensor  # (B,) int64
    texts: list[str] = field(default_factory=list)  # reference transcripts ("" for audio-only)
    languages: list[str] = field(default_factory=list)  # ISO codes, e.g. "en"
    cut_ids: list[str] = field(default_factory=list)
    packing: Packing | None = None  # where each utterance sits in the rows of a packed batch

    @property
    def size(self) -> int:
        """Utterances in the batch."""
        return self.feature_lens.shape[0]

    @property
    def num_frames(self) -> int:
        """Valid (unpadded) feature frames in the batch."""
        return int(self.feature_lens.sum())

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        """The batch with ``fn`` applied to each of its tensors."""
        return replace(
            self,
            features=fn(self.features),
            feature_lens=fn(self.feature_lens),
            tokens=fn(self.tokens),
            token_lens=fn(self.token_lens),
            packing=None if self.packing is None else self.packing.map(fn),
        )

    def pin_memory(self) -> Batch:
        """The tensors in page-locked host memory (what ``DataLoader(pin_memory=True)`` calls), so that
        ``to(cuda)`` copies without the host waiting for the device."""
        return self._map(torch.Tensor.pin_memory)

    def to(self, device: torch.device | str) -> Batch:
        return self._map(lambda t: t.to(device, non_blocking=True))
