"""``Ranks.device``: the device a batch-transcription process runs on."""

from __future__ import annotations

import torch

from usmkit.inference import ranks as ranks_module
from usmkit.inference.ranks import Ranks


def _fake_cuda(monkeypatch) -> list[torch.device]:
    """``resolve_device`` answers a bare ``cuda``; ``set_device`` records what it is given and, like
    torch's, refuses a device without an index."""
    chosen: list[torch.device] = []

    def set_device(device: torch.device) -> None:
        if device.index is None:
            raise ValueError(f"Expected a torch.device with a specified index, got {device}")
        chosen.append(device)

    monkeypatch.setattr(ranks_module, "resolve_device", lambda name: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return chosen


def test_one_process_on_a_gpu_gets_an_indexed_device(monkeypatch):
    chosen = _fake_cuda(monkeypatch)
    device = Ranks(rank=0, world=1, local_rank=0).device("auto")
    assert device == torch.device("cuda", 0)
    assert chosen == [torch.device("cuda", 0)]


def test_each_process_of_several_gets_its_local_gpu(monkeypatch):
    chosen = _fake_cuda(monkeypatch)
    device = Ranks(rank=3, world=4, local_rank=1).device("cuda")
    assert device == torch.device("cuda", 1)
    assert chosen == [torch.device("cuda", 1)]
