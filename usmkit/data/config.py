"""Typed configs for the data pipeline: features, SpecAugment and the loader.

The lead composes these into the top-level Hydra config; library code only ever sees these frozen
dataclasses. Validation happens in ``__post_init__`` so a bad value fails at construction, naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

OnBadInput = Literal["error", "skip"]
FBANKS = ("lhotse", "seamless_m4t")
NORMALIZATIONS = ("global", "utterance")


@dataclass(frozen=True)
class FeatureConfig:
    """Kaldi-compatible log-mel filterbank (lhotse ``Fbank``).

    ``precomputed=True`` reads features stored once with lhotse (``LilcomChunkyWriter``) under
    ``{manifest_dir}/feats_{split}``; ``False`` computes them in the loader workers on every batch.
    Precomputed is the default because reading stored features is several times faster than computing
    them, in-process and in workers (``bench/data_throughput.py``).
    Speed perturbation changes the waveform, so it needs on-the-fly features: combining
    ``precomputed=True`` with ``DataConfig.speed_perturb`` is rejected by ``DataConfig``.
    """

    num_mel_bins: int = 80
    frame_shift_ms: float = 10.0
    frame_length_ms: float = 25.0
    sample_rate: int = 16000
    precomputed: bool = True
    # lhotse's Fbank, or seamless_m4t: Kaldi's fbank as transformers' SeamlessM4TFeatureExtractor computes it
    # (16-bit sample scale, 20 Hz to Nyquist, only frames wholly inside the audio), for w2v-BERT 2.0
    fbank: str = "lhotse"
    # global: the corpus's mean and variance per bin (feature_stats.safetensors); utterance: each utterance's
    # own (unbiased variance), as SeamlessM4T's extractor does; reads the whole utterance, so not for streaming
    normalize: str = "global"

    def __post_init__(self) -> None:
        if self.fbank not in FBANKS:
            raise ValueError(f"FeatureConfig.fbank={self.fbank!r} is unknown; choose one of {FBANKS}")
        if self.normalize not in NORMALIZATIONS:
            raise ValueError(f"FeatureConfig.normalize={self.normalize!r} is unknown; choose one of {NORMALIZATIONS}")
        if self.num_mel_bins <= 0:
            raise ValueError(f"FeatureConfig.num_mel_bins must be > 0, got {self.num_mel_bins}")
        if not 0 < self.frame_shift_ms <= self.frame_length_ms:
            raise ValueError(
                f"FeatureConfig needs 0 < frame_shift_ms <= frame_length_ms, got "
                f"frame_shift_ms={self.frame_shift_ms}, frame_length_ms={self.frame_length_ms}"
            )
        if self.sample_rate <= 0:
            raise ValueError(f"FeatureConfig.sample_rate must be > 0, got {self.sample_rate}")


def seamless_m4t_features(**overrides) -> FeatureConfig:
    """The features of w2v-BERT 2.0 (SeamlessM4T): 80-bin Kaldi fbank at 10 ms, each utterance normalized on its
    own; the encoder stacks 2 frames into one (``ConformerConfig(front_end="stack")``)."""
    return FeatureConfig(**({"num_mel_bins": 80, "fbank": "seamless_m4t", "normalize": "utterance"} | overrides))


@dataclass(frozen=True)
class SpecAugmentConfig:
    """SpecAugment (Park et al. 2019), adaptive time masks as in the Conformer/USM recipes.

    Each utterance gets ``freq_masks`` frequency masks of width ~U[0, freq_width] bins and
    ``time_masks`` time masks of width ~U[0, time_width_ratio * its own length] frames.
    Applied to normalized features (mask value 0 = the global mean), training only.
    """

    freq_masks: int = 2
    freq_width: int = 27
    time_masks: int = 10
    time_width_ratio: float = 0.05
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.freq_masks < 0 or self.time_masks < 0:
            raise ValueError(
                f"SpecAugmentConfig mask counts must be >= 0, got freq_masks={self.freq_masks}, "
                f"time_masks={self.time_masks}"
            )
        if self.freq_width < 0:
            raise ValueError(f"SpecAugmentConfig.freq_width must be >= 0, got {self.freq_width}")
        if not 0.0 <= self.time_width_ratio <= 1.0:
            raise ValueError(f"SpecAugmentConfig.time_width_ratio must be in [0, 1], got {self.time_width_ratio}")


@dataclass(frozen=True)
class DataConfig:
    """Where the manifests are and how training/eval batches are drawn from them.

    - ``max_duration``: seconds of audio per batch (lhotse ``DynamicBucketingSampler``).
    - ``num_workers``: DataLoader worker processes; 1 overlaps loading with the training step.
    - ``speed_perturb``: factors drawn per cut in training, e.g. ``(0.9, 1.0, 1.1)``; ``()`` (the
      default, to go with precomputed features) disables it. Needs ``features.precomputed=False``.
    - ``language_temperature`` T: language l is drawn with probability proportional to n_l^(1/T)
      (n_l = its number of cuts), as USM samples its languages. T=1 keeps natural proportions and
      finite epochs; T>1 flattens towards uniform and makes the training stream infinite
      (every language repeats), so training is counted in steps, not epochs.
    - ``labeled_fraction``: keep this fraction of the labeled training cuts (low-label studies);
      the subset is deterministic by seed and nested (10% is inside 20%).
    - ``gain_db``: training utterances get a random loudness change in [-gain_db, +gain_db] dB
      (applied to the log-mel features; 0 disables), for speakers recorded at other levels.
    - ``noise_snr_db`` / ``noise_prob``: a share ``noise_prob`` of the training utterances gets
      stationary colored background noise at an SNR uniform in ``noise_snr_db = (low, high)`` dB,
      inside the recording's own band (applied to the log-mel features; ``()`` disables), for
      speakers recorded with more noise than the training set.
    - ``noise_cuts``: a lhotse cuts manifest of noise recordings (e.g. MUSAN's noise part). With it, the noise
      of ``noise_snr_db`` / ``noise_prob`` is mixed into the waveform from these recordings (lhotse
      ``CutSet.mix``; a random window of a random recording, at an SNR uniform in ``noise_snr_db``) instead of
      the synthetic noise on the features. Needs ``features.precomputed=False``.
    - ``reverb_prob``: a share of the training cuts reverberated with a synthetic room impulse response
      (lhotse's random-room generator). Needs ``features.precomputed=False``.
    - ``narrowband_prob``: a share of the training cuts through a telephone channel (the band cut at 3.4 kHz,
      then lhotse ``Narrowband``: down to 8 kHz, the G.711 mu-law codec, back up), for narrowband audio.
      Needs ``features.precomputed=False``.
    - ``lowpass_prob`` / ``lowpass_hz``: a share of the training cuts low-passed at a cut-off drawn
      log-uniformly in ``lowpass_hz = (low, high)`` Hz (lhotse's resampling low-pass), for band-limited audio;
      ``narrowband_prob + lowpass_prob <= 1`` (each cut gets at most one channel). Needs
      ``features.precomputed=False``; ``usmkit.data.waveform_augment`` says how the four combine.
    - ``waveform_augment_from_epoch``: the four above apply from this epoch of the training split on (0: from
      the first); the epochs before train on the audio as recorded, e.g. through CTC's all-blank start, which
      band-limited and reverberated audio can prolong. Counted by the loader, so a resumed run agrees.
    - ``pad_to_frames``: pad each batch's feature frames up to a multiple of this (0 = off). With
      ``trainer.compile=true`` it keeps the compiled step to a few static time lengths (use 256);
      without compilation it only wastes compute.
    - ``fixed_batch_shapes``: training batches of a few fixed shapes, for CUDA graphs
      (``trainer.compile_mode=reduce-overhead``), which record one graph per shape. Cuts are bucketed by
      their frames padded to ``pad_to_frames`` (needs it > 0), and a batch of padded length L holds exactly
      ``max_duration / (L x frame shift)`` cuts, so the number of shapes is the number of padded lengths.
      Per epoch, each length's last incomplete batch waits for a later epoch (the log says how many cuts);
      refused with ``speed_perturb`` (it changes lengths after batching). Evaluation is unchanged.
    - ``pack_to_frames``: training batches of packed rows (0 = off): several whole utterances share each row
      of this many feature frames, and a batch is always ``max_duration / (pack_to_frames x frame shift)``
      rows, so a compiled step sees one shape (CUDA graphs: one graph) and computes little padding. The
      model keeps the utterances apart and the losses see each alone (``usmkit.data.packing``). Cuts must fit
      a row: ``max_cut_duration`` at most a row's seconds. Not with ``pad_to_frames`` or ``fixed_batch_shapes``
      (packing fixes the shape itself), ``speed_perturb`` (it changes lengths after batching) or ``shar_dir``.
      Evaluation is unchanged.
    - ``utterance_mean_norm``: after global normalization, subtract each utterance's own per-bin mean
      (CMN; removes recording-level gain and channel offsets). Needs the whole utterance, so models
      trained with it decode offline (``usmkit.cli.evaluate``), not with streaming ``usmkit-transcribe``.
    - ``speaker_mean_norm``: after global normalization, subtract each speaker's own per-bin mean,
      computed over all of that speaker's utterances in the set being loaded (Kaldi's per-speaker
      CMN: removes the speaker's microphone and room, keeps what distinguishes one word from another,
      which a single short utterance's own mean does not). At evaluation a test speaker's mean comes
      from that speaker's test utterances (unlabeled), as in Kaldi recipes. Offline decoding only.
    - ``speaker_var_norm``: with ``speaker_mean_norm``, also scale each bin to the global std by the
      speaker's own (per-speaker CMVN): a speaker with a narrower dynamic range (a quieter recording
      over the same noise floor) is stretched to the others'.
    - ``max_cut_duration``: training cuts longer than this (seconds) are left out (counted in the log).
    - ``max_text_tokens``: training leaves out transcribed cuts and text-only sentences (MOST) of more tokens
      than this (counted in the log; 0 = no such limit), and always the cuts whose transcripts have more
      tokens than the cut has feature frames (no encoder has the frames to emit them).
    - ``on_bad_input``: ``"error"`` raises ``BadInputError`` naming the file; ``"skip"`` drops the
      cut and logs one summary line of everything dropped.
    - ``allow_urls``: let recordings load from ``url`` sources (downloads); off, only files are read.
      Other lhotse source types (``command`` runs a shell command) are always refused.
    - ``shar_dir``: the training split streams from lhotse Shar shards in ``<shar_dir>/<train_split>/``
      (``python -m usmkit.cli.prepare shar``; ``usmkit.data.shar``), each process and loader worker reading its
      own; the dev split, the tokenizer and the feature statistics stay with ``manifest_dir``. Features are
      computed on the fly, and what needs the whole split in memory (``language_temperature``,
      ``labeled_fraction``, speaker norms, ``fixed_batch_shapes``) is refused.
    """

    manifest_dir: str = "data/synth"
    corpus: str = "synth"
    train_split: str = "train"
    dev_split: str = "dev"
    max_duration: float = 200.0
    num_buckets: int = 10
    shuffle: bool = True
    num_workers: int = 1
    speed_perturb: tuple[float, ...] = ()
    gain_db: float = 0.0
    noise_snr_db: tuple[float, ...] = ()
    noise_prob: float = 0.5
    noise_cuts: str | None = None
    reverb_prob: float = 0.0
    narrowband_prob: float = 0.0
    lowpass_prob: float = 0.0
    lowpass_hz: tuple[float, ...] = (3000.0, 7000.0)
    waveform_augment_from_epoch: int = 0
    pad_to_frames: int = 0
    fixed_batch_shapes: bool = False
    pack_to_frames: int = 0
    language_temperature: float = 1.0
    on_bad_input: OnBadInput = "error"
    allow_urls: bool = False
    features: FeatureConfig = field(default_factory=FeatureConfig)
    spec_augment: SpecAugmentConfig = field(default_factory=SpecAugmentConfig)
    labeled_fraction: float = 1.0
    max_cut_duration: float = 30.0
    max_text_tokens: int = 1000
    utterance_mean_norm: bool = False
    speaker_mean_norm: bool = False
    speaker_var_norm: bool = False
    shar_dir: str | None = None

    def __post_init__(self) -> None:
        if self.shar_dir:
            refused = [
                name
                for name, on in (
                    ("features.precomputed=true", self.features.precomputed),
                    (f"language_temperature={self.language_temperature:g}", self.language_temperature != 1.0),
                    (f"labeled_fraction={self.labeled_fraction:g}", self.labeled_fraction != 1.0),
                    ("speaker_mean_norm=true", self.speaker_mean_norm),
                    ("fixed_batch_shapes=true", self.fixed_batch_shapes),
                )
                if on
            ]
            if refused:
                raise ValueError(
                    f"DataConfig.shar_dir streams the training audio from shards, which does not go with "
                    f"{', '.join(refused)}: drop those, or leave shar_dir unset to read the manifests"
                )
        if self.max_duration <= 0:
            raise ValueError(f"DataConfig.max_duration must be > 0 seconds, got {self.max_duration}")
        if self.num_buckets < 1:
            raise ValueError(f"DataConfig.num_buckets must be >= 1, got {self.num_buckets}")
        if self.num_workers < 0:
            raise ValueError(f"DataConfig.num_workers must be >= 0, got {self.num_workers}")
        if any(f <= 0 for f in self.speed_perturb):
            raise ValueError(f"DataConfig.speed_perturb factors must be > 0, got {self.speed_perturb}")
        if self.speed_perturb and self.features.precomputed:
            raise ValueError(
                f"DataConfig.speed_perturb={self.speed_perturb} changes the waveform, so it needs on-the-fly "
                "features: set features.precomputed=False, or speed_perturb=() to keep precomputed features"
            )
        if self.pad_to_frames < 0:
            raise ValueError(f"DataConfig.pad_to_frames must be >= 0 (0 = off), got {self.pad_to_frames}")
        if self.fixed_batch_shapes and self.pad_to_frames == 0:
            raise ValueError(
                "DataConfig.fixed_batch_shapes=true buckets cuts by their padded length: set pad_to_frames "
                "(e.g. 256) too"
            )
        if self.fixed_batch_shapes and self.speed_perturb:
            raise ValueError(
                f"DataConfig.fixed_batch_shapes=true with speed_perturb={list(self.speed_perturb)}: speed "
                "changes a cut's length after it is batched, so shapes would not stay fixed; drop one of them"
            )
        self._check_packing()
        if self.gain_db < 0:
            raise ValueError(f"DataConfig.gain_db must be >= 0 (a range in dB), got {self.gain_db}")
        if self.noise_snr_db and (len(self.noise_snr_db) != 2 or self.noise_snr_db[0] > self.noise_snr_db[1]):
            raise ValueError(
                f"DataConfig.noise_snr_db must be () (off) or [low, high] dB with low <= high, got {list(self.noise_snr_db)}"
            )
        if not 0.0 <= self.noise_prob <= 1.0:
            raise ValueError(f"DataConfig.noise_prob must be in [0, 1], got {self.noise_prob}")
        self._check_waveform_augmentation()
        if self.speaker_mean_norm and self.utterance_mean_norm:
            raise ValueError(
                "DataConfig.speaker_mean_norm and utterance_mean_norm both subtract a mean; pick one of them"
            )
        if self.speaker_var_norm and not self.speaker_mean_norm:
            raise ValueError("DataConfig.speaker_var_norm=true needs speaker_mean_norm=true (CMVN = mean and variance)")
        if self.language_temperature <= 0:
            raise ValueError(f"DataConfig.language_temperature must be > 0, got {self.language_temperature}")
        if self.on_bad_input not in ("error", "skip"):
            raise ValueError(f"DataConfig.on_bad_input must be 'error' or 'skip', got {self.on_bad_input!r}")
        if not 0.0 < self.labeled_fraction <= 1.0:
            raise ValueError(f"DataConfig.labeled_fraction must be in (0, 1], got {self.labeled_fraction}")
        if self.max_cut_duration <= 0:
            raise ValueError(f"DataConfig.max_cut_duration must be > 0 seconds, got {self.max_cut_duration}")
        if self.max_text_tokens < 0:
            raise ValueError(f"DataConfig.max_text_tokens must be >= 0 (0 = no limit), got {self.max_text_tokens}")

    def _check_packing(self) -> None:
        if self.pack_to_frames < 0:
            raise ValueError(f"DataConfig.pack_to_frames must be >= 0 (0 = off), got {self.pack_to_frames}")
        if self.pack_to_frames == 0:
            return
        refused = [
            name
            for name, on in (
                (f"pad_to_frames={self.pad_to_frames}", self.pad_to_frames > 0),
                ("fixed_batch_shapes=true", self.fixed_batch_shapes),
                (f"speed_perturb={list(self.speed_perturb)}", bool(self.speed_perturb)),
                (f"shar_dir={self.shar_dir}", bool(self.shar_dir)),
            )
            if on
        ]
        if refused:
            raise ValueError(
                f"DataConfig.pack_to_frames={self.pack_to_frames} packs fixed rows itself, which does not go with "
                f"{', '.join(refused)}: drop those, or set pack_to_frames=0"
            )
        row_s = self.pack_to_frames * self.features.frame_shift_ms / 1000.0
        if self.max_cut_duration > row_s:
            raise ValueError(
                f"DataConfig.pack_to_frames={self.pack_to_frames} makes rows of {row_s:g} s, shorter than "
                f"max_cut_duration={self.max_cut_duration:g} s: set max_cut_duration={row_s:g} (longer cuts are "
                "left out of training) or raise pack_to_frames"
            )
        shift_s = self.features.frame_shift_ms / 1000.0
        most = int(self.max_duration / shift_s + 1e-6)  # a batch is max_duration seconds of rows
        if self.pack_to_frames > most:
            least = math.ceil(self.max_cut_duration / shift_s - 1e-6)
            raise ValueError(
                f"DataConfig.pack_to_frames={self.pack_to_frames} makes rows of {row_s:g} s, longer than a whole "
                f"batch (max_duration={self.max_duration:g} s): set pack_to_frames between {least} (a row holds "
                f"max_cut_duration={self.max_cut_duration:g} s) and {most} (one row a batch)"
            )

    @property
    def waveform_augmentation_on(self) -> list[str]:
        """The waveform augmentations that are on, as ``key=value`` (empty: none)."""
        on = [
            (f"noise_cuts={self.noise_cuts}", bool(self.noise_cuts)),
            (f"reverb_prob={self.reverb_prob:g}", self.reverb_prob > 0),
            (f"narrowband_prob={self.narrowband_prob:g}", self.narrowband_prob > 0),
            (f"lowpass_prob={self.lowpass_prob:g}", self.lowpass_prob > 0),
        ]
        return [name for name, is_on in on if is_on]

    def _check_waveform_augmentation(self) -> None:
        if self.waveform_augment_from_epoch < 0:
            raise ValueError(
                f"DataConfig.waveform_augment_from_epoch must be >= 0 (0: from the first epoch), got "
                f"{self.waveform_augment_from_epoch}"
            )
        for key in ("reverb_prob", "narrowband_prob", "lowpass_prob"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"DataConfig.{key} must be in [0, 1], got {getattr(self, key)}")
        if self.narrowband_prob + self.lowpass_prob > 1.0:
            raise ValueError(
                f"DataConfig.narrowband_prob + lowpass_prob must be <= 1 (each cut gets at most one channel), got "
                f"{self.narrowband_prob:g} + {self.lowpass_prob:g}"
            )
        nyquist = self.features.sample_rate / 2
        bad_band = len(self.lowpass_hz) != 2 or not 0 < self.lowpass_hz[0] <= self.lowpass_hz[1] < nyquist
        if self.lowpass_prob > 0 and bad_band:
            raise ValueError(
                f"DataConfig.lowpass_hz must be [low, high] Hz with 0 < low <= high < {nyquist:g} (half the feature "
                f"rate), got {list(self.lowpass_hz)}"
            )
        if self.noise_cuts and not self.noise_snr_db:
            raise ValueError(
                f"DataConfig.noise_cuts={self.noise_cuts} mixes its noise at the SNR of noise_snr_db: set it too, "
                "e.g. noise_snr_db=[5,20]"
            )
        on = self.waveform_augmentation_on
        if on and self.features.precomputed:
            raise ValueError(
                f"DataConfig {', '.join(on)} changes the waveform, so it needs on-the-fly features: set "
                "features.precomputed=false, or turn it off"
            )
