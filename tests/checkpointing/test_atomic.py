"""replaced_atomically: the target changes only when the write inside the block finishes."""

from __future__ import annotations

import pytest

from usmkit.checkpointing.atomic import replaced_atomically


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
