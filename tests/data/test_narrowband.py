"""Waveform augmentation (usmkit.data.waveform_augment): narrowband, low-pass, reverberation and recorded noise
change the audio as claimed, are deterministic per seed, are off at probability 0, keep lengths, ids and
transcripts, and a loader using them resumes exactly."""

from __future__ import annotations

from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

from usmkit.data.config import DataConfig, FeatureConfig
from usmkit.data.loader import make_loader
from usmkit.data.manifests import write_manifest
from usmkit.data.normalize import compute_global_stats
from usmkit.data.validate import BadInputError
from usmkit.data.waveform_augment import LOWPASS_GRID_HZ, load_noise_cuts, one_intra_op_thread, waveform_augmentation

SR = 16000


def band_db(samples: np.ndarray, low: float, high: float = SR / 2) -> float:
    """Energy (dB) of ``samples`` between ``low`` and ``high`` Hz."""
    power = np.abs(np.fft.rfft(samples.astype(np.float64))) ** 2
    freqs = np.fft.rfftfreq(samples.size, 1 / SR)
    return float(10 * np.log10(power[(freqs > low) & (freqs <= high)].sum() + 1e-30))


def broadband_cut(path: Path, seconds: float = 1.0, seed: int = 0) -> MonoCut:
    """White noise (energy at every frequency) in a 24-bit FLAC: its quantization stays far below any band."""
    x = (np.random.default_rng(seed).standard_normal(int(seconds * SR)) * 0.1).astype(np.float32)
    sf.write(path, x, SR, subtype="PCM_24")
    return Recording.from_file(path, recording_id=path.stem).to_cut()


def augmented(cut: MonoCut, seed: int = 0, **options) -> np.ndarray:
    aug = waveform_augmentation(sample_rate=SR, seed=seed, **options)
    (out,) = list(aug(CutSet.from_cuts([cut])))
    assert out.id == cut.id and out.duration == cut.duration
    with torch.random.fork_rng(devices=[]), aug.loading():
        torch.manual_seed(seed)  # the loader seeds torch per batch; the RIR generator draws from it
        return out.load_audio()[0]


@pytest.fixture
def noise_manifest(tmp_path: Path) -> Path:
    """A lhotse cuts manifest of two short noise recordings (0.3 s, shorter than the speech cuts), each with a
    transcript (as a manifest made from a labeled corpus would have) that must not reach the batches."""
    cuts = []
    for i in range(2):
        path = tmp_path / "noise" / f"noise{i}.flac"
        path.parent.mkdir(exist_ok=True)
        sf.write(path, np.random.default_rng(100 + i).standard_normal(int(0.3 * SR)).astype(np.float32) * 0.05, SR)
        cut = Recording.from_file(path).to_cut()
        cut.supervisions = [SupervisionSegment(f"n{i}", cut.recording_id, 0.0, cut.duration, text="noise words")]
        cuts.append(cut)
    return write_manifest(CutSet.from_cuts(cuts), tmp_path / "noise_cuts.jsonl.gz")


def test_narrowband_removes_everything_above_4khz_and_keeps_the_telephone_band(tmp_path):
    cut = broadband_cut(tmp_path / "a.flac")
    x, y = cut.load_audio()[0], augmented(cut, narrowband_prob=1.0)
    assert band_db(y, 4000) < band_db(x, 4000) - 30
    assert abs(band_db(y, 300, 3000) - band_db(x, 300, 3000)) < 1.0  # mu-law noise and filter ripple only
    assert y.shape == x.shape


@pytest.mark.parametrize("cutoff", [3000, 5000])
def test_lowpass_cuts_above_its_cutoff(tmp_path, cutoff):
    cut = broadband_cut(tmp_path / "a.flac")
    x, y = cut.load_audio()[0], augmented(cut, lowpass_prob=1.0, lowpass_hz=(cutoff, cutoff))
    stop = 1.2 * cutoff  # lhotse's resampling filter has a transition band (the module docstring)
    assert band_db(y, stop) < band_db(x, stop) - 30
    assert abs(band_db(y, 100, cutoff - 300) - band_db(x, 100, cutoff - 300)) < 1.0


def test_lowpass_cutoffs_are_log_uniform_on_the_grid_inside_the_range():
    aug = waveform_augmentation(sample_rate=SR, lowpass_prob=1.0, lowpass_hz=(3000.0, 7000.0), seed=3)
    cutoffs = [aug.lowpass_cutoff() for _ in range(2000)]
    assert all(3000 <= c <= 7000 and c % LOWPASS_GRID_HZ == 0 for c in cutoffs)
    assert len(set(cutoffs)) > 30  # the whole grid is reached
    below = np.mean([c < 4600 for c in cutoffs])  # log-uniform: ln(4.6/3) / ln(7/3) = 0.50 (uniform: 0.40)
    assert 0.46 < below < 0.54


