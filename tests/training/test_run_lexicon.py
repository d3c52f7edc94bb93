"""``write_run_lexicon``: what it writes when the training transcripts are there is covered end to end
(tests/cli/test_train.py, tests/streaming/test_transcribe_cli.py); here, the runs it leaves alone."""

from __future__ import annotations

import logging

from usmkit.training.run_lexicon import write_run_lexicon


def test_no_transcripts_or_no_tokenizer_write_nothing_and_training_goes_on(tmp_path, caplog):
    cuts = []  # a split without transcripts
    assert write_run_lexicon(cuts, None, tmp_path) is None  # BEST-RQ: no tokenizer, no lexicon
    with caplog.at_level(logging.WARNING):
        assert write_run_lexicon(cuts, object(), tmp_path) is None
    assert "--lexicon will rebuild it from the training corpus" in caplog.text
    assert list(tmp_path.iterdir()) == []  # no folder, no temporary
