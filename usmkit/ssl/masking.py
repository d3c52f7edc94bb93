"""BEST-RQ span masking: every valid frame starts a span with probability p; a span covers L frames.

Shapes: B batch, T feature frames (10 ms).

Pure functions, vectorized over the batch and time (no Python loop over frames), so they run the
same eagerly and under ``torch.compile``. A frame is masked when a span started at it or at one of
the ``L - 1`` frames before it; spans are clipped at the utterance length. Packed rows (several
utterances per row; ``mask_packed_spans``): the same per utterance, spans clipped at each utterance's end. Away from the utterance
start, the expected masked fraction is ``1 - (1 - p) ** L`` (BEST-RQ: p = 0.01, L = 40 -> 0.33).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from usmkit.ssl.bestrq_config import BestRQConfig


def valid_mask(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """(B,) lengths -> (B, T) bool, True at frames ``t < lengths[b]``."""
    return torch.arange(T, device=lengths.device) < lengths[:, None]  # (B, T)


def sample_span_starts(valid: torch.Tensor, prob: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Bernoulli(``prob``) span starts at the valid frames: (B, T) bool -> (B, T) bool.

    ``generator`` (on ``valid``'s device) makes the draw reproducible; ``None`` uses the global RNG.
    """
    if not 0.0 <= prob <= 1.0:
        raise ValueError(f"span start probability must be in [0, 1], got {prob}")
    u = torch.rand(valid.shape, generator=generator, device=valid.device)  # (B, T)
    return (u < prob) & valid


def ensure_one_start(
    starts: torch.Tensor, lengths: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Give every non-empty row without a start one start at a uniformly random valid frame.

    starts (B, T) bool, lengths (B,) -> (B, T) bool. Like fairseq's ``min_masks``: at p = 0.01 a 3 s
    utterance draws no span 5% of the time and would add nothing to the loss. Rows that already have a
    start are unchanged, so the statistics of long utterances are untouched.
    """
    B, T = starts.shape
    u = torch.rand(B, generator=generator, device=starts.device)  # (B,)
    pos = (u * lengths).long().clamp(max=T - 1)  # (B,) in [0, length)
    need = ~starts.any(dim=1) & (lengths > 0)  # (B,)
    forced = (torch.arange(T, device=starts.device) == pos[:, None]) & need[:, None]  # (B, T)
    return starts | forced


def expand_spans(
    starts: torch.Tensor, span: int, valid: torch.Tensor | None = None, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Mask ``span`` frames from every start (overlaps merge): (B, T) bool -> (B, T) bool.

    Frame t is masked when a start lies in ``(t - span, t]``; counted with a cumulative sum, so the
    cost is O(B T) whatever the span. ``valid`` (B, T) clips the spans at each utterance's length.
    ``positions`` (B, T) (packed rows: each frame's index in its utterance): only starts of the frame's own
    utterance count, those in ``(t - span, t] and [t - positions[t], t]``.

    >>> expand_spans(torch.tensor([[0, 1, 0, 0, 0, 0, 1, 0]], dtype=torch.bool), span=3).int().tolist()
    [[0, 1, 1, 1, 0, 0, 1, 1]]
    """
    if span < 1:
        raise ValueError(f"span must be >= 1 frame, got {span}")
    counts = torch.cumsum(starts.to(torch.int32), dim=1)  # (B, T): starts in [0, t]
    if positions is None:
        shifted = F.pad(counts, (span, 0))[:, : counts.shape[1]]  # (B, T): starts in [0, t - span]
    else:
        t = torch.arange(counts.shape[1], device=counts.device)  # (T,)
        before = torch.maximum(t - span, t - positions - 1)  # (B, T) last frame not counted, >= -1
        shifted = F.pad(counts, (1, 0)).gather(1, before + 1)  # (B, T): starts in [0, before]
    masked = (counts - shifted) > 0
    return masked & valid if valid is not None else masked


def mask_spans(
    lengths: torch.Tensor, T: int, cfg: BestRQConfig, generator: torch.Generator | None = None
) -> torch.Tensor:
    """BEST-RQ input mask: (B,) valid lengths -> (B, T) bool, True where the input is replaced by noise.

    Span starts are drawn with probability ``cfg.mask_prob`` at the valid frames (plus one forced
    start in rows that drew none, if ``cfg.min_one_span``); each masks ``cfg.span_frames`` frames
    (``mask_span_ms / frame_shift_ms``), clipped at the length.
    """
    valid = valid_mask(lengths, T)  # (B, T)
    starts = sample_span_starts(valid, cfg.mask_prob, generator)
    if cfg.min_one_span:
        starts = ensure_one_start(starts, lengths, generator)
    return expand_spans(starts, cfg.span_frames, valid)


def mask_packed_spans(
    ids: torch.Tensor,
    positions: torch.Tensor,
    rows: torch.Tensor,
    offsets: torch.Tensor,
    lengths: torch.Tensor,
    cfg: BestRQConfig,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``mask_spans`` of packed rows: (R, T) bool, True where the input is replaced by noise.

    ids, positions (R, T): each feature frame's utterance (-1 at padding) and its index in it
    (``usmkit.kernels.masks.Segments``); rows, offsets, lengths (U,): where each utterance sits and its valid
    frames. Starts are drawn per frame as in ``mask_spans``; with ``cfg.min_one_span`` every non-empty
    utterance without one gets one at a uniformly random frame of its own; spans stop at its end.
    """
    R, T = ids.shape
    valid = ids >= 0
    starts = sample_span_starts(valid, cfg.mask_prob, generator)  # (R, T)
    if cfg.min_one_span:
        U = lengths.shape[0]
        per_utt = torch.zeros(U + 1, dtype=torch.int64, device=ids.device)
        per_utt = per_utt.scatter_add(0, (ids + 1).flatten(), starts.flatten().to(torch.int64))[1:]  # (U,)
        need = (per_utt == 0) & (lengths > 0)  # (U,)
        u = torch.rand(U, generator=generator, device=ids.device)  # (U,)
        pos = torch.minimum((u * lengths).long(), (lengths - 1).clamp(min=0))  # (U,) in [0, length)
        flat = rows * T + offsets + pos  # (U,)
        forced = torch.zeros(R * T, dtype=torch.int64, device=ids.device).scatter_add(0, flat, need.to(torch.int64))
        starts = starts | (forced.view(R, T) > 0)
    return expand_spans(starts, cfg.span_frames, valid, positions)
