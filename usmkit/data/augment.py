"""Training-time augmentation: SpecAugment (torchaudio), random gain and background noise on features,
speed perturbation (lhotse) on cuts.

Shapes: B batch, T frames, F mel bins, L valid frames of one utterance.
"""

from __future__ import annotations

import math
import random

import torch
import torchaudio.functional as AF
from lhotse.dataset import PerturbSpeed
from torchaudio.compliance.kaldi import inverse_mel_scale, mel_scale_scalar

from usmkit.data.config import SpecAugmentConfig


class SpecAugment:
    """Frequency masks and adaptive-width time masks, drawn independently for each utterance.

    Widths: frequency ~U[0, freq_width) bins (torchaudio ``mask_along_axis_iid``); time
    ~U[0, time_width_ratio * L) frames placed inside the utterance's own L valid frames, so padding
    never absorbs a mask and short utterances are not wiped out. The mask value is 0 (the global mean
    after normalization). Time masks are our own few tensor ops: torchaudio draws widths and positions
    over the padded length with one bound for the whole batch, which is not adaptive SpecAugment.
    """

    def __init__(self, cfg: SpecAugmentConfig) -> None:
        self.cfg = cfg

    def __call__(self, features: torch.Tensor, feature_lens: torch.Tensor) -> torch.Tensor:
        """features: (B, T, F) normalized; feature_lens: (B,). Returns a masked copy (B, T, F)."""
        cfg = self.cfg
        if not cfg.enabled:
            return features
        spec = features.transpose(1, 2)  # (B, F, T)
        for _ in range(cfg.freq_masks):
            spec = AF.mask_along_axis_iid(spec, mask_param=cfg.freq_width, mask_value=0.0, axis=1)
        out = spec.transpose(1, 2)  # (B, T, F)
        if cfg.time_masks > 0 and cfg.time_width_ratio > 0:
            out = out.masked_fill(self._time_mask(feature_lens, out.shape[1])[:, :, None], 0.0)
        return out if out is not features else features.clone()

    def _time_mask(self, lens: torch.Tensor, T: int) -> torch.Tensor:
        """(B, T) bool: True inside any of the ``time_masks`` spans of each utterance."""
        B, K = lens.shape[0], self.cfg.time_masks
        L = lens.to(torch.float32)[:, None]  # (B, 1)
        width = (torch.rand(B, K) * (self.cfg.time_width_ratio * L).floor()).floor()  # (B, K) in [0, ratio*L)
        start = (torch.rand(B, K) * (L - width)).floor()  # (B, K): span ends inside the L valid frames
        t = torch.arange(T, dtype=torch.float32)  # (T,)
        inside = (t >= start[:, :, None]) & (t < (start + width)[:, :, None])  # (B, K, T)
        return inside.any(dim=1)


def speed_perturbation(factors: tuple[float, ...], seed: int) -> PerturbSpeed | None:
    """lhotse cut transform: each cut gets one of ``factors`` uniformly at random (1.0 = unchanged).

    Returns None when no factor changes anything. Cut ids are kept, so batches still name the
    manifest's cuts. Needs on-the-fly features (the waveform changes).
    """
    changing = [f for f in factors if f != 1.0]
    if not changing:
        return None
    # PerturbSpeed applies a factor with probability p, picked among ``changing``; p = share of the
    # non-identity factors gives each factor in ``factors`` (1.0 included) the same chance.
    return PerturbSpeed(factors=changing, p=len(changing) / len(factors), randgen=random.Random(seed), preserve_id=True)


def random_gain(features: torch.Tensor, max_db: float) -> torch.Tensor:
    """Each utterance's loudness changed by a uniform random gain in [-max_db, +max_db] dB.

    On log-mel power features a waveform gain of g dB is exactly an added constant g * ln(10) / 10
    (up to the energy floor), so this works on stored features too. Speakers recorded far quieter
    or louder than the training set are otherwise out of distribution after global normalization
    (FSDD's speaker theo is ~20 dB below the others). features (B, T, F) unnormalized log-mel.
    """
    if max_db <= 0:
        return features
    gain_db = (torch.rand(features.shape[0]) * 2 - 1) * max_db  # (B,)
    return features + (gain_db * math.log(10) / 10)[:, None, None].to(features.dtype)


