"""Fixtures of the fault suite: a tiny untrained streamable CTC checkpoint (see fault_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fault_helpers import make_ctc_checkpoint


@pytest.fixture(scope="session")
def ctc_ckpt(tmp_path_factory) -> Path:
    return make_ctc_checkpoint(tmp_path_factory.mktemp("fault_ckpt"))


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
