"""Map-style dataset in the lhotse style: a sampled ``CutSet`` in, one typed ``Batch`` out.

Shapes: B batch, T feature frames, F mel bins, U tokens.

Per batch (in a loader worker): speed perturbation (train, lhotse) -> reverberation, recorded noise and a
band-limited channel on the waveform (train, lhotse; ``usmkit.data.waveform_augment``) -> features (lhotse
input strategy: stored or on-the-fly fbank) -> random gain and synthetic background noise (train) -> global
mean/variance normalization -> SpecAugment (train, torchaudio) -> packing into fixed rows (train, with a
``RowPacker``: ``usmkit.data.packing``) -> tokens from the supervision text.
Feature values that are not finite (NaN/Inf samples in a recording make its fbank frames NaN) are
set to the global mean (0 after normalization), with a warning naming the cut and counting the frames.
"""

from __future__ import annotations

import contextlib
import logging
import random
from functools import partial
from typing import Protocol

import torch
from lhotse import CutSet
from lhotse.cut import Cut

from usmkit.data.augment import SpecAugment, add_noise, random_gain, speed_perturbation
from usmkit.data.batch import Batch
from usmkit.data.config import FeatureConfig, SpecAugmentConfig
from usmkit.data.features import input_strategy, to_sample_rate, true_lengths
from usmkit.data.normalize import FeatureStats, SpeakerNorm, normalize_utterances
from usmkit.data.packing import RowPacker, cut_frames
from usmkit.data.sampling import cut_language, cut_speaker
from usmkit.data.waveform_augment import WaveformAugment

TOKEN_PAD = -1
log = logging.getLogger(__name__)


def repair_non_finite_features(
    feats: torch.Tensor, cuts: CutSet, fill: torch.Tensor | None = None
) -> tuple[torch.Tensor, int]:
    """feats (B, T, F) with non-finite values replaced by ``fill`` (F,) (default 0), a warning per cut
    naming it and its count of affected frames; returns (feats, frames repaired)."""
    bad = ~torch.isfinite(feats)  # (B, T, F)
    if not bool(bad.any()):
        return feats, 0
    frames = bad.any(-1).sum(-1)  # (B,)
    for cut, n in zip(cuts, frames.tolist(), strict=True):
        if n:
            log.warning(
                "cut %s: %d feature frames are NaN/Inf (non-finite samples in its audio); set to the mean", cut.id, n
            )
    value = torch.zeros(feats.shape[-1]) if fill is None else fill.to(feats.dtype)
    return torch.where(bad, value, feats), int(frames.sum())


class TextEncoder(Protocol):
    """What the dataset needs of ``usmkit.data.tokenizer.Tokenizer``."""

    def encode(self, text: str) -> list[int]: ...


def cut_text(cut: Cut) -> str:
    """The cut's transcript: its supervisions' texts in time order, joined by spaces ("" if none)."""
    sups = sorted(cut.supervisions, key=lambda s: s.start)
    return " ".join(s.text.strip() for s in sups if s.text and s.text.strip())


def shift_per_utterance(
    feats: torch.Tensor, feat_lens: torch.Tensor, offsets: torch.Tensor, scales: torch.Tensor | None = None
) -> torch.Tensor:
    """feats (B, T, F) minus one offset (B, F) per utterance, times one scale (B, F) if given, on the
    valid frames; padding stays 0."""
    valid = (torch.arange(feats.shape[1]) < feat_lens[:, None])[:, :, None]  # (B, T, 1)
    out = feats - offsets[:, None, :]
    if scales is not None:
        out = out * scales[:, None, :]
    return out.masked_fill(~valid, 0.0)


def subtract_utterance_mean(feats: torch.Tensor, feat_lens: torch.Tensor) -> torch.Tensor:
    """Per-utterance, per-bin mean over the valid frames subtracted (CMN); padding stays 0.

    feats (B, T, F), feat_lens (B,) -> (B, T, F). A gain change is a constant added to every log-mel
    bin, so this removes it exactly (a speaker recorded 20 dB quieter looks like the others).
    """
    valid = (torch.arange(feats.shape[1]) < feat_lens[:, None])[:, :, None]  # (B, T, 1)
    mean = (feats * valid).sum(1) / feat_lens.clamp_min(1)[:, None]  # (B, F)
    return shift_per_utterance(feats, feat_lens, mean)


