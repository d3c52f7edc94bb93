"""MOST's model: durations (alignment, upsampling), the consistency loss, switching losses off, the warm-ups,
overfitting a tiny batch of each stream, heads from stage 1, decoding, and the config's checks."""

from __future__ import annotations

import pytest
import torch
import torchaudio.functional as taf

from usmkit.config import ConfigError, TaskConfig, from_dict
from usmkit.data.batch import Batch
from usmkit.data.mixer import MostBatch
from usmkit.data.text_only import TextBatch
from usmkit.decoding.modes import decode
from usmkit.models.config import ConformerConfig
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.subsampling import conv_out_size
from usmkit.ssl.alignment import forced_durations, frames_needed, token_durations
from usmkit.ssl.bestrq import BestRQConfig
from usmkit.ssl.duration import durations_from_log, log_duration_errors, upsample
from usmkit.ssl.most import MostModel
from usmkit.ssl.most_config import LOSSES, MostConfig

pytestmark = pytest.mark.usefixtures("one_thread")

FEAT, V = 16, 12
BESTRQ = BestRQConfig(num_codebooks=2, codebook_size=32, mask_prob=0.05)


def _model(seed: int = 0, **most) -> MostModel:
    torch.manual_seed(seed)
    enc = ConformerEncoder(
        ConformerConfig(
            input_dim=FEAT,
            d_model=32,
            num_layers=3,
            num_heads=2,
            subsampling_channels=8,
            dropout=0.0,
            chunk_size=None,
            zero_init_residual=False,
        )
    )
    cfg = MostConfig(**({"text_layer": 1, "text_warmup_steps": 0} | most))
    return MostModel(enc, V, cfg, BESTRQ, input_dim=FEAT)


def _tokens(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    lens = torch.tensor([len(r) for r in rows])
    tokens = torch.full((len(rows), int(lens.max())), -1)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r)
    return tokens, lens


def _audio(B: int, T: int, seed: int, lengths: list[int], rows: list[list[int]] | None = None) -> Batch:
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lengths)
    feats = torch.randn(B, T, FEAT, generator=g) * (torch.arange(T) < lens[:, None])[:, :, None]
    tokens, token_lens = (
        _tokens(rows) if rows else (torch.zeros(B, 0, dtype=torch.int64), torch.zeros(B, dtype=torch.int64))
    )
    return Batch(feats, lens, tokens, token_lens)


def _most_batch(step: int = 0) -> MostBatch:
    unlabeled = _audio(2, 96, seed=1, lengths=[96, 70])
    paired = _audio(2, 80, seed=2, lengths=[80, 61], rows=[[4, 5, 6, 6, 7], [8, 9, 10]])
    text = TextBatch(*_tokens([[5, 7, 9, 11], [6, 4, 4, 10, 8, 7]]))
    return MostBatch(unlabeled, paired, text, step)


# ---- durations


def test_token_durations_sum_to_the_frames_and_match_torchaudio_merge_tokens():
    """Each token's duration runs from its start in the path to the next token's start (leading blanks to the
    first token): checked against torchaudio's own token spans."""
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        T, U = 30, int(torch.randint(1, 8, (1,), generator=g))
        log_probs = torch.randn(1, T, V, generator=g).log_softmax(-1)
        tokens = torch.randint(4, V, (1, U), generator=g)
        path, scores = taf.forced_align(log_probs, tokens.int(), blank=0)
        spans = taf.merge_tokens(path[0], scores[0].exp())
        durations = token_durations(path[0], U)
        starts = [0] + [s.start for s in spans[1:]]
        assert durations.tolist() == [b - a for a, b in zip(starts, [*starts[1:], T], strict=True)]
        assert int(durations.sum()) == T and bool((durations >= 1).all())


def test_forced_durations_rows_sum_to_their_lengths_and_short_rows_are_flagged():
    g = torch.Generator().manual_seed(1)
    log_probs = torch.randn(3, 12, V, generator=g).log_softmax(-1)
    tokens, token_lens = _tokens([[4, 5, 5, 6], [7, 7, 7, 7], [8]])
    lengths = torch.tensor([12, 6, 9])  # row 1 needs 7 frames (4 tokens, 3 repeats)
    durations, ok = forced_durations(log_probs, lengths, tokens, token_lens)
    assert frames_needed([7, 7, 7, 7]) == 7
    assert ok.tolist() == [True, False, True]
    assert durations.sum(1).tolist() == [12, 0, 9]
    assert (
        durations[0].tolist()[:4]
        == token_durations(taf.forced_align(log_probs[:1], tokens[:1].int(), blank=0)[0][0], 4).tolist()
    )


