"""Features, normalization and augmentation: fbank shape, stored == on-the-fly, caching, stats, masks."""

from __future__ import annotations

import math
import shutil
import threading
import time
from dataclasses import replace

import torch
from filelock import FileLock
from lhotse import CutSet
from lhotse.utils import fastcopy

from usmkit.data.augment import SpecAugment
from usmkit.data.config import DataConfig, FeatureConfig, SpecAugmentConfig
from usmkit.data.dataset import AsrDataset
from usmkit.data.features import fbank_extractor, feature_storage_dir, precompute_features
from usmkit.data.normalize import FeatureStats, compute_global_stats, load_or_compute_stats, stats_path
from usmkit.data.validate import validate_cuts

ON_THE_FLY = FeatureConfig(precomputed=False)
STORED = FeatureConfig(precomputed=True)


def test_fbank_is_80_bins_at_10ms(audio_corpus):
    cut = audio_corpus[0]
    feats = fbank_extractor(ON_THE_FLY).extract(cut.load_audio(), 16000)
    assert feats.shape[1] == 80
    assert abs(feats.shape[0] - cut.duration * 100) <= 1


def test_stored_features_equal_on_the_fly(audio_corpus, tmp_path):
    stored = precompute_features(audio_corpus, STORED, feature_storage_dir(tmp_path, "train"))
    assert [c.id for c in stored] == [c.id for c in audio_corpus]
    a = AsrDataset(ON_THE_FLY)[audio_corpus.subset(first=4)]
    b = AsrDataset(STORED)[stored.subset(first=4)]
    assert a.features.shape == b.features.shape
    assert a.feature_lens.tolist() == b.feature_lens.tolist() == [c.num_frames for c in stored.subset(first=4)]
    for i, L in enumerate(a.feature_lens.tolist()):
        # lhotse's batched on-the-fly extraction zero-pads shorter waveforms, so the last frame of all but
        # the longest cut sees zeros where the stored path sees the reflected edge: compare the rest.
        torch.testing.assert_close(a.features[i, : L - 1], b.features[i, : L - 1], atol=1e-4, rtol=1e-5)


def test_feature_cache_is_reused_extended_and_rebuilt(audio_corpus, tmp_path):
    out = feature_storage_dir(tmp_path, "train")
    first = precompute_features(audio_corpus.subset(first=6), STORED, out)
    manifest = out / "cuts.jsonl.gz"
    stamp = manifest.stat().st_mtime_ns
    again = precompute_features(audio_corpus.subset(first=6), STORED, out)
    assert manifest.stat().st_mtime_ns == stamp, "a complete cache must not be rewritten"
    assert [c.features.storage_key for c in again] == [c.features.storage_key for c in first]
    grown = precompute_features(audio_corpus, STORED, out)  # 6 more cuts: computed and appended
    assert len(grown) == len(audio_corpus) and all(c.has_features for c in grown)
    assert len(CutSet.from_file(manifest)) == len(audio_corpus)
    rebuilt = precompute_features(audio_corpus, FeatureConfig(num_mel_bins=40, precomputed=True), out)
    assert rebuilt[0].load_features().shape[1] == 40


def test_stored_features_go_with_the_manifests_transcripts_and_follow_a_changed_span(audio_corpus, tmp_path):
    """A transcript corrected in the manifest (same cut id) trains with the correction, not the text the
    cache was built with; a cut whose span changed gets its features computed again."""
    out = feature_storage_dir(tmp_path, "train")
    cuts = audio_corpus.subset(first=3)
    precompute_features(cuts, STORED, out)
    first = cuts[0]
    corrected = fastcopy(first, supervisions=[fastcopy(first.supervisions[0], text="corrected words")])
    shorter = fastcopy(cuts[1], duration=round(cuts[1].duration / 2, 3))
    again = precompute_features(CutSet.from_cuts([corrected, shorter, cuts[2]]), STORED, out)
    assert again[0].supervisions[0].text == "corrected words"
    assert again[1].duration == shorter.duration
    assert abs(again[1].load_features().shape[0] - shorter.duration * 100) <= 1
    assert again[2].load_features().shape == precompute_features(cuts, STORED, out)[2].load_features().shape


