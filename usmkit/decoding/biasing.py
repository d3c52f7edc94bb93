"""Contextual biasing of lexicon decoding: phrases with boosts, given at decode time.

A phrase file holds one phrase per line, optionally a tab and its boost (blank lines and ``#``
comments are skipped)::

    kathleen	6
    four two seven	4
    main street

The phrases' words join the lexicon (spelled with the tokenizer's pieces, so a name the training
transcripts never had can be produced), and the word LM is wrapped (``biased_lm``: torchaudio's custom
LM interface, ``CTCDecoderLM``, around flashlight's KenLM) so that each word that continues a phrase
earns the phrase's boost, added to the LM score. A phrase left unfinished gives its boosts back when
the path leaves it (or ends), as in WeNet's and icefall's context graphs: only whole phrases keep
their bonus, so a common first word ("main") is not favoured on its own. Boosts are in the units of
the decoder's score (like ``LexiconConfig.word_score``): the wrapper divides them by ``lm_weight``,
which the decoder multiplies every LM score by.

The search is flashlight's lexicon beam search (``usmkit.decoding.ctc_lexicon.LexiconDecoder``,
which takes the phrases as ``bias``); what is ours is the phrase trie over word indices and the state
bookkeeping, the pattern of torchaudio's custom-LM tutorial (one ``CTCDecoderLMState`` child per word).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from usmkit.errors import UsageError
from usmkit.metrics import TextNormConfig, normalize_text

DEFAULT_BOOST = 5.0  # per word of a phrase, when its line gives none


class BiasPhraseError(UsageError, ValueError):
    """A phrase file that cannot be read or a line of it that is not a phrase; the message names it."""


@dataclass(frozen=True)
class BiasPhrase:
    """A phrase (its normalized words) and the boost each of its words earns."""

    words: tuple[str, ...]
    boost: float = DEFAULT_BOOST

    def __post_init__(self) -> None:
        if not self.words:
            raise ValueError("a bias phrase needs at least one word")
        if not math.isfinite(self.boost):
            raise ValueError(f"bias boost must be a finite number, got {self.boost}")


def parse_bias_phrases(lines: Iterable[str], where: str = "phrases", norm: TextNormConfig | None = None):
    """``BiasPhrase``s of ``phrase[<TAB>boost]`` lines, the phrase normalized as transcripts are;
    ``BiasPhraseError`` naming ``where`` and the line for one that cannot be read."""
    norm = norm or TextNormConfig()
    phrases: list[BiasPhrase] = []
    for number, line in enumerate(lines, 1):
        text = line.rstrip("\n")
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        phrase, _, boost = text.partition("\t")
        words = tuple(normalize_text(phrase, norm).split())
        try:
            value = float(boost) if boost.strip() else DEFAULT_BOOST
            phrases.append(BiasPhrase(words, value))
        except ValueError as e:
            raise BiasPhraseError(
                f"{where}, line {number}: {text!r} is not 'phrase<TAB>boost' ({e}); write one phrase a line, "
                "optionally a tab and a number"
            ) from None
    if not phrases:
        raise BiasPhraseError(f"{where} holds no phrase: write one phrase a line, optionally a tab and its boost")
    return tuple(phrases)


def read_bias_phrases(path: str | Path, norm: TextNormConfig | None = None) -> tuple[BiasPhrase, ...]:
    """The phrases of the file ``path`` (``parse_bias_phrases``); ``BiasPhraseError`` naming it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BiasPhraseError(f"cannot read the bias phrases {path}: {e}") from None
    return parse_bias_phrases(text.splitlines(), str(path), norm)


def extend_lexicon(lexicon: Path, phrases: Sequence[BiasPhrase], tokenizer, out: Path) -> list[str]:
    """Copy the lexicon file ``lexicon`` to ``out`` with the phrases' words it lacks (spelled with the
    tokenizer's pieces) appended; returns the words added."""
    text = lexicon.read_text(encoding="utf-8")
    known = {line.split("\t", 1)[0] for line in text.splitlines() if line}
    added: list[str] = []
    lines = [text.rstrip("\n")]
    for word in dict.fromkeys(w for p in phrases for w in p.words):
        pieces = [tokenizer.id_to_piece(i) for i in tokenizer.encode(word)]
        if word not in known and pieces:
            lines.append(f"{word}\t{' '.join(pieces)}")
            added.append(word)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return added


