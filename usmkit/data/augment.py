"""Training-time augmentation: SpecAugment (torchaudio) on features, speed perturbation (lhotse) on cuts.

Shapes: B batch, T frames, F mel bins, L valid frames of one utterance.
"""

from __future__ import annotations

import math
import random

import torch
import torchaudio.functional as AF
from lhotse.dataset import PerturbSpeed

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
