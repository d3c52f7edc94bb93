"""Every offline decode mode in one table (``DECODE_MODES``), and the one dispatch that runs them.

Shapes: B batch, T feature frames, F feature bins, T' encoder frames, D encoder dim, V vocabulary.

A mode works on a batch's encoder output and the heads that read it (``Encoded``). A model that decodes
has ``encode(features (B, T, F), lengths (B,)) -> (enc (B, T', D), enc_lens (B,))`` and its heads as
attributes: ``ctc`` (enc -> log-probs (B, T', V)) and ``las`` (``usmkit.models.las.LASDecoder``), either
None where the model has no such head (``AsrModel``, ``MostModel``). Models do not decode themselves:
decoding sits above them.

    mode             heads      how
    ctc_greedy       CTC        best path                                               ensembles too
    ctc_beam         CTC        prefix beam search                                      ensembles too
    las_beam         LAS        attention beam search (length_penalty, max_len)
    rescore          CTC + LAS  prefix beam n-best rescored by the attention decoder
    ctc_lexicon      CTC        the word decoder (lexicon + word LM, ``LexiconDecoder``) ensembles too
    lexicon_rescore  CTC + LAS  the word decoder's n-best rescored by the attention decoder

A new mode is one ``DecodeMode`` in the table: its search function (``tokens`` for token ids, ``words``
for a word decoder's transcripts), the heads it reads, and ``candidates`` if an ensemble can decode with
it (``usmkit.decoding.ensemble``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from usmkit.decoding.ctc_greedy import ctc_greedy, ctc_greedy_hypotheses
from usmkit.decoding.ctc_prefix_beam import ctc_prefix_beam_search_batch
from usmkit.decoding.ensemble import Candidates, CtcEnsemble
from usmkit.decoding.hypothesis import Hypothesis
from usmkit.decoding.las_beam import las_beam_search
from usmkit.decoding.rescoring import attention_rescore_batch, rescore_lexicon_nbest

if TYPE_CHECKING:
    from usmkit.data.tokenizer import Tokenizer
    from usmkit.models.las import LASDecoder


@dataclass(frozen=True)
class Encoded:
    """One batch's encoder output and the heads that read it."""

    enc: torch.Tensor  # (B, T', D)
    lens: torch.Tensor  # (B,) valid encoder frames
    ctc: torch.nn.Module | None  # enc -> log-probs (B, T', V)
    las: LASDecoder | None

    def log_probs(self) -> torch.Tensor:
        """The CTC head's log-probs (B, T', V)."""
        return self.ctc(self.enc)


@dataclass(frozen=True)
class DecodeOptions:
    """The settings a mode may read; each mode's row in the module docstring says which."""

    beam_size: int = 10
    rescore_ctc_weight: float = 0.3  # rescore / lexicon_rescore: the first pass's share of the score
    length_penalty: float = 0.0  # las_beam: added per token
    max_len: int | None = None  # las_beam: the longest hypothesis in tokens (None: from the audio)
    # ctc_lexicon / lexicon_rescore: ``usmkit.decoding.ctc_lexicon.LexiconDecoder`` (or what has its calls)
    word_decoder: Any = None


TokenSearch = Callable[[Encoded, DecodeOptions], list[Hypothesis]]  # the best hypothesis per utterance
WordSearch = Callable[[Encoded, DecodeOptions, "Tokenizer"], list[str]]  # the best transcript per utterance
# One member's log-probs (B, T', V), lengths (B,) -> candidate token sequences per utterance (an ensemble's)
CandidateSearch = Callable[[torch.Tensor, torch.Tensor, DecodeOptions, "Tokenizer"], Candidates]


@dataclass(frozen=True)
class DecodeMode:
    """One row of ``DECODE_MODES``: the heads a mode reads and how it searches (``tokens`` or ``words``)."""

    ctc: bool  # reads the CTC head
    las: bool  # reads the attention decoder
    tokens: TokenSearch | None = None
    words: WordSearch | None = None  # a word decoder's transcripts (DecodeOptions.word_decoder)
    candidates: CandidateSearch | None = None  # an ensemble's candidates from one member; None: no ensembles

    def __post_init__(self) -> None:
        if (self.tokens is None) == (self.words is None):
            raise ValueError("a DecodeMode searches with tokens or with words, one of them")

    @property
    def lexicon(self) -> bool:
        """Whether the mode needs a word decoder (DecodeOptions.word_decoder)."""
        return self.words is not None