class AsrDataset(torch.utils.data.Dataset):
    """``dataset[cuts] -> Batch``; pass it to a DataLoader with a lhotse sampler and ``batch_size=None``.

    ``tokenizer=None`` gives audio-only batches (tokens (B, 0)). ``stats=None`` leaves features
    unnormalized (only for computing the stats themselves; training always passes them).
    ``spec_augment`` / ``speed_perturb`` / ``waveform`` / ``gain_db`` / ``noise_snr_db`` are for training;
    leave them off for evaluation. ``waveform`` (``usmkit.data.waveform_augment.waveform_augmentation``) needs
    on-the-fly features; when it mixes recorded noise, the synthetic feature noise (``noise_snr_db``) is off.
    ``packer``: pack the utterances into its fixed rows (``Batch.packing``); every augmentation and
    normalization runs on each utterance before, so packing changes none of them.
    """

    def __init__(
        self,
        features: FeatureConfig,
        *,
        tokenizer: TextEncoder | None = None,
        stats: FeatureStats | None = None,
        spec_augment: SpecAugmentConfig | None = None,
        speed_perturb: tuple[float, ...] = (),
        waveform: WaveformAugment | None = None,
        waveform_from_epoch: int = 0,
        gain_db: float = 0.0,
        noise_snr_db: tuple[float, ...] = (),
        noise_prob: float = 0.5,
        pad_to_frames: int = 0,
        utterance_mean_norm: bool = False,
        speaker_norms: dict[str, SpeakerNorm] | None = None,
        packer: RowPacker | None = None,
        seed: int = 0,
    ) -> None:
        if speed_perturb and features.precomputed:
            raise ValueError(
                f"speed_perturb={speed_perturb} needs on-the-fly features (FeatureConfig.precomputed=False)"
            )
        if waveform is not None and features.precomputed:
            raise ValueError("waveform augmentation needs on-the-fly features (FeatureConfig.precomputed=False)")
        if stats is not None and stats.num_bins != features.num_mel_bins:
            raise ValueError(
                f"feature stats have {stats.num_bins} bins but FeatureConfig.num_mel_bins={features.num_mel_bins}; "
                "recompute feature_stats.safetensors"
            )
        self.features = features
        self.tokenizer = tokenizer
        self.stats = stats
        self.spec_augment = SpecAugment(spec_augment) if spec_augment is not None and spec_augment.enabled else None
        self.perturb = speed_perturbation(speed_perturb, seed)
        self.waveform = waveform
        self.waveform_from_epoch = waveform_from_epoch
        self.waveform_now = waveform is not None and waveform_from_epoch == 0  # until ``reseed`` names the epoch
        self.gain_db = gain_db
        self.noise_snr_db = () if waveform is not None and waveform.noise is not None else noise_snr_db
        self.noise_prob = noise_prob
        self.pad_to_frames = pad_to_frames
        self.utterance_mean_norm = utterance_mean_norm
        self.speaker_norms = speaker_norms
        self.packer = packer
        self.input = input_strategy(features)

    def reseed(self, seed: int, epoch: int | None = None) -> None:
        """Restart the speed perturbation's and the waveform augmentation's random streams from ``seed`` (the
        loader calls it per batch with the batch's seed and epoch; the waveform augmentation applies from epoch
        ``waveform_from_epoch`` on)."""
        if self.perturb is not None:
            self.perturb.random = random.Random(seed)
        if self.waveform is not None:
            self.waveform.reseed(seed)
            self.waveform_now = epoch is None or epoch >= self.waveform_from_epoch

    def __getitem__(self, cuts: CutSet) -> Batch:
        if len(cuts) == 0:
            raise ValueError("AsrDataset got an empty CutSet for a batch")
        # Packed rows are assigned from the frames the sampler counted, on the cuts as it saw them.
        sizes = [cut_frames(c, self.features.frame_shift_ms / 1000.0) for c in cuts] if self.packer else []
        if self.perturb is not None:
            cuts = self.perturb(cuts)
        if not self.features.precomputed:
            cuts = cuts.map(partial(to_sample_rate, sample_rate=self.features.sample_rate))
        loading = contextlib.nullcontext()
        if self.waveform is not None and self.waveform_now:
            cuts, loading = self.waveform(cuts), self.waveform.loading()
        with loading:  # the audio is read here, and the waveform augmentation applied to it
            feats, feat_lens = self.input(cuts)  # (B, T, F), (B,)
        feats, feat_lens = feats.float(), true_lengths(cuts, feat_lens.long(), self.features)
        feats, _ = repair_non_finite_features(feats, cuts, None if self.stats is None else self.stats.mean)
        feats = random_gain(feats, self.gain_db)
        if self.noise_snr_db:
            low, high = self.noise_snr_db
            feats = add_noise(feats, feat_lens, (low, high), self.noise_prob, self.features.sample_rate)
        if self.features.normalize == "utterance":
            feats = normalize_utterances(feats, feat_lens)  # padding -> 0
        elif self.stats is not None:
            feats = self.stats.normalize(feats, feat_lens)  # padding -> 0
        else:
            valid = torch.arange(feats.shape[1]) < feat_lens[:, None]  # (B, T)
            feats = feats.masked_fill(~valid[:, :, None], 0.0)
        if self.utterance_mean_norm:
            feats = subtract_utterance_mean(feats, feat_lens)
        if self.speaker_norms is not None:
            feats = self._normalize_speakers(feats, feat_lens, cuts)
        if self.spec_augment is not None:
            feats = self.spec_augment(feats, feat_lens)
        if self.pad_to_frames > 0:  # a few static time lengths for a compiled step
            extra = -feats.shape[1] % self.pad_to_frames
            feats = torch.nn.functional.pad(feats, (0, 0, 0, extra))  # (B, T + extra, F), zeros
        packing = None
        cuts = list(cuts)
        if self.packer is not None:  # (R, N, F) rows; the utterances from now on in row-major order
            order, feats, feat_lens, packing = self.packer.pack(feats, feat_lens, sizes)
            cuts = [cuts[i] for i in order]
        texts = [cut_text(c) for c in cuts]
        tokens, token_lens = self._tokenize(texts)
        return Batch(
            features=feats,
            feature_lens=feat_lens,
            tokens=tokens,
            token_lens=token_lens,
            texts=texts,
            languages=[cut_language(c) for c in cuts],
            cut_ids=[c.id for c in cuts],
            packing=packing,
        )

    def _normalize_speakers(self, feats: torch.Tensor, feat_lens: torch.Tensor, cuts: CutSet) -> torch.Tensor:
        """feats (B, T, F) normalized -> each utterance through its speaker's ``SpeakerNorm``; padding stays 0."""
        norms = []
        for cut in cuts:
            speaker = cut_speaker(cut)
            if speaker not in self.speaker_norms:
                raise ValueError(f"cut {cut.id!r}: speaker {speaker!r} has no mean (data.speaker_mean_norm)")
            norms.append(self.speaker_norms[speaker])
        shifts = torch.stack([n.shift for n in norms])  # (B, F)
        return shift_per_utterance(feats, feat_lens, shifts, torch.stack([n.scale for n in norms]))

    def _tokenize(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, U) int64 padded with -1, and (B,) lengths; (B, 0) without a tokenizer."""
        if self.tokenizer is None:
            return torch.empty(len(texts), 0, dtype=torch.int64), torch.zeros(len(texts), dtype=torch.int64)
        ids = [self.tokenizer.encode(t) if t else [] for t in texts]
        lens = torch.tensor([len(i) for i in ids], dtype=torch.int64)
        tokens = torch.full((len(ids), max(map(len, ids), default=0)), TOKEN_PAD, dtype=torch.int64)
        for row, seq in enumerate(ids):
            tokens[row, : len(seq)] = torch.tensor(seq, dtype=torch.int64)
        return tokens, lens
