"""Global mean/variance normalization of log-mel features.

Shapes: B batch, T frames, F mel bins.

Stats are computed once over (a prefix of) the training cuts and stored next to the manifests as
``{manifest_dir}/feature_stats.safetensors``; the dataset applies them after feature extraction and
before SpecAugment, so masked regions (value 0) sit at the global mean.

Statistics are finite or they are nothing: one NaN sample in one file would otherwise make every
mean NaN, and the stored file would poison every later run over the corpus. Frames that are not
finite are left out of the sums (the dataset sets them to the mean, so leaving them out is what they
become), non-finite stats are never written, and a stored file that holds them is computed again.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import torch
from lhotse import CutSet
from lhotse.features.base import StatsAccumulator
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from usmkit.checkpointing.atomic import replaced_atomically
from usmkit.data.config import DataConfig, FeatureConfig
from usmkit.data.features import fbank_extractor, rate_suffix, to_sample_rate
from usmkit.data.sampling import cut_speaker
from usmkit.data.validate import BadInputError

log = logging.getLogger(__name__)

STATS_FILE = "feature_stats.safetensors"
MIN_STD = 1e-5  # floor: a constant mel bin (e.g. above the band of 8 kHz audio) must not divide by 0


def normalize_utterances(features: torch.Tensor, feature_lens: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Each utterance to zero mean and unit variance per bin over its own valid frames (unbiased variance, ``eps``
    added: SeamlessM4T's normalization); 0 on padding. features (B, T, F), feature_lens (B,) -> (B, T, F) float32."""
    valid = (torch.arange(features.shape[1], device=features.device) < feature_lens[:, None])[:, :, None]  # (B, T, 1)
    x = features.float().masked_fill(~valid, 0.0)
    n = feature_lens.clamp_min(1)[:, None, None].to(x.dtype)  # (B, 1, 1)
    mean = x.sum(1, keepdim=True) / n  # (B, 1, F)
    var = ((x - mean) ** 2).masked_fill(~valid, 0.0).sum(1, keepdim=True) / (n - 1).clamp_min(1)  # (B, 1, F)
    return ((x - mean) / torch.sqrt(var + eps)).masked_fill(~valid, 0.0)


@dataclass(frozen=True)
class FeatureStats:
    mean: torch.Tensor  # (F,) float32
    std: torch.Tensor  # (F,) float32, >= MIN_STD

    def __post_init__(self) -> None:
        if self.mean.shape != self.std.shape or self.mean.dim() != 1:
            raise ValueError(
                f"FeatureStats needs mean and std of the same shape (F,), got {tuple(self.mean.shape)} "
                f"and {tuple(self.std.shape)}"
            )

    @property
    def num_bins(self) -> int:
        return self.mean.shape[0]

    def normalize(self, features: torch.Tensor, feature_lens: torch.Tensor) -> torch.Tensor:
        """(x - mean) / std on valid frames, 0 on padding.

        features: (B, T, F); feature_lens: (B,). Returns (B, T, F) float32.
        """
        if features.shape[-1] != self.num_bins:
            raise ValueError(
                f"features have {features.shape[-1]} bins but the stats have {self.num_bins}; "
                "recompute feature_stats.safetensors for this feature config"
            )
        valid = torch.arange(features.shape[1]) < feature_lens[:, None]  # (B, T)
        x = (features - self.mean) / self.std
        return x.masked_fill(~valid[:, :, None], 0.0)

    @property
    def finite(self) -> bool:
        return bool(self.mean.isfinite().all() and self.std.isfinite().all())

    def save(self, path: str | Path, cfg: FeatureConfig) -> None:
        """Write them to ``path`` (atomically); ``BadInputError`` instead when any value is NaN/Inf."""
        if not self.finite:
            bins = int((~(self.mean.isfinite() & self.std.isfinite())).sum())
            raise BadInputError(
                "non-finite feature statistics",
                str(path),
                f"{bins} of {self.num_bins} bins are NaN/Inf, so they were not written",
                hint="the features they were computed from hold values that are not finite: check the training audio "
                "and its stored features (validation counts NaN/Inf samples per file)",
            )
        with replaced_atomically(path) as tmp:  # another run over the corpus may be reading it
            save_file(
                {"mean": self.mean.contiguous(), "std": self.std.contiguous()},
                str(tmp),
                metadata={"feature_config": _config_key(cfg)},
            )

    @classmethod
    def load(cls, path: str | Path) -> FeatureStats:
        t = load_file(str(path))
        return cls(mean=t["mean"], std=t["std"])


