"""The background checkpoint writer: the same files as a checkpoint written in the loop, a copy that the
live model cannot change, one checkpoint at a time, and failures that are raised once, never lost."""

from __future__ import annotations

import errno
import threading

import pytest
import torch

from usmkit.checkpointing import async_save
from usmkit.checkpointing import checkpoint as ck
from usmkit.checkpointing.async_save import CheckpointWriter


def _model_and_state():
    """A model with a non-contiguous weight and a buffer sharing a weight's storage (as tied weights do),
    its AdamW after one step, and a train state."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[1].weight = torch.nn.Parameter(torch.randn(4, 2).t())  # (2, 4), not contiguous
    model[0].register_buffer("rows", model[0].weight.detach()[:2])  # shares the weight's storage
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    state = {"step": 1, "optimizer": opt.state_dict(), "rng": ck.rng_state(), "best": None}
    return model, opt, state


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_background_checkpoint_has_the_bytes_of_one_written_in_the_loop(tmp_path):
    model, _, state = _model_and_state()
    sync = ck.save_checkpoint(tmp_path / "sync", 1, model, state, "x: 1\n")
    writer = CheckpointWriter()
    path = writer.write(tmp_path / "async", 1, ck.checkpoint_content(model, state, "x: 1\n", copy=True))
    writer.wait()
    assert path == tmp_path / "async" / "step-000001" and ck.verify_checkpoint(path)
    assert _files(path) == _files(sync)  # every file, the SHA-256 record in train_state.json included
    assert writer.last_write_s is not None


def test_the_copy_is_the_model_and_optimizer_as_they_were_when_it_was_taken(tmp_path, monkeypatch):
    """The writer is held up until the model and the optimizer have taken another step in place: what it
    writes is still the step it was given."""
    model, opt, state = _model_and_state()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    moments = {i: s["exp_avg"].clone() for i, s in enumerate(opt.state.values())}
    content = ck.checkpoint_content(model, state, "", copy=True)
    go, real = threading.Event(), async_save.write_checkpoint

    def held_up(*args):
        assert go.wait(timeout=60)
        return real(*args)

    monkeypatch.setattr(async_save, "write_checkpoint", held_up)
    writer = CheckpointWriter()
    path = writer.write(tmp_path, 1, content)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()  # changes the weights and moments in place
    assert not torch.equal(model[0].weight, weights["0.weight"])
    go.set()
    writer.wait()
    saved = ck.load_tensors(path / ck.MODEL_FILE)
    assert saved.keys() == weights.keys() and all(torch.equal(saved[k], weights[k]) for k in weights)
    saved_state = ck.load_train_state(path)["optimizer"]["state"]
    assert all(torch.equal(saved_state[i]["exp_avg"], moments[i]) for i in moments)


def test_each_write_waits_for_the_one_before(tmp_path, monkeypatch):
    """A second ``write`` returns only once the first checkpoint is in place (one copy in memory at a time)."""
    events, real = [], async_save.write_checkpoint
    go = {1: threading.Event(), 2: threading.Event()}

    def held_up(root, step, content):
        assert go[step].wait(timeout=60)
        out = real(root, step, content)
        events.append(f"written {step}")
        return out

    def hand_over_second():
        writer.write(tmp_path, 2, ck.checkpoint_content(model, state, "", copy=True))
        events.append("handed over 2")
        go[2].set()

    monkeypatch.setattr(async_save, "write_checkpoint", held_up)
    model, _, state = _model_and_state()
    writer = CheckpointWriter()
    writer.write(tmp_path, 1, ck.checkpoint_content(model, state, "", copy=True))
    second = threading.Thread(target=hand_over_second)
    second.start()
    second.join(timeout=0.5)
    assert second.is_alive() and events == []  # held in write() while checkpoint 1 is not written
    go[1].set()
    second.join(timeout=60)
    writer.wait()
    assert events == ["written 1", "handed over 2", "written 2"]


def test_a_failed_write_is_raised_once_in_one_line_and_drops_what_was_queued_behind_it(tmp_path, monkeypatch):
    model, _, state = _model_and_state()
    first = ck.save_checkpoint(tmp_path, 1, model, state, "")
    real = ck.save_file

    def full(tensors, path, *args, **kwargs):
        if "step-000002" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(tensors, path, *args, **kwargs)

    monkeypatch.setattr(ck, "save_file", full)
    writer, after = CheckpointWriter(), []
    writer.write(tmp_path, 2, ck.checkpoint_content(model, state, "", copy=True), then=after.append)
    writer.then("best.json", lambda: after.append("best"))
    with pytest.raises(ck.CheckpointWriteError) as e:
        writer.wait()
    message = str(e.value)
    assert "\n" not in message and message.startswith("step 2's checkpoint, written in the background, failed: ")
    assert "No space left on device" in message and "untouched" in message and "resume=true" in message
    assert writer.failed is False and after == []  # neither the pruning nor best.json ran
    writer.wait()  # raised once
    assert [c.step for c in ck.list_checkpoints(tmp_path)] == [1] and ck.verify_checkpoint(first)
    assert not list(tmp_path.glob(".tmp-*"))


def test_any_other_failure_in_the_background_names_the_job_and_how_to_go_on(tmp_path):
    writer = CheckpointWriter()
    writer.then("recording step 3's checkpoint as the best", lambda: open(tmp_path / "no" / "such", "w"))
    failure = writer.finish()
    assert isinstance(failure, ck.CheckpointWriteError)
    message = str(failure)
    assert message.startswith("recording step 3's checkpoint as the best failed in the background (FileNotFoundError")
    assert "before it are intact" in message and "resume=true" in message and "\n" not in message
    assert writer.finish() is None


def test_an_interrupt_in_the_background_comes_back_as_it_was():
    writer = CheckpointWriter()

    def interrupted():
        raise KeyboardInterrupt

    writer.then("a job", interrupted)
    assert isinstance(writer.finish(), KeyboardInterrupt)
