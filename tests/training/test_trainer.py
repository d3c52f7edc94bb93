"""The loop on a toy task: exact resume, non-finite steps, and divergence."""

import json
import logging
from dataclasses import replace

import pytest
import torch

from usmkit.config import OptimConfig, TrainerConfig
from usmkit.data.batch import Batch
from usmkit.models.output import StepOutput
from usmkit.training.spec import ParamGroup, TrainSpec
from usmkit.training.task_spec import batch_dynamic_axes, encoder_param_groups, train_spec
from usmkit.training.trainer import Trainer, TrainingDiverged


class ToyLoader:
    """A shuffled, resumable list of batches (like the lhotse sampler: position + epoch)."""

    def __init__(self, n=6, poison=(), kill_after=None):
        self.kill_after, self.served = kill_after, 0
        g = torch.Generator().manual_seed(0)
        self.batches = [
            Batch(
                features=torch.randn(2, 5, 3, generator=g),
                feature_lens=torch.tensor([5, 4]),
                tokens=torch.zeros(2, 0, dtype=torch.long),
                token_lens=torch.zeros(2, dtype=torch.long),
            )
            for _ in range(n)
        ]
        for i in poison:
            self.batches[i].features[0, 0, 0] = float("nan")
        self.epoch, self.pos = 0, 0

    def __iter__(self):
        order = torch.randperm(len(self.batches), generator=torch.Generator().manual_seed(self.epoch)).tolist()
        while self.pos < len(order):
            if self.kill_after is not None and self.served == self.kill_after:
                raise KeyboardInterrupt("simulated kill")
            self.served += 1
            self.pos += 1
            yield self.batches[order[self.pos - 1]]
        self.pos = 0

    def set_epoch(self, e):
        self.epoch = e

    def state_dict(self):
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, sd):
        self.epoch, self.pos = sd["epoch"], sd["pos"]


class ToyTask(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))

    def forward(self, batch):
        y = self.net(batch.features).squeeze(-1)  # (B, T)
        loss = (y - 1).pow(2).mean()
        return StepOutput(loss=loss, metrics={"ymean": y.mean().detach()})


def _trainer(tmp_path, max_steps, loader=None, spec=None, **kw):
    kw = {"log_every": 1, "eval_every": 0, "save_every": 4, "progress": False} | kw
    cfg = TrainerConfig(exp_dir=str(tmp_path), max_steps=max_steps, **kw)
    return Trainer(cfg, OptimConfig(lr=1e-2, warmup_steps=2), ToyTask(), loader or ToyLoader(), "x: 1\n", spec=spec)


@pytest.mark.parametrize("async_save", [True, False], ids=["background_checkpoints", "checkpoints_in_the_loop"])
def test_resumed_run_matches_uninterrupted(tmp_path, async_save):
    full = _trainer(tmp_path / "a", 10, async_save=False).fit()
    with pytest.raises(KeyboardInterrupt):  # killed during step 6, after the checkpoint at step 4
        _trainer(tmp_path / "b", 10, loader=ToyLoader(kill_after=5), async_save=async_save).fit()
    resumed = _trainer(tmp_path / "b", 10, async_save=async_save)
    assert resumed.resume() and resumed.step == 4
    out = resumed.fit()
    assert out.losses == full.losses[4:]  # bitwise equal losses at steps 5..10


def test_a_run_resumed_after_the_last_batch_of_an_epoch_goes_on(tmp_path):
    """The checkpoint at step 4 holds a loader at the end of its 4-batch epoch: the resumed pass yields
    nothing, and the run goes on with the next epoch instead of taking the split for empty."""
    full = _trainer(tmp_path / "a", 8, loader=ToyLoader(n=4)).fit()
    with pytest.raises(KeyboardInterrupt):  # killed asking for step 5's batch, after the checkpoint at step 4
        _trainer(tmp_path / "b", 8, loader=ToyLoader(n=4, kill_after=4)).fit()
    resumed = _trainer(tmp_path / "b", 8, loader=ToyLoader(n=4))
    assert resumed.resume() and resumed.step == 4 and resumed.epoch == 0
    assert resumed.fit().losses == full.losses[4:]


def test_an_empty_training_split_is_named(tmp_path):
    with pytest.raises(RuntimeError, match="yielded no batch"):
        _trainer(tmp_path, 3, loader=ToyLoader(n=0)).fit()