def test_a_run_waits_for_another_computing_the_same_cache(audio_corpus, tmp_path):
    """Run A is computing ``out`` (its lock held, a feature file written, no config yet). Run B waits for it
    instead of taking the folder for a foreign one, then uses A's features without computing any."""
    ref = precompute_features(audio_corpus, STORED, tmp_path / "ref")
    out = feature_storage_dir(tmp_path, "train")
    out.mkdir()
    shutil.copy(next((tmp_path / "ref").rglob("*.npy")), out)  # A's first feature file
    a_lock = FileLock(out.with_name(out.name + ".lock"))
    a_lock.acquire()
    got, errors = [], []

    def run_b():
        try:
            got.append(precompute_features(audio_corpus, STORED, out))
        except Exception as e:  # noqa: BLE001 (reported by the assertion below)
            errors.append(e)

    b = threading.Thread(target=run_b)
    b.start()
    time.sleep(0.5)
    assert b.is_alive() and not errors, errors  # waiting for A
    shutil.copytree(tmp_path / "ref", out, dirs_exist_ok=True)  # A finishes its cache
    stamp = (out / "cuts.jsonl.gz").stat().st_mtime_ns
    a_lock.release()
    b.join(timeout=60)
    assert not errors, errors
    assert (out / "cuts.jsonl.gz").stat().st_mtime_ns == stamp, "B computed features A had stored"
    for mine, theirs in zip(got[0], ref, strict=True):
        torch.testing.assert_close(torch.from_numpy(mine.load_features()), torch.from_numpy(theirs.load_features()))


def test_a_complete_cache_is_read_without_a_lock(audio_corpus, tmp_path):
    out = feature_storage_dir(tmp_path, "train")
    precompute_features(audio_corpus, STORED, out)
    lock = out.with_name(out.name + ".lock")
    lock.unlink(missing_ok=True)
    precompute_features(audio_corpus, STORED, out)
    assert not lock.exists()  # so a read-only corpus with its features stored is used as it is


def test_8khz_input_is_resampled_to_16khz(tmp_path, build_corpus):
    cuts8k = build_corpus(tmp_path, {"en": 2}, sr=8000)
    assert cuts8k[0].sampling_rate == 8000
    cuts, report = validate_cuts(cuts8k, require_text=True)
    assert report.num_skipped == 0 and all(c.sampling_rate == 16000 for c in cuts)
    batch = AsrDataset(ON_THE_FLY)[cuts]
    assert batch.feature_lens.tolist() == [round(c.duration * 100) for c in cuts]
    stored = precompute_features(cuts, STORED, feature_storage_dir(tmp_path, "dev"))
    assert stored[0].load_features().shape == (stored[0].num_frames, 80)


def test_narrowband_features_keep_their_own_cache_and_stats(audio_corpus, tmp_path):
    from usmkit.data.loader import prepare_cuts

    wide = DataConfig(manifest_dir=str(tmp_path), features=STORED)
    narrow = replace(wide, features=replace(STORED, sample_rate=8000))
    cuts = audio_corpus.subset(first=3)
    first, _ = prepare_cuts(cuts, wide, split="train", require_text=True)
    manifest = feature_storage_dir(tmp_path, "train") / "cuts.jsonl.gz"
    stamp = manifest.stat().st_mtime_ns
    eight, _ = prepare_cuts(cuts, narrow, split="train", require_text=True)
    assert feature_storage_dir(tmp_path, "train", 8000) == tmp_path / "feats_train_8000hz"
    assert (feature_storage_dir(tmp_path, "train", 8000) / "cuts.jsonl.gz").is_file()
    assert eight[0].sampling_rate == 8000 and abs(eight[0].num_frames - first[0].num_frames) <= 1
    prepare_cuts(cuts, wide, split="train", require_text=True)
    assert manifest.stat().st_mtime_ns == stamp, "the 16 kHz cache survives an 8 kHz run"
    load_or_compute_stats(first, wide)
    load_or_compute_stats(eight, narrow)
    assert (
        stats_path(tmp_path).is_file() and stats_path(tmp_path, 8000) == tmp_path / "feature_stats_8000hz.safetensors"
    )
    wide_mean, narrow_mean = (
        FeatureStats.load(stats_path(tmp_path)).mean,
        FeatureStats.load(stats_path(tmp_path, 8000)).mean,
    )
    assert not torch.allclose(wide_mean, narrow_mean)  # 80 bins over 0-8 kHz vs over 0-4 kHz