# ---------------------------------------------------------------- the searches
def _ctc_greedy(x: Encoded, opts: DecodeOptions) -> list[Hypothesis]:
    return ctc_greedy_hypotheses(x.log_probs(), x.lens)


def _ctc_beam(x: Encoded, opts: DecodeOptions) -> list[Hypothesis]:
    return [nbest[0] for nbest in ctc_prefix_beam_search_batch(x.log_probs(), x.lens, opts.beam_size)]


def _las_beam(x: Encoded, opts: DecodeOptions) -> list[Hypothesis]:
    nbests = las_beam_search(
        x.las, x.enc, x.lens, opts.beam_size, max_len=opts.max_len, length_penalty=opts.length_penalty
    )
    return [nbest[0] for nbest in nbests]


def _rescore(x: Encoded, opts: DecodeOptions) -> list[Hypothesis]:
    nbests = ctc_prefix_beam_search_batch(x.log_probs(), x.lens, opts.beam_size)
    return attention_rescore_batch(x.las, x.enc, x.lens, nbests, ctc_weight=opts.rescore_ctc_weight)


def _ctc_lexicon(x: Encoded, opts: DecodeOptions, tokenizer: Tokenizer) -> list[str]:
    return opts.word_decoder(x.log_probs(), x.lens)


def _lexicon_rescore(x: Encoded, opts: DecodeOptions, tokenizer: Tokenizer) -> list[str]:
    nbests = opts.word_decoder.scored_nbest(x.log_probs(), x.lens)
    return rescore_lexicon_nbest(x.las, tokenizer, x.enc, x.lens, nbests, opts.rescore_ctc_weight)


def _greedy_candidates(log_probs: torch.Tensor, lens: torch.Tensor, opts: DecodeOptions, tokenizer) -> Candidates:
    return [[tuple(ids)] for ids in ctc_greedy(log_probs, lens)]


def _beam_candidates(log_probs: torch.Tensor, lens: torch.Tensor, opts: DecodeOptions, tokenizer) -> Candidates:
    """The whole n-best list of each utterance."""
    nbests = ctc_prefix_beam_search_batch(log_probs, lens, opts.beam_size)
    return [[tuple(h.tokens) for h in nbest] for nbest in nbests]


def _lexicon_candidates(log_probs: torch.Tensor, lens: torch.Tensor, opts: DecodeOptions, tokenizer) -> Candidates:
    """The word decoder's whole n-best list (its best transcript where it has no ``nbest``), as token ids."""
    decoder = opts.word_decoder
    texts = decoder.nbest(log_probs, lens) if hasattr(decoder, "nbest") else [[t] for t in decoder(log_probs, lens)]
    return [[tuple(tokenizer.encode(t)) for t in texts_b] or [()] for texts_b in texts]


DECODE_MODES: dict[str, DecodeMode] = {
    "ctc_greedy": DecodeMode(ctc=True, las=False, tokens=_ctc_greedy, candidates=_greedy_candidates),
    "ctc_beam": DecodeMode(ctc=True, las=False, tokens=_ctc_beam, candidates=_beam_candidates),
    "las_beam": DecodeMode(ctc=False, las=True, tokens=_las_beam),
    "rescore": DecodeMode(ctc=True, las=True, tokens=_rescore),
    "ctc_lexicon": DecodeMode(ctc=True, las=False, words=_ctc_lexicon, candidates=_lexicon_candidates),
    "lexicon_rescore": DecodeMode(ctc=True, las=True, words=_lexicon_rescore),
}
LEXICON_MODES = tuple(name for name, m in DECODE_MODES.items() if m.lexicon)  # the modes that need a word decoder
ATTENTION_MODES = tuple(name for name, m in DECODE_MODES.items() if m.las)  # the modes that need a LAS decoder
RESCORE_MODES = tuple(name for name, m in DECODE_MODES.items() if m.ctc and m.las)  # two passes: rescore_ctc_weight
ENSEMBLE_MODES = tuple(name for name, m in DECODE_MODES.items() if m.candidates is not None)


