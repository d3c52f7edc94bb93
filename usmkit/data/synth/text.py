"""Transcripts for the synthetic corpus: word sequences drawn from wordfreq lists, and digit strings.

Vocabulary: the top 1500 English words and top 500 German, Spanish, French and Italian words of
``wordfreq`` (alphabetic words only), small enough for a tiny model to learn in minutes. Words are
drawn independently with p(word) proportional to ``word_frequency ** 0.5``: the square root
flattens Zipf's law so that the rarer half of the list is heard often enough to be learned.

Held-out words: 100 English content words (fixed: the same for every seed and size; never a digit
word or a word of another corpus language) never occur in any paired speech except ``test_textonly``, and occur in the ``text_only`` pool, so the gain from
text injection on words the model has never heard can be measured.
"""

from __future__ import annotations

import bisect
import itertools
import random
import unicodedata
from dataclasses import dataclass
from functools import cache

from usmkit.metrics import normalize_text

LANGUAGES: tuple[str, ...] = ("en", "de", "es", "fr", "it")
LANGUAGE_SHARES: dict[str, float] = {"en": 0.70, "de": 0.075, "es": 0.075, "fr": 0.075, "it": 0.075}
TOP_N: dict[str, int] = {"en": 1500, "de": 500, "es": 500, "fr": 500, "it": 500}
FREQUENCY_EXPONENT = 0.5
MIN_WORDS, MAX_WORDS = 4, 16
MIN_DIGITS, MAX_DIGITS = 3, 9
DIGIT_SHARE = 0.1  # share of utterances that are digit strings
HELDOUT_COUNT = 100
HELDOUT_MIN_RANK = 200  # held-out words come from below the 200 most frequent (content words)
HELDOUT_SEED = "usmkit-synth-heldout-v1"  # fixed: the held-out list does not depend on the corpus seed

DIGIT_WORDS: dict[str, tuple[str, ...]] = {
    "en": ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"),
    "de": ("null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun"),
    "es": ("cero", "uno", "dos", "tres", "cuatro", "cinco", "seis", "siete", "ocho", "nueve"),
    "fr": ("zéro", "un", "deux", "trois", "quatre", "cinq", "six", "sept", "huit", "neuf"),
    "it": ("zero", "uno", "due", "tre", "quattro", "cinque", "sei", "sette", "otto", "nove"),
}
# One-letter words that are real words; other single letters in wordfreq lists are elision or
# contraction fragments ("l'", "qu'", "'s").
_SINGLE_LETTER_WORDS: dict[str, frozenset[str]] = {
    "en": frozenset("ai"),
    "de": frozenset(),
    "es": frozenset("ayoeu"),
    "fr": frozenset("aày"),
    "it": frozenset("aeèio"),
}
# Contraction fragments, abbreviations and roman numerals that espeak-ng spells out or reads
# differently from their spelling, and English words inside the other languages' lists.
_BLOCKED: dict[str, frozenset[str]] = {
    "en": frozenset("re ll ve st nd rd th vs ok ii iii iv uk usa lol etc co al de la pre".split()),
    "de": frozenset("the of is us her usa eu de ne".split()),
    "es": frozenset("the etc web".split()),
    "fr": frozenset("qu the but in of etc ca ci".split()),
    "it": frozenset("the of ex po de".split()),
}
_VOWELS = frozenset("aeiouyäöüàâéèêëîïôœùûìíòóúáñ")


def _is_speakable_word(word: str, language: str) -> bool:
    if not word.isalpha() or word != normalize_text(word):
        return False
    if len(word) == 1:
        return word in _SINGLE_LETTER_WORDS[language]
    if word in _BLOCKED[language]:
        return False
    # Words without a vowel are abbreviations that espeak-ng spells out letter by letter.
    base = unicodedata.normalize("NFC", word)
    return any(ch in _VOWELS for ch in base)


@dataclass(frozen=True)
class WordPool:
    """Words of one language with cumulative sampling weights (for ``random.choices``)."""

    words: tuple[str, ...]
    cum_weights: tuple[float, ...]

    def sample(self, rng: random.Random, k: int) -> list[str]:
        return rng.choices(self.words, cum_weights=self.cum_weights, k=k)


def _pool(words: list[str], weights: list[float]) -> WordPool:
    return WordPool(tuple(words), tuple(itertools.accumulate(weights)))


