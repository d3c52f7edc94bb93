"""Checkpoint averaging: the mean of the last N checkpoints' weights, refused across runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from usmkit.checkpointing.average import average_last
from usmkit.checkpointing.checkpoint import CONFIG_FILE, MODEL_FILE, CheckpointError, save_checkpoint
from usmkit.cli.average import main
from usmkit.errors import UsageError


def _net(width: int = 4) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.BatchNorm1d(width))


def _save_run(root: Path, steps: list[int], width: int = 4) -> list[dict[str, torch.Tensor]]:
    saved = []
    for step in steps:
        torch.manual_seed(step)
        net = _net(width)
        net[1].num_batches_tracked.fill_(step)
        net[1].running_mean.normal_()
        save_checkpoint(root, step, net, {"step": step}, f"step: {step}\n")
        saved.append({k: v.clone() for k, v in net.state_dict().items()})
    return saved


def test_average_of_the_last_checkpoints(tmp_path):
    saved = _save_run(tmp_path / "checkpoints", [10, 20, 30, 40])
    out, steps = average_last(tmp_path, last=3)
    assert out == tmp_path / "checkpoints" / "avg-last3" and steps == [20, 30, 40]
    avg = load_file(str(out / MODEL_FILE))
    for k, v in avg.items():
        if v.is_floating_point():
            torch.testing.assert_close(v, torch.stack([s[k] for s in saved[1:]]).mean(0))
        else:  # integer buffers come from the newest checkpoint
            assert torch.equal(v, saved[-1][k])
    assert (out / CONFIG_FILE).read_text() == "step: 40\n"  # the newest checkpoint's config
    # The averaged checkpoint loads into the model it came from.
    _net().load_state_dict(avg)


def test_average_of_one_is_the_checkpoint(tmp_path):
    saved = _save_run(tmp_path / "checkpoints", [5, 6])
    avg = load_file(str(average_last(tmp_path, last=1)[0] / MODEL_FILE))
    for k in saved[-1]:
        assert torch.equal(avg[k], saved[-1][k])


def test_too_few_checkpoints_is_a_clear_error(tmp_path, capsys):
    _save_run(tmp_path / "checkpoints", [1, 2])
    with pytest.raises(UsageError, match=r"holds 2 checkpoint\(s\).*keep_last"):
        average_last(tmp_path, last=3)
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path), "--last", "5"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "keep_last" in err and "Traceback" not in err


def test_checkpoints_of_another_model_are_refused(tmp_path):
    root = tmp_path / "checkpoints"
    _save_run(root, [1])
    _save_run(root, [2], width=8)
    with pytest.raises(CheckpointError, match=r"step-000002: 0.bias has shape \(8,\)"):
        average_last(tmp_path, last=2)
