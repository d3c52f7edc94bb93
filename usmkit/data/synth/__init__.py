"""The embedded default corpus: multi-voice speech synthesized on this machine with espeak-ng.

Build it with ``python -m usmkit.data.synth out=data/synth size=default seed=0``; see ``build.py``
for the output layout, ``plan.py`` for the splits, ``voices.py`` and ``text.py`` for what is said.
"""

from usmkit.data.synth.build import BuildResult, SynthConfig, build_corpus

__all__ = ["BuildResult", "SynthConfig", "build_corpus"]
