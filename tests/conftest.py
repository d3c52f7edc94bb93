"""Settings and fixtures shared by every test folder.

Fixtures here are the ones several test files need: the embedded corpus at ``size=tiny`` (built once per
session), ``one_thread`` for modules of tiny models and ``aot_eager`` for compiling without inductor. Folder-specific fixtures live in that folder's
``conftest.py`` (``tests/data/conftest.py``: small audio files and lhotse manifests).
"""

import os
import warnings
from pathlib import Path

# The entry points set this (usmkit/entrypoint.py); tests import library modules directly, so set it here,
# before torch loads OpenMP: spinning OpenMP threads stall a shared CPU.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

# Triton kernels run on the CPU under the interpreter (slow but exact); it must be set before any
# @triton.jit function is defined.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(min(2, os.cpu_count() or 1))

# The real corpora (AN4, Kathleen, FSDD) are read from $USMKIT_CORPORA; in this project's checkout they sit
# in ../shared/data. Tests that need one skip where it is missing.
os.environ.setdefault("USMKIT_CORPORA", str(Path(__file__).resolve().parents[1].parent / "shared" / "data"))


@pytest.fixture(scope="session")
def synth_corpus(tmp_path_factory) -> Path:
    """The embedded corpus, ``python -m usmkit.cli.prepare synth out=... size=tiny seed=0 external_engines=false``, built
    once per session (espeak-ng voices only, so the audio does not depend on which other engines are installed).

    Read-only by convention: a test that must change a corpus copies it first.
    """
    from usmkit.data.synth import SynthConfig, build_corpus

    out = tmp_path_factory.mktemp("synth_tiny") / "corpus"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny text: "fewer pieces than requested" is expected
        result = build_corpus(SynthConfig(out=out, size="tiny", seed=0, workers=2, external_engines=False))
    assert not result.skipped
    return out


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module (``pytestmark = pytest.mark.usefixtures("one_thread")``): tiny models on a
    shared 2-core machine run several times faster on one thread. The thread count is restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def aot_eager(monkeypatch):
    """torch.compile with the aot_eager backend: dynamo and autograd tracing without inductor's compile time.
    Dynamo's caches and counters start empty (``torch._dynamo.utils.counters``)."""
    from torch._dynamo.utils import counters

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend="aot_eager", **kw))
    torch._dynamo.reset()
    counters.clear()