def test_log_lines_hold_the_values_of_their_step(tmp_path):
    """Each line is written once its step has been read (a step later, so the host never waits for the
    device to drain): it carries that step's loss and task metrics, not the next step's."""
    out = _trainer(tmp_path, 7, log_every=2).fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lines = [row for row in rows if "train/loss" in row]
    assert [line["step"] for line in lines] == [2, 4, 6, 7]
    # Each checkpoint (steps 4 and 7) logs, on a line of its own, how long it kept the loop waiting.
    saves = [row for row in rows if "train/checkpoint_s" in row]
    assert [row["step"] for row in saves] == [4, 7] and all(row["train/checkpoint_s"] > 0 for row in saves)
    losses = dict(out.losses)
    for line in lines:
        assert line["train/loss"] == pytest.approx(losses[line["step"]])
        assert line["train/bad_steps"] == 0.0 and line["train/grad_norm"] > 0
        assert set(line) >= {"train/lr", "train/frames_per_s", "train/loader_wait", "train/ymean"}
    assert len({line["train/ymean"] for line in lines}) == 4


def test_non_finite_steps_are_skipped_and_counted(tmp_path):
    out = _trainer(tmp_path, 8, loader=ToyLoader(poison=(2,))).fit()
    assert out.step == 8 and out.bad_steps >= 1
    assert all(torch.isfinite(torch.tensor(loss)) for _, loss in out.losses)
    assert all(torch.isfinite(p).all() for p in _trainer(tmp_path / "x", 0).module.parameters())


def test_a_non_finite_gradient_is_named_in_the_warning(tmp_path, caplog):
    """A finite loss whose backward leaves one parameter's gradient infinite: the step is skipped and its
    warning names that parameter (the per-gradient norms kept by the clipping)."""
    trainer = _trainer(tmp_path, 3)
    name, param = trainer.named_parameters[-1]
    fired = []

    def poison_once(grad):
        if fired:
            return grad
        fired.append(True)
        return torch.full_like(grad, float("inf"))

    param.register_hook(poison_once)
    with caplog.at_level(logging.WARNING, logger="usmkit.training.trainer"):
        out = trainer.fit()
    assert out.bad_steps == 1
    (line,) = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    assert f"non-finite gradients: {name} of {len(trainer.named_parameters)} (norms: 0 NaN, 1 inf)" in line, line


def test_a_non_finite_step_leaves_weights_and_optimizer_state_as_they_were(tmp_path):
    poisoned = lambda: ToyLoader(poison=(2,))  # noqa: E731
    probe = _trainer(tmp_path / "probe", 6, loader=poisoned()).fit()
    (bad,) = set(range(1, 7)) - {step for step, _ in probe.losses}  # the step that drew the poisoned batch
    before = _trainer(tmp_path / "before", bad - 1, loader=poisoned())
    before.fit()
    through = _trainer(tmp_path / "through", bad, loader=poisoned())
    out = through.fit()
    assert out.bad_steps == 1 and out.step == bad
    for p, q in zip(before.module.parameters(), through.module.parameters(), strict=True):
        assert torch.equal(p, q)
        if bad > 1:
            a, b = before.optimizer.state[p], through.optimizer.state[q]
            assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
            assert float(b["step"]) == bad - 1  # the skipped update is not counted by AdamW


def test_training_stops_after_too_many_bad_steps(tmp_path):
    loader = ToyLoader(n=3, poison=(0, 1, 2))
    with pytest.raises(TrainingDiverged, match="3 consecutive steps"):
        _trainer(tmp_path, 5, loader=loader, max_bad_steps=3).fit()


def test_time_budget_stops_early_and_saves(tmp_path, monkeypatch):
    import usmkit.training.trainer as trainer_module

    clock = iter(range(0, 10_000, 7))  # every call of the trainer's clock: 7 s later than the one before
    monkeypatch.setattr(trainer_module.time, "perf_counter", lambda: float(next(clock)))
    out = _trainer(tmp_path, 100, max_minutes=1.0).fit()
    assert 0 < out.step < 100
    assert (tmp_path / "checkpoints" / f"step-{out.step:06d}").is_dir()  # saved where it stopped
    resumed = _trainer(tmp_path, 100)
    assert resumed.resume() and resumed.step == out.step


def test_several_processes_agree_on_the_time_budget_only_at_log_steps(tmp_path, monkeypatch):
    """Agreeing on rank 0's clock is a collective and a device sync: asked every ``log_every`` steps."""
    import torch.distributed as dist

    import usmkit.training.trainer as trainer_module

    clock = iter(range(0, 10_000, 7))
    monkeypatch.setattr(trainer_module.time, "perf_counter", lambda: float(next(clock)))
    asked_at = []
    broadcast = dist.broadcast

    def counted(tensor, src, *args, **kwargs):
        asked_at.append(trainer.step)
        return broadcast(tensor, src, *args, **kwargs)

    monkeypatch.setattr(dist, "broadcast", counted)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        trainer = _trainer(tmp_path / "exp", 100, max_minutes=1.0, log_every=4)
        out = trainer.fit()
    finally:
        dist.destroy_process_group()
    assert 0 < out.step < 100 and out.step % 4 == 0
    assert asked_at and all(step % 4 == 0 for step in asked_at)


