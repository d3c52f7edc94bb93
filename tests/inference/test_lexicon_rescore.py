"""``usmkit.cli.evaluate decode=lexicon_rescore``: the lexicon decoder's n-best, rescored by the attention decoder.

A joint CTC/LAS model (``las_teacher`` in conftest.py: a CTC head that emits words) decoded over the corpus's dev
set: with ``rescore_ctc_weight=1`` the rescoring keeps the lexicon's own ranking, so its hypotheses are
``decode=ctc_lexicon``'s; a wider n-best does not change ``ctc_lexicon``'s first; with weight 0 the run decodes
every utterance too (which candidate the attention decoder picks: ``tests/decoding/test_ctc_lexicon.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from usmkit.decoding.ctc_lexicon import LexiconConfig
from usmkit.inference.evaluate import EvalConfig, evaluate

pytest.importorskip("flashlight.lib.text.decoder")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def hypotheses(checkpoint: Path, corpus: Path, **changes) -> list[str]:
    cfg = EvalConfig(checkpoint=str(checkpoint), test_sets=("dev",), manifest_dir=str(corpus), device="cpu", **changes)
    entry = evaluate(cfg)["sets"]["dev"]
    return [e["hyp"] for e in entry["examples"]]


def test_lexicon_rescoring_keeps_the_lexicon_ranking_at_weight_one_and_picks_among_its_nbest(las_teacher, synth_corpus):
    lexicon = LexiconConfig(order=1, beam_size=20, word_score=10.0)  # an untrained model: words only when cheap
    plain = hypotheses(las_teacher, synth_corpus, decode="ctc_lexicon", lexicon=lexicon)
    assert any(plain), "the teacher should say words"
    wide = LexiconConfig(order=1, beam_size=20, word_score=10.0, nbest=5)
    kept = hypotheses(las_teacher, synth_corpus, decode="lexicon_rescore", lexicon=wide, rescore_ctc_weight=1.0)
    assert kept == plain
    attention = hypotheses(las_teacher, synth_corpus, decode="lexicon_rescore", lexicon=wide, rescore_ctc_weight=0.0)
    nbest = hypotheses(las_teacher, synth_corpus, decode="ctc_lexicon", lexicon=wide)  # its first: the same as plain
    assert nbest == plain and len(attention) == len(plain)
