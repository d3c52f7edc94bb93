"""The text-only stream (MOST's unspoken text): sentences read once, tokenized once, bucketed by length.

Shapes: B sentences, U tokens.

The file is JSON lines (optionally gzipped) of ``{"text": ..., "language": ...}``, as the corpus
recipes write ``<manifest_dir>/<corpus>_text_only.jsonl.gz`` (``usmkit.data.manifests``). Sentences
are batched by lhotse's ``DynamicBucketingSampler``, like audio: each sentence counts as the seconds
its speech would last (``tokens * seconds_per_token``), so a batch of short sentences holds more of
them, and the sampler's ``state_dict`` resumes the stream exactly.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lhotse.cut.text import TextExample
from lhotse.serialization import load_jsonl

from usmkit.data.config import DataConfig
from usmkit.data.dataset import TOKEN_PAD, TextEncoder
from usmkit.data.sampling import make_sampler
from usmkit.data.validate import BadInputError
from usmkit.errors import UsageError

log = logging.getLogger(__name__)


@dataclass
class TextBatch:
    """A batch of text-only sentences."""

    tokens: torch.Tensor  # (B, U) int64, padded with -1
    token_lens: torch.Tensor  # (B,) int64
    texts: list[str] = field(default_factory=list)
    languages: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.tokens.shape[0]

    def to(self, device: torch.device | str) -> TextBatch:
        return replace(
            self,
            tokens=self.tokens.to(device, non_blocking=True),
            token_lens=self.token_lens.to(device, non_blocking=True),
        )


@dataclass
class TextItem(TextExample):
    """One sentence as lhotse's sampler sees it: an id and a ``duration`` (estimated seconds of speech)."""

    id: str = ""
    duration: float = 0.0
    language: str = ""


def read_text_only(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """The records of a text-only file; a user error naming the file (and line) when it is missing or bad."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(
            f"no text-only file at {path}: name one with task.most.text_only=PATH (JSON lines of "
            '{"text": ..., "language": ...}), or build the embedded corpus with `python -m usmkit.cli.prepare synth out=DIR`'
        )
    try:
        records = list(load_jsonl(path))
    except (ValueError, EOFError, OSError, UnicodeDecodeError) as e:
        raise BadInputError("unreadable text-only file", str(path), f"{type(e).__name__}: {e}") from None
    for line, record in enumerate(records, start=1):
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise BadInputError(
                "bad text-only record",
                f"{path}, line {line}",
                f'expected {{"text": ..., "language": ...}}, got {record!r}',
            )
    return records


def text_items(
    records: Iterable[dict[str, str]], tokenizer: TextEncoder, seconds_per_token: float, max_tokens: int = 0
) -> list[TextItem]:
    """Tokenized sentences, each ``len(tokens) * seconds_per_token`` seconds long. Empty ones are left out, and
    those of more than ``max_tokens`` tokens (``data.max_text_tokens``; 0 = no limit), counted in a warning."""
    items, long = [], 0
    for i, record in enumerate(records):
        text = record["text"].strip()
        tokens = tokenizer.encode(text) if text else []
        if max_tokens and len(tokens) > max_tokens:
            long += 1
        elif tokens:
            items.append(
                TextItem(
                    text=text,
                    tokens=np.asarray(tokens, dtype=np.int64),
                    id=f"text-{i:08d}",
                    duration=len(tokens) * seconds_per_token,
                    language=str(record.get("language", "")),
                )
            )
    if long:
        log.warning("the text-only stream leaves out %d sentences longer than data.max_text_tokens=%d tokens",
                    long, max_tokens)  # fmt: skip
    return items


def collate_text(items: Sequence[TextItem]) -> TextBatch:
    """Sentences -> ``TextBatch`` (tokens padded with -1)."""
    lens = torch.tensor([len(item.tokens) for item in items], dtype=torch.int64)
    tokens = torch.full((len(items), int(lens.max())), TOKEN_PAD, dtype=torch.int64)
    for row, item in enumerate(items):
        tokens[row, : len(item.tokens)] = torch.from_numpy(item.tokens)
    return TextBatch(tokens, lens, [item.text for item in items], [item.language for item in items])


class TextOnlyLoader:
    """Iterable of ``TextBatch`` over ``items`` with the resumable loader's interface
    (``state_dict`` / ``load_state_dict`` / ``set_epoch``), in the main process (batches are small)."""

    def __init__(
        self, items: list[TextItem], cfg: DataConfig, *, rank: int = 0, world_size: int = 1, seed: int = 0
    ) -> None:
        if not items:
            raise UsageError("the text-only stream has no sentence (the file is empty or every text is)")
        self.sampler = make_sampler(items, cfg, train=True, rank=rank, world_size=world_size, seed=seed)

    def __iter__(self) -> Iterator[TextBatch]:
        for items in self.sampler:
            yield collate_text(list(items))

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(copy.deepcopy(state))  # lhotse consumes the dict it gets