def compute_global_stats(cuts: CutSet, cfg: FeatureConfig, *, max_cuts: int = 2000) -> FeatureStats:
    """Per-bin mean and std of log-mel features over the first ``max_cuts`` cuts.

    Uses stored features when a cut has them, else computes them (lhotse ``Fbank``); the running
    sums are lhotse's ``StatsAccumulator`` (float64). Frames with a NaN/Inf value (from NaN/Inf
    samples) are left out, counted in one warning.
    """
    extractor = fbank_extractor(cfg)
    acc = StatsAccumulator(cfg.num_mel_bins)
    skipped: dict[str, int] = {}  # cut id -> its non-finite frames
    for cut in islice(cuts, max_cuts):
        if cut.has_features:
            feats = cut.load_features()
        else:
            cut = to_sample_rate(cut, cfg.sample_rate)
            feats = extractor.extract(cut.load_audio(), cfg.sample_rate)  # (T, F)
        finite = np.isfinite(feats).all(axis=-1)  # (T,)
        if not finite.all():
            skipped[cut.id] = int((~finite).sum())
            feats = feats[finite]
        if len(feats):
            acc.update(feats)
    if skipped:
        log.warning(
            "feature statistics leave out %d NaN/Inf frames of %d cuts (e.g. cut %s): their audio holds NaN/Inf samples",
            sum(skipped.values()),
            len(skipped),
            next(iter(skipped)),
        )
    if acc.total_frames == 0:
        raise ValueError("compute_global_stats got no finite feature frames: the CutSet is empty or all NaN/Inf")
    mean = torch.from_numpy(acc.norm_means).float()
    std = torch.from_numpy(acc.norm_stds).float().clamp_min(MIN_STD)
    return FeatureStats(mean=mean, std=std)


def stats_path(manifest_dir: str | Path, sample_rate: int = 16000) -> Path:
    """``{manifest_dir}/feature_stats.safetensors``; ``feature_stats_{rate}hz.safetensors`` for a
    feature rate other than 16 kHz (its own features, see ``feature_storage_dir``)."""
    return Path(manifest_dir) / STATS_FILE.replace(".safetensors", f"{rate_suffix(sample_rate)}.safetensors")


def load_or_compute_stats(cuts: CutSet, cfg: DataConfig, *, max_cuts: int = 2000) -> FeatureStats:
    """Stats from ``{cfg.manifest_dir}/feature_stats.safetensors``; computed from ``cuts`` (the training
    cuts) and saved when absent, made with another feature config, or holding NaN/Inf values."""
    path = stats_path(cfg.manifest_dir, cfg.features.sample_rate)
    if path.is_file():
        with safe_open(str(path), framework="pt") as f:
            made_with = (f.metadata() or {}).get("feature_config")
        if made_with == _config_key(cfg.features):
            stats = FeatureStats.load(path)
            if stats.finite:
                return stats
            log.warning("%s holds NaN/Inf values (from audio with NaN/Inf samples): recomputing it", path)
        else:
            log.warning("%s was computed for another feature config: recomputing it", path)
    stats = compute_global_stats(cuts, cfg.features, max_cuts=max_cuts)
    stats.save(path, cfg.features)
    return stats


def _config_key(cfg: FeatureConfig) -> str:
    # Storage choice does not change the features themselves.
    return json.dumps(asdict(cfg) | {"precomputed": None}, sort_keys=True)


@dataclass(frozen=True)
class SpeakerNorm:
    """One speaker's correction of globally normalized features: ``(feats - shift) * scale``, each (F,).

    ``shift`` = (speaker mean - global mean) / global std, so subtracting it is Kaldi's per-speaker
    CMN; ``scale`` = global std / speaker std with variance normalization (CMVN), else ones.
    """

    shift: torch.Tensor  # (F,)
    scale: torch.Tensor  # (F,)


def speaker_norms(
    cuts: CutSet, cfg: FeatureConfig, stats: FeatureStats, *, variance: bool = False, max_cuts_per_speaker: int = 500
) -> dict[str, SpeakerNorm]:
    """Per speaker, its ``SpeakerNorm`` over at most ``max_cuts_per_speaker`` of its cuts (the first ones).

    ``variance=False``: mean only (``data.speaker_mean_norm``); ``True``: mean and variance
    (``data.speaker_var_norm``). Every cut needs a speaker.
    """
    by_speaker: dict[str, list] = {}
    for cut in cuts:
        speaker = cut_speaker(cut)
        if speaker is None:
            raise ValueError(
                f"cut {cut.id!r} has no speaker, which data.speaker_mean_norm=true needs; set the supervisions' "
                "speaker in the manifest, or turn speaker_mean_norm off"
            )
        group = by_speaker.setdefault(speaker, [])
        if len(group) < max_cuts_per_speaker:
            group.append(cut)
    norms = {}
    for speaker, group in by_speaker.items():
        own = compute_global_stats(CutSet.from_cuts(group), cfg)
        scale = stats.std / own.std if variance else torch.ones_like(own.std)
        norms[speaker] = SpeakerNorm(shift=(own.mean - stats.mean) / stats.std, scale=scale)
    return norms
