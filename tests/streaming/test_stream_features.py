"""Streaming inputs: incremental fbank vs lhotse offline, stats lookup, stream resampling, levels, audio sources."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.functional as AF

from usmkit.data.config import FeatureConfig
from usmkit.data.features import fbank_extractor
from usmkit.data.normalize import STATS_FILE, FeatureStats
from usmkit.streaming.audio import AudioError, FileSource, LevelMeter, RawPcmSource, StreamResampler
from usmkit.streaming.features import StatsNotFoundError, StreamingFbank, find_feature_stats, load_feature_stats

CFG = FeatureConfig()


@pytest.fixture(autouse=True)
def _one_thread():
    """Blocks of a few hundred samples are too small to share out over threads; one is fastest under load."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _signal(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n) / 16000
    return 0.1 * torch.sin(2 * torch.pi * 220 * t) + 0.02 * torch.randn(n, generator=g)


def _offline(x: torch.Tensor, cfg: FeatureConfig = CFG) -> torch.Tensor:
    return torch.as_tensor(fbank_extractor(cfg).extract(x.numpy(), cfg.sample_rate))


def _streamed(fb: StreamingFbank, x: torch.Tensor, block: int) -> torch.Tensor:
    return torch.cat([fb.accept(b) for b in x.split(block)] + [fb.flush()])


