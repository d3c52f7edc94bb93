"""CTC model ensembles (usmkit.decoding.ensemble): candidates from each member, chosen by mean likelihood."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from usmkit.decoding.ctc_greedy import ctc_greedy
from usmkit.decoding.ctc_prefix_beam import ctc_prefix_beam_search_batch
from usmkit.decoding.ensemble import CtcEnsemble, choose_by_mean_likelihood
from usmkit.decoding.modes import DecodeOptions, decode, decode_texts
from usmkit.models.asr import AsrHeadConfig, AsrModel
from usmkit.models.las import LASConfig

V, F_IN = 10, 6


class PairEncoder(nn.Module):
    """The ConformerEncoder interface at its smallest: 2x subsampling by stacking frame pairs, one layer."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2 * F_IN, 16)

    @property
    def output_dim(self) -> int:
        return 16

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, F = features.shape
        pairs = features[:, : T // 2 * 2].reshape(B, T // 2, 2 * F)  # (B, T/2, 2F)
        return torch.tanh(self.proj(pairs)), lengths // 2


class FixedPosteriors(nn.Module):
    """A 'model' whose CTC log-probs are given: encode passes them through, ctc returns them."""

    def __init__(self, log_probs: torch.Tensor) -> None:
        super().__init__()
        self.ctc = nn.Identity()
        self.register_buffer("fixed", log_probs)

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.fixed, lengths


class IdTokenizer:
    """Token ids as text: '3 4' <-> [3, 4]."""

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


def _ctc_model(seed: int) -> AsrModel:
    torch.manual_seed(seed)
    return AsrModel(PairEncoder(), V, AsrHeadConfig(ctc_weight=1.0)).eval()


def _spike(frames: int, at: int, token: int, sure: float = 0.9) -> torch.Tensor:
    """(1, frames, V) log-probs: blank everywhere, ``token`` with probability ``sure`` at frame ``at``."""
    probs = torch.full((frames, V), 0.01)
    probs[:, 0] = 1.0
    probs[at] = (1 - sure) / (V - 1)
    probs[at, token] = sure
    return (probs / probs.sum(-1, keepdim=True)).log()[None]


def test_members_spiking_on_different_frames_still_agree():
    # Frame-posterior averaging would lose the word (blank wins every frame); hypothesis scoring keeps it.
    a, b = _spike(6, at=1, token=3), _spike(6, at=4, token=3)
    averaged = torch.logsumexp(torch.stack([a, b]), 0) - math.log(2)
    lens = torch.tensor([6])
    assert ctc_greedy(averaged, lens) == [[]]
    ensemble = CtcEnsemble([FixedPosteriors(a), FixedPosteriors(b)])
    assert decode_texts(ensemble, torch.zeros(1, 6, 1), lens, IdTokenizer()) == ["3"]


def test_the_more_confident_member_wins_a_disagreement():
    sure, unsure = _spike(5, at=2, token=3, sure=0.95), _spike(5, at=2, token=7, sure=0.55)
    lens = torch.tensor([5])
    ensemble = CtcEnsemble([FixedPosteriors(unsure), FixedPosteriors(sure)])
    assert decode_texts(ensemble, torch.zeros(1, 5, 1), lens, IdTokenizer()) == ["3"]
    # The choice is the brute-force argmax of log mean_i p_i(y | x) over the candidates.
    log_probs = [unsure, sure]
    scores = {}
    for cand in [(7,), (3,)]:
        nll = [F.ctc_loss(lp[0], torch.tensor(cand), lens, torch.tensor([1]), reduction="sum") for lp in log_probs]
        scores[cand] = math.log(sum(math.exp(-float(x)) for x in nll) / 2)
    assert choose_by_mean_likelihood(log_probs, lens, [[(7,), (3,)]]) == [max(scores, key=scores.get)]


def test_ensemble_of_one_model_twice_transcribes_like_the_model():
    model = _ctc_model(0)
    g = torch.Generator().manual_seed(0)
    features, lens = torch.randn(3, 30, F_IN, generator=g), torch.tensor([30, 22, 16])
    twice = CtcEnsemble([model, model])
    tok = IdTokenizer()
    greedy = [tok.decode(ids) for ids in decode(model, features, lens, mode="ctc_greedy")]
    assert decode_texts(twice, features, lens, tok, "ctc_greedy") == greedy
    # ctc_beam proposes the whole n-best; the pick is the candidate of highest exact CTC likelihood.
    with torch.no_grad():
        log_probs = model.ctc(model.encode(features, lens)[0])
    nbests = ctc_prefix_beam_search_batch(log_probs, lens // 2, 4)
    picked = decode_texts(twice, features, lens, tok, "ctc_beam", DecodeOptions(beam_size=4))
    for row, nbest in enumerate(nbests):
        cands = [tuple(h.tokens) for h in nbest]
        nll = [
            F.ctc_loss(
                log_probs[row, : lens[row] // 2],
                torch.tensor(c, dtype=torch.long),
                lens[row : row + 1] // 2,
                torch.tensor([len(c)]),
                reduction="sum",
            )
            for c in cands
        ]
        assert picked[row] == tok.decode(list(cands[int(torch.stack(nll).argmin())]))


def test_ensemble_refuses_what_it_cannot_combine():
    with pytest.raises(ValueError, match="at least 2"):
        CtcEnsemble([_ctc_model(0)])
    las = LASConfig(num_layers=1, num_heads=2, ff_mult=2, dropout=0.0)
    las_only = AsrModel(PairEncoder(), V, AsrHeadConfig(ctc_weight=0.0, las=las))
    with pytest.raises(ValueError, match="no CTC head"):
        CtcEnsemble([_ctc_model(0), las_only])
    with pytest.raises(
        ValueError, match=r"ensemble decodes with \('ctc_greedy', 'ctc_beam', 'ctc_lexicon'\), not 'las_beam'"
    ):
        decode_texts(
            CtcEnsemble([_ctc_model(0), _ctc_model(1)]), torch.zeros(1, 8, F_IN), torch.tensor([8]), None, "las_beam"
        )
