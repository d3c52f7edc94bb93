"""AsrModel: joint CTC/attention training step, decoding it in every mode (usmkit.decoding.modes), overfitting a
tiny batch."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from usmkit.data.batch import Batch
from usmkit.decoding.modes import decode, decode_hypotheses
from usmkit.models.asr import AsrHeadConfig, AsrModel
from usmkit.models.las import LASConfig

V = 12
F_IN = 8
TARGETS = [[5, 6, 6, 7], [8, 9]]
SMALL_LAS = LASConfig(num_layers=1, num_heads=2, ff_mult=2, dropout=0.0, label_smoothing=0.1)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class StandInEncoder(nn.Module):
    """Same interface as ConformerEncoder: stacks 4 frames (4x subsampling) and applies an MLP."""

    def __init__(self, input_dim: int = F_IN, dim: int = 32) -> None:
        super().__init__()
        self.dim = dim
        self.net = nn.Sequential(nn.Linear(4 * input_dim, dim), nn.GELU(), nn.Linear(dim, dim))

    @property
    def output_dim(self) -> int:
        return self.dim

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, F = features.shape
        x = features[:, : T // 4 * 4].reshape(B, T // 4, 4 * F)  # (B, T/4, 4F)
        return self.net(x), lengths // 4


def tiny_batch(F: int = F_IN, T: int = 40) -> Batch:
    g = torch.Generator().manual_seed(0)
    tokens = torch.full((2, 4), -1)
    for b, t in enumerate(TARGETS):
        tokens[b, : len(t)] = torch.tensor(t)
    return Batch(
        features=torch.randn(2, T, F, generator=g),
        feature_lens=torch.tensor([T, T - 8]),
        tokens=tokens,
        token_lens=torch.tensor([len(t) for t in TARGETS]),
    )


def make_model(cfg: AsrHeadConfig, seed: int = 0) -> AsrModel:
    torch.manual_seed(seed)
    return AsrModel(StandInEncoder(), V, cfg)


def test_joint_forward_and_backward():
    model = make_model(AsrHeadConfig(ctc_weight=0.3, las=SMALL_LAS))
    batch = tiny_batch()
    out = model(batch)
    assert set(out.metrics) == {"loss", "loss_ctc", "loss_att", "acc_att"}
    assert torch.isfinite(out.loss) and out.loss.dim() == 0
    assert all(not m.requires_grad and m.dim() == 0 for m in out.metrics.values())
    expected = 0.3 * out.metrics["loss_ctc"] + 0.7 * out.metrics["loss_att"]
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    out.loss.backward()
    for part in (model.encoder, model.ctc, model.las):
        grads = [p.grad for p in part.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert any(g.abs().sum() > 0 for g in grads)


def test_ctc_only_metrics_and_decode_errors():
    model = make_model(AsrHeadConfig())
    out = model(tiny_batch())
    assert set(out.metrics) == {"loss", "loss_ctc"} and model.las is None
    assert out.loss.item() == pytest.approx(out.metrics["loss_ctc"].item())
    batch = tiny_batch()
    for mode in ("las_beam", "rescore"):
        with pytest.raises(ValueError, match="needs a LAS decoder"):
            decode(model, batch.features, batch.feature_lens, mode=mode)
    with pytest.raises(ValueError, match="unknown decode mode"):
        decode(model, batch.features, batch.feature_lens, mode="viterbi")


def test_attention_only_model():
    model = make_model(AsrHeadConfig(ctc_weight=0.0, las=SMALL_LAS))
    assert model.ctc is None
    out = model(tiny_batch())
    assert set(out.metrics) == {"loss", "loss_att", "acc_att"}
    with pytest.raises(ValueError, match="needs a CTC head"):
        decode(model, tiny_batch().features, tiny_batch().feature_lens, mode="ctc_greedy")


def test_head_config_validation():
    with pytest.raises(ValueError, match="ctc_weight"):
        AsrHeadConfig(ctc_weight=1.5)
    with pytest.raises(ValueError, match="without a LAS decoder"):
        AsrHeadConfig(ctc_weight=0.3)
    with pytest.raises(ValueError, match="no loss"):
        AsrHeadConfig(ctc_weight=1.0, las=SMALL_LAS)
    with pytest.raises(ValueError, match="output_dim"):
        AsrModel(nn.Linear(4, 4), V, AsrHeadConfig())


def overfit(model: AsrModel, modes: tuple[str, ...], max_steps: int, check_every: int) -> int:
    """Adam on the tiny batch until every decode mode returns TARGETS; returns the steps taken (or -1)."""
    batch = tiny_batch()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(1, max_steps + 1):
        loss = model(batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % check_every == 0:
            model.eval()
            done = all(decode(model, batch.features, batch.feature_lens, mode=m, beam_size=3) == TARGETS for m in modes)
            model.train()
            if done:
                return step
    return -1


def test_ctc_model_overfits_until_greedy_returns_targets():
    model = make_model(AsrHeadConfig())
    steps = overfit(model, ("ctc_greedy", "ctc_beam"), max_steps=400, check_every=10)
    assert steps > 0, "CTC-only model did not learn the two targets in 400 steps"
    model.eval()
    batch = tiny_batch()
    hyps = decode_hypotheses(model, batch.features, batch.feature_lens, mode="ctc_beam", beam_size=3)
    for hyp, n in zip(hyps, (10, 8), strict=True):
        assert len(hyp.timestamps) == len(hyp.tokens) and all(0 <= t < n for t in hyp.timestamps)
        assert list(hyp.timestamps) == sorted(hyp.timestamps)


def test_joint_model_overfits_in_every_decode_mode():
    model = make_model(AsrHeadConfig(ctc_weight=0.3, las=SMALL_LAS))
    steps = overfit(model, ("ctc_greedy", "ctc_beam", "las_beam", "rescore"), max_steps=400, check_every=20)
    assert steps > 0, "joint model did not learn the two targets in 400 steps"


@pytest.mark.skipif(
    importlib.util.find_spec("usmkit.models.conformer") is None, reason="usmkit.models.conformer not written yet"
)
def test_with_real_tiny_conformer():
    from usmkit.models.conformer import ConformerEncoder
    from usmkit.models.presets import tiny

    torch.manual_seed(0)
    encoder = ConformerEncoder(tiny(input_dim=16, num_layers=2, dropout=0.0, zero_init_residual=False))
    model = AsrModel(encoder, V, AsrHeadConfig(ctc_weight=0.3, las=LASConfig(num_layers=1, num_heads=4, dropout=0.0)))
    batch = tiny_batch(F=16, T=48)
    out = model(batch)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    for part in (model.encoder, model.ctc, model.las):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in part.parameters())
    model.eval()
    for mode in ("ctc_greedy", "ctc_beam", "las_beam", "rescore"):
        hyps = decode(model, batch.features, batch.feature_lens, mode=mode, beam_size=2, max_len=5)
        assert len(hyps) == 2 and all(isinstance(t, int) and 0 <= t < V for h in hyps for t in h)


def test_intermediate_ctc_loss_mixes_the_middle_block():
    from usmkit.models.conformer import ConformerEncoder
    from usmkit.models.ctc import ctc_loss
    from usmkit.models.presets import tiny

    torch.manual_seed(0)
    encoder = ConformerEncoder(tiny(input_dim=16, num_layers=4, dropout=0.0, zero_init_residual=False))
    batch = tiny_batch(F=16, T=48)
    plain = AsrModel(encoder, V, AsrHeadConfig())
    inter = AsrModel(encoder, V, AsrHeadConfig(inter_ctc_weight=0.3))
    inter.ctc.load_state_dict(plain.ctc.state_dict())
    assert inter.inter_layers == (2,)  # the middle of 4 blocks
    assert set(inter.state_dict()) == set(plain.state_dict())  # no new weights: checkpoints interchange
    # The final output is the plain forward's; the block-2 output is what the encoder keeps.
    enc, lens, (mid,) = encoder.forward_with_intermediate(batch.features, batch.feature_lens, (2,))
    ref_enc, ref_lens = encoder(batch.features, batch.feature_lens)
    torch.testing.assert_close(enc, ref_enc)
    assert torch.equal(lens, ref_lens) and mid.shape == enc.shape and not torch.allclose(mid, enc)
    final = ctc_loss(plain.ctc(enc), lens, batch.tokens, batch.token_lens)
    middle = ctc_loss(plain.ctc(mid), lens, batch.tokens, batch.token_lens)
    got = inter.losses(batch.features, batch.feature_lens, batch.tokens, batch.token_lens)
    torch.testing.assert_close(got["loss_ctc"], final)
    torch.testing.assert_close(got["loss_inter_ctc"], middle)
    torch.testing.assert_close(got["loss"], 0.7 * final + 0.3 * middle)
    # Off (the default), the loss is the plain CTC loss and no intermediate loss is reported.
    off = plain.losses(batch.features, batch.feature_lens, batch.tokens, batch.token_lens)
    assert "loss_inter_ctc" not in off
    torch.testing.assert_close(off["loss"], final)


def test_intermediate_ctc_config_errors():
    from usmkit.models.conformer import ConformerEncoder
    from usmkit.models.presets import tiny

    with pytest.raises(ValueError, match="inter_ctc_weight must be in"):
        AsrHeadConfig(inter_ctc_weight=1.0)
    with pytest.raises(ValueError, match="forward_with_intermediate"):
        AsrModel(StandInEncoder(), V, AsrHeadConfig(inter_ctc_weight=0.3))
    encoder = ConformerEncoder(tiny(input_dim=16, num_layers=4, dropout=0.0, zero_init_residual=False))
    with pytest.raises(ValueError, match="inter_ctc_layer=4 must be below"):
        AsrModel(encoder, V, AsrHeadConfig(inter_ctc_weight=0.3, inter_ctc_layer=4))
    with pytest.raises(ValueError, match=r"must lie in 1\.\.4"):
        encoder.forward_with_intermediate(torch.zeros(1, 48, 16), torch.tensor([48]), (5,))
