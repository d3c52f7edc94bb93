"""Lexicon + word-LM CTC decoding: the ARPA we write is a normalized LM, and the beam snaps to lexicon words."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch

from usmkit.data.tokenizer import Tokenizer, minimum_vocab_size
from usmkit.decoding.ctc_lexicon import LexiconConfig, LexiconDecoder, write_arpa
from usmkit.errors import UsageError

pytest.importorskip("flashlight.lib.text.decoder")

TEXTS = [
    "the business council met again",
    "a normal party needs a review",
    "they should win the game",
    "people throughout the states opened business",
] * 3


def read_arpa(path) -> tuple[dict[str, tuple[float, float]], dict[tuple[str, str], float]]:
    uni: dict[str, tuple[float, float]] = {}
    bi: dict[tuple[str, str], float] = {}
    section = None
    for line in path.read_text().splitlines():
        if line.startswith("\\") and line.endswith("-grams:"):
            section = int(line[1])
            continue
        parts = line.split("\t")
        if section == 1 and len(parts) >= 2:
            uni[parts[1]] = (float(parts[0]), float(parts[2]) if len(parts) > 2 else 0.0)
        elif section == 2 and len(parts) == 2:
            h, w = parts[1].split()
            bi[(h, w)] = float(parts[0])
    return uni, bi


@pytest.mark.parametrize("order", [1, 2])
def test_arpa_is_normalized(tmp_path, order):
    path = tmp_path / "lm.arpa"
    n_words = write_arpa([t.split() for t in TEXTS], path, order=order)
    uni, bi = read_arpa(path)
    assert n_words == len({w for t in TEXTS for w in t.split()})
    targets = [w for w in uni if w != "<s>"]
    assert sum(10 ** uni[w][0] for w in targets) == pytest.approx(1.0, abs=1e-5)
    if order == 2:
        seen = defaultdict(dict)
        for (h, w), lp in bi.items():
            seen[h][w] = lp
        for h in ("<s>", "the", "business"):
            total = sum(10 ** seen[h][w] if w in seen[h] else 10 ** (uni[h][1] + uni[w][0]) for w in targets)
            assert total == pytest.approx(1.0, abs=1e-4), h


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return Tokenizer.train(TEXTS, tmp_path_factory.mktemp("tok"), vocab_size=minimum_vocab_size(TEXTS))


def emissions_for(tokenizer: Tokenizer, text: str, frames_per_token: int = 3) -> torch.Tensor:
    """(1, T, V) log-probs that spell ``text``'s pieces, each followed by blanks; other ids get little mass."""
    ids = tokenizer.encode(text)
    V = tokenizer.vocab_size
    rows = []
    for i in ids:
        rows.append(torch.nn.functional.one_hot(torch.tensor(i), V).float())
        rows += [torch.nn.functional.one_hot(torch.tensor(0), V).float()] * (frames_per_token - 1)
    probs = torch.stack(rows) * 0.9 + 0.1 / V  # (T, V)
    return probs.log()[None]


@pytest.mark.parametrize("order", [0, 1, 2])
def test_lexicon_decoding_snaps_misspellings_to_words(tmp_path, tokenizer, order):
    decoder = LexiconDecoder.build(TEXTS, tokenizer, tmp_path, LexiconConfig(order=order, beam_size=20))
    exact = emissions_for(tokenizer, "they should win the game")
    assert decoder(exact, torch.tensor([exact.shape[1]])) == ["they should win the game"]
    # The acoustic evidence spells "shold" and "bussiness": greedy CTC would print them, the lexicon cannot.
    missing = emissions_for(tokenizer, "they shold win the bussiness")
    (text,) = decoder(missing, torch.tensor([missing.shape[1]]))
    assert text == "they should win the business"


def test_lexicon_decoding_respects_lengths(tmp_path, tokenizer):
    decoder = LexiconDecoder.build(TEXTS, tokenizer, tmp_path, LexiconConfig(order=1, beam_size=20))
    a = emissions_for(tokenizer, "they should win the game")
    b = emissions_for(tokenizer, "a normal party")
    T = max(a.shape[1], b.shape[1])
    pad = lambda x: torch.cat([x, x[:, -1:].expand(1, T - x.shape[1], -1)], dim=1)  # noqa: E731 repeat the last frame
    batch = torch.cat([pad(a), pad(b)])
    out = decoder(batch, torch.tensor([a.shape[1], b.shape[1]]))
    assert out == ["they should win the game", "a normal party"]


def test_lexicon_nbest_is_distinct_transcripts_best_first(tmp_path, tokenizer):
    decoder = LexiconDecoder.build(TEXTS, tokenizer, tmp_path, LexiconConfig(order=1, beam_size=50, nbest=5))
    exact = emissions_for(tokenizer, "they should win the game")
    (nbest,) = decoder.nbest(exact, torch.tensor([exact.shape[1]]))
    assert nbest[0] == "they should win the game" == decoder(exact, torch.tensor([exact.shape[1]]))[0]
    assert 1 < len(nbest) <= 5 and len(set(nbest)) == len(nbest)
    words = {w for t in TEXTS for w in t.split()}
    assert all(set(t.split()) <= words for t in nbest)


def test_config_rejects_bad_order():
    with pytest.raises(ValueError, match="order"):
        LexiconConfig(order=3)
    with pytest.raises(ValueError, match="nbest"):
        LexiconConfig(nbest=0)
    assert math.isinf(float("-inf"))


