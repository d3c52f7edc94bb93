"""LAS beam search and attention rescoring of CTC n-best lists."""

from __future__ import annotations

import pytest
import torch

from usmkit.decoding import Hypothesis, attention_rescore, attention_rescore_batch, las_beam_search
from usmkit.models.las import BOS_ID, EOS_ID, LASConfig, LASDecoder

V = 12
TARGETS = [(4, 5, 6, 7, 8), (9, 10, 5, 5)]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def make_decoder(seed: int) -> LASDecoder:
    torch.manual_seed(seed)
    cfg = LASConfig(num_layers=2, num_heads=2, ff_mult=2, dropout=0.0, label_smoothing=0.1)
    return LASDecoder(encoder_dim=16, vocab_size=V, cfg=cfg)


@pytest.fixture(scope="module")
def overfit():
    """A decoder trained until it reproduces TARGETS from two fixed random 'encoder outputs'."""
    dec = make_decoder(0)
    g = torch.Generator().manual_seed(0)
    enc = torch.randn(2, 8, 16, generator=g)
    enc_lens = torch.tensor([8, 6])
    tokens = torch.tensor([list(TARGETS[0]), [*TARGETS[1], -1]])
    token_lens = torch.tensor([len(t) for t in TARGETS])
    opt = torch.optim.Adam(dec.parameters(), lr=3e-3)
    for _ in range(80):
        loss, _ = dec.loss(enc, enc_lens, tokens, token_lens)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return dec.eval(), enc, enc_lens


def greedy_by_recompute(dec: LASDecoder, enc: torch.Tensor, enc_len: int, max_len: int) -> tuple[int, ...]:
    """Greedy decoding with a full teacher-forced forward per token (no cache): the slow oracle."""
    ys = [BOS_ID]
    for _ in range(max_len):
        lp = dec(enc, torch.tensor([enc_len]), torch.tensor([ys]))[0, -1]
        tok = int(lp.argmax())
        if tok == EOS_ID:
            break
        ys.append(tok)
    return tuple(ys[1:])


@torch.no_grad()
def test_beam_one_equals_greedy():
    for seed in range(3):
        dec = make_decoder(seed).eval()
        enc = torch.randn(2, 7, 16)
        enc_lens = torch.tensor([7, 3])
        nbests = las_beam_search(dec, enc, enc_lens, beam_size=1, max_len=6)
        for b in range(2):
            assert len(nbests[b]) == 1
            assert nbests[b][0].tokens == greedy_by_recompute(dec, enc[b : b + 1, : enc_lens[b]], int(enc_lens[b]), 6)


@torch.no_grad()
def test_beam_search_recovers_overfit_targets(overfit):
    dec, enc, enc_lens = overfit
    for beam in (1, 4):
        nbests = las_beam_search(dec, enc, enc_lens, beam_size=beam)
        assert [nbest[0].tokens for nbest in nbests] == TARGETS
        for nbest in nbests:
            assert len(nbest) == beam
            assert [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)


@torch.no_grad()
def test_beam_scores_equal_teacher_forced_scores(overfit):
    dec, enc, enc_lens = overfit
    nbests = las_beam_search(dec, enc, enc_lens, beam_size=3, length_penalty=0.0)
    for b, nbest in enumerate(nbests):
        scored = dec.score(
            enc[b : b + 1].expand(len(nbest), -1, -1), enc_lens[b : b + 1].expand(len(nbest)), [h.tokens for h in nbest]
        )
        for h, s in zip(nbest, scored.tolist(), strict=True):
            assert h.att_score == pytest.approx(s, abs=1e-4)
            assert h.score == pytest.approx(s, abs=1e-4)


@torch.no_grad()
def test_length_penalty_and_max_len():
    dec = make_decoder(1).eval()
    enc = torch.randn(1, 9, 16)
    (nbest,) = las_beam_search(dec, enc, torch.tensor([9]), beam_size=2, max_len=5, length_penalty=100.0)
    assert len(nbest[0].tokens) == 5  # a huge per-token bonus runs every hypothesis to max_len
    assert nbest[0].score == pytest.approx(nbest[0].att_score + 500.0, abs=1e-3)
    (nbest,) = las_beam_search(dec, enc, torch.tensor([9]), beam_size=2, max_len=0)
    assert nbest[0].tokens == ()


def test_beam_search_rejects_bad_arguments():
    dec = make_decoder(0).eval()
    with pytest.raises(ValueError, match="beam_size"):
        las_beam_search(dec, torch.randn(1, 4, 16), torch.tensor([4]), beam_size=0)
    with pytest.raises(ValueError, match="encoder frame"):
        las_beam_search(dec, torch.randn(1, 4, 16), torch.tensor([0]))
    with pytest.raises(ValueError, match="B, T, E"):
        las_beam_search(dec, torch.randn(4, 16), torch.tensor([4]))


# ------------------------------------------------------------------------ rescoring


def planted_nbest(target: tuple[int, ...]) -> list[Hypothesis]:
    """CTC n-best where the right answer is ranked last by CTC."""
    wrong = [target[:-1], (*target[:2], 11, *target[3:])]
    return [
        Hypothesis(wrong[0], score=-1.0, ctc_score=-1.0),
        Hypothesis(wrong[1], score=-1.5, ctc_score=-1.5),
        Hypothesis(target, score=-2.0, ctc_score=-2.0, timestamps=tuple(range(len(target)))),
    ]


def test_rescore_with_ctc_weight_one_keeps_ctc_best(overfit):
    dec, enc, enc_lens = overfit
    nbest = planted_nbest(TARGETS[0])
    best = attention_rescore(dec, enc[:1], enc_lens[:1], nbest, ctc_weight=1.0)
    assert best.tokens == nbest[0].tokens and best.ctc_score == -1.0
    assert best.att_score is not None and best.score == pytest.approx(-1.0)


def test_rescore_with_overfit_decoder_picks_the_right_hypothesis(overfit):
    dec, enc, enc_lens = overfit
    nbests = [planted_nbest(t) for t in TARGETS]
    best = attention_rescore_batch(dec, enc, enc_lens, nbests, ctc_weight=0.3)
    assert [h.tokens for h in best] == TARGETS
    assert best[0].timestamps == tuple(range(len(TARGETS[0])))  # CTC timestamps survive rescoring
    for h in best:
        assert h.score == pytest.approx(0.3 * h.ctc_score + 0.7 * h.att_score)


def test_rescore_rejects_bad_arguments(overfit):
    dec, enc, enc_lens = overfit
    with pytest.raises(ValueError, match="empty n-best"):
        attention_rescore(dec, enc[:1], enc_lens[:1], [])
    with pytest.raises(ValueError, match="ctc_weight"):
        attention_rescore(dec, enc[:1], enc_lens[:1], planted_nbest(TARGETS[0]), ctc_weight=1.5)
    with pytest.raises(ValueError, match="ctc_score"):
        attention_rescore(dec, enc[:1], enc_lens[:1], [Hypothesis((4,), score=0.0)])
    with pytest.raises(ValueError, match="one utterance"):
        attention_rescore(dec, enc, enc_lens, planted_nbest(TARGETS[0]))
