"""compile_scope=blocks: each Conformer block and the front end compiled, equal to eager, no recompiles."""

import copy

import pytest
import torch
from torch._dynamo.utils import counters
from toy_batches import FixedLoader, ctc_batch

from usmkit.config import OptimConfig, TrainerConfig
from usmkit.models.asr import AsrHeadConfig, AsrModel
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.presets import tiny
from usmkit.training.compile_blocks import compile_blocks
from usmkit.training.task_spec import compile_units, train_spec
from usmkit.training.trainer import Trainer


def _model() -> AsrModel:
    torch.manual_seed(0)
    enc = ConformerEncoder(
        tiny(d_model=64, num_layers=3, num_heads=2, dropout=0.0, chunk_size=8, left_chunks=1, zero_init_residual=False)
    )
    return AsrModel(enc, vocab_size=40, cfg=AsrHeadConfig())


def test_compiled_blocks_match_eager_over_batch_sizes_with_one_graph_each(aot_eager):
    model = _model()
    eager = copy.deepcopy(model)
    assert compile_blocks(compile_units(model)) == 4  # 3 blocks + the subsampling front end
    for B, seed in ((3, 0), (5, 1), (2, 2)):  # batch sizes vary, the padded length does not
        batch = ctc_batch(B, seed=seed)
        out, ref = model(batch), eager(batch)
        out.loss.backward()
        ref.loss.backward()
        torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=1e-5)
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4 * q.grad.abs().max().item(), msg=name)
    # One graph for the identical blocks, one for the front end: neither a new batch size nor
    # another block instance compiles again.
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])


def test_evaluation_runs_the_eager_forward(aot_eager):
    model = _model()
    compile_blocks(compile_units(model))
    model.eval()
    with torch.no_grad():
        model(ctc_batch(3))
    assert counters["stats"]["unique_graphs"] == 0, dict(counters["stats"])


def test_a_model_without_blocks_is_refused(tmp_path):
    model = torch.nn.Linear(2, 2)
    assert compile_units(model) == ()
    cfg = TrainerConfig(exp_dir=str(tmp_path), compile=True, compile_scope="blocks", progress=False)
    with pytest.raises(ValueError, match="no blocks to compile.*compile_scope=whole"):
        Trainer(cfg, OptimConfig(), model, FixedLoader((2, 3, 4, 2)), "x: 1\n", spec=train_spec(model, OptimConfig()))


def test_trainer_with_compile_scope_blocks_trains_like_eager(tmp_path, aot_eager):
    losses = {}
    for scope in ("eager", "blocks"):
        cfg = TrainerConfig(
            exp_dir=str(tmp_path / scope), max_steps=4, log_every=1, eval_every=0, save_every=100, progress=False,
            compile=scope != "eager", compile_scope="blocks",
        )  # fmt: skip
        model, optim = _model(), OptimConfig(lr=1e-3, warmup_steps=2)
        trainer = Trainer(cfg, optim, model, FixedLoader((2, 3, 4, 2)), "x: 1\n", spec=train_spec(model, optim))
        losses[scope] = [loss for _, loss in trainer.fit().losses]
    assert len(losses["blocks"]) == 4
    torch.testing.assert_close(losses["blocks"], losses["eager"], rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_blocks_replayed_as_cuda_graphs_match_plain_compiled_blocks():
    """compile_scope=blocks with compile_mode=reduce-overhead: the same losses and gradients as the
    blocks compiled without CUDA graphs, over two batch sizes, each recorded and then replayed."""
    torch._dynamo.reset()
    counters.clear()
    plain, graphed = _model().cuda(), _model().cuda()
    compile_blocks(compile_units(plain))
    compile_blocks(compile_units(graphed), mode="reduce-overhead")
    for B, seed in ((3, 0), (3, 1), (5, 2), (5, 3)):
        batch = ctc_batch(B, seed=seed).to(torch.device("cuda"))
        results = []
        for model in (plain, graphed):
            model.zero_grad()
            torch.compiler.cudagraph_mark_step_begin()
            loss = model(batch).loss
            loss.backward()
            results.append((loss.detach().clone(), [p.grad.clone() for p in model.parameters()]))
        (loss_p, grads_p), (loss_g, grads_g) = results
        torch.testing.assert_close(loss_g, loss_p, rtol=1e-5, atol=1e-5)
        for a, b in zip(grads_g, grads_p, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item())
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