def test_upsampled_length_is_the_sum_of_durations_and_frames_repeat_their_token():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 4, 5, generator=g)
    durations = torch.tensor([[2, 1, 3, 1], [1, 4, 0, 0], [5, 0, 0, 0]])
    frames, lengths, index, offset = upsample(x, durations)
    assert lengths.tolist() == durations.sum(1).tolist() and frames.shape == (3, 7, 5)
    for b in range(3):
        n = int(lengths[b])
        reference = torch.repeat_interleave(x[b], durations[b], dim=0)  # the plain oracle
        assert torch.equal(frames[b, :n], reference)
        assert torch.equal(frames[b, n:], torch.zeros_like(frames[b, n:]))
    assert offset[0].tolist() == [0, 1, 0, 0, 1, 2, 0] and index[0].tolist() == [0, 0, 1, 2, 2, 2, 3]
    with pytest.raises(ValueError, match="num_frames"):
        upsample(x, durations, num_frames=6)
    padded, padded_lengths, _, _ = upsample(x, durations, round_up=lambda longest: longest + 5)  # 7 -> 12 frames
    assert padded.shape == (3, 12, 5) and torch.equal(padded[:, :7], frames) and torch.equal(padded_lengths, lengths)
    assert not padded[:, 7:].any()


def test_predicted_durations_are_whole_clipped_frames_and_the_error_metrics():
    log_d = torch.tensor([[0.0, 1.1, 9.0], [-3.0, 0.7, 0.7]])
    assert durations_from_log(log_d, torch.tensor([3, 2]), max_frames=8).tolist() == [[1, 3, 8], [1, 2, 0]]
    mse, mae = log_duration_errors(torch.log(torch.tensor([[2.0, 4.0]])), torch.tensor([[2, 1]]), torch.ones(1, 2))
    assert mse.item() == pytest.approx(torch.log(torch.tensor(4.0)).item() ** 2 / 2)
    assert mae.item() == pytest.approx(torch.log(torch.tensor(4.0)).item() / 2)


# ---- the losses


def _record_block_k_input(model, monkeypatch) -> dict:
    """Make ``model`` record the speech encoder's block-k input (``h_k``) and lengths of each forward."""
    seen = {}
    run_blocks = model.encoder.run_blocks

    def spy(x, lengths, start, stop, *args, **kwargs):
        out = run_blocks(x, lengths, start, stop, *args, **kwargs)
        if (start, stop) == (0, model.text_layer):
            seen["h_k"], seen["lengths"] = out[0].detach(), lengths
        return out

    monkeypatch.setattr(model.encoder, "run_blocks", spy)
    return seen


def test_consistency_loss_is_zero_when_the_text_encoder_gives_the_speech_encoders_frames(monkeypatch):
    """Replace the text encoder's frames by the speech encoder's block-k input (garbage in padded frames):
    the consistency loss is exactly 0; any change at a valid frame makes it positive."""
    model = _model().eval()
    seen = _record_block_k_input(model, monkeypatch)

    def agreeing_frames(states, durations, num_frames=None):
        h = seen["h_k"].clone()
        pad = torch.arange(h.shape[1]) >= seen["lengths"][:, None]
        return h + 5.0 * pad[:, :, None], seen["lengths"]

    monkeypatch.setattr(model.text_encoder, "frames", agreeing_frames)
    batch = _most_batch().paired
    assert model(batch).metrics["loss_consistency"].item() == 0.0

    def nudged(states, durations, num_frames=None):
        h, lengths = agreeing_frames(states, durations, num_frames)
        return h + 0.1 * (torch.arange(h.shape[1]) == 3)[None, :, None], lengths

    monkeypatch.setattr(model.text_encoder, "frames", nudged)
    assert model(batch).metrics["loss_consistency"].item() > 0


