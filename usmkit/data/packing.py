"""Packed batches (``DataConfig.pack_to_frames``): several whole utterances share one fixed-length row.

Shapes: R rows per batch, N feature frames per row (``pack_to_frames``), U utterances, F feature bins.

A packed batch is always (R, N, F), so a compiled step sees one shape (and CUDA graphs one graph), and the
frames a step computes are mostly speech instead of padding. Where each utterance sits is the batch's
``Packing``; the model keeps the utterances apart (block-diagonal attention, convolution taps that stop at
an utterance's edge: ``usmkit.models.packing``), and the losses see each utterance alone.

Layout. Utterance u takes a slot of ``align`` x ceil(n_u / align) frames (``align`` = the encoder's
subsampling factor), so every utterance starts on a frame the subsampling front end strides to: its encoder
frames are then exactly those it gets alone in a row (``usmkit.models.packing``). The frames between an
utterance's end and its slot's end are padding.

Which utterances share a batch: ``PackedBatchSampler``, first-fit decreasing over the cuts that lhotse's
``DynamicBucketingSampler`` draws (shuffled, duration-bucketed), the left-over cuts first in the next batch;
the collation places them the same way (``RowPacker.assign``). lhotse has no such packing (its
``CutConcatenate`` joins cuts into longer cuts and forgets where each began), hence this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from lhotse import CutSet
from lhotse.cut import Cut
from lhotse.utils import compute_num_frames


@dataclass
class Packing:
    """Where each utterance of a packed batch sits; its lengths are the batch's ``feature_lens`` (U,).

    ``segment_ids`` (R, N) int64: the utterance of each feature frame, -1 at padding. Utterances are numbered
    row by row, left to right (the batch's order), so ids never decrease along a row (padding aside).
    ``rows`` (U,) int64: the row of each utterance. ``offsets`` (U,) int64: its first frame in that row, a
    multiple of ``align``.
    """

    segment_ids: torch.Tensor
    rows: torch.Tensor
    offsets: torch.Tensor
    align: int

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Packing:
        """The packing with ``fn`` applied to each of its tensors."""
        return replace(self, segment_ids=fn(self.segment_ids), rows=fn(self.rows), offsets=fn(self.offsets))


@dataclass(frozen=True)
class RowPacker:
    """``rows`` rows of ``frames`` feature frames; utterances start at multiples of ``align`` frames."""

    rows: int
    frames: int
    align: int

    def __post_init__(self) -> None:
        if self.rows < 1 or self.align < 1 or self.frames < self.align:
            raise ValueError(f"RowPacker needs rows >= 1 and frames >= align >= 1, got {self}")

    def slot(self, n: int) -> int:
        """Frames an utterance of ``n`` frames takes: n rounded up to a multiple of ``align`` (at least one)."""
        return max(1, -(-n // self.align)) * self.align

    def fits(self, n: int) -> bool:
        return self.slot(n) <= self.frames

    def assign(self, lengths: Sequence[int]) -> list[list[int]]:
        """First-fit in the given order: the indices of ``lengths`` placed in each row, left to right.

        May use more than ``rows`` rows (the caller checks); ValueError for an utterance longer than a row.
        """
        free: list[int] = []
        placed: list[list[int]] = []
        for i, n in enumerate(lengths):
            need = self.slot(n)
            if need > self.frames:
                raise ValueError(f"an utterance of {n} frames does not fit a packed row of {self.frames} frames")
            row = next((r for r, space in enumerate(free) if space >= need), None)
            if row is None:
                free.append(self.frames)
                placed.append([])
                row = len(free) - 1
            free[row] -= need
            placed[row].append(i)
        return placed

    def pack(
        self, feats: torch.Tensor, lengths: torch.Tensor, sizes: Sequence[int]
    ) -> tuple[list[int], torch.Tensor, torch.Tensor, Packing]:
        """feats (U, T, F), lengths (U,), the frames the sampler counted for each (``sizes``) ->
        (order, packed (R, N, F), lengths (U,) in that order, packing).

        Rows are assigned from ``sizes``, as the sampler's constraint did, so the batch fits its rows; an
        utterance whose features came out longer than counted (a frame of rounding) keeps the counted frames.
        ``order``: the utterances in row-major order, as the batch lists them from now on (the packing's ids
        refer to positions in it). Rows left empty are all padding (zeros).
        """
        U, _, Fdim = feats.shape
        placed = self.assign(sizes)
        if len(placed) > self.rows:
            raise ValueError(
                f"{U} utterances need {len(placed)} packed rows of {self.frames} frames, more than the {self.rows} "
                "of a batch (PackedBatchSampler keeps batches within them)"
            )
        out = feats.new_zeros(self.rows, self.frames, Fdim)
        ids = torch.full((self.rows, self.frames), -1, dtype=torch.int64)
        order: list[int] = []
        rows: list[int] = []
        offsets: list[int] = []
        kept: list[int] = []
        for r, row in enumerate(placed):
            offset = 0
            for i in row:
                n = min(int(lengths[i]), sizes[i])
                out[r, offset : offset + n] = feats[i, :n]
                ids[r, offset : offset + n] = len(order)
                order.append(i)
                rows.append(r)
                offsets.append(offset)
                kept.append(n)
                offset += self.slot(sizes[i])
        as_tensor = lambda values: torch.tensor(values, dtype=torch.int64)  # noqa: E731
        packing = Packing(ids, as_tensor(rows), as_tensor(offsets), self.align)
        return order, out, as_tensor(kept), packing


def cut_frames(cut: Cut, frame_shift: float) -> int:
    """The cut's feature frames: stored, or as the on-the-fly extractor will compute them."""
    if cut.has_features:
        return cut.num_frames
    return compute_num_frames(cut.duration, frame_shift, cut.sampling_rate)


class PackedBatchSampler:
    """Batches of whole cuts that fill ``packer``'s rows: the training sampler with ``DataConfig.pack_to_frames``.

    ``inner`` (lhotse's ``DynamicBucketingSampler``) supplies shuffled batches of similar-length cuts about a
    row long, from one duration bucket or another; they go into a pool until it holds the rows' frames. The
    pool is placed first-fit: the cuts the last batch left over first (so none waits more than a batch or two),
    then the new ones longest first (first-fit decreasing over several buckets' cuts, which fills the gaps the
    long ones leave with short ones). What does not fit is left over for the next batch; at the end of an epoch
    the rest goes into last batches, so an epoch holds every cut once. A batch lists its cuts in the order
    they were placed, so ``RowPacker.assign`` over it puts each where it was planned.

    lhotse's samplers decide on a cut after adding it, without seeing the next, so a constraint of theirs
    cannot both fill rows and never overflow them; hence this sampler on top of theirs. Its state is the epoch
    and the batches yielded in it; loading it replays the epoch up to there, as lhotse's samplers resume, so
    the left-over cuts come back exactly.
    """

    def __init__(self, inner: Any, packer: RowPacker, frame_shift: float) -> None:
        self.inner = inner
        self.packer = packer
        self.frame_shift = frame_shift
        self.yielded = 0  # batches of the current epoch yielded
        self._skip = 0  # batches to replay silently on the next pass (a loaded state)

    @property
    def epoch(self) -> int:
        return int(self.inner.epoch)

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)
        self._skip = 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "packed_batches": self.yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.set_epoch(int(state["epoch"]))
        self._skip = int(state["packed_batches"])

    def __iter__(self) -> Iterator[CutSet]:
        skip, self._skip = self._skip, 0
        self.yielded = 0
        for cuts in self._batches():
            self.yielded += 1
            if self.yielded > skip:
                yield cuts

    def _batches(self) -> Iterator[CutSet]:
        capacity = self.packer.rows * self.packer.frames
        source = iter(self.inner)
        carry: list[Cut] = []
        new: list[Cut] = []
        exhausted = False
        while True:
            while not exhausted and sum(self._slot(c) for c in carry + new) < capacity:
                batch = next(source, None)
                exhausted = batch is None
                new += [] if batch is None else list(batch)
            if not carry and not new:
                return
            placed, carry = self._place(carry, new)
            new = []
            yield CutSet.from_cuts(placed)

    def _slot(self, cut: Cut) -> int:
        return self.packer.slot(cut_frames(cut, self.frame_shift))

    def _place(self, carry: list[Cut], new: list[Cut]) -> tuple[list[Cut], list[Cut]]:
        """First-fit of ``carry`` then ``new`` (each longest first) into empty rows: (placed, left over)."""
        free: list[int] = []
        placed: list[Cut] = []
        left: list[Cut] = []
        for cut in sorted(carry, key=self._slot, reverse=True) + sorted(new, key=self._slot, reverse=True):
            need = self._slot(cut)
            row = next((r for r, space in enumerate(free) if space >= need), None)
            if row is None and len(free) < self.packer.rows:
                free.append(self.packer.frames)
                row = len(free) - 1
            if row is None:
                left.append(cut)
                continue
            free[row] -= need
            placed.append(cut)
        return placed, left


def packed_rows(max_duration: float, frame_shift: float, frames: int) -> int:
    """Rows per packed batch: ``max_duration`` seconds of rows of ``frames`` frames (at least one)."""
    return max(1, round(max_duration / frame_shift) // frames)
