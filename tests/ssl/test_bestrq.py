"""BestRQModel: the step's contract, targets from unmasked input, a loop oracle for the loss, overfitting,
checkpoint round trips (and that only ``encoder.*`` reaches fine-tuning), the defaults' sizes, the recipe."""

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from usmkit.checkpointing.checkpoint import load_weights, save_checkpoint
from usmkit.data.batch import Batch
from usmkit.models.output import StepOutput
from usmkit.ssl.bestrq import BestRQConfig, BestRQModel, code_perplexity

FEAT = 16
SMALL = dict(num_codebooks=2, codebook_size=64)


class StandInEncoder(nn.Module):
    """The encoder's forward signature: 4 stacked frames -> Linear -> bidirectional GRU; T' = T // 4."""

    def __init__(self, input_dim: int = FEAT, d_model: int = 32) -> None:
        super().__init__()
        self.proj = nn.Linear(4 * input_dim, d_model)
        self.rnn = nn.GRU(d_model, d_model // 2, batch_first=True, bidirectional=True)
        self.d_model = d_model
        self.inputs: list[torch.Tensor] = []  # what forward saw, for the tests

    @property
    def output_dim(self) -> int:
        return self.d_model

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.inputs.append(features.detach().clone())
        B, T, F = features.shape
        x = features[:, : T // 4 * 4].reshape(B, T // 4, 4 * F)  # (B, T', 4F)
        y, _ = self.rnn(torch.tanh(self.proj(x)))
        return y, lengths // 4


def _batch(B=3, T=120, seed=0, lengths=None) -> Batch:
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lengths if lengths is not None else [T, T - 23, T // 2])[:B]
    feats = torch.randn(B, T, FEAT, generator=g)
    feats = feats * (torch.arange(T) < lens[:, None]).unsqueeze(-1)
    return Batch(
        features=feats,
        feature_lens=lens,
        tokens=torch.zeros(B, 0, dtype=torch.int64),
        token_lens=torch.zeros(B, dtype=torch.int64),
    )


def _model(seed=0, **cfg) -> BestRQModel:
    torch.manual_seed(seed)
    return BestRQModel(StandInEncoder(), BestRQConfig(**(SMALL | cfg)), input_dim=FEAT)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="num_codebooks"):
        BestRQConfig(num_codebooks=0)
    with pytest.raises(ValueError, match="mask_prob"):
        BestRQConfig(mask_prob=0.0)
    with pytest.raises(ValueError, match="mask_span_ms"):
        BestRQConfig(mask_span_ms=5.0)
    with pytest.raises(ValueError, match="noise_std"):
        BestRQConfig(noise_std=-0.1)
    with pytest.raises(ValueError, match="codebook_size"):
        BestRQConfig(codebook_size=1)
    with pytest.raises(TypeError, match="BestRQConfig"):
        BestRQModel(StandInEncoder(), dict(SMALL), input_dim=FEAT)


def test_step_output_contract():
    model = _model(mask_prob=0.05)
    batch = _batch()
    out = model(batch)
    assert isinstance(out, StepOutput)
    assert out.loss.dim() == 0 and torch.isfinite(out.loss) and out.loss.requires_grad
    want = {"loss", "acc_mean", "perplexity_mean", "pred_perplexity_mean", "mask_frac"}
    want |= {f"acc_cb{i}" for i in range(2)} | {f"perplexity_cb{i}" for i in range(2)}
    assert set(out.metrics) == want
    for v in out.metrics.values():
        assert isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad
    assert 0 < out.metrics["mask_frac"] < 1
    assert 1.0 <= out.metrics["perplexity_mean"] <= 64.0
    out.loss.backward()
    assert model.heads.weight.grad is not None and model.encoder.proj.weight.grad.abs().sum() > 0


def test_targets_come_from_unmasked_features_and_encoder_sees_noise():
    model = _model(mask_prob=0.1, noise_std=0.1)
    batch = _batch()
    seen = []
    targets = model.quantizer.targets

    def spy(features, lengths):
        seen.append(features.clone())
        return targets(features, lengths)

    model.quantizer.targets = spy
    model.train()
    model(batch)
    assert torch.equal(seen[0], batch.features)
    enc_in = model.encoder.inputs[-1]
    changed = (enc_in != batch.features).any(dim=-1)  # (B, T)
    valid = torch.arange(batch.features.shape[1]) < batch.feature_lens[:, None]
    assert changed.any() and not (changed & ~valid).any()  # padding is never touched
    assert enc_in[changed].std() < 0.2  # N(0, 0.1) noise, not the unit-variance features


def test_loss_and_accuracy_match_a_loop_oracle():
    model = _model(mask_prob=0.05).eval()  # eval: fixed masks from cfg.seed + 1
    batch = _batch()
    with torch.no_grad():
        out = model(batch)
        g = torch.Generator().manual_seed(model.cfg.seed + 1)
        masked, mask = model.mask_features(batch.features, batch.feature_lens, g)
        enc, enc_lens = model.encoder(masked, batch.feature_lens)
        codes, target_lens = model.quantizer.targets(batch.features, batch.feature_lens)
        ces, hits, count = [], [], 0
        for b in range(batch.size):
            for t in range(min(int(enc_lens[b]), int(target_lens[b]))):
                if mask[b, 4 * t : 4 * t + 4].any():
                    count += 1
                    logits = model.heads(enc[b, t]).view(2, 64)
                    for n in range(2):
                        ces.append(torch.nn.functional.cross_entropy(logits[n], codes[b, t, n]))
                        hits.append(float(logits[n].argmax() == codes[b, t, n]))
    assert count > 0
    torch.testing.assert_close(out.loss, torch.stack(ces).mean())
    torch.testing.assert_close(out.metrics["acc_mean"], torch.tensor(sum(hits) / len(hits)))


def test_eval_passes_repeat_their_masks_and_train_mode_draws_new_ones():
    model = _model(mask_prob=0.05)
    batch = _batch()
    model.eval()
    with torch.no_grad():
        first = [model(batch).metrics["mask_frac"] for _ in range(3)]  # one dev pass of 3 batches
        model.train().eval()  # what the trainer does around each evaluation
        again = [model(batch).metrics["mask_frac"] for _ in range(3)]
    assert first == again
    assert len({float(v) for v in first}) > 1  # batches of one pass get different masks
    model.train()
    torch.manual_seed(0)
    c = model(batch).metrics["mask_frac"]
    d = model(batch).metrics["mask_frac"]
    assert not torch.equal(c, d)


def test_no_masked_frame_gives_zero_loss_not_nan():
    model = _model(mask_prob=1e-12, min_one_span=False)
    out = model(_batch())
    assert out.metrics["mask_frac"] == 0
    assert out.loss == 0 and torch.isfinite(out.metrics["acc_mean"])
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_code_perplexity():
    codes = torch.tensor([[0, 0], [1, 0], [2, 0], [3, 0]])  # (frames, N=2)
    ppl = code_perplexity(codes, torch.ones(4), codebook_size=4)
    torch.testing.assert_close(ppl, torch.tensor([4.0, 1.0]))
    ppl = code_perplexity(codes, torch.tensor([1.0, 1.0, 0.0, 0.0]), codebook_size=4)  # weights drop rows
    torch.testing.assert_close(ppl, torch.tensor([2.0, 1.0]))
    assert code_perplexity(codes, torch.zeros(4), 4).tolist() == [1.0, 1.0]


def test_loss_falls_when_overfitting_one_batch():
    # Each utterance repeats one random frame, so its codes can be read off the unmasked context:
    # with fresh random masks every step, the loss must fall from chance (log K) towards 0.
    model = _model(seed=0, mask_prob=0.05)
    g = torch.Generator().manual_seed(0)
    frames = torch.randn(2, 1, FEAT, generator=g).expand(2, 80, FEAT).contiguous()
    batch = Batch(
        frames, torch.tensor([80, 80]), torch.zeros(2, 0, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    losses = []
    for _ in range(30):
        out = model(batch)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert first > 0.9 * math.log(64)  # starts near chance
    assert last < 0.3 * first, losses
    assert out.metrics["acc_mean"] > 0.9


def test_state_dict_round_trip_through_safetensors(tmp_path: Path):
    model = _model(seed=0, mask_prob=0.05)
    sd = model.state_dict()
    assert {"quantizer.projections", "quantizer.codebooks", "heads.weight", "heads.bias"} <= set(sd)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "m.safetensors"))
    other = BestRQModel(
        StandInEncoder(), BestRQConfig(**SMALL, mask_prob=0.05, seed=9), input_dim=FEAT
    )  # other quantizer
    batch = _batch()
    assert not torch.equal(other.quantizer.targets(batch.features, batch.feature_lens)[0],
                           model.quantizer.targets(batch.features, batch.feature_lens)[0])  # fmt: skip
    other.load_state_dict(load_file(str(tmp_path / "m.safetensors")))
    want = model.quantizer.targets(batch.features, batch.feature_lens)[0]
    assert torch.equal(other.quantizer.targets(batch.features, batch.feature_lens)[0], want)
    # Same config, other initial weights: after loading, the whole step is the same.
    fresh = _model(seed=3, mask_prob=0.05)
    fresh.load_state_dict(load_file(str(tmp_path / "m.safetensors")))
    model.eval(), fresh.eval()
    batch = _batch(lengths=[120, 120, 120])
    with torch.no_grad():
        want = model(batch)
        assert want.metrics["mask_frac"] > 0
        assert torch.equal(fresh(batch).loss, want.loss)


class FineTuneStandIn(nn.Module):
    """What stage 3 looks like to ``init_from``: an ``encoder`` plus its own head."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = StandInEncoder()
        self.ctc = nn.Linear(32, 10)


def test_init_from_takes_only_the_encoder(tmp_path: Path):
    model = _model(seed=0)
    ckpt = save_checkpoint(tmp_path / "checkpoints", 1, model, {"step": 1}, "task: {kind: bestrq}\n")
    torch.manual_seed(1)
    target = FineTuneStandIn()
    ctc_before = target.ctc.weight.clone()
    loaded = load_weights(target, ckpt, prefix="encoder.")
    assert loaded and all(k.startswith("encoder.") for k in loaded)
    assert not any(k.startswith(("quantizer.", "heads.")) for k in target.state_dict())
    torch.testing.assert_close(target.encoder.proj.weight, model.encoder.proj.weight)
    assert torch.equal(target.ctc.weight, ctc_before)
    # Resuming stage 1 (strict, all keys) restores the quantizer too.
    resumed = BestRQModel(StandInEncoder(), BestRQConfig(**SMALL, seed=5), input_dim=FEAT)
    load_weights(resumed, ckpt)
    assert torch.equal(resumed.quantizer.codebooks, model.quantizer.codebooks)


def test_paper_defaults_on_a_tiny_input():
    cfg = BestRQConfig()  # 16 codebooks x 8192 codes
    model = BestRQModel(StandInEncoder(input_dim=80), cfg, input_dim=80)
    q = model.quantizer
    assert q.projections.shape == (16, 320, 16) and q.codebooks.shape == (16, 8192, 16)
    buffer_mb = sum(b.numel() * b.element_size() for b in model.buffers()) / 2**20
    assert buffer_mb < 10  # 8.3 MiB of frozen quantizer
    assert model.heads.weight.shape == (16 * 8192, 32)
    g = torch.Generator().manual_seed(0)
    batch = Batch(
        features=torch.randn(2, 200, 80, generator=g),
        feature_lens=torch.tensor([200, 150]),
        tokens=torch.zeros(2, 0, dtype=torch.int64),
        token_lens=torch.zeros(2, dtype=torch.int64),
    )
    torch.manual_seed(0)
    out = model(batch)
    out.loss.backward()
    assert torch.isfinite(out.loss) and abs(out.loss.item() - math.log(8192)) < 1.5
    assert {f"acc_cb{i}" for i in range(16)} <= set(out.metrics)
    assert out.metrics["perplexity_mean"] > 30  # 50 and 37 target frames spread over 8192 codes


def test_with_the_real_tiny_conformer():
    conformer = pytest.importorskip("usmkit.models.conformer", reason="usmkit.models.conformer not written yet")
    presets = pytest.importorskip("usmkit.models.presets", reason="usmkit.models.presets not written yet")
    enc_cfg = presets.tiny(input_dim=FEAT, chunk_size=8)
    torch.manual_seed(0)
    model = BestRQModel(conformer.ConformerEncoder(enc_cfg), BestRQConfig(**SMALL, mask_prob=0.05), enc_cfg.input_dim)
    batch = _batch(T=101, lengths=[101, 80, 40])  # T' = 24 < T // 4 = 25: aligned on the common prefix
    out = model(batch)
    out.loss.backward()
    assert torch.isfinite(out.loss) and out.loss > 0
    grads = [p.grad for n, p in model.named_parameters() if n.startswith("encoder.")]
    assert all(g is not None for g in grads) and sum(g.abs().sum() for g in grads) > 0


def _compose_train(overrides: list[str]):
    from omegaconf import OmegaConf

    from usmkit.cli.compose import compose_train

    return OmegaConf.create(compose_train(overrides, command="test"))


def test_stage1_recipe_composes_to_the_defaults():
    from omegaconf import OmegaConf

    from usmkit.config import TaskConfig

    cfg = _compose_train(["recipe=stage1"])
    task = OmegaConf.to_container(cfg.task, resolve=True)
    assert task["kind"] == "bestrq"
    assert BestRQConfig(**TaskConfig(**task).bestrq) == BestRQConfig()
    assert cfg.data.train_split == "unlabeled" and cfg.data.dev_split == "dev"
    assert cfg.data.spec_augment.enabled is False
    assert cfg.trainer.best_metric == "dev_loss"
    cfg = _compose_train(["recipe=stage1", "data.features.frame_shift_ms=20.0"])
    assert BestRQConfig(**OmegaConf.to_container(cfg.task.bestrq, resolve=True)).span_frames == 20


def test_health_check_flags_collapsed_heads_after_warmup_only():
    model = _model()
    collapsed = {"train/pred_perplexity_mean": 1.5, "train/perplexity_mean": 330.0}
    assert model.health_check(collapsed, step=50, warmup_steps=50) is None  # still warming up
    message = model.health_check(collapsed, step=500, warmup_steps=50)
    assert message and "collapsed" in message and "optim.lr" in message
    healthy = {"train/pred_perplexity_mean": 27.0, "train/perplexity_mean": 320.0}
    assert model.health_check(healthy, step=500, warmup_steps=50) is None
    assert model.health_check({"train/loss": 1.0}, step=500, warmup_steps=50) is None


def test_stack_frames_follow_the_encoders_subsampling():
    """One target per encoder frame: 8 stacked feature frames at 8x; a mismatch is refused by name."""
    from omegaconf import OmegaConf

    from usmkit.models.conformer import ConformerEncoder
    from usmkit.models.presets import tiny

    cfg = _compose_train(["recipe=stage1", "model.subsampling_factor=8"])
    bestrq = BestRQConfig(**OmegaConf.to_container(cfg.task.bestrq, resolve=True))
    assert bestrq.stack_frames == 8
    enc_cfg = tiny(input_dim=FEAT, subsampling_factor=8, chunk_size=4, num_layers=1)
    torch.manual_seed(0)
    model = BestRQModel(ConformerEncoder(enc_cfg), BestRQConfig(**SMALL, stack_frames=8), FEAT)
    batch = _batch(T=120, lengths=[120, 97, 60])
    out = model(batch)
    assert torch.isfinite(out.loss) and out.loss > 0
    codes, target_lens = model.quantizer.targets(batch.features, batch.feature_lens)
    assert codes.shape[1] == 15 and target_lens.tolist() == [15, 12, 7]  # T // 8 targets
    with pytest.raises(
        ValueError, match=r"task.bestrq.stack_frames=4 does not match model.subsampling_factor=8.*stack_frames=8"
    ):
        BestRQModel(ConformerEncoder(enc_cfg), BestRQConfig(**SMALL), FEAT)
