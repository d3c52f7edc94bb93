"""The embedded default corpus: multi-voice speech synthesized on this machine with espeak-ng.

Build it with ``python -m usmkit.cli.prepare synth out=data/synth size=default seed=0``; see ``build.py``
for the output layout, ``plan.py`` for the splits, ``voices.py`` and ``text.py`` for what is said.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from usmkit.data.synth.build import BuildResult, SynthConfig, build_corpus

__all__ = ["BuildResult", "SynthConfig", "build_corpus"]


def __getattr__(name: str):
    # Imported on first use, so that ``python -m usmkit.cli.prepare synth`` runs ``__main__``'s first import
    # (usmkit.cli) before ``build`` loads torch.
    if name in __all__:
        from usmkit.data.synth import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