def test_global_stats_match_direct_computation_and_round_trip(audio_corpus, tmp_path):
    stats = compute_global_stats(audio_corpus, ON_THE_FLY, max_cuts=5)
    ex = fbank_extractor(ON_THE_FLY)
    frames = torch.cat(
        [torch.from_numpy(ex.extract(c.load_audio(), 16000)) for c in audio_corpus.subset(first=5)]
    ).double()
    torch.testing.assert_close(stats.mean, frames.mean(0).float(), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(stats.std, frames.std(0, unbiased=False).float(), atol=1e-4, rtol=1e-4)

    cfg = DataConfig(manifest_dir=str(tmp_path), features=ON_THE_FLY)
    loaded = load_or_compute_stats(audio_corpus, cfg, max_cuts=5)  # computes and saves
    assert stats_path(tmp_path).is_file()
    torch.testing.assert_close(FeatureStats.load(stats_path(tmp_path)).mean, loaded.mean)
    torch.testing.assert_close(load_or_compute_stats(audio_corpus.subset(first=1), cfg).std, loaded.std)  # reused
    other = load_or_compute_stats(
        audio_corpus, replace(cfg, features=FeatureConfig(num_mel_bins=40, precomputed=False))
    )
    assert other.num_bins == 40, "stats made for another feature config must be recomputed"


def test_normalization_centers_valid_frames_and_zeroes_padding():
    stats = FeatureStats(mean=torch.full((3,), 2.0), std=torch.full((3,), 4.0))
    x = torch.full((2, 4, 3), 10.0)
    out = stats.normalize(x, torch.tensor([4, 2]))
    assert torch.all(out[0] == 2.0) and torch.all(out[1, :2] == 2.0) and torch.all(out[1, 2:] == 0.0)


def test_spec_augment_masks_inside_bounds():
    torch.manual_seed(0)
    x = torch.ones(3, 200, 80)
    lens = torch.tensor([200, 120, 60])
    time_only = SpecAugment(SpecAugmentConfig(freq_masks=0, time_masks=1, time_width_ratio=0.05))(x, lens)
    for i, L in enumerate(lens.tolist()):
        masked_frames = int((time_only[i, :L] == 0).all(dim=1).sum())
        assert masked_frames <= int(0.05 * L)
        assert torch.all(time_only[i, L:] == 1.0), "padding is not the augmenter's business"
    many = SpecAugment(SpecAugmentConfig(freq_masks=0, time_masks=10, time_width_ratio=0.05))(x, lens)
    masked = (many == 0).all(dim=2)  # (B, T)
    assert 0 < int(masked[0].sum()) <= 10 * int(0.05 * 200)
    assert not masked[1, 120:].any() and not masked[2, 60:].any()
    freq_only = SpecAugment(SpecAugmentConfig(freq_masks=2, freq_width=27, time_masks=0))(x, lens)
    masked_bins = (freq_only[0] == 0).all(dim=0).sum()
    assert 0 < masked_bins <= 2 * 27
    heavy = SpecAugment(SpecAugmentConfig(freq_masks=2, freq_width=27, time_masks=10))(x, lens)
    assert (heavy == 0).any() and heavy.shape == x.shape
    off = SpecAugment(SpecAugmentConfig(enabled=False))(x, lens)
    assert torch.equal(off, x)


def test_speed_perturbation_changes_length(audio_corpus):
    cuts = audio_corpus.subset(first=3)
    plain = AsrDataset(ON_THE_FLY)[cuts].feature_lens.float()
    slow = AsrDataset(ON_THE_FLY, speed_perturb=(0.9,))[cuts].feature_lens.float()
    fast = AsrDataset(ON_THE_FLY, speed_perturb=(1.1,))[cuts].feature_lens.float()
    torch.testing.assert_close(slow, plain / 0.9, atol=2.0, rtol=0)
    torch.testing.assert_close(fast, plain / 1.1, atol=2.0, rtol=0)
    assert AsrDataset(ON_THE_FLY, speed_perturb=(1.1,))[cuts].cut_ids == [c.id for c in cuts]


def test_random_gain_is_a_per_utterance_log_offset():
    import math

    import torch

    from usmkit.data.augment import random_gain

    torch.manual_seed(0)
    feats = torch.randn(4, 10, 80)
    out = random_gain(feats, max_db=20.0)
    shift = out - feats  # (B, T, F): one constant per utterance
    assert torch.allclose(shift, shift[:, :1, :1].expand_as(shift))
    assert shift.abs().max() <= 20 * math.log(10) / 10 + 1e-6
    assert shift[:, 0, 0].unique().numel() == 4
    assert torch.equal(random_gain(feats, 0.0), feats)


def _log_mel_speech(batch: int, frames: int, band_bins: int = 80) -> torch.Tensor:
    """Speech-like log-mel power (B, T, 80): loud in ``band_bins`` low bins, at the energy floor above."""
    torch.manual_seed(0)
    feats = torch.randn(batch, frames, 80) * 2.0 - 2.0
    feats[:, :, band_bins:] = -23.0  # log(1e-10): an 8-kHz recording resampled to 16 kHz
    return feats


def test_add_noise_reaches_the_drawn_snr_inside_the_band_only():
    from usmkit.data.augment import add_noise

    feats = _log_mel_speech(3, 400, band_bins=40)
    lens = torch.tensor([400, 300, 250])
    feats[1, 300:] = 0.0
    feats[2, 250:] = 0.0
    out = add_noise(feats, lens, (10.0, 10.0), prob=1.0, sample_rate=16000)
    assert torch.all(out >= feats)  # noise only adds power
    assert torch.equal(out[:, :, 40:], feats[:, :, 40:])  # nothing outside the recording's band
    assert torch.equal(out[1, 300:], feats[1, 300:]) and torch.equal(out[2, 250:], feats[2, 250:])  # padding
    for row, length in enumerate(lens.tolist()):
        signal = feats[row, :length].exp().sum(-1).mean()
        noise = (out[row, :length].exp() - feats[row, :length].exp()).sum(-1).mean()
        snr = 10 * torch.log10(signal / noise)
        assert abs(float(snr) - 10.0) < 0.5, (row, float(snr))


def test_add_noise_prob_and_config_checks():
    import pytest

    from usmkit.data.augment import add_noise

    feats = _log_mel_speech(64, 20)
    lens = torch.full((64,), 20)
    assert torch.equal(add_noise(feats, lens, (5.0, 30.0), prob=0.0, sample_rate=16000), feats)
    changed = (add_noise(feats, lens, (5.0, 30.0), prob=0.5, sample_rate=16000) != feats).flatten(1).any(1)
    assert 10 < int(changed.sum()) < 54  # about half the utterances
    with pytest.raises(ValueError, match="noise_snr_db"):
        DataConfig(noise_snr_db=(30.0, 5.0))
    with pytest.raises(ValueError, match="noise_prob"):
        DataConfig(noise_snr_db=(5.0, 30.0), noise_prob=1.5)


def test_dataset_adds_noise_in_training_only(audio_corpus):
    cuts = CutSet.from_cuts(list(audio_corpus)[:2])
    clean = AsrDataset(ON_THE_FLY)[cuts].features
    noisy = AsrDataset(ON_THE_FLY, noise_snr_db=(0.0, 0.0), noise_prob=1.0)[cuts].features
    assert noisy.shape == clean.shape and not torch.allclose(noisy, clean)
    assert torch.equal(AsrDataset(ON_THE_FLY, noise_snr_db=(), noise_prob=1.0)[cuts].features, clean)


def test_speaker_mean_norm_centers_every_speaker_and_removes_its_gain(audio_corpus):
    import pytest

    from usmkit.data.normalize import SpeakerNorm, speaker_norms

    stats = compute_global_stats(audio_corpus, ON_THE_FLY)
    norms = speaker_norms(audio_corpus, ON_THE_FLY, stats)
    assert sorted(norms) == ["de-spk0", "de-spk1", "en-spk0", "en-spk1"]
    assert all(torch.equal(n.scale, torch.ones(80)) for n in norms.values())  # mean only
    batch = AsrDataset(ON_THE_FLY, stats=stats, speaker_norms=norms)[audio_corpus]
    for frames in _frames_by_speaker(batch, audio_corpus).values():
        torch.testing.assert_close(frames.mean(0), torch.zeros(80), atol=0.02, rtol=0)  # fbank dither
    valid = torch.arange(batch.features.shape[1]) < batch.feature_lens[:, None]  # (B, T)
    assert torch.all(batch.features[~valid] == 0)
    # A speaker recorded 20 dB louder: the same normalized features once its own mean is subtracted.
    louder = {s: SpeakerNorm(n.shift + 2 * math.log(10) / stats.std, n.scale) for s, n in norms.items()}
    shifted = AsrDataset(ON_THE_FLY, stats=stats, speaker_norms=louder)[audio_corpus].features
    assert not torch.allclose(shifted, batch.features)
    unknown = {s: v for s, v in norms.items() if s != "en-spk0"}
    with pytest.raises(ValueError, match="en-spk0"):
        AsrDataset(ON_THE_FLY, stats=stats, speaker_norms=unknown)[audio_corpus]
    with pytest.raises(ValueError, match="pick one"):
        DataConfig(speaker_mean_norm=True, utterance_mean_norm=True)


def _frames_by_speaker(batch, cuts) -> dict[str, torch.Tensor]:
    """Each speaker's valid frames of ``batch`` (frames, F)."""
    speaker_of = {c.id: c.supervisions[0].speaker for c in cuts}
    order = [speaker_of[i] for i in batch.cut_ids]
    valid = torch.arange(batch.features.shape[1]) < batch.feature_lens[:, None]  # (B, T)
    return {
        s: batch.features[rows][valid[rows]]
        for s in set(order)
        for rows in [[i for i, o in enumerate(order) if o == s]]
    }


def test_speaker_var_norm_gives_every_speaker_unit_variance(audio_corpus):
    import pytest

    from usmkit.data.normalize import speaker_norms

    stats = compute_global_stats(audio_corpus, ON_THE_FLY)
    norms = speaker_norms(audio_corpus, ON_THE_FLY, stats, variance=True)
    assert not all(torch.allclose(n.scale, torch.ones(80)) for n in norms.values())
    batch = AsrDataset(ON_THE_FLY, stats=stats, speaker_norms=norms)[audio_corpus]
    for frames in _frames_by_speaker(batch, audio_corpus).values():
        torch.testing.assert_close(frames.mean(0), torch.zeros(80), atol=0.02, rtol=0)  # fbank dither
        torch.testing.assert_close(frames.std(0, correction=0), torch.ones(80), atol=0.02, rtol=0)
    with pytest.raises(ValueError, match="speaker_mean_norm"):
        DataConfig(speaker_var_norm=True)


def test_utterance_mean_norm_removes_a_gain_change_exactly():
    from usmkit.data.dataset import subtract_utterance_mean

    torch.manual_seed(0)
    feats = torch.randn(2, 30, 80)
    lens = torch.tensor([30, 17])
    feats[1, 17:] = 0.0  # padding
    louder = feats + 2.3 * (torch.arange(30) < lens[:, None])[:, :, None]  # +20 dB is +2.3 in every log-mel bin
    a, b = subtract_utterance_mean(feats, lens), subtract_utterance_mean(louder, lens)
    assert torch.allclose(a, b, atol=1e-5)
    assert torch.allclose(a[0].mean(0), torch.zeros(80), atol=1e-5)  # zero mean per bin on valid frames
    assert torch.allclose(a[1, :17].mean(0), torch.zeros(80), atol=1e-5)
    assert (a[1, 17:] == 0).all()  # padding stays 0


# ---------------------------------------------------------------- SeamlessM4T's features (w2v-BERT 2.0)


def _an4_files(n: int) -> list:
    import os
    from pathlib import Path

    import pytest

    root = Path(os.environ.get("USMKIT_CORPORA", "")) / "an4" / "wav" / "an4test_clstk"
    files = sorted(root.glob("*/*.sph"))[:n]
    if not files:
        pytest.skip(f"no AN4 copy under {root} ($USMKIT_CORPORA)")
    return files


def _stacked(feats: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    B, T, F = feats.shape
    return feats[:, : T // 2 * 2].reshape(B, T // 2, 2 * F)  # what w2v-BERT's encoder stacks (ConformerConfig)


def test_seamless_features_equal_transformers_on_real_audio(tmp_path):
    """Real speech (AN4), a padded batch: usmkit's SeamlessM4T fbank + per-utterance normalization, stacked 2
    to 1, within 1e-3 of ``SeamlessM4TFeatureExtractor`` on every valid frame; stored features are the same."""
    import pytest
    import soundfile as sf
    from lhotse import Recording
    from lhotse.cut import MonoCut

    from usmkit.data.config import seamless_m4t_features
    from usmkit.data.features import seamless_frames
    from usmkit.data.normalize import normalize_utterances

    transformers = pytest.importorskip("transformers")
    waves, cuts = [], []
    for i, path in enumerate(_an4_files(3)):
        x, rate = sf.read(path, dtype="float32")
        waves.append(x)
        flac = tmp_path / f"{i}.flac"
        sf.write(flac, x, rate)
        rec = Recording.from_file(flac, recording_id=f"an4-{i}")
        cuts.append(MonoCut(id=rec.id, start=0, duration=rec.duration, channel=0, recording=rec))
    ref = transformers.SeamlessM4TFeatureExtractor()(waves, sampling_rate=16000, return_tensors="pt")
    ref_feats, ref_mask = ref["input_features"], ref["attention_mask"]  # (B, T', 160), (B, T')

    cfg = seamless_m4t_features(precomputed=False)
    extractor = fbank_extractor(cfg)
    rows = [torch.from_numpy(extractor.extract(x, 16000)) for x in waves]  # padded to lhotse's frame count
    lens = torch.tensor([seamless_frames(len(x), cfg) for x in waves])
    assert all(r.shape[0] - n in (1, 2) for r, n in zip(rows, lens.tolist(), strict=True))
    feats = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)  # (B, T, 80)
    ours = _stacked(normalize_utterances(feats, lens), lens)
    assert ref_mask.sum(1).tolist() == (lens // 2).tolist()
    for b in range(len(waves)):
        n = int(lens[b] // 2)
        assert (ours[b, :n] - ref_feats[b, :n]).abs().max() <= 1e-3

    on_the_fly = AsrDataset(cfg)[CutSet.from_cuts(cuts)]
    stored_cuts = precompute_features(CutSet.from_cuts(cuts), replace(cfg, precomputed=True), tmp_path / "feats")
    stored = AsrDataset(replace(cfg, precomputed=True))[stored_cuts]
    for batch in (on_the_fly, stored):
        assert batch.feature_lens.tolist() == lens.tolist()
        got = _stacked(batch.features, batch.feature_lens)
        for b in range(len(waves)):
            n = int(lens[b] // 2)
            assert (got[b, :n] - ref_feats[b, :n]).abs().max() <= 1e-3


def test_feature_cache_of_the_default_fbank_keeps_its_record():
    """Caches written before ``fbank``/``normalize`` existed stay valid: the record of the default config is as before."""
    from usmkit.data.features import _config_record

    assert _config_record(STORED) == {
        "num_mel_bins": 80, "frame_shift_ms": 10.0, "frame_length_ms": 25.0, "sample_rate": 16000, "precomputed": True,
    }  # fmt: skip
    assert _config_record(replace(STORED, fbank="seamless_m4t"))["fbank"] == "seamless_m4t"
