"""Several data streams in one training step (MOST: unlabeled audio, paired speech, text-only).

Shapes: B batch, T feature frames.

What a ratio means here: every step holds exactly one batch of each stream, drawn in a fixed order;
how much a stream weighs in the step is the size of its batches, which the stream's own loader sets
(``usmkit.ssl.most_data``: ``<stream>_ratio * data.max_duration`` seconds). Each stream runs through
its own epochs (a short stream restarts while a long one goes on), so the mixed stream never ends and
training is counted in steps. ``state_dict`` holds every stream's loader state, its epoch and the
number of batches yielded, so a resumed mixer yields what an uninterrupted one yields.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from usmkit.data.batch import Batch
from usmkit.data.text_only import TextBatch


class StreamLoader(Protocol):
    """A resumable loader (``usmkit.data.loader.AsrLoader``, ``usmkit.data.text_only.TextOnlyLoader``)."""

    def __iter__(self) -> Iterator[Any]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def set_epoch(self, epoch: int) -> None: ...


@dataclass
class MostBatch:
    """One MOST step: a batch of each active stream (None for a stream that is off) and the step number.

    ``step`` is the optimizer step this batch belongs to (batches yielded before it divided by the
    batches per step), which the task's warm-up schedules read; it is restored on resume.
    """

    unlabeled: Batch | None = None
    paired: Batch | None = None
    text: TextBatch | None = None
    step: int = 0

    @property
    def num_frames(self) -> int:
        """Valid feature frames of audio in the step (unlabeled and paired)."""
        return sum(b.num_frames for b in (self.unlabeled, self.paired) if b is not None)

    @property
    def size(self) -> int:
        return sum(b.size for b in (self.unlabeled, self.paired, self.text) if b is not None)

    def to(self, device: torch.device | str) -> MostBatch:
        def move(b):
            return None if b is None else b.to(device)

        return MostBatch(move(self.unlabeled), move(self.paired), move(self.text), self.step)


STREAM_FIELDS = ("unlabeled", "paired", "text")


class StreamMixer:
    """Yields ``MostBatch``es holding one batch of each loader in ``streams`` (keys: ``STREAM_FIELDS``).

    Iterate it once (the trainer does); to continue elsewhere, ``load_state_dict`` a ``state_dict``
    into a mixer built the same way. ``set_epoch`` does nothing: each stream keeps its own epochs.
    """

    def __init__(self, streams: Mapping[str, StreamLoader], batches_per_step: int = 1) -> None:
        unknown = sorted(set(streams) - set(STREAM_FIELDS))
        if unknown or not streams:
            raise ValueError(f"streams must be some of {STREAM_FIELDS}, got {sorted(streams)}")
        if batches_per_step < 1:
            raise ValueError(f"batches_per_step must be >= 1, got {batches_per_step}")
        self.streams = {name: streams[name] for name in STREAM_FIELDS if name in streams}
        self.batches_per_step = batches_per_step
        self.epochs = dict.fromkeys(self.streams, 0)
        self.index = 0  # batches yielded so far

    def _next(self, name: str, iterators: dict[str, Iterator[Any]]) -> Any:
        """The stream's next batch, starting its next epoch when this one is over (a stream that runs
        through its epochs itself, an endless ``AsrLoader``, reports the epoch of its batch)."""
        try:
            batch = next(iterators[name])
            self.epochs[name] = getattr(self.streams[name], "epoch", self.epochs[name])
            return batch
        except StopIteration:
            self.epochs[name] += 1
            self.streams[name].set_epoch(self.epochs[name])
            iterators[name] = iter(self.streams[name])
            try:
                return next(iterators[name])
            except StopIteration:
                raise RuntimeError(f"the {name} stream yielded no batch in a whole epoch: is it empty?") from None

    def __iter__(self) -> Iterator[MostBatch]:
        iterators = {name: iter(loader) for name, loader in self.streams.items()}
        while True:
            parts = {name: self._next(name, iterators) for name in self.streams}
            batch = MostBatch(**parts, step=self.index // self.batches_per_step)
            self.index += 1
            yield batch

    def set_epoch(self, epoch: int) -> None:
        """Nothing to do: the mixed stream never ends, and each stream keeps its own epochs."""

    def close(self) -> None:
        """End the streams' loader workers (those that have any)."""
        for loader in self.streams.values():
            close = getattr(loader, "close", None)
            if close is not None:
                close()

    def state_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "epochs": dict(self.epochs),
            "streams": {name: loader.state_dict() for name, loader in self.streams.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if sorted(state["streams"]) != sorted(self.streams):
            raise ValueError(
                f"the saved mixer state has streams {sorted(state['streams'])}, this run {sorted(self.streams)}: "
                "resume with the loss weights the run started with"
            )
        self.index = int(state["index"])
        self.epochs = {name: int(state["epochs"][name]) for name in self.streams}
        for name, loader in self.streams.items():
            loader.load_state_dict(state["streams"][name])
