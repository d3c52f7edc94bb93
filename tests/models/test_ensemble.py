"""CTC posterior averaging (usmkit.models.ensemble) against the members' own posteriors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from usmkit.data.batch import Batch
from usmkit.models.asr import AsrHeadConfig, AsrModel
from usmkit.models.ensemble import CtcEnsemble
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


def tiny_batch() -> Batch:
    g = torch.Generator().manual_seed(0)
    return Batch(
        features=torch.randn(2, 30, F_IN, generator=g),
        feature_lens=torch.tensor([30, 22]),
        tokens=torch.tensor([[3, 4], [5, -1]]),
        token_lens=torch.tensor([2, 1]),
    )


def _ctc_model(seed: int) -> AsrModel:
    torch.manual_seed(seed)
    return AsrModel(PairEncoder(), V, AsrHeadConfig(ctc_weight=1.0)).eval()


def test_ensemble_posteriors_are_the_members_mean_probability():
    a, b, c = _ctc_model(0), _ctc_model(1), _ctc_model(2)
    batch = tiny_batch()
    ensemble = CtcEnsemble([a, b, c]).eval()
    with torch.no_grad():
        encoded, enc_lens = ensemble.encode(batch.features, batch.feature_lens)
        log_probs = ensemble.ctc(encoded)  # (B, T', V)
        members = [m.ctc(m.encode(batch.features, batch.feature_lens)[0]).exp() for m in (a, b, c)]
    expected = torch.stack(members).mean(0).log()
    torch.testing.assert_close(log_probs, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(log_probs.shape[:2]), atol=1e-5, rtol=0)
    assert torch.equal(enc_lens, a.encode(batch.features, batch.feature_lens)[1])
    assert not torch.allclose(log_probs, members[0].log(), atol=1e-3)  # the members do differ


def test_ensemble_of_one_model_twice_decodes_like_the_model():
    model = _ctc_model(0)
    batch = tiny_batch()
    twice = CtcEnsemble([model, model]).eval()
    for mode in ("ctc_greedy", "ctc_beam"):
        assert twice.decode(batch.features, batch.feature_lens, mode=mode, beam_size=4) == model.decode(
            batch.features, batch.feature_lens, mode=mode, beam_size=4
        )
    with torch.no_grad():
        encoded, _ = twice.encode(batch.features, batch.feature_lens)
        single = model.ctc(model.encode(batch.features, batch.feature_lens)[0])
        averaged = twice.ctc(encoded)
    torch.testing.assert_close(averaged, single, atol=1e-5, rtol=0)
    assert math.isclose(float(averaged.exp().sum(-1).mean()), 1.0, rel_tol=1e-5)


def test_ensemble_refuses_what_it_cannot_average():
    with pytest.raises(ValueError, match="at least 2"):
        CtcEnsemble([_ctc_model(0)])
    las = LASConfig(num_layers=1, num_heads=2, ff_mult=2, dropout=0.0)
    las_only = AsrModel(PairEncoder(), V, AsrHeadConfig(ctc_weight=0.0, las=las))
    with pytest.raises(ValueError, match="no CTC head"):
        CtcEnsemble([_ctc_model(0), las_only])
    with pytest.raises(ValueError, match="ctc_lexicon, not 'las_beam'"):
        batch = tiny_batch()
        CtcEnsemble([_ctc_model(0), _ctc_model(1)]).decode(batch.features, batch.feature_lens, "las_beam")
