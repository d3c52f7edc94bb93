"""Fixtures of the fault suite: a tiny untrained streamable CTC checkpoint, a copy of the embedded corpus and
finished short runs on it (see fault_helpers.py). Tests run on one torch thread, as the command line does
(OMP_NUM_THREADS=1)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from fault_helpers import fast_train, make_ctc_checkpoint, metrics, worker_train


@pytest.fixture(scope="session")
def ctc_ckpt(tmp_path_factory) -> Path:
    return make_ctc_checkpoint(tmp_path_factory.mktemp("fault_ckpt"))


@pytest.fixture(scope="module")
def corpus(synth_corpus, tmp_path_factory) -> Path:
    """A copy of the embedded corpus per test module: training caches features and statistics next to the
    manifests."""
    out = tmp_path_factory.mktemp("faults") / "corpus"
    shutil.copytree(synth_corpus, out)
    return out


@pytest.fixture(scope="module")
def uninterrupted(corpus, tmp_path_factory) -> Path:
    """A finished ``FAST_TRAIN`` run: 6 steps, checkpoints at steps 2, 4 and 6."""
    exp = tmp_path_factory.mktemp("runs") / "full"
    fast_train(corpus, exp)
    assert [s for s, _ in metrics(exp)] == [1, 2, 3, 4, 5, 6]
    return exp


@pytest.fixture(scope="module")
def uninterrupted_workers(corpus, tmp_path_factory) -> Path:
    """The same run with two loader workers (``FAST_TRAIN_WORKERS``)."""
    exp = tmp_path_factory.mktemp("runs") / "full_workers"
    worker_train(corpus, exp)
    assert [s for s, _ in metrics(exp)] == [1, 2, 3, 4, 5, 6]
    return exp


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread(one_thread):
    """One thread from before a module's runs are trained (module fixtures come before function ones)."""
    yield


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """A command a test runs may set its own thread count: put back the suite's."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
