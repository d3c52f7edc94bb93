"""The loop with checkpoints written in the background (``trainer.async_save``): the same checkpoints as
written in the loop, a copy taken at the save, failures that stop the run at the next step, at the end and
on a stop signal, and a run that ends only once its last checkpoint is on disk."""

from __future__ import annotations

import errno
import random
import signal
import threading

import numpy as np
import pytest
import torch
from test_trainer import ToyLoader, _trainer

from usmkit.checkpointing import async_save
from usmkit.checkpointing import checkpoint as ck


def _seeded_run(exp, async_save_on: bool, max_steps: int = 8):
    random.seed(0)
    np.random.seed(0)  # the train state records the Python and NumPy random states too
    trainer = _trainer(exp, max_steps, async_save=async_save_on)
    return trainer, trainer.fit()


def test_background_checkpoints_equal_those_written_in_the_loop(tmp_path):
    _, sync = _seeded_run(tmp_path / "sync", False)
    trainer, background = _seeded_run(tmp_path / "async", True)
    assert trainer.writer is not None and background.losses == sync.losses
    steps = [c.step for c in ck.list_checkpoints(tmp_path / "async" / "checkpoints")]
    assert steps == [c.step for c in ck.list_checkpoints(tmp_path / "sync" / "checkpoints")] == [4, 8]
    for step in steps:
        a, b = (tmp_path / run / "checkpoints" / f"step-{step:06d}" for run in ("async", "sync"))
        assert ck.verify_checkpoint(a)
        assert {p.name: p.read_bytes() for p in a.iterdir()} == {p.name: p.read_bytes() for p in b.iterdir()}


def test_the_checkpoint_holds_the_step_it_was_saved_at_not_the_next(tmp_path, monkeypatch):
    """The writer is held up while the loop takes another optimizer step, which changes the weights and
    the AdamW moments in place: the checkpoint still holds those of the step saved."""
    trainer = _trainer(tmp_path, 3, save_every=0)
    trainer.fit()
    go, real = threading.Event(), async_save.write_checkpoint

    def held_up(*args):
        assert go.wait(timeout=60)
        return real(*args)

    monkeypatch.setattr(async_save, "write_checkpoint", held_up)
    _step(trainer)
    weights = {k: v.clone() for k, v in trainer.module.state_dict().items()}
    moments = [s["exp_avg"].clone() for s in trainer.optimizer.state.values()]
    path = trainer.save()
    assert path == tmp_path / "checkpoints" / "step-000004" and not path.exists()  # still in the writer
    _step(trainer)
    assert not torch.equal(trainer.module.net[0].weight, weights["net.0.weight"])
    go.set()
    trainer.writer.wait()
    saved = ck.load_tensors(path / ck.MODEL_FILE)
    assert all(torch.equal(saved[k], v) for k, v in weights.items())
    state = ck.load_train_state(path)
    assert state["step"] == 4
    assert all(torch.equal(state["optimizer"]["state"][i]["exp_avg"], m) for i, m in enumerate(moments))


def _step(trainer) -> None:
    """One optimizer step by hand, as the loop takes it."""
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.module(trainer.train_loader.batches[0]).loss.backward()
    trainer.optimizer.step()
    trainer.step += 1


def _full_disk_at(monkeypatch, step: int, when: threading.Event | None = None) -> None:
    """The checkpoint of ``step`` finds the disk full (once ``when`` is set)."""
    real = ck.save_file

    def save_file(tensors, path, *args, **kwargs):
        if f"step-{step:06d}" in str(path):
            assert when is None or when.wait(timeout=60)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(tensors, path, *args, **kwargs)

    monkeypatch.setattr(ck, "save_file", save_file)


def test_a_failed_background_write_stops_the_run_at_the_next_step(tmp_path, monkeypatch):
    """The checkpoint of step 8 fails (a full disk) while the loop trains on, during step 10 here: the run
    stops after that step, not at the next checkpoint (12), with one line naming the checkpoint; the one of
    step 4 is intact and a resumed run goes on from it."""
    step10 = threading.Event()
    _full_disk_at(monkeypatch, 8, when=step10)

    class Loader(ToyLoader):
        def __iter__(self):
            for batch in super().__iter__():
                if self.served == 10:  # the batch of step 10: the write fails now, and the step waits for it
                    step10.set()
                    while not trainer.writer.failed:
                        threading.Event().wait(0.01)
                yield batch

    trainer = _trainer(tmp_path, 16, loader=Loader())
    with pytest.raises(ck.CheckpointWriteError) as e:
        trainer.fit()
    message = str(e.value)
    assert "\n" not in message and e.value.exit_code == 1
    assert message.startswith("step 8's checkpoint, written in the background, failed: could not write checkpoint")
    assert "step-000008" in message and "No space left on device" in message
    assert "earlier checkpoints" in message and "resume=true" in message
    assert trainer.step == 10
    assert [c.step for c in ck.list_checkpoints(tmp_path / "checkpoints")] == [4]
    assert ck.verify_checkpoint(tmp_path / "checkpoints" / "step-000004")
    monkeypatch.undo()
    resumed = _trainer(tmp_path, 16)
    assert resumed.resume() and resumed.step == 4
    assert resumed.fit().step == 16


