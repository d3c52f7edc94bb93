"""Incremental log-mel features: the frames lhotse's ``Fbank`` computes offline, as the samples arrive.

Shapes: N samples, t feature frames (10 ms hop), F mel bins.

The offline extractor (``usmkit.data.features.fbank_extractor``, lhotse, ``snip_edges=False``) pads
the signal by reflection, ``(L - S) // 2`` samples at the start (L window, S shift, in samples) and
up to the frame count ``(N + S // 2) // S`` at the end, then cuts frames every S samples. Every
frame depends only on its own window, so the frames can be computed as soon as their window is
complete. lhotse's ``Wav2LogFilterBank.online_inference`` does exactly that (the same module and
arithmetic as the offline path, including the start reflection); what it leaves out is the end
reflection, which ``flush`` adds. Thus ``accept`` + ``flush`` frames equal the offline frames.

Then the global mean/variance normalization the model was trained with (``FeatureStats``).

``FeatureConfig.fbank="seamless_m4t"`` (w2v-BERT 2.0's features) keeps only frames wholly inside the signal
(``snip_edges``): frame t is samples ``S t .. S t + L - 1``, no reflection at either end, nothing to flush;
``usmkit.data.features.seamless_window_frames`` computes the frames of the windows. Per-utterance
normalization (``normalize="utterance"``) needs the whole utterance and cannot stream: such a model is refused.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

# lhotse's streaming framing, the first half of its ``online_inference``: cutting the windows apart from the
# features lets one call compute the frames of many streams' windows (``StreamingFbank.frames``).
from lhotse.features.kaldi.layers import _get_strided_batch_streaming

from usmkit.checkpointing.checkpoint import CheckpointError, run_dir
from usmkit.data.config import DataConfig, FeatureConfig
from usmkit.data.features import fbank_extractor, seamless_window_frames
from usmkit.data.normalize import STATS_FILE, FeatureStats, stats_path


class StatsNotFoundError(FileNotFoundError):
    """No ``feature_stats.safetensors`` where the checkpoint's training run would have left one."""


class FeatureStatsError(CheckpointError, ValueError):
    """A ``feature_stats.safetensors`` that cannot be read (garbage, truncated) or does not fit the model."""


def find_feature_stats(ckpt_path: str | Path, manifest_dir: str | Path, sample_rate: int = 16000) -> Path:
    """The normalization stats of a checkpoint: ``<exp_dir>/feature_stats.safetensors`` (exp_dir = the
    checkpoint's grandparent, ``<exp_dir>/checkpoints/step-N``), else the manifest directory's stats for
    the feature rate (``usmkit.data.normalize.stats_path``)."""
    candidates = [run_dir(ckpt_path) / STATS_FILE, stats_path(manifest_dir, sample_rate)]
    for path in candidates:
        if path.is_file():
            return path
    raise StatsNotFoundError(
        f"no feature normalization stats for checkpoint {ckpt_path}: looked for {candidates[0]} and "
        f"{candidates[1]}; copy the training run's {STATS_FILE} next to the checkpoints (into the experiment "
        "directory) or run from the directory the model was trained in"
    )


def load_feature_stats(path: str | Path, cfg: FeatureConfig) -> FeatureStats:
    """``FeatureStats`` from ``path``, checked against the feature config's number of mel bins.
    ``FeatureStatsError`` naming the file where it is damaged or does not fit."""
    try:
        stats = FeatureStats.load(path)
    except Exception as e:  # safetensors raises its own error types for damaged files, KeyError for other tensors
        raise FeatureStatsError(
            f"cannot read feature stats {path} ({type(e).__name__}: {e}); copy the training run's {STATS_FILE} "
            "there again"
        ) from None
    if stats.num_bins != cfg.num_mel_bins:
        raise FeatureStatsError(
            f"feature stats {path} have {stats.num_bins} bins but the model's features have {cfg.num_mel_bins} "
            "mel bins; use the stats of the run that trained this checkpoint"
        )
    return stats