def test_checkpoints_pruned_to_keep_last(tmp_path):
    t = _trainer(tmp_path, 12, keep_last=2)
    t.fit()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step-000008", "step-000012"]
    assert replace(t.cfg, keep_last=1).keep_last == 1


def _batch_size_loader() -> ToyLoader:
    """Four batches of sizes 2..5 at one padded length (what bucketing gives a compiled step)."""
    loader = ToyLoader(n=4)
    for i in range(len(loader.batches)):
        B = 2 + i
        loader.batches[i] = Batch(
            features=torch.randn(B, 5, 3, generator=torch.Generator().manual_seed(i)),
            feature_lens=torch.full((B,), 5), tokens=torch.zeros(B, 0, dtype=torch.long),
            token_lens=torch.zeros(B, dtype=torch.long),
        )  # fmt: skip
    return loader


def test_compiled_step_does_not_recompile_across_batch_sizes(tmp_path, monkeypatch):
    """trainer.compile: static time length, dynamic batch size -> one graph for every batch."""
    from torch._dynamo.utils import counters

    import usmkit.training.trainer as trainer_mod

    real_compile = torch.compile
    monkeypatch.setattr(trainer_mod.torch, "compile", lambda m, **kw: real_compile(m, backend="aot_eager", **kw))
    loader = _batch_size_loader()
    torch._dynamo.reset()
    counters.clear()
    spec = TrainSpec(dynamic_axes=batch_dynamic_axes)  # the batch axes the task marks dynamic
    out = _trainer(tmp_path, 4, loader=loader, spec=spec, compile=True, compile_scope="whole").fit()
    assert out.step == 4
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_module_health_check_warns_once(tmp_path, caplog):
    class Unhealthy(ToyTask):
        calls = 0

        def health_check(self, scalars, step, warmup_steps):
            type(self).calls += 1
            return f"something is off at step {step}" if "train/ymean" in scalars else None

    cfg = TrainerConfig(exp_dir=str(tmp_path), max_steps=4, log_every=1, eval_every=0, save_every=4, progress=False)
    trainer = Trainer(cfg, OptimConfig(lr=1e-2, warmup_steps=2), Unhealthy(), ToyLoader(), "x: 1\n")
    with caplog.at_level("WARNING", logger="usmkit.training.trainer"):
        trainer.fit()
    warnings = [r.message for r in caplog.records if "something is off" in r.message]
    assert warnings == ["something is off at step 1"]  # once, not at every log line
    assert Unhealthy.calls == 1


class EncoderHeadTask(ToyTask):
    """ToyTask with its first layer named like a pre-trained encoder (``encoder.*``) and a new head."""

    def __init__(self):
        super().__init__()
        self.encoder, self.head = self.net[0], self.net[2]
        del self.net  # parameters named encoder.* and head.* only

    def forward(self, batch):
        y = self.head(torch.relu(self.encoder(batch.features))).squeeze(-1)  # (B, T)
        return StepOutput(loss=(y - 1).pow(2).mean(), metrics={})


def _encoder_head_trainer(tmp_path, max_steps, **optim):
    cfg = TrainerConfig(exp_dir=str(tmp_path), max_steps=max_steps, eval_every=0, save_every=100, progress=False)
    task, optim_cfg = EncoderHeadTask(), OptimConfig(lr=1e-2, warmup_steps=2, **optim)
    return Trainer(cfg, optim_cfg, task, ToyLoader(), "x: 1\n", spec=train_spec(task, optim_cfg))


def test_frozen_encoder_steps_train_only_the_head(tmp_path):
    trainer = _encoder_head_trainer(tmp_path, 3, freeze_encoder_steps=3)
    encoder0 = {k: v.clone() for k, v in trainer.module.encoder.state_dict().items()}
    head0 = trainer.module.head.weight.clone()
    trainer.fit()
    for k, v in trainer.module.encoder.state_dict().items():
        assert torch.equal(v, encoder0[k]), k  # no update, no weight decay either
    assert not torch.equal(trainer.module.head.weight, head0)
    trainer = _encoder_head_trainer(tmp_path / "b", 4, freeze_encoder_steps=3)
    trainer.fit()  # step 4 is past the freeze: the encoder learns
    assert not torch.equal(trainer.module.encoder.weight, encoder0["weight"])


