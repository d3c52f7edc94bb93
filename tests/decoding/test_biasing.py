"""Contextual biasing (usmkit.decoding.biasing): phrases with boosts in the lexicon beam search.

The lexicon is the words of four sentences; the held-out name "tom" and the digit string "one two one"
are in none of them. CTC log-probs that spell them are decoded with and without a phrase list.
"""

from __future__ import annotations

import pytest
import torch

from usmkit.data.tokenizer import Tokenizer, minimum_vocab_size
from usmkit.decoding.biasing import BiasPhrase, BiasPhraseError, parse_bias_phrases, read_bias_phrases
from usmkit.decoding.ctc_lexicon import LexiconConfig, LexiconDecoder

pytest.importorskip("flashlight.lib.text.decoder")

TEXTS = [
    "the business council met again",
    "a normal party needs a review",
    "they should win the game",
    "people throughout the states opened business",
] * 3
CFG = LexiconConfig(order=1, lm_weight=1.0, beam_size=50)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return Tokenizer.train(TEXTS, tmp_path_factory.mktemp("tok"), vocab_size=minimum_vocab_size(TEXTS))


def emissions(tokenizer: Tokenizer, text: str, peak: float = 0.9, frames_per_token: int = 3) -> torch.Tensor:
    """(1, T, V) log-probs that spell ``text``'s pieces with posterior ``peak`` (blank has most of the rest),
    each followed by blanks."""
    V = tokenizer.vocab_size
    rows = []
    for i in tokenizer.encode(text):
        piece = torch.full((V,), 0.05 / (V - 2))
        piece[0], piece[i] = 0.95 - peak, peak
        rows.append(piece)
        rows += [torch.nn.functional.one_hot(torch.tensor(0), V).float() * 0.9 + 0.1 / V] * (frames_per_token - 1)
    return torch.stack(rows).log()[None]


def decode(decoder: LexiconDecoder, log_probs: torch.Tensor) -> str:
    return decoder(log_probs, torch.tensor([log_probs.shape[1]]))[0]


@pytest.mark.parametrize("held_out", ["they should win tom", "one two one"])
def test_a_held_out_name_or_digit_string_is_recognized_only_with_the_bias(tmp_path, tokenizer, held_out):
    plain = LexiconDecoder.build(TEXTS, tokenizer, tmp_path / "plain", CFG)
    x = emissions(tokenizer, held_out)
    assert decode(plain, x) != held_out  # its new words are not in the lexicon
    phrase = " ".join(w for w in held_out.split() if w not in {w for t in TEXTS for w in t.split()})
    biased = LexiconDecoder.build(TEXTS, tokenizer, tmp_path / "biased", CFG, bias=parse_bias_phrases([phrase]))
    assert decode(biased, x) == held_out
    assert biased.bias_words == list(dict.fromkeys(phrase.split()))
    best = biased.best_hypothesis(x[0])
    assert tokenizer.decode(list(best.tokens)) == held_out  # streaming finals take this path
    # The lexicon's own words decode as before.
    known = emissions(tokenizer, "they should win the game")
    assert decode(biased, known) == decode(plain, known) == "they should win the game"


def test_the_boost_decides_a_weakly_heard_name_and_an_unfinished_phrase_gives_it_back(tmp_path, tokenizer):
    """Weak evidence for "tom" (posterior 0.3 per piece, blank 0.65): in the lexicon with no boost it loses to silence;
    with a boost it wins; as the first word of a longer phrase that the audio does not finish, the boost is
    taken back and it loses again."""
    x = emissions(tokenizer, "tom", peak=0.3)
    LexiconDecoder.build(TEXTS, tokenizer, tmp_path, CFG)  # the files

    def with_bias(*phrases: BiasPhrase) -> str:
        return decode(LexiconDecoder(tokenizer, tmp_path, CFG, bias=phrases), x)

    assert with_bias(BiasPhrase(("tom",), 0.0)) != "tom"
    assert with_bias(BiasPhrase(("tom",), 8.0)) == "tom"
    assert with_bias(BiasPhrase(("tom", "sawyer"), 8.0)) != "tom"


def test_phrase_files_are_read_and_bad_lines_named(tmp_path):
    path = tmp_path / "phrases.tsv"
    path.write_text("# names\nTom Sawyer\t7.5\n\none two one\n")
    assert read_bias_phrases(path) == (BiasPhrase(("tom", "sawyer"), 7.5), BiasPhrase(("one", "two", "one"), 5.0))
    path.write_text("tom\tloud\n")
    with pytest.raises(BiasPhraseError, match=r"phrases.tsv, line 1: 'tom\\tloud' is not 'phrase<TAB>boost'"):
        read_bias_phrases(path)
    path.write_text("# nothing\n")
    with pytest.raises(BiasPhraseError, match="holds no phrase"):
        read_bias_phrases(path)
    with pytest.raises(BiasPhraseError, match="cannot read the bias phrases"):
        read_bias_phrases(tmp_path / "missing.tsv")
