"""Text normalization (one definition for corpus preparation, training and scoring) and WER / CER
scoring through jiwer."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import asdict, dataclass

import jiwer

_EDGE_APOSTROPHES = re.compile(r"(^|\s)'+|'+(?=\s|$)")


@dataclass(frozen=True)
class TextNormConfig:
    lowercase: bool = True
    remove_punctuation: bool = True  # unicode categories P* and S* become spaces
    keep_apostrophes: bool = True  # apostrophes inside words (it's, l'école); those at a word's edges go
    strip_accents: bool = False


def normalize_text(text: str, cfg: TextNormConfig = TextNormConfig()) -> str:
    """NFC, lowercase, punctuation and symbols to spaces, whitespace collapsed; digits stay digits.

    >>> normalize_text("Hello, World!  It's  'ME'.")
    "hello world it's me"
    >>> normalize_text("It's", TextNormConfig(keep_apostrophes=False))
    'it s'
    """
    text = unicodedata.normalize("NFC", text)
    if cfg.lowercase:
        text = text.lower()
    if cfg.strip_accents:
        text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    if cfg.remove_punctuation:
        text = "".join(" " if unicodedata.category(c)[0] in "PS" and c != "'" else c for c in text)
        text = _EDGE_APOSTROPHES.sub(" ", text)
        if not cfg.keep_apostrophes:
            text = text.replace("'", " ")
    return " ".join(text.split())


@dataclass(frozen=True)
class ErrorStats:
    utterances: int
    ref_words: int
    substitutions: int
    deletions: int
    insertions: int
    wer: float
    ref_chars: int
    char_errors: int
    cer: float

    def as_dict(self) -> dict:
        return asdict(self)


def score(refs: list[str], hyps: list[str]) -> ErrorStats:
    """Corpus-level WER and CER (errors summed over utterances / reference length).

    jiwer rejects empty references; an empty reference counts every hypothesis word as an insertion.
    """
    if len(refs) != len(hyps):
        raise ValueError(f"{len(refs)} references but {len(hyps)} hypotheses")
    pairs = [(r, h) for r, h in zip(refs, hyps, strict=True) if r.strip()]
    empty_ref_words = sum(len(h.split()) for r, h in zip(refs, hyps, strict=True) if not r.strip())
    empty_ref_chars = sum(len(h) for r, h in zip(refs, hyps, strict=True) if not r.strip())
    s = d = i = n_words = char_err = n_chars = 0
    if pairs:
        r, h = [p[0] for p in pairs], [p[1] for p in pairs]
        # jiwer needs a non-empty hypothesis string too; a single space transform keeps it aligned.
        h = [x if x.strip() else "" for x in h]
        words = jiwer.process_words(r, h)
        s, d, i = words.substitutions, words.deletions, words.insertions
        n_words = s + d + words.hits
        chars = jiwer.process_characters(r, h)
        char_err = chars.substitutions + chars.deletions + chars.insertions
        n_chars = chars.substitutions + chars.deletions + chars.hits
    i += empty_ref_words
    char_err += empty_ref_chars
    return ErrorStats(
        utterances=len(refs),
        ref_words=n_words,
        substitutions=s,
        deletions=d,
        insertions=i,
        wer=(s + d + i) / max(n_words, 1),
        ref_chars=n_chars,
        char_errors=char_err,
        cer=char_err / max(n_chars, 1),
    )
