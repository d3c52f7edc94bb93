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
from pathlib import Path

from usmkit.checkpointing.atomic import replaced_dir_atomically
from usmkit.config import TrainConfig
from usmkit.decoding.ctc_lexicon import LEXICON_DIR, STREAMING_LEXICON, write_lexicon_files
from usmkit.runs import lexicon_texts

log = logging.getLogger(__name__)


def write_run_lexicon(cfg: TrainConfig, tokenizer, exp_dir: str | Path) -> Path | None:
    """``exp_dir/lexicon/`` from the run's training transcripts (``usmkit.runs.lexicon_texts``), replaced
    atomically; None, with a warning, where they cannot be read or hold no text (``--lexicon`` then rebuilds
    the lexicon from the run's training manifests). ``tokenizer`` None (BEST-RQ): no lexicon."""
    if tokenizer is None:
        return None
    folder = Path(exp_dir) / LEXICON_DIR
    try:
        texts = lexicon_texts(cfg)
        with replaced_dir_atomically(folder) as tmp:
            words = write_lexicon_files(texts, tokenizer, tmp, STREAMING_LEXICON)
    except (OSError, ValueError) as e:  # no readable split (a Shar-only corpus), no text, or a full disk
        log.warning("%s not written: %s; --lexicon will rebuild it from the training corpus", folder, e)
        return None
    log.info("lexicon for --lexicon: %d words of %d training transcripts in %s", words, len(texts), folder)
    return folder