def test_best_hypothesis_spells_lexicon_words_with_increasing_frames(tmp_path, tokenizer):
    decoder = LexiconDecoder.build(TEXTS, tokenizer, tmp_path, LexiconConfig(order=1, beam_size=20))
    missing = emissions_for(tokenizer, "they shold win the bussiness")[0]  # (T, V)
    hyp = decoder.best_hypothesis(missing)
    assert tokenizer.decode(list(hyp.tokens)) == "they should win the business"  # double letters spelled out
    assert len(hyp.timestamps) == len(hyp.tokens)
    assert (
        list(hyp.timestamps) == sorted(hyp.timestamps) and 0 <= hyp.timestamps[0] and hyp.timestamps[-1] < len(missing)
    )


def test_streaming_finals_are_the_lexicon_path(tmp_path, tokenizer):
    from usmkit.streaming.decoder import DecoderConfig, StreamingDecoder

    words = LexiconDecoder.build(TEXTS, tokenizer, tmp_path, LexiconConfig(order=1, beam_size=20))
    lp = emissions_for(tokenizer, "they shold win the bussiness")[0]  # (T, V)
    plain, lexicon = (
        StreamingDecoder(tokenizer, DecoderConfig()),
        StreamingDecoder(tokenizer, DecoderConfig(), words=words),
    )
    finals = {}
    for name, dec in (("plain", plain), ("lexicon", lexicon)):
        segments = []
        for start in range(0, lp.shape[0], 4):  # chunk by chunk, as a stream arrives
            segments += dec.accept(lp[start : start + 4])
        finals[name] = [s.text for s in segments + dec.finish()]
    assert finals["plain"] == ["they shold win the bussiness"]
    assert finals["lexicon"] == ["they should win the business"]


def test_an_lm_path_that_is_missing_or_not_an_lm_is_one_line(tmp_path, tokenizer):
    missing = tmp_path / "no.arpa"
    with pytest.raises(UsageError, match=f"lexicon.lm_path={missing}: no such file"):
        LexiconDecoder.build(TEXTS, tokenizer, tmp_path / "a", LexiconConfig(order=2, lm_path=str(missing)))
    garbage = tmp_path / "notes.arpa"
    garbage.write_text("these are my notes, not a language model\n")
    with pytest.raises(UsageError, match=f"lexicon.lm_path={garbage} cannot be read as an ARPA or KenLM binary LM"):
        LexiconDecoder.build(TEXTS, tokenizer, tmp_path / "b", LexiconConfig(order=2, lm_path=str(garbage)))


def test_scored_nbest_is_the_nbest_with_decreasing_scores(tmp_path, tokenizer):
    decoder = LexiconDecoder.build(TEXTS, tokenizer, tmp_path, LexiconConfig(order=1, beam_size=50, nbest=5))
    exact = emissions_for(tokenizer, "they should win the game")
    lengths = torch.tensor([exact.shape[1]])
    (scored,) = decoder.scored_nbest(exact, lengths)
    assert [t for t, _ in scored] == decoder.nbest(exact, lengths)[0]
    scores = [s for _, s in scored]
    assert scores == sorted(scores, reverse=True) and all(math.isfinite(s) for s in scores)


def test_attention_rescoring_of_the_lexicon_nbest(tmp_path, tokenizer):
    """``rescore_lexicon_nbest``: with ctc_weight 1 the lexicon's own first; with 0 the transcript the attention
    decoder scores best (checked against ``LASDecoder.score`` on each); an empty list gives ""."""
    from usmkit.decoding.rescoring import rescore_lexicon_nbest
    from usmkit.models.las import LASConfig, LASDecoder

    decoder = LexiconDecoder.build(TEXTS, tokenizer, tmp_path, LexiconConfig(order=1, beam_size=50, nbest=5))
    exact = emissions_for(tokenizer, "they should win the game")
    (scored,) = decoder.scored_nbest(exact, torch.tensor([exact.shape[1]]))
    torch.manual_seed(0)
    las = LASDecoder(encoder_dim=16, vocab_size=tokenizer.vocab_size, cfg=LASConfig(num_layers=1, num_heads=2)).eval()
    enc, enc_lens = torch.randn(2, 9, 16), torch.tensor([9, 7])
    nbests = [scored, []]
    assert rescore_lexicon_nbest(las, tokenizer, enc, enc_lens, nbests, ctc_weight=1.0) == [scored[0][0], ""]
    with torch.no_grad():
        att = las.score(enc[:1].expand(len(scored), -1, -1), enc_lens[:1].expand(len(scored)),
                        [tuple(tokenizer.encode(t)) for t, _ in scored])  # fmt: skip
    favourite = scored[int(att.argmax())][0]
    assert favourite != scored[0][0]  # the two passes disagree here, so the weight decides
    assert rescore_lexicon_nbest(las, tokenizer, enc, enc_lens, nbests, ctc_weight=0.0) == [favourite, ""]
    mixed = [0.5 * s + 0.5 * float(a) for (_, s), a in zip(scored, att, strict=True)]
    assert (
        rescore_lexicon_nbest(las, tokenizer, enc, enc_lens, nbests, ctc_weight=0.5)[0]
        == scored[max(range(len(scored)), key=mixed.__getitem__)][0]
    )