def test_reverberation_fills_the_silence_after_a_burst(tmp_path):
    burst = np.zeros(SR, dtype=np.float32)
    burst[: SR // 5] = np.random.default_rng(0).standard_normal(SR // 5) * 0.1  # 0.2 s of sound, then silence
    sf.write(tmp_path / "burst.flac", burst, SR, subtype="PCM_24")
    cut = Recording.from_file(tmp_path / "burst.flac").to_cut()
    tails = []
    for seed in range(3):
        y = augmented(cut, seed=seed, reverb_prob=1.0)
        assert y.shape == burst.shape
        head, tail = np.mean(y[: SR // 5] ** 2), np.mean(y[SR // 4 : SR // 4 + SR // 10] ** 2)  # 50-150 ms after
        tails.append(10 * np.log10(tail / head))
    assert np.mean(burst[SR // 4 :] ** 2) == 0.0
    assert all(-60 < t < -3 for t in tails), tails  # a decaying tail where there was silence
    assert len({round(t, 3) for t in tails}) == 3  # each seed, its own room


def test_recorded_noise_is_mixed_at_the_snr_over_the_whole_cut(tmp_path, noise_manifest):
    cut = broadband_cut(tmp_path / "a.flac", seconds=1.0)
    noise = load_noise_cuts(noise_manifest, SR)
    x = cut.load_audio()[0]
    y = augmented(cut, noise=noise, noise_snr_db=(10.0, 10.0), noise_prob=1.0)
    added = y - x
    snr = 10 * np.log10(np.mean(x**2) / np.mean(added**2))
    assert 9.0 < snr < 11.0
    quarter = SR // 4  # noise recordings of 0.3 s are repeated to cover the cut (but its last 50 ms)
    assert all(np.mean(added[i * quarter : (i + 1) * quarter] ** 2) > 0.1 * np.mean(added**2) for i in range(3))


def test_noise_cuts_lose_their_transcripts_and_a_missing_manifest_is_named(tmp_path, noise_manifest):
    assert all(not c.supervisions for c in load_noise_cuts(noise_manifest, SR))
    with pytest.raises(BadInputError, match="nowhere.jsonl.gz"):
        load_noise_cuts(tmp_path / "nowhere.jsonl.gz", SR)


ALL_ON = dict(reverb_prob=0.5, noise_snr_db=(5.0, 20.0), noise_prob=0.5, narrowband_prob=0.3, lowpass_prob=0.3)


def test_deterministic_per_seed_and_different_across_seeds(tmp_path, noise_manifest):
    noise = load_noise_cuts(noise_manifest, SR)
    cuts = CutSet.from_cuts(broadband_cut(tmp_path / f"c{i}.flac", seed=i) for i in range(6))

    def audio(seed: int) -> list[np.ndarray]:
        aug = waveform_augmentation(sample_rate=SR, noise=noise, seed=seed, **ALL_ON)
        out = aug(cuts)
        with torch.random.fork_rng(devices=[]), aug.loading():
            torch.manual_seed(seed)
            return [c.load_audio()[0] for c in out]

    first, again, other = audio(1), audio(1), audio(2)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))
    originals = [c.load_audio()[0] for c in cuts]
    assert sum(not np.array_equal(a, o) for a, o in zip(first, originals, strict=True)) >= 3


@pytest.mark.parametrize("option", ["reverb_prob", "narrowband_prob", "lowpass_prob", "noise_prob"])
def test_each_option_is_off_at_probability_zero(tmp_path, noise_manifest, option):
    cut = broadband_cut(tmp_path / "a.flac")
    options = dict(noise=load_noise_cuts(noise_manifest, SR), noise_snr_db=(10.0, 10.0))
    options |= dict.fromkeys(("reverb_prob", "narrowband_prob", "lowpass_prob", "noise_prob"), 0.0)
    assert waveform_augmentation(sample_rate=SR, **options) is None  # all at 0: the dataset skips it
    assert not np.array_equal(augmented(cut, **options | {option: 1.0}), cut.load_audio()[0])


def test_a_zero_option_beside_others_draws_nothing(tmp_path):
    """Narrowband at 0 with low-pass on: no cut comes out narrowband (its telephone band would show)."""
    cuts = CutSet.from_cuts(broadband_cut(tmp_path / f"c{i}.flac", seed=i) for i in range(8))
    aug = waveform_augmentation(sample_rate=SR, narrowband_prob=0.0, lowpass_prob=1.0, lowpass_hz=(6000, 6000))
    for cut, original in zip(aug(cuts), cuts, strict=True):
        x, y = original.load_audio()[0], cut.load_audio()[0]
        assert band_db(y, 4000, 5000) > band_db(x, 4000, 5000) - 1  # kept: not through a telephone line
        assert band_db(y, 7200) < band_db(x, 7200) - 30  # but low-passed


def test_one_intra_op_thread_restores_the_thread_count():
    before = torch.get_num_threads()
    with one_intra_op_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


# ---------------------------------------------------------------- through the loader
@pytest.fixture
def stats(audio_corpus):
    return compute_global_stats(audio_corpus, FeatureConfig(precomputed=False))


def loader_config(noise_cuts: str | None = None, **overrides) -> DataConfig:
    base = dict(max_duration=2.5, num_buckets=2, num_workers=0, features=FeatureConfig(precomputed=False))
    return DataConfig(**base | overrides, noise_cuts=noise_cuts)


def test_augmented_batches_collate_with_the_same_cuts_lengths_and_texts(
    audio_corpus, stats, tiny_tokenizer, noise_manifest
):
    plain = loader_config()
    on = loader_config(str(noise_manifest), **ALL_ON)
    a = list(make_loader(audio_corpus, plain, tokenizer=tiny_tokenizer, stats=stats, train=True, seed=5))
    b = list(make_loader(audio_corpus, on, tokenizer=tiny_tokenizer, stats=stats, train=True, seed=5))
    assert [x.cut_ids for x in a] == [y.cut_ids for y in b] and len(a) >= 3
    for x, y in zip(a, b, strict=True):
        assert x.texts == y.texts and torch.equal(x.tokens, y.tokens)
        assert torch.equal(x.feature_lens, y.feature_lens) and x.features.shape == y.features.shape
        assert torch.isfinite(y.features).all()
    assert any(not torch.equal(x.features, y.features) for x, y in zip(a, b, strict=True))


def test_evaluation_loaders_are_never_augmented(audio_corpus, stats, tiny_tokenizer, noise_manifest):
    plain = make_loader(audio_corpus, loader_config(), tokenizer=tiny_tokenizer, stats=stats, train=False)
    on = make_loader(
        audio_corpus, loader_config(str(noise_manifest), **ALL_ON), tokenizer=tiny_tokenizer, stats=stats, train=False
    )
    for x, y in zip(plain, on, strict=True):
        assert torch.equal(x.features, y.features)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_resume_gives_the_same_waveform_augmented_batches(
    audio_corpus, stats, tiny_tokenizer, noise_manifest, num_workers
):
    cfg = loader_config(str(noise_manifest), num_workers=num_workers, speed_perturb=(0.9, 1.0, 1.1), **ALL_ON)

    def build():
        return make_loader(audio_corpus, cfg, tokenizer=tiny_tokenizer, stats=stats, train=True, seed=11)

    reference = list(build())
    assert len(reference) >= 4
    k = 2
    first = build()
    it = iter(first)
    head = list(islice(it, k))
    state = first.state_dict()
    del it
    torch.manual_seed(4321)  # the caller's RNG does not matter
    resumed = build()
    resumed.load_state_dict(state)
    got = head + list(resumed)
    assert [b.cut_ids for b in got] == [b.cut_ids for b in reference]
    for a, b in zip(got, reference, strict=True):
        assert torch.equal(a.features, b.features)


@pytest.mark.parametrize("endless", [False, True])
def test_waveform_augmentation_starts_at_its_epoch(audio_corpus, stats, tiny_tokenizer, noise_manifest, endless):
    """``waveform_augment_from_epoch=1``: epoch 0 trains on the audio as recorded, epoch 1 on the augmented."""
    plain, on = loader_config(), loader_config(str(noise_manifest), **ALL_ON)
    late = loader_config(str(noise_manifest), waveform_augment_from_epoch=1, **ALL_ON)

    def epochs(cfg):
        loader = make_loader(
            audio_corpus, cfg, tokenizer=tiny_tokenizer, stats=stats, train=True, seed=5, endless=endless
        )
        if endless:  # one pass, epoch after epoch
            first = list(islice(iter(loader), 2 * n))
            return first[:n], first[n:]
        first = list(loader)
        loader.set_epoch(1)
        return first, list(loader)

    n = len(list(make_loader(audio_corpus, plain, tokenizer=tiny_tokenizer, stats=stats, train=True, seed=5)))
    (p0, p1), (a0, a1), (l0, l1) = epochs(plain), epochs(on), epochs(late)
    assert [b.cut_ids for b in l0 + l1] == [b.cut_ids for b in a0 + a1]
    assert all(torch.equal(x.features, y.features) for x, y in zip(l0, p0, strict=True)), "epoch 0: as recorded"
    assert all(torch.equal(x.features, y.features) for x, y in zip(l1, a1, strict=True)), "epoch 1: augmented"
    assert any(not torch.equal(x.features, y.features) for x, y in zip(l1, p1, strict=True))


def test_config_refuses_what_cannot_work():
    with pytest.raises(ValueError, match="narrowband_prob=0.2 changes the waveform.*precomputed=false"):
        DataConfig(narrowband_prob=0.2, features=FeatureConfig(precomputed=True))
    with pytest.raises(ValueError, match="reverb_prob must be in"):
        DataConfig(reverb_prob=1.5, features=FeatureConfig(precomputed=False))
    with pytest.raises(ValueError, match="narrowband_prob \\+ lowpass_prob must be <= 1"):
        DataConfig(narrowband_prob=0.6, lowpass_prob=0.6, features=FeatureConfig(precomputed=False))
    with pytest.raises(ValueError, match="lowpass_hz.*< 4000"):
        DataConfig(lowpass_prob=0.5, features=FeatureConfig(precomputed=False, sample_rate=8000))
    with pytest.raises(ValueError, match="noise_cuts=n.jsonl.gz.*noise_snr_db"):
        DataConfig(noise_cuts="n.jsonl.gz", features=FeatureConfig(precomputed=False))
    with pytest.raises(ValueError, match="waveform_augment_from_epoch must be >= 0"):
        DataConfig(waveform_augment_from_epoch=-1, features=FeatureConfig(precomputed=False))
    ok = DataConfig(features=FeatureConfig(precomputed=True, sample_rate=8000))  # off: nothing to check
    assert ok.waveform_augmentation_on == []


def test_the_training_command_takes_the_keys():
    """What ``python -m usmkit.cli.train`` (and the AN4 recipe's ``--extra``) passes reaches ``DataConfig``."""
    from usmkit.cli.compose import compose_yaml
    from usmkit.config import TrainConfig, from_dict

    overrides = ["data=an4", "data.narrowband_prob=0.3", "data.lowpass_prob=0.2", "data.lowpass_hz=[3000,5000]",
                 "data.reverb_prob=0.1", "data.noise_cuts=noise.jsonl.gz", "data.noise_snr_db=[5,20]"]  # fmt: skip
    data = from_dict(TrainConfig, compose_yaml("train", overrides, command="t", schema=TrainConfig)).data
    assert (data.narrowband_prob, data.lowpass_prob, data.reverb_prob) == (0.3, 0.2, 0.1)
    assert tuple(data.lowpass_hz) == (3000.0, 5000.0) and data.noise_cuts == "noise.jsonl.gz"
    assert not data.features.precomputed


def test_shard_streamed_cuts_are_augmented_and_resume_exactly(tmp_path, build_corpus, tiny_tokenizer, build_config):
    """Cuts read from lhotse Shar shards hold their audio in memory; the augmentation applies to them alike."""
    from usmkit.data.shar import shar_cuts, split_shards, write_split

    write_split(build_corpus(tmp_path / "corpus", {"en": 12}), tmp_path / "shar" / "train", shard_size=3)
    meta = shar_cuts(split_shards(tmp_path / "shar", "train"), audio=False)

    def batches(n: int, state=None, **augment) -> tuple[list, dict]:
        cfg = build_config(shar_dir=str(tmp_path / "shar"), num_workers=1, max_duration=2.5, **augment)
        loader = make_loader(meta, cfg, tokenizer=tiny_tokenizer, stats=None, train=True)
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for batch in loader:
            out.append(batch)
            if len(out) == n:
                break
        state = loader.state_dict()
        loader.close()
        return out, state

    on = dict(narrowband_prob=0.4, lowpass_prob=0.3, reverb_prob=0.3)
    plain, _ = batches(4)
    straight, _ = batches(4, **on)
    assert [b.cut_ids for b in plain] == [b.cut_ids for b in straight]
    assert any(not torch.equal(a.features, b.features) for a, b in zip(plain, straight, strict=True))
    _, state = batches(2, **on)
    again, _ = batches(2, state, **on)
    for want, got in zip(straight[2:], again, strict=True):
        assert got.cut_ids == want.cut_ids and torch.equal(got.features, want.features)