@dataclass
class _Node:
    """A place in the phrase trie: the words reached so far of one or more phrases."""

    children: dict[int, _Node] = field(default_factory=dict)
    boost: float = 0.0  # what the word that led here earned
    complete: bool = False  # a whole phrase ends here


def _phrase_trie(phrases: Sequence[BiasPhrase], word_index) -> _Node:
    root = _Node()
    for phrase in phrases:
        node = root
        for word in phrase.words:
            index = word_index(word)
            child = node.children.setdefault(index, _Node(boost=phrase.boost))
            child.boost = max(child.boost, phrase.boost)  # phrases sharing a prefix: the larger boost
            node = child
        node.complete = True
    return root


def biased_lm(lm_path: str | None, lexicon: Path, phrases: Sequence[BiasPhrase], lm_weight: float):
    """The word LM of ``lm_path`` (ARPA or KenLM binary; None: no LM) over the words of the lexicon file
    ``lexicon``, with the phrases' boosts: a ``CTCDecoderLM`` for ``ctc_decoder(lexicon=lexicon, lm=...)``.

    The word indices are the ones ``ctc_decoder`` gives the lexicon's words (flashlight's
    ``create_word_dict`` of the same file)."""
    from flashlight.lib.text.decoder import ZeroLM
    from flashlight.lib.text.dictionary import create_word_dict, load_words
    from torchaudio.models.decoder import CTCDecoderLM, CTCDecoderLMState

    if not lm_weight > 0:
        raise ValueError(f"biasing adds to the LM score, which lm_weight={lm_weight} switches off: use lm_weight > 0")
    words = create_word_dict(load_words(str(lexicon)))
    if lm_path is None:
        inner = ZeroLM()
    else:
        try:
            from flashlight.lib.text.decoder.kenlm import KenLM
        except ImportError:
            from flashlight.lib.text.decoder import KenLM
        inner = KenLM(lm_path, words)
    root = _phrase_trie(phrases, words.get_index)

    class BiasedLM(CTCDecoderLM):
        """``inner``'s scores plus the boosts of the phrase words each path continues (module docstring).
        Each state is the child, per word, of the state before it; ``_states`` maps it to (the inner LM's
        state, the place in the phrase trie, the boosts earned in the unfinished phrase, the state's score)."""

        def __init__(self) -> None:
            CTCDecoderLM.__init__(self)
            self.inner = inner
            self._states: dict[CTCDecoderLMState, tuple] = {}

        def start(self, start_with_nothing: bool):
            self._states = {}  # one utterance at a time: the previous one's states are done with
            state = CTCDecoderLMState()
            self._states[state] = (self.inner.start(start_with_nothing), root, 0.0, 0.0)
            return state

        def score(self, state, word: int):
            child = state.child(word)
            if child not in self._states:
                inner_state, node, earned, _ = self._states[state]
                next_inner, lm_score = self.inner.score(inner_state, word)
                bonus = 0.0
                if word not in node.children:  # the path leaves the phrase: its boosts go back
                    bonus, earned, node = -earned, 0.0, root
                if word in node.children:
                    node = node.children[word]
                    bonus += node.boost / lm_weight
                    earned += node.boost / lm_weight
                    if node.complete:  # a whole phrase: its bonus stays
                        earned = 0.0
                        node = node if node.children else root
                self._states[child] = (next_inner, node, earned, lm_score + bonus)
            return child, self._states[child][3]

        def finish(self, state):
            inner_state, _, earned, _ = self._states[state]
            _, lm_score = self.inner.finish(inner_state)
            return state, lm_score - earned  # an unfinished phrase at the end gives its boosts back

    return BiasedLM()
