"""The JSONL output of batch transcription: appended line by line, resumable, merged from ranks.

One JSON object per line, one line per input, each with its ``id``. Lines are appended as inputs
finish and flushed after every batch, so a run that is killed keeps what it wrote. A kill can only cut
the *last* line short (every earlier one ended with its newline before the next began): ``repair``
drops such a tail, and a rerun sees every id of a complete line as done and transcribes the rest.
(An append-only journal rather than ``usmkit.checkpointing.atomic``'s write-and-rename: renaming a
whole file per line would copy the output over and over; the tail repair gives the same guarantee,
every line in the file is whole.)

With several processes each rank appends to its own part file, ``OUT.rank<r>.part``, beside
``OUT``; at the end rank 0 merges ``OUT`` and every part into one ``OUT`` without duplicate ids
(written atomically), then removes the parts. Parts left by a killed run (of any number of ranks)
count as done for the next run and are merged by it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

from usmkit.checkpointing.atomic import replaced_atomically
from usmkit.data.validate import BadInputError

log = logging.getLogger(__name__)

PART_SUFFIX = ".part"
RECORD_START = b'{"id": '  # how every line begins: records are written with their id first


def part_path(out: Path, rank: int) -> Path:
    """Rank ``rank``'s part file beside ``out``: ``out.rank<r>.part``."""
    return out.with_name(f"{out.name}.rank{rank}{PART_SUFFIX}")


def part_paths(out: Path) -> list[Path]:
    """Every part file beside ``out`` (of this run or an earlier one), by rank."""
    found = out.parent.glob(f"{out.name}.rank*{PART_SUFFIX}") if out.parent.is_dir() else []
    ranks = []
    for p in found:
        middle = p.name[len(out.name) + len(".rank") : -len(PART_SUFFIX)]
        if middle.isdigit():
            ranks.append((int(middle), p))
    return [p for _, p in sorted(ranks)]


def repair(path: Path) -> int:
    """Drop a last line cut short (no newline at its end) from ``path``; returns the bytes dropped.
    Only the file's writer calls it, before it appends."""
    if not path.is_file():
        return 0
    with path.open("rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(max(0, size - 1))
        if f.read(1) == b"\n":
            return 0
        # Find the last newline, reading backwards in blocks.
        end, block = size, 1 << 16
        keep = 0
        while end > 0:
            start = max(0, end - block)
            f.seek(start)
            chunk = f.read(end - start)
            i = chunk.rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            end = start
        f.truncate(keep)
    log.warning("%s: dropped its last line, cut short (%d bytes) by a run that stopped; it is transcribed again",
                path, size - keep)  # fmt: skip
    return size - keep


def check_journal(path: Path) -> None:
    """``BadInputError`` unless ``path`` is missing, empty, or begins as a transcript file of ours (a record,
    or a first record cut short): a file named by a slip (notes, a config, audio) is refused before any work,
    never truncated (``repair``), appended to or replaced (``merge``)."""
    if not path.is_file():
        return
    with path.open("rb") as f:
        head = f.read(len(RECORD_START))
    if not RECORD_START.startswith(head):
        raise BadInputError(
            "not a transcript file",
            str(path),
            f"it does not begin with {RECORD_START.decode()}... as usmkit's transcript lines do",
            hint="pass another out= or move the file away",
        )


def read_records(path: Path) -> Iterator[dict]:
    """The records of the complete lines of ``path`` (a line cut short at the end is not one). A complete
    line that is not a JSON object with an ``id`` is a ``BadInputError``: the file is not ours."""
    if not path.is_file():
        return
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                return  # a tail cut short: its writer repairs it, a reader leaves it
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if not isinstance(record, dict) or not isinstance(record.get("id"), str):
                raise BadInputError(
                    "not a transcript file",
                    f"{path}, line {number}",
                    "it is not a JSON object with an id (usmkit writes one per transcribed input)",
                    hint="pass another out= or move the file away",
                )
            yield record


def done_ids(out: Path) -> set[str]:
    """The ids already written to ``out`` or any of its part files."""
    return {r["id"] for p in (out, *part_paths(out)) for r in read_records(p)}


class JournalWriter:
    """Appends records to one file as JSON lines; ``flush`` after each batch makes them survive a kill."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        repair(path)
        self.path = path
        self._file: TextIO = path.open("a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def merge(out: Path) -> int:
    """``out`` and every part file merged into ``out`` (first line of each id kept, atomically), the parts
    removed; returns the number of records. Call it once every writer has finished."""
    parts = part_paths(out)
    if not parts:
        return sum(1 for _ in read_records(out))
    records = _unique([out, *parts])
    with replaced_atomically(out) as tmp, tmp.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    for p in parts:
        p.unlink(missing_ok=True)
    return len(records)


def _unique(paths: Iterable[Path]) -> list[dict]:
    seen: set[str] = set()
    kept = []
    for p in paths:
        for record in read_records(p):
            if record["id"] not in seen:
                seen.add(record["id"])
                kept.append(record)
    return kept
