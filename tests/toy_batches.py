"""Random CTC batches and a fixed loader for tests that run a tiny model or the trainer on them; packed rows' ``Segments``
from their utterance runs."""

from __future__ import annotations

import torch

from usmkit.data.batch import Batch
from usmkit.kernels.masks import Segments


def ctc_batch(B: int, T: int = 64, U: int = 5, seed: int = 0) -> Batch:
    """B rows of T 80-dim feature frames (the first row full, the others T/2..T) and U tokens from 4..39."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(T // 2, T + 1, (B,), generator=g)
    lens[0] = T
    return Batch(
        features=torch.randn(B, T, 80, generator=g), feature_lens=lens,
        tokens=torch.randint(4, 40, (B, U), generator=g), token_lens=torch.full((B,), U),
    )  # fmt: skip


class FixedLoader:
    """The trainer's loader protocol over ``ctc_batch`` batches of the given sizes (seeded by size)."""

    def __init__(self, sizes: tuple[int, ...]):
        self.batches = [ctc_batch(B, seed=B) for B in sizes]

    def __iter__(self):
        return iter(self.batches)

    def set_epoch(self, e):
        pass

    def state_dict(self):
        return {}

    def load_state_dict(self, sd):
        pass


def segments(T: int, rows: list[list[tuple[int, int]]], device="cpu") -> Segments:
    """Packed rows of T frames from (start, length) utterances per row, numbered row by row, left to right."""
    ids = torch.full((len(rows), T), -1)
    positions = torch.zeros(len(rows), T, dtype=torch.int64)
    u = 0
    for r, row in enumerate(rows):
        for start, n in row:
            ids[r, start : start + n] = u
            positions[r, start : start + n] = torch.arange(n)
            u += 1
    return Segments(ids.to(device), positions.to(device))
