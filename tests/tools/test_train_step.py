"""tools.train_step: the shared synthetic step runs on a CPU (fp32, no autocast) and times itself there."""

from __future__ import annotations

import torch

from tools.train_step import SHAPES, OursCTC, TorchaudioCTC, feature_frames, make_batch, make_step, timed


def test_a_tiny_step_of_either_model_trains_on_the_cpu(one_thread):
    B, T = SHAPES["tiny"]
    batch = make_batch(B, T, torch.device("cpu"))
    for model in (OursCTC("tiny", "sdpa", 16), TorchaudioCTC("tiny")):
        torch.manual_seed(0)
        step = make_step(model, batch)
        before = [p.detach().clone() for p in model.parameters()]
        loss = step()
        assert torch.isfinite(loss) and loss.dtype == torch.float32
        assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        times = timed(step, 1)
        assert len(times) == 1 and times[0] > 0


def test_batches_give_exactly_their_encoder_frames_through_each_front_end():
    """4x conv subsampling takes 4 T + 3 feature frames for T encoder frames; w2v-BERT 2.0's 2x stacking 2 T,
    so its 1536 frames of 20 ms are the same 300 s of audio as ``usm600m``'s 768 of 40 ms."""
    assert feature_frames("tiny", 16) == 67 and feature_frames("w2v_bert_2", 16) == 32
    assert (
        feature_frames("usm600m", SHAPES["usm600m"][1]) // 10
        == feature_frames("w2v_bert_2", SHAPES["w2v_bert_2"][1]) // 10
    )
    feats, lens, _, _ = make_batch(2, 16, torch.device("cpu"), size="w2v_bert_2")
    assert feats.shape == (2, 32, 80) and lens.tolist() == [32, 32]