def test_a_failed_last_checkpoint_fails_the_run_at_its_end(tmp_path, monkeypatch):
    _full_disk_at(monkeypatch, 6)
    with pytest.raises(ck.CheckpointWriteError, match=r"^step 6's checkpoint, written in the background, failed"):
        _trainer(tmp_path, 6, save_every=4).fit()
    assert [c.step for c in ck.list_checkpoints(tmp_path / "checkpoints")] == [4]


def test_a_stop_signal_whose_checkpoint_fails_says_so_instead_of_saved(tmp_path, monkeypatch):
    """SIGTERM during step 3: the step is saved, the write fails, and the run ends with that failure, not
    with the message that the checkpoint is saved."""
    _full_disk_at(monkeypatch, 3)

    class Signalling(ToyLoader):
        def __iter__(self):
            for batch in super().__iter__():
                if self.served == 3:
                    signal.raise_signal(signal.SIGTERM)  # recorded by the trainer's handler
                yield batch

    with pytest.raises(ck.CheckpointWriteError, match=r"^step 3's checkpoint, written in the background"):
        _trainer(tmp_path, 10, save_every=2, loader=Signalling()).fit()
    assert [c.step for c in ck.list_checkpoints(tmp_path / "checkpoints")] == [2]


def test_fit_returns_once_its_last_checkpoint_is_complete(tmp_path, monkeypatch):
    """The writer is slow; fit still returns only after the last checkpoint (and best.json) are on disk."""
    calls, real = [], async_save.write_checkpoint

    def slow(*args):
        threading.Event().wait(0.3)
        calls.append(args[1])
        return real(*args)

    monkeypatch.setattr(async_save, "write_checkpoint", slow)
    trainer = _trainer(tmp_path, 5, save_every=2, eval_every=5)
    trainer.dev_eval = lambda module: {"dev_wer": 0.5}
    out = trainer.fit()
    assert out.step == 5 and calls == [2, 4, 5]
    assert ck.verify_checkpoint(tmp_path / "checkpoints" / "step-000005")
    assert ck.read_best(tmp_path / "checkpoints")["path"] == "step-000005"


def test_an_error_leaving_fit_waits_for_the_checkpoint_in_flight(tmp_path, monkeypatch):
    """Killed during step 6 while the checkpoint of step 4 is still being written: fit lets it complete
    before the error leaves it."""
    killed, real = threading.Event(), async_save.write_checkpoint

    def after_the_kill(*args):
        assert killed.wait(timeout=60)
        return real(*args)

    class Killing(ToyLoader):
        def __iter__(self):
            for batch in super().__iter__():
                if self.served == 6:
                    killed.set()
                    raise KeyboardInterrupt("simulated kill")
                yield batch

    monkeypatch.setattr(async_save, "write_checkpoint", after_the_kill)
    with pytest.raises(KeyboardInterrupt):
        _trainer(tmp_path, 10, loader=Killing()).fit()
    assert [c.step for c in ck.list_checkpoints(tmp_path / "checkpoints")] == [4]
    assert ck.verify_checkpoint(tmp_path / "checkpoints" / "step-000004")


def test_each_save_waits_for_the_write_before_it(tmp_path, monkeypatch):
    """One checkpoint in flight at most: each copy is taken after the previous checkpoint is written."""
    events, write, content = [], async_save.write_checkpoint, ck.checkpoint_content

    def slow_write(root, step, c):
        threading.Event().wait(0.05)
        events.append(f"written {step}")
        return write(root, step, c)

    def copy(module, state, config_yaml, copy=False):
        events.append(f"copied {state['step']}")
        return content(module, state, config_yaml, copy=copy)

    monkeypatch.setattr(async_save, "write_checkpoint", slow_write)
    monkeypatch.setattr("usmkit.training.trainer.checkpoint_content", copy)
    _trainer(tmp_path, 4, save_every=1).fit()
    assert events == [f"{what} {s}" for s in (1, 2, 3, 4) for what in ("copied", "written")]
