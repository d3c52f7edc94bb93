"""The sentencepiece tokenizer every model head and the text encoder share.

Fixed special ids (the same in every model we train):

    0 <blank>  CTC blank; sentencepiece's pad piece, never produced by ``encode``
    1 <unk>    unknown (rare: byte fallback spells unseen characters as UTF-8 byte pieces)
    2 <s>      begin of sentence (LAS decoder), never produced by ``encode``
    3 </s>     end of sentence (LAS decoder), never produced by ``encode``

The model is a unigram (or BPE) model over all languages at once with ``character_coverage=1.0``
and ``byte_fallback=True``. Byte fallback reserves 256 byte pieces, so a model needs at least
``4 + 256 + (distinct characters)`` pieces: a smaller ``vocab_size`` raises ``ValueError``. A
``vocab_size`` larger than the texts can fill is a soft limit (``hard_vocab_limit=False``): the model
gets as many pieces as the texts support, with a warning.

Unigram's pieces for a corpus of a few words depend on the sentencepiece version: for FSDD's ten
digit words 0.2.2 makes nine of them one piece each and 0.2.3 spells them in characters. BPE gives
each one piece in both, and a model whose pieces are whole words learns FSDD better: hence
``tokenizer_type=bpe`` in the FSDD baseline (``experiments/baseline_wer/``).
"""

from __future__ import annotations

import os
import unicodedata
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from usmkit.errors import UsageError

BLANK_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
NUM_BYTE_PIECES = 256
PAD_VALUE = -1  # padding in Batch.tokens; decode skips it
MODEL_FILE = "tokenizer.model"


def minimum_vocab_size(texts: Iterable[str]) -> int:
    """Smallest vocab_size sentencepiece accepts for ``texts`` with byte fallback and full coverage."""
    chars = set()
    for text in texts:
        chars.update(unicodedata.normalize("NFKC", text))
    chars.discard(" ")
    return 4 + NUM_BYTE_PIECES + len(chars) + 1  # +1: the word-boundary piece "▁"


class VocabularyError(UsageError, ValueError):
    """A vocabulary size the training texts cannot fit (the message says the smallest that fits)."""


class TokenizerFileError(UsageError, ValueError):
    """A file that is not a sentencepiece model usmkit can use (the message names it)."""


class Tokenizer:
    """A trained sentencepiece model with usmkit's fixed special ids."""

    def __init__(self, processor: spm.SentencePieceProcessor, path: Path | None = None) -> None:
        specials = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        if specials != (BLANK_ID, UNK_ID, BOS_ID, EOS_ID):
            raise TokenizerFileError(
                f"sentencepiece model {path} has special ids (pad, unk, bos, eos) = {specials}; usmkit needs "
                f"{(BLANK_ID, UNK_ID, BOS_ID, EOS_ID)}: train it with Tokenizer.train"
            )
        self._sp = processor
        self._path = path

    @property
    def model_proto(self) -> bytes:
        """The serialized sentencepiece model: equal bytes, equal tokenization."""
        return self._sp.serialized_model_proto()

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Load ``path`` (a ``.model`` file, or a directory holding ``tokenizer.model``)."""
        path = Path(path)
        if path.is_dir():
            path = path / MODEL_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"no sentencepiece model at {path}; train one with Tokenizer.train(...) or build the corpus "
                f"with `python -m usmkit.cli.prepare synth out=...` (it writes out/tokenizer/{MODEL_FILE})"
            )
        try:
            processor = spm.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError) as e:  # sentencepiece's wording: "could not parse ModelProto from ..."
            first = str(e).splitlines()[0] if str(e) else ""
            raise TokenizerFileError(
                f"{path} is not a sentencepiece model ({type(e).__name__}: {first}); point tokenizer= at a "
                f"sentencepiece .model file (a corpus's tokenizer/{MODEL_FILE}), or leave tokenizer unset to use "
                "the corpus's (trained on its transcripts when missing)"
            ) from None
        return cls(processor, path)

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        out_dir: str | os.PathLike[str],
        vocab_size: int = 512,
        model_type: str = "unigram",
    ) -> Tokenizer:
        """Train on ``texts`` and write ``out_dir/tokenizer.model`` and ``out_dir/tokenizer.vocab``."""
        if model_type not in ("unigram", "bpe"):
            raise ValueError(f"model_type must be 'unigram' or 'bpe', got {model_type!r}")
        texts = [t for t in (text.strip() for text in texts) if t]
        if not texts:
            raise ValueError("Tokenizer.train got no non-empty texts")
        minimum = minimum_vocab_size(texts)
        if vocab_size < minimum:
            raise VocabularyError(
                f"vocab_size={vocab_size} is too small for these texts: byte fallback needs 4 special + "
                f"{NUM_BYTE_PIECES} byte pieces + {minimum - 4 - NUM_BYTE_PIECES} characters = {minimum}; "
                f"pass vocab_size >= {minimum}"
            )
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_prefix=str(out_dir / Path(MODEL_FILE).stem),
            vocab_size=vocab_size,
            hard_vocab_limit=False,  # a soft maximum: small corpora get fewer pieces (warned below)
            model_type=model_type,
            character_coverage=1.0,
            byte_fallback=True,
            pad_id=BLANK_ID,
            pad_piece="<blank>",
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            num_threads=min(os.cpu_count() or 1, 8),
            minloglevel=2,
        )
        tokenizer = cls.load(out_dir / MODEL_FILE)
        if tokenizer.vocab_size < vocab_size:
            warnings.warn(
                f"tokenizer trained with {tokenizer.vocab_size} pieces, fewer than the requested "
                f"{vocab_size}: the {len(texts)} texts do not support more",
                stacklevel=2,
            )
        return tokenizer

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def blank_id(self) -> int:
        return BLANK_ID

    @property
    def unk_id(self) -> int:
        return UNK_ID

    @property
    def bos_id(self) -> int:
        return BOS_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def path(self) -> Path | None:
        """The ``.model`` file this tokenizer was loaded from."""
        return self._path

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; never 0 (blank), 2 (bos) or 3 (eos)."""
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts), out_type=int)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, skipping blank, bos, eos and the padding value -1."""
        size = self.vocab_size
        kept = []
        for i in ids:
            i = int(i)
            if i in (BLANK_ID, BOS_ID, EOS_ID, PAD_VALUE):
                continue
            if not 0 <= i < size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {size}) of {self._path}")
            kept.append(i)
        return self._sp.decode(kept)

    def pieces(self, text: str) -> list[str]:
        """The pieces of ``text`` (for inspection)."""
        return self._sp.encode(text, out_type=str)

    def id_to_piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(int(token_id))