def checkpoint_feature_stats(ckpt_path: str | Path, data: DataConfig) -> FeatureStats:
    """The checkpoint's stats (``find_feature_stats``), checked against its data config's features."""
    return load_feature_stats(
        find_feature_stats(ckpt_path, data.manifest_dir, data.features.sample_rate), data.features
    )


class StreamingFbank:
    """Samples in (float in [-1, 1], at ``cfg.sample_rate``), in blocks of any size; feature frames out.

    ``accept`` returns the frames whose window is complete, ``flush`` the last ones (they need the
    end of the signal). Buffers fewer than L + S samples. With ``stats`` the frames are normalized.

    >>> cfg = FeatureConfig()
    >>> x = torch.randn(16000) * 0.1
    >>> fb = StreamingFbank(cfg)
    >>> frames = torch.cat([fb.accept(b) for b in x.split(1234)] + [fb.flush()])
    >>> offline = torch.as_tensor(fbank_extractor(cfg).extract(x.numpy(), 16000))
    >>> frames.shape == offline.shape and torch.allclose(frames, offline, atol=1e-4)
    True
    """

    def __init__(self, cfg: FeatureConfig, stats: FeatureStats | None = None) -> None:
        if stats is not None and stats.num_bins != cfg.num_mel_bins:
            raise ValueError(f"stats have {stats.num_bins} bins, the feature config {cfg.num_mel_bins}")
        if cfg.normalize == "utterance":
            raise ValueError(
                "data.features.normalize=utterance normalizes each utterance with its own statistics, which a stream "
                "does not have until it ends; fine-tune the model with data.features.normalize=global to stream it"
            )
        self.cfg = cfg
        self.stats = stats
        self.snip_edges = cfg.fbank == "seamless_m4t"
        self._fbank = fbank_extractor(cfg)
        # Window and shift in samples, rounded as lhotse's Wav2Win rounds them.
        self.window = int(math.floor(cfg.frame_length_ms / 1000.0 * cfg.sample_rate))
        self.shift = int(math.floor(cfg.frame_shift_ms / 1000.0 * cfg.sample_rate))
        self.reset()

    def reset(self) -> None:
        self.num_samples = 0  # samples accepted so far
        self.num_frames = 0  # frames returned so far
        self._started = False  # online_inference has consumed the start (and its reflection)
        self._buffer = torch.zeros(1, 0)  # (1, n): before the start, all samples; after, lhotse's remainder
        self._tail = torch.zeros(0)  # the last `window` samples of the signal, for the end reflection

    def _empty(self) -> torch.Tensor:
        return torch.zeros(0, self.cfg.num_mel_bins, device=self.device)

    @property
    def device(self) -> torch.device:
        """Where ``frames`` computes (the windows it takes must be there)."""
        if self.snip_edges:
            return torch.device("cpu")
        return self._fbank.extractor.wav2win._window.device

    def to(self, device: torch.device | str) -> StreamingFbank:
        """Compute ``frames`` on ``device`` (a server's GPU: the frames of all streams' windows in one call there).
        Cutting windows (``accept_windows``) stays on the CPU; ``accept`` / ``flush`` need the CPU.
        (SeamlessM4T's frames are computed on the CPU.)"""
        if self.snip_edges:
            return self
        self._fbank.extractor.to(device)
        if self.stats is not None:
            self.stats = FeatureStats(mean=self.stats.mean.to(device), std=self.stats.std.to(device))
        return self

    def frames(self, windows: torch.Tensor) -> torch.Tensor:
        """windows (t, L) -> their (t, F) log-mel frames, normalized with ``stats``. Pure: each frame depends only
        on its own window, so the windows of many streams (sharing the config and stats) can go in one call."""
        if windows.shape[0] == 0:
            return self._empty()
        if self.snip_edges:
            frames = seamless_window_frames(windows.cpu(), self.cfg)  # (t, F)
            return frames if self.stats is None else (frames - self.stats.mean.cpu()) / self.stats.std.cpu()
        extractor = self._fbank.extractor  # lhotse's Wav2LogFilterBank: window processing, then FFT and mel
        with torch.no_grad():
            frames = extractor._forward_strided(*extractor.wav2win._forward_strided(windows[None]))[0]  # (t, F)
        if self.stats is None:
            return frames
        return (frames - self.stats.mean) / self.stats.std

    def accept(self, samples: torch.Tensor | np.ndarray) -> torch.Tensor:
        """samples (N,) -> the (t, F) frames completed by them (t may be 0)."""
        return self.frames(self.accept_windows(samples))

    def flush(self) -> torch.Tensor:
        """The last frames (t, F): those whose window reaches into the end reflection; ``reset()`` before a new stream."""
        return self.frames(self.flush_windows())

    def _cut(self, x: torch.Tensor, context: torch.Tensor | None) -> torch.Tensor:
        """Windows (t, L) of the samples x (1, N) after ``context`` (1, n) (None: the start, reflected), as lhotse's
        ``online_inference`` cuts them (its first half; ``frames`` is its second); keeps the remainder."""
        dither = self._fbank.extractor.wav2win.dither
        if dither != 0.0:
            x = x + dither * torch.randn(x.shape)
        windows, self._buffer = _get_strided_batch_streaming(x, self.shift, self.window, context, snip_edges=False)
        self.num_frames += windows.shape[1]
        return windows[0]  # (t, L)

    def _no_windows(self) -> torch.Tensor:
        return torch.zeros(0, self.window)

    def accept_windows(self, samples: torch.Tensor | np.ndarray) -> torch.Tensor:
        """samples (N,) -> the raw windows (t, L) of the frames they complete (``frames`` turns them into features)."""
        x = torch.as_tensor(samples, dtype=torch.float32)
        if x.dim() != 1:
            raise ValueError(f"samples must be one channel (N,), got shape {tuple(x.shape)}")
        if x.numel() == 0:
            return self._no_windows()
        if self.snip_edges:  # frames wholly inside the signal: windows every S samples from the first
            self.num_samples += x.numel()
            self._buffer = torch.cat([self._buffer, x[None]], dim=1)  # (1, n)
            n = max(0, (self._buffer.shape[1] - self.window) // self.shift + 1)
            if n == 0:
                return self._no_windows()
            windows = self._buffer[0].unfold(0, self.window, self.shift)[:n]  # (t, L)
            self._buffer = self._buffer[:, n * self.shift :]
            self.num_frames += n
            return windows.clone()
        self.num_samples += x.numel()
        self._tail = torch.cat([self._tail, x])[-self.window :]
        if not self._started:
            self._buffer = torch.cat([self._buffer, x[None]], dim=1)  # (1, n)
            if self._buffer.shape[1] < self.window:  # the start reflection and the first window need this much
                return self._no_windows()
            self._started = True
            return self._cut(self._buffer, None)
        if self._new_frames(self._buffer.shape[1] + x.shape[0]) == 0:
            self._buffer = torch.cat([self._buffer, x[None]], dim=1)
            return self._no_windows()
        return self._cut(x[None], self._buffer)

    def _new_frames(self, buffered: int) -> int:
        """Frames lhotse cuts from ``buffered`` samples (after the start)."""
        return max(0, (buffered - (self.window - self.shift)) // self.shift)

    def flush_windows(self) -> torch.Tensor:
        """The windows (t, L) of the last frames, those that reach into the end reflection."""
        if self.snip_edges:  # no frame reaches past the signal
            return self._no_windows()
        total = (self.num_samples + self.shift // 2) // self.shift  # lhotse's frame count for the whole signal
        if not self._started:
            # Shorter than one window (25 ms): lhotse's reflection would read past the signal; no frames.
            return self._no_windows()
        pad_left = (self.window - self.shift) // 2
        pad_right = (total - 1) * self.shift + self.window - self.num_samples - pad_left
        if pad_right <= 0 or self._new_frames(self._buffer.shape[1] + pad_right) == 0:
            return self._no_windows()
        before = self.num_frames
        reflection = torch.flip(self._tail[-pad_right:], (0,))  # as lhotse's _get_strided_batch pads
        windows = self._cut(reflection[None], self._buffer)[: total - before]
        self.num_frames = before + windows.shape[0]
        return windows