@pytest.mark.parametrize(
    "n,block",
    [(n, b) for n in (400, 401, 1000) for b in (7, 160, 10**6)]
    + [(n, b) for n in (16000, 16037, 23456) for b in (160, 333, 4000, 10**6)],
)
def test_streaming_fbank_equals_offline_lhotse(n, block):
    x = _signal(n, seed=n)
    offline = _offline(x)
    streamed = _streamed(StreamingFbank(CFG), x, block)
    assert streamed.shape == offline.shape == ((n + 80) // 160, 80)
    torch.testing.assert_close(streamed, offline, atol=1e-4, rtol=1e-5)


def test_other_feature_configs_too():
    cfg = FeatureConfig(num_mel_bins=40, frame_length_ms=20.0, frame_shift_ms=10.0, sample_rate=8000)
    x = _signal(5555)
    torch.testing.assert_close(_streamed(StreamingFbank(cfg), x, 123), _offline(x, cfg), atol=1e-4, rtol=1e-5)


def test_normalized_with_the_global_stats():
    x = _signal(8000)
    mean, std = torch.linspace(-5, 5, 80), torch.linspace(0.5, 2, 80)
    fb = StreamingFbank(CFG, FeatureStats(mean=mean, std=std))
    torch.testing.assert_close(_streamed(fb, x, 999), (_offline(x) - mean) / std, atol=1e-4, rtol=1e-5)
    assert fb.num_samples == 8000 and fb.num_frames == 50


def test_the_windows_of_several_streams_featurized_in_one_call_equal_each_stream_alone():
    """A server cuts each stream's windows (``accept_windows`` / ``flush_windows``) and computes the frames of all of
    them at once (``frames``): each stream's share equals its own ``accept`` / ``flush``, and the offline frames."""
    stats = FeatureStats(mean=torch.linspace(-5, 5, 80), std=torch.linspace(0.5, 2, 80))
    signals = [_signal(n, seed=n) for n in (3000, 5210, 401)]
    blocks = (640, 1000, 97)
    shared = StreamingFbank(CFG, stats)  # computes the frames of every stream's windows
    cutters = [StreamingFbank(CFG, stats) for _ in signals]
    got: list[list[torch.Tensor]] = [[] for _ in signals]
    pieces = [list(x.split(b)) for x, b in zip(signals, blocks, strict=True)]
    for r in range(max(len(p) for p in pieces) + 1):  # rounds: every stream's next block (then its end) at once
        windows = []
        for fb, p in zip(cutters, pieces, strict=True):
            windows.append(fb.accept_windows(p[r]) if r < len(p) else fb.flush_windows() if r == len(p) else None)
        live = [w for w in windows if w is not None]
        frames = shared.frames(torch.cat(live)).split([w.shape[0] for w in live])
        it = iter(frames)
        for i, w in enumerate(windows):
            if w is not None:
                got[i].append(next(it))
    for x, b, parts in zip(signals, blocks, got, strict=True):
        alone = _streamed(StreamingFbank(CFG, stats), x, b)
        torch.testing.assert_close(torch.cat(parts), alone, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.cat(parts), (_offline(x) - stats.mean) / stats.std, atol=1e-4, rtol=1e-5)
    assert [fb.num_frames for fb in cutters] == [(x.numel() + 80) // 160 for x in signals]


def test_shorter_than_a_window_gives_no_frames():
    fb = StreamingFbank(CFG)
    assert fb.accept(np.zeros(0, np.float32)).shape == (0, 80)
    assert fb.accept(_signal(399)).shape == (0, 80)
    assert fb.flush().shape == (0, 80)
    with pytest.raises(ValueError, match="one channel"):
        fb.accept(torch.zeros(2, 100))


def test_stats_lookup_order_and_errors(tmp_path):
    exp = tmp_path / "exp"
    ckpt = exp / "checkpoints" / "step-000010"
    ckpt.mkdir(parents=True)
    manifests = tmp_path / "data"
    manifests.mkdir()
    with pytest.raises(StatsNotFoundError, match="feature_stats.safetensors") as err:
        find_feature_stats(ckpt, manifests)
    assert str(exp / STATS_FILE) in str(err.value) and str(manifests / STATS_FILE) in str(err.value)
    FeatureStats(mean=torch.zeros(80), std=torch.ones(80)).save(manifests / STATS_FILE, CFG)
    assert find_feature_stats(ckpt, manifests) == manifests / STATS_FILE
    FeatureStats(mean=torch.ones(40), std=torch.ones(40)).save(exp / STATS_FILE, CFG)
    assert find_feature_stats(ckpt, manifests) == exp / STATS_FILE  # next to the checkpoints wins
    with pytest.raises(ValueError, match="40 bins but the model's features have 80"):
        load_feature_stats(exp / STATS_FILE, CFG)
    (exp / STATS_FILE).write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="cannot read feature stats"):
        load_feature_stats(exp / STATS_FILE, CFG)
    assert load_feature_stats(manifests / STATS_FILE, CFG).num_bins == 80


@pytest.mark.parametrize("orig", [8000, 11025, 22050, 44100, 48000])
def test_stream_resampler_equals_whole_signal_resampling(orig):
    x = _signal(orig + 1234, seed=orig)
    whole = AF.resample(x, orig, 16000)
    for block in (97, 4096):
        rs = StreamResampler(orig, 16000)
        streamed = torch.cat([rs.accept(b) for b in x.split(block)] + [rs.flush()])
        assert streamed.shape == whole.shape
        torch.testing.assert_close(streamed, whole, atol=1e-5, rtol=1e-5)


def test_level_meter_levels_and_clipping():
    meter = LevelMeter(640)
    tone = np.sin(2 * np.pi * 440 * np.arange(1600) / 16000).astype(np.float32)  # peak 1.0: clipped
    levels = meter.accept(np.concatenate([np.zeros(640, np.float32), tone]))
    assert levels.shape == (3,) and levels[0] == -np.inf
    np.testing.assert_allclose(levels[1:], 10 * np.log10(0.5), atol=0.05)  # a full-scale sine: -3 dBFS
    assert meter.flush().shape == (1,)
    assert meter.clipped > 0 and 0 < meter.clipped_fraction < 0.05


def test_raw_pcm_drops_a_cut_sample_and_says_so():
    pcm = (np.arange(-500, 500, dtype=np.int16) * 60).tobytes() + b"\x01"  # odd: the last sample is cut
    source = RawPcmSource(io.BufferedReader(io.BytesIO(pcm)), 16000, 16000, block_seconds=0.01)
    samples = np.concatenate(list(source))
    np.testing.assert_array_equal(samples, np.arange(-500, 500, dtype=np.float32) * 60 / 32768)
    assert source.notes() == ["stdin ended in the middle of a 16-bit sample: dropped the last 1 byte"]


def test_raw_pcm_at_another_rate_is_resampled():
    pcm = (_signal(8000).numpy() * 32767).astype(np.int16).tobytes()
    samples = np.concatenate(list(RawPcmSource(io.BytesIO(pcm), 8000, 16000)))
    assert samples.shape == (16000,)


def test_file_sources_read_any_rate_and_format(tmp_path):
    x = _signal(22050, seed=3).numpy()
    sf.write(tmp_path / "a.flac", x, 22050)
    samples = np.concatenate(list(FileSource(tmp_path / "a.flac", 16000)))
    assert samples.shape == (16000,)
    stereo = np.stack([x, x], axis=1)
    sf.write(tmp_path / "b.wav", stereo, 16000, subtype="FLOAT")
    np.testing.assert_allclose(np.concatenate(list(FileSource(tmp_path / "b.wav", 16000))), x, atol=1e-6)


def test_file_source_errors_name_the_file(tmp_path):
    with pytest.raises(AudioError, match="no such file"):
        FileSource(tmp_path / "missing.wav", 16000)
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(AudioError, match=r"empty\.wav: the file is empty \(0 bytes\)"):
        FileSource(tmp_path / "empty.wav", 16000)
    (tmp_path / "junk.wav").write_bytes(b"RIFF\x00\x00junk" * 50)
    with pytest.raises(AudioError, match=r"junk\.wav: cannot decode it as audio"):
        FileSource(tmp_path / "junk.wav", 16000)
    (tmp_path / "notes.txt").write_text("this is not audio\n")
    with pytest.raises(AudioError, match=r"notes\.txt: cannot decode.*format is unsupported"):
        FileSource(tmp_path / "notes.txt", 16000)
    sf.write(tmp_path / "header.wav", np.zeros(0, np.float32), 16000)
    with pytest.raises(AudioError, match=r"header\.wav: the file holds no audio samples"):
        FileSource(tmp_path / "header.wav", 16000)
    with pytest.raises(AudioError, match="not a regular file"):
        FileSource(tmp_path, 16000)


@pytest.mark.parametrize("n", [399, 400, 16000, 16321])
@pytest.mark.parametrize("block", [1, 160, 1234])
def test_streaming_seamless_fbank_equals_offline(n, block):
    """w2v-BERT 2.0's features (SeamlessFbank, frames wholly inside the signal) chunk by chunk: the offline frames
    that count (``seamless_frames``), none more; normalized with global stats (per-utterance cannot stream)."""
    from dataclasses import replace

    from usmkit.data.config import seamless_m4t_features
    from usmkit.data.features import seamless_frames

    cfg = seamless_m4t_features(normalize="global")
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 0.1
    offline = torch.as_tensor(fbank_extractor(cfg).extract(x.numpy(), 16000))[: seamless_frames(n, cfg)]
    fb = StreamingFbank(cfg)
    streamed = torch.cat([fb.accept(b) for b in x.split(block)] + [fb.flush()])
    assert streamed.shape == offline.shape == (max(0, 1 + (n - 400) // 160), 80)
    torch.testing.assert_close(streamed, offline, atol=2e-4, rtol=1e-5)
    with pytest.raises(ValueError, match="normalize=global to stream"):
        StreamingFbank(replace(cfg, normalize="utterance"))
