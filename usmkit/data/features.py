"""Log-mel filterbank features: lhotse ``Fbank`` on the fly, or computed once and stored with lhotse.

Shapes: B batch, T feature frames (10 ms hop), F mel bins (80).

Precomputed features live in ``{manifest_dir}/feats_{split}/`` (``feats_{split}_{rate}hz/`` for a
feature rate other than 16 kHz, so narrowband and wideband runs over one corpus keep their own
caches): lhotse writes one array per cut
(``NumpyFilesWriter``) and we keep the cut manifest that points at them (``cuts.jsonl.gz``) plus the
feature config it was made with (``feature_config.json``). The cache is reused when the config matches
and every requested cut is in it; cuts missing from it are computed and appended; a different
config rebuilds it. Runs that need the same cache at once take turns (a lock file beside it,
``feats_{split}.lock``): the first computes, the others then find the features stored. A cache whose
computation was killed before it wrote its config (arrays, maybe its manifest, no
``feature_config.json``) is computed again, with a warning; a folder holding anything else is not
ours, and is refused rather than deleted.

Storage format: ``NumpyFilesWriter`` (raw float32 ``.npy``). lhotse's ``LilcomChunkyWriter`` is 4x
smaller but needs the ``lilcom`` package, which usmkit does not depend on; raw arrays also decode
fastest, and reading speed is what the loader needs.

``FeatureConfig.fbank="seamless_m4t"`` (w2v-BERT 2.0's features) is ``SeamlessFbank``: torchaudio's Kaldi
fbank with SeamlessM4T's settings, as a lhotse extractor, so it is stored and computed on the fly the same way.

On-the-fly extraction is lhotse's batched path (faster than one cut at a time); it zero-pads
shorter waveforms, so the last frame of a cut can differ slightly from the stored one (all other
frames agree to 1e-4).
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torchaudio
from filelock import FileLock
from lhotse import CutSet, Fbank, FbankConfig, NumpyFilesWriter
from lhotse.cut import Cut
from lhotse.dataset import OnTheFlyFeatures, PrecomputedFeatures
from lhotse.dataset.input_strategies import BatchIO
from lhotse.features.base import FeatureExtractor, register_extractor
from lhotse.utils import compute_num_frames, fastcopy

from usmkit.checkpointing.atomic import replaced_atomically
from usmkit.data.config import FeatureConfig
from usmkit.data.manifests import read_cuts, write_manifest
from usmkit.data.validate import BadInputError, OnBad, Problem, ValidationReport

log = logging.getLogger(__name__)

CUTS_FILE = "cuts.jsonl.gz"
CONFIG_FILE = "feature_config.json"


@dataclass
class SeamlessFbankConfig:
    sampling_rate: int = 16000
    num_mel_bins: int = 80
    frame_shift_ms: float = 10.0
    frame_length_ms: float = 25.0

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict) -> SeamlessFbankConfig:
        return SeamlessFbankConfig(**data)


@register_extractor
class SeamlessFbank(FeatureExtractor):
    """Log-mel filterbank as transformers' ``SeamlessM4TFeatureExtractor`` computes it before its normalization
    and stacking: Kaldi's fbank (``torchaudio.compliance.kaldi.fbank``: povey window, pre-emphasis 0.97, DC
    offset removed, power spectrum, no dither) of the samples at 16-bit scale, mel bins from 20 Hz to Nyquist,
    frames wholly inside the audio (``snip_edges``: ``1 + (N - 400) // 160`` frames at 16 kHz).
    (lhotse's ``Fbank`` differs in scale, band edge and edge frames; this class is the missing one.)

    lhotse's manifests hold ``round(N / 160)`` frames per cut whatever the extractor, so the array is padded with
    zeros to that count; ``AsrDataset`` counts only the first ``seamless_frames(N)`` (``true_lengths``).
    """

    name = "seamless-m4t-fbank"
    config_type = SeamlessFbankConfig

    @property
    def frame_shift(self) -> float:
        return self.config.frame_shift_ms / 1000.0

    def feature_dim(self, sampling_rate: int) -> int:
        return self.config.num_mel_bins

    def extract(self, samples: np.ndarray | torch.Tensor, sampling_rate: int) -> np.ndarray:
        """samples (N,) or (1, N) in [-1, 1] -> (T, num_mel_bins) float32 log-mel."""
        if sampling_rate != self.config.sampling_rate:
            raise ValueError(
                f"SeamlessFbank is set for {self.config.sampling_rate} Hz, got audio at {sampling_rate} Hz"
            )
        x = torch.as_tensor(samples, dtype=torch.float32).reshape(1, -1) * 32768.0  # (1, N) at 16-bit scale
        if x.shape[1] < self.config.frame_length_ms * sampling_rate / 1000:
            return np.zeros((0, self.config.num_mel_bins), dtype=np.float32)
        feats = torchaudio.compliance.kaldi.fbank(
            x,
            num_mel_bins=self.config.num_mel_bins,
            sample_frequency=sampling_rate,
            frame_shift=self.config.frame_shift_ms,
            frame_length=self.config.frame_length_ms,
            dither=0.0,
            low_freq=20.0,
            high_freq=0.0,
            snip_edges=True,
        )  # (T, F)
        lhotse_frames = compute_num_frames(x.shape[1] / sampling_rate, self.frame_shift, sampling_rate)
        return torch.nn.functional.pad(feats, (0, 0, 0, max(0, lhotse_frames - feats.shape[0]))).numpy()


def seamless_window_frames(windows: torch.Tensor, cfg: FeatureConfig) -> torch.Tensor:
    """The ``SeamlessFbank`` frames (t, F) of raw windows (t, L) of ``frame_length_ms`` samples each: one Kaldi frame
    per window (each frame depends on its own window only, so the windows can be laid end to end and framed with
    a shift of a whole window). What a stream computes as its samples arrive."""
    if windows.shape[0] == 0:
        return torch.zeros(0, cfg.num_mel_bins)
    return torchaudio.compliance.kaldi.fbank(
        windows.reshape(1, -1).float() * 32768.0,
        num_mel_bins=cfg.num_mel_bins,
        sample_frequency=cfg.sample_rate,
        frame_shift=cfg.frame_length_ms,
        frame_length=cfg.frame_length_ms,
        dither=0.0,
        low_freq=20.0,
        high_freq=0.0,
        snip_edges=True,
    )  # (t, F)


def seamless_frames(num_samples: int, cfg: FeatureConfig) -> int:
    """Frames of ``SeamlessFbank`` wholly inside ``num_samples`` samples: ``1 + (N - 400) // 160`` at 16 kHz.

    >>> seamless_frames(64000, FeatureConfig(fbank="seamless_m4t"))
    398
    """
    window = int(cfg.frame_length_ms * cfg.sample_rate / 1000)
    hop = int(cfg.frame_shift_ms * cfg.sample_rate / 1000)
    return 0 if num_samples < window else 1 + (num_samples - window) // hop


def true_lengths(cuts: CutSet, feature_lens: torch.Tensor, cfg: FeatureConfig) -> torch.Tensor:
    """The valid frames of each cut's features (B,): ``feature_lens`` as lhotse counts them, fewer for
    ``SeamlessFbank`` (its frames wholly inside the audio)."""
    if cfg.fbank != "seamless_m4t":
        return feature_lens
    snipped = torch.tensor([seamless_frames(c.num_samples, cfg) for c in cuts], dtype=feature_lens.dtype)
    return torch.minimum(feature_lens, snipped)


def fbank_extractor(cfg: FeatureConfig) -> Fbank | SeamlessFbank:
    """The lhotse (kaldi-compatible) log-mel extractor for ``cfg``."""
    if cfg.fbank == "seamless_m4t":
        return SeamlessFbank(
            SeamlessFbankConfig(cfg.sample_rate, cfg.num_mel_bins, cfg.frame_shift_ms, cfg.frame_length_ms)
        )
    return Fbank(
        FbankConfig(
            sampling_rate=cfg.sample_rate,
            num_filters=cfg.num_mel_bins,
            frame_shift=cfg.frame_shift_ms / 1000.0,
            frame_length=cfg.frame_length_ms / 1000.0,
        )
    )


def input_strategy(cfg: FeatureConfig) -> BatchIO:
    """lhotse input strategy: reads stored features, or computes them from audio per batch.

    Both return ``(features (B, T, F), feature_lens (B,))``, padded with log(1e-10).
    """
    if cfg.precomputed:
        return PrecomputedFeatures()
    return OnTheFlyFeatures(fbank_extractor(cfg))


def rate_suffix(sample_rate: int) -> str:
    """File-name suffix of a feature rate: none for the default 16 kHz, else ``_{rate}hz``."""
    return "" if sample_rate == 16000 else f"_{sample_rate}hz"


def feature_storage_dir(manifest_dir: str | Path, split: str, sample_rate: int = 16000) -> Path:
    return Path(manifest_dir) / f"feats_{split}{rate_suffix(sample_rate)}"


def to_sample_rate(cut: Cut, sample_rate: int) -> Cut:
    """``cut`` resampled lazily (lhotse) to ``sample_rate``; unchanged when already there."""
    return cut if cut.sampling_rate == sample_rate else cut.resample(sample_rate)


def precompute_features(
    cuts: CutSet,
    cfg: FeatureConfig,
    storage_dir: str | Path,
    *,
    num_jobs: int = 1,
    on_bad: OnBad = "error",
    report: ValidationReport | None = None,
) -> CutSet:
    """Attach stored fbank features to ``cuts``, computing only what ``storage_dir`` lacks.

    Returns the cuts (same ids, same order) with ``cut.features`` pointing into ``storage_dir``: each is the
    cut given, transcripts included, with its stored features attached; a stored cut whose audio span differs
    from the one given (same id, another recording, start or duration) is computed again. lhotse
    leaves out a cut whose audio fails to decode while its features are computed (damage that
    validation did not reach); such a cut raises ``BadInputError`` naming it (``on_bad="error"``) or is
    left out, counted in ``report`` and logged (``"skip"``).
    """
    storage_dir = Path(storage_dir)
    wanted = CutSet.from_cuts(to_sample_rate(c, cfg.sample_rate) for c in cuts)
    cached = _read_complete_cache(storage_dir, cfg)
    if cached is None or any(not _same_audio(cached.get(c.id), c) for c in wanted):
        # Another run may be computing this cache: wait for it, then compute only what it lacks. (No
        # lock is taken when the cache is complete, so a read-only corpus with its features works.)
        storage_dir.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(storage_dir.with_name(storage_dir.name + ".lock")):
            cached = _load_cache(storage_dir, cfg)
            missing = CutSet.from_cuts(c for c in wanted if not _same_audio(cached.get(c.id), c))
            if len(missing) > 0:
                log.info("computing fbank features for %d of %d cuts into %s", len(missing), len(wanted), storage_dir)
                storage_dir.mkdir(parents=True, exist_ok=True)
                computed = missing.compute_and_store_features(
                    extractor=fbank_extractor(cfg),
                    storage_path=storage_dir,
                    storage_type=NumpyFilesWriter,
                    num_jobs=num_jobs,
                    progress_bar=False,
                )
                cached.update({c.id: c for c in computed})
                _save_cache(storage_dir, cfg, cached)
    failed = [c for c in wanted if c.id not in cached]
    for cut in failed:
        problem = Problem("corrupt audio", _audio_name(cut), "its audio failed to decode while computing its features")
        if on_bad == "error":
            raise BadInputError(problem.kind, f"{problem.name} (cut {cut.id})", problem.detail)
        if report is not None:
            report.problems.append(problem)
    if failed:
        log.warning("left out %d of %d cuts whose audio failed to decode: %s", len(failed), len(wanted), failed[0].id)
    return CutSet.from_cuts(fastcopy(c, features=cached[c.id].features) for c in wanted if c.id in cached)


def _same_audio(stored: Cut | None, cut: Cut) -> bool:
    """Whether ``stored`` (a cut of the feature cache) covers the audio span of ``cut``: its features are
    then ``cut``'s, whatever else (transcripts, speakers) the manifest changed since."""
    return (
        stored is not None
        and stored.recording_id == cut.recording_id
        and stored.start == cut.start
        and stored.duration == cut.duration
    )


def _audio_name(cut: Cut) -> str:
    files = [s.source for s in cut.recording.sources] if cut.has_recording else []
    return str(files[0]) if files else cut.id


def _read_complete_cache(storage_dir: Path, cfg: FeatureConfig) -> dict[str, Cut] | None:
    """The cached cuts when ``storage_dir`` holds a finished cache of ``cfg`` (else None); changes nothing."""
    cuts_path, config_path = storage_dir / CUTS_FILE, storage_dir / CONFIG_FILE
    if not (config_path.is_file() and cuts_path.is_file()):
        return None
    if json.loads(config_path.read_text()) != _config_record(cfg):
        return None
    return {c.id: c for c in read_cuts(cuts_path)}  # paths relative to the cache, like every manifest


def _load_cache(storage_dir: Path, cfg: FeatureConfig) -> dict[str, Cut]:
    """The cached cuts of ``cfg`` ({} when none); a cache of another config is removed. Under the lock."""
    cached = _read_complete_cache(storage_dir, cfg)
    if cached is not None:
        return cached
    config_path = storage_dir / CONFIG_FILE
    if not config_path.is_file():
        if storage_dir.exists() and any(storage_dir.iterdir()):
            stranger = _not_ours(storage_dir)
            if stranger is not None:
                raise BadInputError(
                    "not a feature cache",
                    str(storage_dir),
                    f"it has no {CONFIG_FILE} and holds {stranger.relative_to(storage_dir)}, which usmkit does not "
                    "write there",
                    hint="move it away, or point data.manifest_dir elsewhere",
                )
            # The lock is ours, so no other run is computing it: a computation was killed before its end.
            log.warning(
                "%s holds features of a computation that stopped before it finished (no %s): computing them again",
                storage_dir,
                CONFIG_FILE,
            )
            shutil.rmtree(storage_dir)
    elif json.loads(config_path.read_text()) != _config_record(cfg):
        # Only ever deletes a directory this module created (it holds our config file).
        log.warning("feature config changed since %s was written: recomputing it", storage_dir)
        shutil.rmtree(storage_dir)
    return {}


def _not_ours(storage_dir: Path) -> Path | None:
    """The first entry of ``storage_dir`` that an unfinished computation of ours cannot have left, or None.

    What one leaves: lhotse's ``NumpyFilesWriter`` arrays (``xyz/<key>.npy``, a folder per key prefix),
    maybe our manifest (written just before the config) and temporary files of our atomic writes.
    """
    for entry in storage_dir.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            stray = next((f for f in entry.iterdir() if not (f.is_file() and f.suffix == ".npy")), None)
            if stray is not None:
                return stray
        elif not (entry.is_file() and (entry.name == CUTS_FILE or entry.name.startswith(".tmp-"))):
            return entry
    return None


def _config_record(cfg: FeatureConfig) -> dict:
    """What ``feature_config.json`` holds for a cache computed with ``cfg``: not the normalization (applied
    after reading), nor ``fbank`` at its default (so caches written before that field existed stay valid)."""
    record = asdict(cfg) | {"precomputed": True}
    del record["normalize"]
    if record["fbank"] == "lhotse":
        del record["fbank"]
    return record


def _save_cache(storage_dir: Path, cfg: FeatureConfig, cuts: dict[str, Cut]) -> None:
    write_manifest(CutSet.from_cuts(cuts.values()), storage_dir / CUTS_FILE)  # atomic (temp file + rename)
    with replaced_atomically(storage_dir / CONFIG_FILE) as tmp:  # read without the lock by other runs
        tmp.write_text(json.dumps(_config_record(cfg), indent=1))
