"""Dropout whose CPU mask costs a seventh of the random draws.

Our own module, because PyTorch's CPU dropout is the slowest part of a small model's CPU training
step: it draws one number per element from the single-threaded mt19937 generator. Here, on
the CPU, each 64-bit draw (63 random bits) supplies 7 random bytes, and an element is kept when its
byte is at least ``round(p * 256)``: the same independent Bernoulli mask, with ``p`` rounded to a
multiple of 1/256 (0.1 -> 0.1016); speed against ``torch.dropout``: ``experiments/dropout_cpu``. On GPUs and
under ``torch.compile`` it is ``F.dropout`` (random numbers generated inside the kernel), unchanged.
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F
from torch import nn

BYTE_LEVELS = 256
LITTLE_ENDIAN = sys.byteorder == "little"  # keep_mask reads the low 7 bytes of each 64-bit word


def byte_threshold(p: float) -> int:
    """The byte value below which an element is dropped: ``round(p * 256)``."""
    return round(p * BYTE_LEVELS)


def keep_mask(shape: torch.Size | tuple[int, ...], threshold: int) -> torch.Tensor:
    """A bool mask of ``shape``, each element independently True with probability ``1 - threshold / 256``.

    Uses the global CPU generator (``torch.manual_seed`` and checkpointed RNG state apply).
    """
    n = math.prod(shape)
    words = torch.empty((n + 6) // 7, dtype=torch.int64).random_()  # uniform on [0, 2**63): 63 random bits
    # Little-endian: bytes 0-6 of each word are fully random, byte 7 holds the top 7 bits only.
    random_bytes = words.view(torch.uint8).view(-1, 8)[:, :7].reshape(-1)[:n]  # (n,)
    return (random_bytes >= threshold).view(shape)


class Dropout(nn.Module):
    """``nn.Dropout(p)`` for (B, ..., D) activations, with the cheaper CPU mask described above."""

    def __init__(self, p: float = 0.1) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self.threshold = byte_threshold(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        cpu_mask = x.device.type == "cpu" and not torch.compiler.is_compiling() and self.threshold > 0 and LITTLE_ENDIAN
        if not cpu_mask:
            return F.dropout(x, self.p, training=True)
        scale = BYTE_LEVELS / (BYTE_LEVELS - self.threshold)
        return x * keep_mask(x.shape, self.threshold) * scale

    def extra_repr(self) -> str:
        return f"p={self.p}"