def test_relative_consistency_is_0_for_the_speech_frames_and_1_for_their_mean(monkeypatch):
    """``consistency_rel``: the consistency MSE over the variance of the speech encoder's valid frames."""
    model = _model().eval()
    seen = _record_block_k_input(model, monkeypatch)

    def speech_frames(states, durations, num_frames=None):
        return seen["h_k"].clone(), seen["lengths"]

    def mean_frames(states, durations, num_frames=None):
        h, lengths = seen["h_k"], seen["lengths"]
        valid = torch.arange(h.shape[1]) < lengths[:, None]  # (B, T')
        return h[valid].mean(0).expand_as(h).clone(), lengths

    batch = _most_batch().paired
    monkeypatch.setattr(model.text_encoder, "frames", speech_frames)
    metrics = model(batch).metrics
    assert metrics["align_ok_frac"].item() == 1.0  # every frame of the batch counts
    assert metrics["consistency_rel"].item() == 0.0
    monkeypatch.setattr(model.text_encoder, "frames", mean_frames)
    assert model(batch).metrics["consistency_rel"].item() == pytest.approx(1.0, rel=1e-5)


@pytest.mark.parametrize("off", LOSSES)
def test_a_loss_switched_off_is_not_computed_and_leaves_the_others_unchanged(off):
    """Weight 0: the term is absent, the total is the others' weighted sum, and every other term is bit-identical
    (eval mode: no dropout, BEST-RQ draws its masks from its own generator; the text masks come last)."""
    batch = _most_batch()
    weights = {"bestrq_weight": 0.5, "text_weight": 2.0}
    full = _model(**weights).eval()
    partial = _model(**(weights | {f"{off}_weight": 0.0})).eval()
    partial.load_state_dict(full.state_dict())
    torch.manual_seed(3)
    a = full(batch).metrics
    torch.manual_seed(3)
    out = partial(batch)
    b = out.metrics
    assert f"loss_{off}" in a and f"loss_{off}" not in b and b[f"weight_{off}"].item() == 0.0
    others = [name for name in LOSSES if name != off]
    for name in others:
        assert torch.equal(a[f"loss_{name}"], b[f"loss_{name}"]), name
    expected = sum(partial.cfg.weight(n) * b[f"loss_{n}"] for n in others)
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_without_alignment_losses_nothing_is_aligned_and_the_text_encoder_gets_no_gradient(monkeypatch):
    model = _model(duration_weight=0.0, consistency_weight=0.0, text_weight=0.0)
    monkeypatch.setattr("usmkit.ssl.most.forced_durations", lambda *a: pytest.fail("aligned without a need"))
    model(_most_batch()).loss.backward()
    assert all(p.grad is None for p in model.text_encoder.parameters())
    assert model.encoder.blocks[0].ff1.up.weight.grad is not None


def test_warm_ups_hold_the_text_and_alignment_losses_back_until_their_step():
    model = _model(text_warmup_steps=5, align_warmup_steps=3).eval()
    names = {s: {k for k in model(_most_batch(step=s)).metrics if k.startswith("loss_")} for s in (2, 3, 5)}
    assert names[2] == {"loss_bestrq", "loss_ctc"}
    assert names[3] == {"loss_bestrq", "loss_ctc", "loss_duration", "loss_consistency"}
    assert names[5] == {f"loss_{n}" for n in LOSSES}
    assert model(_most_batch(step=5)).metrics["weight_text"].item() == 1.0
    assert model(_most_batch(step=2)).metrics["weight_text"].item() == 0.0
    # A plain paired batch (dev evaluation): the paired losses, every warm-up over.
    assert {k for k in model(_most_batch().paired).metrics if k.startswith("loss_")} == {
        "loss_ctc",
        "loss_duration",
        "loss_consistency",
    }


def test_a_tiny_batch_of_each_stream_overfits():
    """Every term falls a lot in a few dozen steps on one fixed batch of each stream (measured in eval mode,
    before and after, with the same masks)."""
    model = _model(seed=1)
    batch = _most_batch()
    # Unlabeled utterances that each repeat one frame: their codes can be read off the unmasked context.
    g = torch.Generator().manual_seed(0)
    batch.unlabeled.features = torch.randn(2, 1, FEAT, generator=g).expand(2, 96, FEAT).contiguous()
    batch.unlabeled.feature_lens = torch.tensor([96, 96])

    def losses() -> dict[str, float]:
        model.eval()
        torch.manual_seed(0)
        with torch.no_grad():
            metrics = model(batch).metrics
        model.train()
        return {n: metrics[f"loss_{n}"].item() for n in LOSSES}

    before = losses()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(50):
        out = model(batch)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    after = losses()
    for name in LOSSES:
        assert after[name] < 0.5 * before[name], (name, before, after)


