"""Activation checkpointing per block: the same losses and gradients as the plain step, also over
compiled blocks (the trainer's order: compile each block, then checkpoint its compiled forward)."""

import copy
from dataclasses import replace

import pytest
import torch
from toy_batches import FixedLoader, ctc_batch

from usmkit.config import OptimConfig, TrainerConfig
from usmkit.models.asr import AsrHeadConfig, AsrModel
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.presets import tiny
from usmkit.training.activation_checkpoint import _CheckpointedForward, checkpoint_blocks
from usmkit.training.compile_blocks import _TrainingForward, compile_blocks
from usmkit.training.task_spec import compile_units, train_spec
from usmkit.training.trainer import Trainer


def _model(dropout: float = 0.1) -> AsrModel:
    torch.manual_seed(0)
    cfg = tiny(d_model=64, num_layers=2, num_heads=2, dropout=dropout, chunk_size=8, left_chunks=1)
    enc = ConformerEncoder(replace(cfg, zero_init_residual=False))
    return AsrModel(enc, vocab_size=40, cfg=AsrHeadConfig())


def _loss_and_grads(model: AsrModel, batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.train()
    model.zero_grad()
    torch.manual_seed(1)  # the dropout masks
    loss = model(batch).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_checkpointed_blocks_with_dropout_give_the_plain_gradients():
    plain, checkpointed = _model(), _model()
    assert checkpoint_blocks(compile_units(checkpointed)) == 3  # 2 blocks + the front end
    batch = ctc_batch(3)
    (loss_p, grads_p), (loss_c, grads_c) = _loss_and_grads(plain, batch), _loss_and_grads(checkpointed, batch)
    torch.testing.assert_close(loss_c, loss_p, rtol=0, atol=0)
    for a, b in zip(grads_c, grads_p, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def _trainer(tmp_path, name: str, model: AsrModel, **options) -> Trainer:
    cfg = TrainerConfig(exp_dir=str(tmp_path / name), max_steps=3, log_every=1, eval_every=0, save_every=100,
                        progress=False, **options)  # fmt: skip
    optim = OptimConfig(lr=1e-3, warmup_steps=2)
    return Trainer(cfg, optim, model, FixedLoader((2, 3, 2)), "x: 1\n", spec=train_spec(model, optim))


def test_the_trainer_checkpoints_around_the_compiled_blocks(tmp_path):
    model = _model()
    _trainer(tmp_path, "t", model, compile=True, compile_scope="blocks", activation_checkpointing=True)
    for unit in compile_units(model):
        assert isinstance(unit.forward, _CheckpointedForward)
        assert isinstance(unit.forward.inner, _TrainingForward)


@pytest.mark.slow  # inductor compiles on the CPU: about a minute on 2 cores
def test_checkpointed_compiled_blocks_with_dropout_train_like_compiled_blocks(tmp_path):
    """Inductor, not a lighter backend: compiling a forward that holds the checkpoint failed in inductor's
    partitioner ("Node ... was invalid, but is output") for blocks with dropout."""
    torch._dynamo.reset()
    losses = {}
    for name, ac in (("compiled", False), ("compiled_ac", True)):
        trainer = _trainer(tmp_path, name, _model(), compile=True, compile_scope="blocks", activation_checkpointing=ac)
        torch.manual_seed(2)
        losses[name] = [loss for _, loss in trainer.fit().losses]
    assert len(losses["compiled_ac"]) == 3
    torch.testing.assert_close(losses["compiled_ac"], losses["compiled"], rtol=1e-5, atol=1e-6)


def test_checkpoint_over_a_compiled_forward_recomputes_the_same_dropout_masks(monkeypatch):
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend="aot_eager", **kw))
    torch._dynamo.reset()
    compiled = _model()
    checkpointed = copy.deepcopy(compiled)
    compile_blocks(compile_units(compiled))
    compile_blocks(compile_units(checkpointed))
    checkpoint_blocks(compile_units(checkpointed))
    batch = ctc_batch(3)
    (loss_p, grads_p), (loss_c, grads_c) = _loss_and_grads(compiled, batch), _loss_and_grads(checkpointed, batch)
    torch.testing.assert_close(loss_c, loss_p, rtol=0, atol=0)
    for a, b in zip(grads_c, grads_p, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
