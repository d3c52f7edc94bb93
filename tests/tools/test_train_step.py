"""tools.train_step: the shared synthetic step runs on a CPU (fp32, no autocast) and times itself there."""

from __future__ import annotations

import torch

from tools.train_step import SHAPES, OursCTC, TorchaudioCTC, make_batch, make_step, timed


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