def test_aligner_checkpoint_supplies_the_alignments(monkeypatch):
    """With align_from, the frozen aligner's posteriors are aligned, not the model's own."""
    model = _model(align_from="exp/aligner", ctc_weight=0.0).eval()
    aligner = _model(seed=5).eval()
    model._aligner.append(aligner)
    calls = []
    monkeypatch.setattr("usmkit.ssl.most.forced_durations", lambda lp, *a: calls.append(lp) or forced_durations(lp, *a))
    batch = _most_batch().paired
    model(batch)
    enc, _ = aligner.encode(batch.features, batch.feature_lens)
    assert len(calls) == 1 and torch.equal(calls[0], aligner.ctc(enc))


# ---- checkpoints and decoding


def test_init_heads_from_stage1_loads_the_bestrq_heads_and_quantizer():
    donor = _model(seed=7)
    stage1 = {f"encoder.{k}": v for k, v in donor.encoder.state_dict().items()}
    stage1 |= {k: v.clone() for k, v in donor.bestrq.state_dict().items()}  # quantizer.*, heads.*
    stage1["heads.weight"] = stage1["heads.weight"] + 1.0
    model = _model(seed=8)
    loaded = model.init_heads_from(stage1)
    assert set(loaded) == {f"bestrq.{k}" for k in donor.bestrq.state_dict()}
    assert torch.equal(model.bestrq.heads.weight, stage1["heads.weight"])
    assert not torch.equal(model.encoder.blocks[0].ff1.up.weight, donor.encoder.blocks[0].ff1.up.weight)


def test_decode_matches_greedy_ctc_over_the_whole_encoder():
    model = _model().eval()
    batch = _most_batch().paired
    enc, lens = model.encoder(batch.features, batch.feature_lens)
    best = model.ctc(enc).argmax(-1)
    expected = [torch.unique_consecutive(best[b, : lens[b]]).tolist() for b in range(2)]
    assert decode(model, batch.features, batch.feature_lens) == [[t for t in e if t != 0] for e in expected]
    with pytest.raises(ValueError, match="needs a LAS decoder, but this MostModel has none"):
        decode(model, batch.features, batch.feature_lens, mode="las_beam")


# ---- config


def test_config_is_typed_and_checked():
    task = from_dict(TaskConfig, {"kind": "most", "most": {"text_layer": 2, "text_weight": 0}})
    assert task.most.text_layer == 2 and task.most.active_streams() == ("unlabeled", "paired")
    assert MostConfig(bestrq_weight=0, ctc_weight=0).active_streams() == ("paired", "text")
    assert MostConfig().resolve_text_layer(18) == 6
    with pytest.raises(ConfigError, match="unknown key"):
        from_dict(TaskConfig, {"most": {"text_layers": 2}})
    with pytest.raises(ValueError, match="every loss weight is 0"):
        MostConfig(**{f"{n}_weight": 0.0 for n in LOSSES})
    with pytest.raises(ValueError, match="text_ratio"):
        MostConfig(text_ratio=0)
    with pytest.raises(ValueError, match="below the encoder's 3 blocks"):
        _model(text_layer=3)


def test_text_detach_encoder_keeps_the_text_loss_out_of_the_text_encoder():
    """With only the text-only loss on: detached, the text encoder gets no gradient while the shared blocks
    above the text layer and the CTC head do; not detached, the text encoder learns from it too."""
    only_text = {"bestrq_weight": 0.0, "ctc_weight": 0.0, "duration_weight": 0.0, "consistency_weight": 0.0}
    for detach in (True, False):
        model = _model(text_detach_encoder=detach, **only_text)
        model(_most_batch()).loss.backward()
        text_grads = [p.grad for p in model.text_encoder.parameters() if p.requires_grad]
        assert all(g is None for g in text_grads) == detach
        assert model.encoder.blocks[2].ff1.up.weight.grad is not None
        assert model.ctc.proj.weight.grad is not None


def test_text_noise_follows_the_spread_of_speech_around_text(monkeypatch):
    """``text_noise``: where the text path reproduces speech on the paired frames there is no spread and
    no noise (the text-only loss is as without it); with a spread the text-only loss changes; 0 = off."""
    only = {"bestrq_weight": 0.0, "ctc_weight": 0.0, "duration_weight": 0.0, "text_mask_prob": 0.0}

    def text_loss(noise: float, spread: float) -> float:
        model = _model(text_noise=noise, **only).eval()
        seen = _record_block_k_input(model, monkeypatch)
        frames = model.text_encoder.frames

        def paired_like_speech(states, durations, num_frames=None, round_up=None):
            if num_frames is None:  # the text-only batch: its own frames
                return frames(states, durations, round_up=round_up)
            h = seen["h_k"].clone()
            return h + spread * torch.randn(h.shape, generator=torch.Generator().manual_seed(1)), seen["lengths"]

        monkeypatch.setattr(model.text_encoder, "frames", paired_like_speech)
        torch.manual_seed(0)
        return model(_most_batch()).metrics["loss_text"].item()

    plain = text_loss(0.0, 0.0)
    assert text_loss(1.0, 0.0) == plain
    assert text_loss(0.0, 0.5) == plain
    assert text_loss(1.0, 0.5) != plain
    with pytest.raises(ValueError, match="text_noise"):
        MostConfig(text_noise=1.0, consistency_weight=0.0)
    with pytest.raises(ValueError, match="text_noise"):
        MostConfig(text_noise=-1.0)