NOISE_BAND_FLOOR_DB = 30.0  # the band ends at the highest mel bin within this of the strongest bin
NOISE_FLUCTUATION_SHAPE = 4.0  # gamma shape of the noise power's frame-to-frame fluctuation (mean 1)


def mel_bin_centers(num_bins: int, sample_rate: int, low_hz: float = 20.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Center frequencies and widths (Hz), each (F,), of the kaldi mel filterbank (20 Hz .. Nyquist)."""
    edges = torch.linspace(mel_scale_scalar(low_hz), mel_scale_scalar(sample_rate / 2), num_bins + 2)
    hz = inverse_mel_scale(edges)  # (F + 2,) filter edges and centers
    return hz[1:-1], hz[2:] - hz[:-2]


def add_noise(
    features: torch.Tensor, feature_lens: torch.Tensor, snr_db: tuple[float, float], prob: float, sample_rate: int
) -> torch.Tensor:
    """Stationary background noise at a random SNR, added to a random share ``prob`` of the utterances.

    Works on log-mel power features, so on stored features too: speech and independent noise add in
    power, and the log-mel of their mixture is ``log(exp(features) + noise)`` up to the cross term,
    whose mean is zero. Each noisy utterance draws:

    - an SNR uniform in ``snr_db`` (dB; signal = its mean power per valid frame),
    - a color: mel-bin power proportional to ``width * f**-alpha``, alpha uniform in [0, 2]
      (white to brown noise),
    - frame-to-frame fluctuation of every bin's power (gamma, mean 1).

    The noise stays inside the utterance's own band (up to its highest mel bin whose mean is within
    ``NOISE_BAND_FLOOR_DB`` of its strongest bin's): a band-limited recording (FSDD's 8 kHz audio,
    resampled to 16 kHz) gets noise below 4 kHz only, as its microphone's noise would be. It is meant for test speakers recorded
    with more noise than the training speakers.

    features (B, T, F) unnormalized log-mel power, feature_lens (B,) -> (B, T, F); padding unchanged.
    """
    lo, hi = snr_db
    batch, frames, bins = features.shape
    noisy_rows = torch.rand(batch) < prob  # (B,)
    if not noisy_rows.any():
        return features
    valid = (torch.arange(frames) < feature_lens[:, None])[:, :, None]  # (B, T, 1)
    count = feature_lens.clamp_min(1).to(features.dtype)  # (B,)
    power = features.exp()  # (B, T, F)
    signal = (power * valid).sum((1, 2)) / count  # (B,) mean power per frame
    mean_log = (features * valid).sum(1) / count[:, None]  # (B, F)
    floor = mean_log.amax(-1, keepdim=True) - NOISE_BAND_FLOOR_DB * math.log(10) / 10
    above = (mean_log > floor).flip(-1).cummax(-1).values.flip(-1)  # (B, F): bins at or below the band's top
    centers, widths = mel_bin_centers(bins, sample_rate)
    alpha = torch.rand(batch, 1) * 2  # (B, 1)
    color = widths * centers**-alpha * above  # (B, F)
    color = color / color.sum(-1, keepdim=True).clamp_min(1e-30)
    snr = lo + torch.rand(batch) * (hi - lo)  # (B,)
    level = signal * 10 ** (-snr / 10)  # (B,) noise power per frame
    fluctuation = torch.distributions.Gamma(NOISE_FLUCTUATION_SHAPE, NOISE_FLUCTUATION_SHAPE).sample(
        (batch, frames, bins)
    )
    noise = level[:, None, None] * color[:, None, :] * fluctuation  # (B, T, F)
    mixed = torch.log(power + noise)
    return torch.where(noisy_rows[:, None, None] & valid, mixed, features)