@dataclass(frozen=True)
class Lexicon:
    """Per-language word pools. ``paired`` excludes the held-out words; ``full`` includes them."""

    paired: dict[str, WordPool]
    full: dict[str, WordPool]
    heldout: tuple[str, ...]  # English, sorted


@cache
def build_lexicon(english_vocabulary: int | None = None) -> Lexicon:
    """Read the wordfreq lists (shipped with the wheel, no download) and pick the held-out words.

    ``english_vocabulary``: keep only the N most frequent English words (held-out words among them
    stay held out); the held-out list is chosen from the whole list first, so it is the same words
    whatever N is.
    """
    import wordfreq

    full: dict[str, WordPool] = {}
    ranked: dict[str, list[str]] = {}
    for language in LANGUAGES:
        words = [w for w in wordfreq.top_n_list(language, TOP_N[language]) if _is_speakable_word(w, language)]
        words = list(dict.fromkeys(words))  # keep rank order, drop duplicates
        ranked[language] = words
        weights = [wordfreq.word_frequency(w, language) ** FREQUENCY_EXPONENT for w in words]
        full[language] = _pool(words, weights)
    # A held-out word must not reach paired speech another way: not a digit word, not a word of
    # another corpus language ("final", "animal", ...).
    elsewhere = {w for lang in LANGUAGES if lang != "en" for w in ranked[lang]}
    elsewhere |= {w for words in DIGIT_WORDS.values() for w in words}
    candidates = [w for w in ranked["en"][HELDOUT_MIN_RANK:] if len(w) >= 4 and w not in elsewhere]
    heldout = tuple(sorted(random.Random(HELDOUT_SEED).sample(candidates, HELDOUT_COUNT)))
    heldout_set = set(heldout)
    if english_vocabulary is not None:
        if english_vocabulary < 1:
            raise ValueError(f"english_vocabulary must be >= 1 word, got {english_vocabulary}")
        english = ranked["en"][:english_vocabulary]
        full["en"] = _pool(english, [wordfreq.word_frequency(w, "en") ** FREQUENCY_EXPONENT for w in english])
        heldout = tuple(w for w in heldout if w in set(english))
        heldout_set = set(heldout)
    paired = dict(full)
    keep = [i for i, w in enumerate(full["en"].words) if w not in heldout_set]
    en_weights = [wordfreq.word_frequency(w, "en") ** FREQUENCY_EXPONENT for w in full["en"].words]
    paired["en"] = _pool([full["en"].words[i] for i in keep], [en_weights[i] for i in keep])
    return Lexicon(paired=paired, full=full, heldout=heldout)


class SentenceSampler:
    """Draws normalized transcripts (lowercase words separated by single spaces)."""

    def __init__(self, lexicon: Lexicon, rng: random.Random) -> None:
        self.lexicon = lexicon
        self.rng = rng
        self._languages = tuple(LANGUAGE_SHARES)
        self._language_cum = tuple(itertools.accumulate(LANGUAGE_SHARES.values()))

    def language(self) -> str:
        return self._languages[bisect.bisect_left(self._language_cum, self.rng.random() * self._language_cum[-1])]

    def words(self, language: str, include_heldout: bool = False) -> str:
        pools = self.lexicon.full if include_heldout else self.lexicon.paired
        return " ".join(pools[language].sample(self.rng, self.rng.randint(MIN_WORDS, MAX_WORDS)))

    def digits(self, language: str) -> str:
        count = self.rng.randint(MIN_DIGITS, MAX_DIGITS)
        return " ".join(self.rng.choice(DIGIT_WORDS[language]) for _ in range(count))

    def utterance(self, language: str, include_heldout: bool = False) -> str:
        """A digit string (10%) or a word sequence."""
        if self.rng.random() < DIGIT_SHARE:
            return self.digits(language)
        return self.words(language, include_heldout)

    def heldout_sentence(self) -> str:
        """An English word sequence with 1-2 held-out words at random positions."""
        words = self.lexicon.paired["en"].sample(self.rng, self.rng.randint(MIN_WORDS, MAX_WORDS))
        for position in self.rng.sample(range(len(words)), self.rng.randint(1, 2)):
            words[position] = self.rng.choice(self.lexicon.heldout)
        return " ".join(words)