def test_encoder_lr_scale_sets_the_encoder_groups_rate(tmp_path):
    trainer = _encoder_head_trainer(tmp_path, 10, encoder_lr_scale=0.25, freeze_encoder_steps=2)
    rates = []
    for _ in range(5):
        rates.append([g["lr"] for g in trainer.optimizer.param_groups])
        trainer.optimizer.step()  # no gradients: only keeps the scheduler's order
        trainer.scheduler.step()
    head, encoder = [r[0] for r in rates], [r[2] for r in rates]
    assert [r[0] for r in rates] == [r[1] for r in rates] and encoder == [r[3] for r in rates]
    assert encoder[:2] == [0.0, 0.0]  # frozen
    assert encoder[2:] == pytest.approx([0.25 * h for h in head[2:]])
    ids = {id(p) for g in trainer.optimizer.param_groups[2:] for p in g["params"]}
    assert ids == {id(p) for p in trainer.module.encoder.parameters()}


def test_encoder_options_need_an_encoder(tmp_path):
    with pytest.raises(ValueError, match="no parameters named encoder"):
        encoder_param_groups(ToyTask(), OptimConfig(encoder_lr_scale=0.5))
    cfg = TrainerConfig(exp_dir=str(tmp_path), max_steps=1, progress=False)
    with pytest.raises(ValueError, match="encoder_lr_scale.*parameter groups"):  # not silently ignored
        Trainer(cfg, OptimConfig(encoder_lr_scale=0.5), ToyTask(), ToyLoader(), "x: 1\n")


def test_parameter_groups_must_cover_every_trainable_parameter_once(tmp_path):
    cfg = TrainerConfig(exp_dir=str(tmp_path), max_steps=1, progress=False)
    task = EncoderHeadTask()
    head_only = TrainSpec(param_groups=(ParamGroup("head", tuple(task.head.parameters())),))
    with pytest.raises(ValueError, match="2 trainable parameters of EncoderHeadTask are in no parameter group"):
        Trainer(cfg, OptimConfig(), task, ToyLoader(), "x: 1\n", spec=head_only)
    twice = TrainSpec(param_groups=(ParamGroup("a", tuple(task.parameters())), ParamGroup("b", (task.head.bias,))))
    with pytest.raises(ValueError, match="two parameter groups: 'a' and 'b'"):
        Trainer(cfg, OptimConfig(), task, ToyLoader(), "x: 1\n", spec=twice)


def test_cuda_graph_mode_is_refused_where_it_cannot_serve(tmp_path):
    with pytest.raises(ValueError, match=r"compile=true.*CUDA device"):
        _trainer(tmp_path, 1, compile_mode="reduce-overhead", device="cpu")
    cfg = TrainerConfig(exp_dir=str(tmp_path), compile=True, compile_mode="reduce-overhead", device="cpu")
    with pytest.raises(ValueError, match=r"accum_steps=1 \(got 2\)"):
        Trainer(cfg, OptimConfig(accum_steps=2), ToyTask(), ToyLoader(), "x: 1\n")


@pytest.mark.gpu
def test_cuda_graph_steps_match_the_default_compiled_steps(tmp_path):
    """compile_mode=reduce-overhead: the same losses as the default compiled step, over several batch sizes."""
    from torch._dynamo.utils import counters

    losses = {}
    for mode in ("default", "reduce-overhead"):
        loader = _batch_size_loader()  # one CUDA graph recorded per batch shape
        torch._dynamo.reset()
        counters.clear()
        cfg = TrainerConfig(
            exp_dir=str(tmp_path / mode), max_steps=10, log_every=1, eval_every=0, save_every=100, progress=False,
            compile=True, compile_mode=mode, compile_scope="whole", device="cuda", precision="fp32",
        )  # fmt: skip
        # EncoderHeadTask has no dropout, so both modes draw no random numbers and must agree.
        spec = TrainSpec(dynamic_axes=batch_dynamic_axes)
        trainer = Trainer(cfg, OptimConfig(lr=1e-2, warmup_steps=2), EncoderHeadTask(), loader, "x: 1\n", spec=spec)
        losses[mode] = [loss for _, loss in trainer.fit().losses]
        assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
        rows = [json.loads(x) for x in (tmp_path / mode / "metrics.jsonl").read_text().splitlines()]
        logged = [r for r in rows if "train/loss" in r]  # the allocator's counters ride on each log line
        assert logged and all(r["train/max_mem_gib"] > 0 and r["train/alloc_retries"] >= 0 for r in logged)
    assert len(losses["default"]) == 10
    torch.testing.assert_close(losses["reduce-overhead"], losses["default"], rtol=1e-5, atol=1e-6)