# ---------------------------------------------------------------- the dispatch
def decode_mode(name: str, model: torch.nn.Module | None = None) -> DecodeMode:
    """``DECODE_MODES[name]``, after checking that ``model`` (when given) has the heads it reads; ValueError
    naming what is missing otherwise."""
    mode = DECODE_MODES.get(name)
    if mode is None:
        raise ValueError(f"unknown decode mode {name!r}; choose one of {tuple(DECODE_MODES)}")
    if model is None:
        return mode
    if isinstance(model, CtcEnsemble):
        if mode.candidates is None:
            raise ValueError(f"an ensemble decodes with {ENSEMBLE_MODES}, not {name!r}")
        return mode
    if mode.las and getattr(model, "las", None) is None:
        raise ValueError(
            f"decode mode {name!r} needs a LAS decoder, but this {type(model).__name__} has none (a CTC model: "
            "decode with ctc_greedy, ctc_beam or ctc_lexicon)"
        )
    if mode.ctc and getattr(model, "ctc", None) is None:
        raise ValueError(
            f"decode mode {name!r} needs a CTC head, but this {type(model).__name__} has none; use 'las_beam'"
        )
    return mode


def encoded(model: torch.nn.Module, features: torch.Tensor, lengths: torch.Tensor) -> Encoded:
    """features (B, T, F), lengths (B,) through ``model``'s encoder, with its heads."""
    enc, enc_lens = model.encode(features, lengths)
    return Encoded(enc, enc_lens, getattr(model, "ctc", None), getattr(model, "las", None))


@torch.no_grad()
def decode_hypotheses(
    model: torch.nn.Module,
    features: torch.Tensor,
    lengths: torch.Tensor,
    mode: str = "ctc_greedy",
    beam_size: int = 10,
    rescore_ctc_weight: float = 0.3,
    length_penalty: float = 0.0,
    max_len: int | None = None,
) -> list[Hypothesis]:
    """Best hypothesis per utterance of features (B, T, F), lengths (B,), with scores (and timestamps for the
    CTC modes), in a mode that searches token ids (not the lexicon modes). Call ``model.eval()`` first."""
    spec = decode_mode(mode, model)
    if spec.tokens is None:
        raise ValueError(f"decode mode {mode!r} returns words, not token ids: use decode_texts with a word decoder")
    opts = DecodeOptions(beam_size, rescore_ctc_weight, length_penalty, max_len)
    return spec.tokens(encoded(model, features, lengths), opts)


def decode(model: torch.nn.Module, features: torch.Tensor, lengths: torch.Tensor, mode: str = "ctc_greedy", **options):
    """Token ids of the best hypothesis per utterance (the caller detokenizes); see ``decode_hypotheses``."""
    return [list(h.tokens) for h in decode_hypotheses(model, features, lengths, mode, **options)]


@torch.no_grad()
def decode_texts(
    module: torch.nn.Module,
    features: torch.Tensor,
    lengths: torch.Tensor,
    tokenizer: Tokenizer,
    mode: str = "ctc_greedy",
    opts: DecodeOptions | None = None,
) -> list[str]:
    """One transcript per utterance of features (B, T, F), lengths (B,) from a model or a ``CtcEnsemble``.

    ``opts.word_decoder``, when given, replaces a mode that searches token ids by ``ctc_lexicon``; the
    lexicon modes need it."""
    opts = opts or DecodeOptions()
    if opts.word_decoder is not None and not DECODE_MODES.get(mode, DECODE_MODES["ctc_greedy"]).lexicon:
        mode = "ctc_lexicon"
    spec = decode_mode(mode, module)
    if spec.lexicon and opts.word_decoder is None:
        raise ValueError(f"decode mode {mode!r} needs a word decoder (usmkit.decoding.ctc_lexicon.LexiconDecoder)")
    if isinstance(module, CtcEnsemble):
        return module.transcribe(
            features, lengths, tokenizer, lambda lp, lens: spec.candidates(lp, lens, opts, tokenizer)
        )
    x = encoded(module, features, lengths)
    if spec.words is not None:
        return spec.words(x, opts, tokenizer)
    return [tokenizer.decode(list(h.tokens)) for h in spec.tokens(x, opts)]
