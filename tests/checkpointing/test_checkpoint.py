import errno

import pytest
import torch

from usmkit.checkpointing import checkpoint as ck


def _module(width=4):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.Linear(width, 2))


def test_save_load_round_trip(tmp_path):
    m = _module()
    path = ck.save_checkpoint(tmp_path, 7, m, {"step": 7}, "a: 1\n")
    assert path.name == "step-000007"
    m2 = _module()
    with torch.no_grad():
        for p in m2.parameters():
            p.zero_()
    ck.load_weights(m2, path)
    for a, b in zip(m.state_dict().values(), m2.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert ck.latest_checkpoint(tmp_path).step == 7
    assert ck.resolve_checkpoint(tmp_path) == path


def test_full_disk_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    m = _module()
    old = ck.save_checkpoint(tmp_path, 1, m, {"step": 1}, "")
    before = (old / ck.MODEL_FILE).read_bytes()

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck, "save_file", no_space)
    with pytest.raises(ck.CheckpointWriteError, match="is full.*No space left on device.*untouched"):
        ck.save_checkpoint(tmp_path, 2, m, {"step": 2}, "")
    assert [c.step for c in ck.list_checkpoints(tmp_path)] == [1]
    assert (old / ck.MODEL_FILE).read_bytes() == before
    assert not list(tmp_path.glob(".tmp-*"))  # no half-written leftovers


def test_other_model_size_lists_mismatched_keys(tmp_path):
    path = ck.save_checkpoint(tmp_path, 1, _module(width=4), {}, "")
    with pytest.raises(
        ck.CheckpointError,
        match=r"(?s)another model size.*shape mismatch \(3\):.*0.weight: checkpoint \(4, 3\) vs model \(8, 3\)",
    ):
        ck.load_weights(_module(width=8), path)


def test_prune_keeps_last_and_best(tmp_path):
    m = _module()
    paths = [ck.save_checkpoint(tmp_path, s, m, {}, "") for s in (1, 2, 3, 4)]
    ck.prune_checkpoints(tmp_path, keep_last=2, keep={paths[0]})
    assert [c.step for c in ck.list_checkpoints(tmp_path)] == [1, 3, 4]


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint found"):
        ck.resolve_checkpoint(tmp_path / "nope")