def test_padded_text_leaves_every_loss_unchanged_and_takes_the_speech_lengths(monkeypatch):
    """pad_text_to (feature frames, as data.pad_to_frames): the text encoder reads tokens padded to a multiple of
    it / 4, the text-only frames take the encoder length of audio padded alike, and every loss equals the unpadded
    model's (padding is masked; no text masks, so both draw the same random numbers)."""
    batch = _most_batch()
    plain = _model(text_mask_prob=0.0).eval()
    padded = _model(text_mask_prob=0.0, pad_text_to=32).eval()
    padded.load_state_dict(plain.state_dict())
    seen = {"tokens": [], "frames": [], "natural": []}
    encode_tokens, frames = padded.text_encoder.encode_tokens, padded.text_encoder.frames

    def spy_tokens(tokens, token_lens):
        seen["tokens"].append(tokens.shape[1])
        return encode_tokens(tokens, token_lens)

    def spy_frames(states, durations, num_frames=None, round_up=None):
        out, lengths = frames(states, durations, num_frames, round_up)
        seen["frames"].append(out.shape[1])
        seen["natural"].append(int(lengths.max()))
        return out, lengths

    monkeypatch.setattr(padded.text_encoder, "encode_tokens", spy_tokens)
    monkeypatch.setattr(padded.text_encoder, "frames", spy_frames)
    torch.manual_seed(3)
    a = plain(batch).metrics
    torch.manual_seed(3)
    b = padded(batch).metrics
    assert seen["tokens"] == [8, 8]  # paired (5 tokens) and text-only (6 tokens), to a multiple of 32 / 4
    paired_frames, text_frames = seen["frames"]
    assert paired_frames == 19  # the paired text follows its speech's frames (80 feature frames)
    speech = [conv_out_size(n * 32) for n in range(1, 40)]  # 7, 15, 23, 31, ...: audio padded to 32 frames
    assert text_frames == min(t for t in speech if t >= seen["natural"][1])
    for name in LOSSES:
        torch.testing.assert_close(b[f"loss_{name}"], a[f"loss_{name}"], rtol=1e-5, atol=1e-6, msg=name)


def test_padded_text_frames_are_the_encoder_lengths_of_padded_audio():
    model = _model(pad_text_to=256)
    assert [model._text_frames(n) for n in (1, 63, 64, 127, 128)] == [63, 63, 127, 127, 191]


def test_compiled_blocks_meet_fewer_text_lengths_with_pad_text_to(aot_eager):
    """Compiled blocks (trainer.compile_scope=blocks) over text-only batches of several lengths: padded, the
    text path takes a few lengths, so fewer graphs compile than unpadded (the speech batches stay one length)."""
    from torch._dynamo.utils import counters

    from usmkit.training.compile_blocks import compile_blocks
    from usmkit.training.task_spec import compile_units

    paired = _audio(2, 80, seed=2, lengths=[80, 61], rows=[[4, 5, 6, 6, 7], [8, 9, 10]])
    graphs = {}
    for pad in (0, 32):
        torch._dynamo.reset()
        counters.clear()
        model = _model(pad_text_to=pad, text_mask_prob=0.0, max_token_frames=2).train()
        compile_blocks(compile_units(model))
        with torch._dynamo.config.patch(recompile_limit=64):  # as usmkit.cli.train raises it: count them all
            for n in (3, 4, 6, 9, 10, 11):  # text-only sentences of n tokens, n to 2n frames
                text = TextBatch(*_tokens([[4 + i % 7 for i in range(n)], [5, 6, 7]]))
                model(MostBatch(_audio(2, 96, seed=1, lengths=[96, 70]), paired, text, 10)).loss.backward()
        graphs[pad] = counters["stats"]["unique_graphs"]
    assert graphs[32] < graphs[0], graphs
