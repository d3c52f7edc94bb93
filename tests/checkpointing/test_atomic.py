"""replaced_atomically: the target changes only when the write inside the block finishes."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from usmkit.checkpointing.atomic import replaced_atomically, replaced_dir_atomically
from usmkit.errors import UsageError


def test_the_file_is_replaced_only_when_the_block_finishes(tmp_path):
    path = tmp_path / "sub" / "m.jsonl"
    with replaced_atomically(path) as tmp:
        assert tmp.parent == path.parent and tmp.name.endswith("m.jsonl") and tmp != path
        tmp.write_text("new\n")
        assert not path.exists()
    assert path.read_text() == "new\n"
    with pytest.raises(RuntimeError), replaced_atomically(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "new\n"
    assert [p.name for p in path.parent.iterdir()] == ["m.jsonl"]


def test_a_named_pipe_is_written_through_not_replaced(tmp_path):
    """``--json /dev/null`` or a pipe: renaming over a special file would replace the device itself."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    with replaced_atomically(fifo) as tmp:
        tmp.write_text("{}\n")
    reader.join(timeout=10)
    assert received == [b"{}\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_folder_output_never_replaces_a_file_or_device(tmp_path):
    for target in (tmp_path / "a_file", tmp_path / "pipe"):
        if target.name == "pipe":
            os.mkfifo(target)
        else:
            target.write_text("keep me")
        with pytest.raises(UsageError, match=f"{target} exists and is not a folder"):
            with replaced_dir_atomically(target) as tmp:
                (tmp / "x").write_text("new")
        assert os.path.lexists(target) and not target.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "pipe"]
