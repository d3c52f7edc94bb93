"""CTC head/loss and the LAS attention decoder (teacher forcing, KV-cache step)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from usmkit.models.ctc import CTCHead, ctc_loss
from usmkit.models.las import BOS_ID, EOS_ID, LASConfig, LASDecoder

V = 12


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def small_decoder(seed: int = 0, **overrides) -> LASDecoder:
    torch.manual_seed(seed)
    cfg = LASConfig(**{"num_layers": 2, "num_heads": 2, "ff_mult": 2, "dropout": 0.0, **overrides})
    return LASDecoder(encoder_dim=16, vocab_size=V, cfg=cfg)


# ------------------------------------------------------------------------ CTC


def test_ctc_head_gives_fp32_log_probs_under_autocast():
    head = CTCHead(16, V)
    x = torch.randn(2, 5, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp = head(x)
    assert lp.shape == (2, 5, V) and lp.dtype == torch.float32
    assert torch.allclose(lp.exp().sum(-1), torch.ones(2, 5), atol=1e-5)


def test_ctc_loss_is_sum_over_utterances_divided_by_batch():
    torch.manual_seed(0)
    lp = torch.randn(3, 10, V).log_softmax(-1)
    lengths = torch.tensor([10, 7, 5])
    tokens = torch.tensor([[4, 5, 5, 6], [7, 8, -1, -1], [9, -1, -1, -1]])
    token_lens = torch.tensor([4, 2, 1])
    per_utt = [
        F.ctc_loss(
            lp[b, : lengths[b], None],
            tokens[b : b + 1, : token_lens[b]],
            lengths[b : b + 1],
            token_lens[b : b + 1],
            reduction="sum",
        )
        for b in range(3)
    ]
    assert ctc_loss(lp, lengths, tokens, token_lens).item() == pytest.approx(sum(per_utt).item() / 3, rel=1e-5)


def test_ctc_loss_fp32_under_autocast_and_zero_for_impossible():
    lp = torch.randn(2, 3, V).log_softmax(-1).bfloat16()
    tokens = torch.tensor([[4, 4, 4, 4], [5, -1, -1, -1]])  # row 0 needs >= 7 frames, has 3: zero_infinity
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = ctc_loss(lp, torch.tensor([3, 3]), tokens, torch.tensor([4, 1]))
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    alone = ctc_loss(lp[1:].float(), torch.tensor([3]), tokens[1:], torch.tensor([1]))
    assert loss.item() == pytest.approx(alone.item() / 2, rel=1e-5)


def test_ctc_rejects_bad_shapes():
    with pytest.raises(ValueError, match="B, T, V"):
        ctc_loss(torch.zeros(3, V), torch.tensor([3]), torch.zeros(1, 2, dtype=torch.long), torch.tensor([2]))
    with pytest.raises(ValueError, match="vocabulary"):
        CTCHead(16, 1)


# ------------------------------------------------------------------------ LAS


def test_las_config_validation():
    with pytest.raises(ValueError, match="label_smoothing"):
        LASConfig(label_smoothing=1.0)
    with pytest.raises(ValueError, match="divisible"):
        LASConfig(dim=30, num_heads=4)
    with pytest.raises(ValueError, match="divisible"):
        LASDecoder(encoder_dim=18, vocab_size=V, cfg=LASConfig(num_heads=4))


def test_make_targets():
    dec = small_decoder()
    tokens = torch.tensor([[5, 6, 7], [8, -1, -1]])
    ys_in, ys_out = dec.make_targets(tokens, torch.tensor([3, 1]))
    assert ys_in.tolist() == [[BOS_ID, 5, 6, 7], [BOS_ID, 8, EOS_ID, EOS_ID]]
    assert ys_out.tolist() == [[5, 6, 7, EOS_ID], [8, EOS_ID, -1, -1]]


@pytest.mark.parametrize("tie", [True, False])
def test_step_with_cache_equals_parallel_forward(tie):
    dec = small_decoder(tie_embeddings=tie).eval()
    enc = torch.randn(2, 7, 16)
    enc_lens = torch.tensor([7, 4])
    ys = torch.cat([torch.full((2, 1), BOS_ID), torch.randint(4, V, (2, 5))], dim=1)  # (2, 6)
    with torch.no_grad():
        full = dec(enc, enc_lens, ys).log_softmax(-1)  # (2, 6, V)
        state = dec.init_state(enc, enc_lens, max_steps=6)
        for t in range(6):
            step_lp, state = dec.step(ys[:, t], state)
            torch.testing.assert_close(step_lp, full[:, t], atol=1e-5, rtol=1e-5)
        with pytest.raises(ValueError, match="cache is full"):
            dec.step(ys[:, 0], state)


def test_padding_does_not_change_the_loss():
    dec = small_decoder(label_smoothing=0.1)
    torch.manual_seed(1)
    enc = torch.randn(2, 9, 16)
    enc[1, 5:] = 1e3  # padded frames: must be masked out of cross-attention
    enc_lens = torch.tensor([9, 5])
    tokens = torch.tensor([[4, 5, 6, 7], [8, 9, -1, -1]])
    token_lens = torch.tensor([4, 2])
    loss, acc = dec.loss(enc, enc_lens, tokens, token_lens)
    alone = [
        dec.loss(
            enc[b : b + 1, : enc_lens[b]],
            enc_lens[b : b + 1],
            tokens[b : b + 1, : token_lens[b]],
            token_lens[b : b + 1],
        )[0]
        for b in range(2)
    ]
    assert loss.item() == pytest.approx((alone[0] + alone[1]).item() / 2, rel=1e-5)
    assert 0.0 <= acc.item() <= 1.0 and not acc.requires_grad


def test_teacher_forced_loss_decreases_when_overfitting():
    dec = small_decoder(label_smoothing=0.1)
    torch.manual_seed(2)
    enc = torch.randn(2, 8, 16)
    enc_lens = torch.tensor([8, 6])
    tokens = torch.tensor([[4, 5, 6, 7, 8], [9, 10, 11, -1, -1]])
    token_lens = torch.tensor([5, 3])
    opt = torch.optim.Adam(dec.parameters(), lr=3e-3)
    first = None
    for _ in range(100):
        loss, acc = dec.loss(enc, enc_lens, tokens, token_lens)
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3 * first
    assert acc.item() == 1.0


def test_score_matches_teacher_forced_log_probs():
    dec = small_decoder().eval()
    enc = torch.randn(1, 6, 16)
    hyps = [(4, 5), (), (6, 6, 6)]
    with torch.no_grad():
        scores = dec.score(enc.expand(3, -1, -1), torch.tensor([6, 6, 6]), hyps)
        for h, s in zip(hyps, scores, strict=True):
            ys = torch.tensor([[BOS_ID, *h]])
            lp = dec(enc, torch.tensor([6]), ys).log_softmax(-1)[0]  # (len+1, V)
            expected = sum(lp[i, tok] for i, tok in enumerate([*h, EOS_ID]))
            assert s.item() == pytest.approx(float(expected), abs=1e-5)
