"""The lexicon an experiment carries: ``<exp_dir>/lexicon/``, written when training starts.

``usmkit-transcribe --lexicon`` and ``usmkit-serve --lexicon`` decode a checkpoint's finals with the words
and word LM of its training transcripts. Rebuilt from the corpus at every launch, they need the corpus where
the run's ``data.manifest_dir`` says (often a path relative to the folder it was trained in); written into
the experiment once, they travel with it, as an export's bundled lexicon does (``usmkit.export.build``).

The folder holds what ``usmkit.decoding.ctc_lexicon.LexiconDecoder`` reads: ``tokens.txt``,
``lexicon.txt`` and ``lm.arpa``, the LM of order ``STREAMING_LEXICON.order`` (what ``--lexicon`` decodes
with; its weights are chosen at decode time).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from lhotse.cut import Cut

from usmkit.checkpointing.atomic import replaced_dir_atomically
from usmkit.decoding.ctc_lexicon import LEXICON_DIR, STREAMING_LEXICON, write_lexicon_files
from usmkit.runs import transcripts_of

log = logging.getLogger(__name__)


def write_run_lexicon(train_cuts: Iterable[Cut], tokenizer, exp_dir: str | Path) -> Path | None:
    """``exp_dir/lexicon/`` from the transcripts of the run's training cuts (the manifests, or the Shar shards'
    manifests), replaced atomically; None, with a warning, where they hold no text or cannot be written
    (``--lexicon`` then rebuilds the lexicon from the run's training manifests). ``tokenizer`` None (BEST-RQ):
    no lexicon."""
    if tokenizer is None:
        return None
    folder = Path(exp_dir) / LEXICON_DIR
    try:
        texts = transcripts_of(train_cuts)
        with replaced_dir_atomically(folder) as tmp:
            words = write_lexicon_files(texts, tokenizer, tmp, STREAMING_LEXICON)
    except (OSError, ValueError) as e:  # no text, or a full disk
        log.warning("%s not written: %s; --lexicon will rebuild it from the training corpus", folder, e)
        return None
    log.info("lexicon for --lexicon: %d words of %d training transcripts in %s", words, len(texts), folder)
    return folder
