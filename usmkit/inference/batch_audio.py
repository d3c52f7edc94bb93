"""Audio and features for batch transcription, made in DataLoader worker processes.

Shapes: B batch, N samples, T feature frames (10 ms), F mel bins.

``BatchAudioDataset`` walks this process's work units (``usmkit.inference.batch_inputs``), worker
``w`` of ``k`` taking units ``w, w + k, ...``, and yields for each:

- a ``BatchUnit``: one ``AudioBatch`` holding its files' samples, padded (``features="device"``: the
  main process computes the features on the GPU), or their normalized features (``features="workers"``);
- a ``LongUnit``: its file as ``LongPiece``s of about ``PIECE_SECONDS`` of normalized features each,
  read block by block (``usmkit.streaming.audio.FileSource``) and featurized incrementally
  (``usmkit.streaming.features.StreamingFbank``, equal to the whole file's frames), so no piece of
  the process holds more than a piece of the file;
- for an input that fails to decode (corrupt, cut short): a ``FailedItem`` naming it and why, in
  place of its row or its pieces; the other files of its batch go on.

The features are those of each file alone, as ``usmkit.cli.evaluate`` reads them (lhotse's ``Fbank``,
stored per cut, then the checkpoint's global mean/variance normalization), computed for a padded
batch at once (``padded_batch``, ``FbankFrontEnd``, on any device). Samples from a file are mono (the channel average) at the model's rate (resampled with
torchaudio, NaN/Inf set to 0: ``FileSource``); from a cut, what lhotse's ``load_audio`` gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch
from lhotse.utils import compute_num_frames_from_samples

from usmkit.data.config import FeatureConfig
from usmkit.data.features import fbank_extractor, to_sample_rate
from usmkit.data.normalize import FeatureStats
from usmkit.errors import UsageError
from usmkit.inference.batch_inputs import AudioItem, BatchUnit, LongUnit
from usmkit.streaming.audio import AudioError, FileSource
from usmkit.streaming.features import StreamingFbank

PIECE_SECONDS = 30.0  # audio per LongPiece: what a worker holds of a long file at once


class FbankFrontEnd:
    """Padded samples (B, N) and their counts (B,) -> normalized log-mel (B, T, F) and frames (B,), on the
    device the samples are on (``to(device)`` moves the filterbank there). Padding frames are 0; values
    that are not finite (NaN samples in a cut) become 0, the global mean, as in training."""

    def __init__(self, cfg: FeatureConfig, stats: FeatureStats) -> None:
        if stats.num_bins != cfg.num_mel_bins:
            raise ValueError(f"stats have {stats.num_bins} bins, the features {cfg.num_mel_bins}")
        if cfg.fbank != "lhotse" or cfg.normalize != "global":
            raise UsageError(
                f"batch transcription computes lhotse's fbank with global statistics; this model was trained on "
                f"data.features.fbank={cfg.fbank} normalize={cfg.normalize} (an imported w2v-BERT 2.0): transcribe "
                "its audio with usmkit.cli.evaluate or usmkit-transcribe instead"
            )
        self.cfg = cfg
        self.module = fbank_extractor(cfg).extractor  # lhotse's Wav2LogFilterBank: a torch module
        self.mean, self.std = stats.mean, stats.std

    def to(self, device: torch.device) -> FbankFrontEnd:
        self.module = self.module.to(device)
        self.mean, self.std = self.mean.to(device), self.std.to(device)
        return self

    def frames(self, num_samples: torch.Tensor) -> torch.Tensor:
        """Feature frames of ``num_samples`` samples (B,) -> (B,): lhotse's count for a cut of that length."""
        shift_s = self.cfg.frame_shift_ms / 1000.0
        return torch.tensor(
            [compute_num_frames_from_samples(int(n), shift_s, self.cfg.sample_rate) for n in num_samples.tolist()],
            dtype=torch.int64,
        )

    @torch.no_grad()
    def __call__(self, waves: torch.Tensor, num_samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lens = self.frames(num_samples)
        with torch.autocast(waves.device.type, enabled=False):
            feats = self.module(waves.float())[:, : int(lens.max())]  # (B, T, F)
        valid = (torch.arange(feats.shape[1], device=feats.device) < lens.to(feats.device)[:, None])[:, :, None]
        feats = (feats - self.mean) / self.std
        feats = torch.where(valid & torch.isfinite(feats), feats, torch.zeros((), device=feats.device))
        return feats, lens.to(feats.device)


@dataclass
class AudioBatch:
    """The files of one ``BatchUnit`` that decoded: samples (``waves``, ``num_samples``) or features
    (``features``, ``feature_lens``), rows in ``items`` order; and the ones that did not."""

    items: list[AudioItem]
    failed: list[FailedItem]
    waves: torch.Tensor | None = None  # (B, N) float32, zero-padded
    num_samples: torch.Tensor | None = None  # (B,) int64
    features: torch.Tensor | None = None  # (B, T, F) float32, normalized, padding 0
    feature_lens: torch.Tensor | None = None  # (B,) int64

    def pin_memory(self) -> AudioBatch:
        """Page-locked tensors (``DataLoader(pin_memory=True)`` calls it), for copies that do not wait."""
        pin = lambda t: None if t is None else t.pin_memory()  # noqa: E731
        return replace(
            self,
            waves=pin(self.waves),
            num_samples=pin(self.num_samples),
            features=pin(self.features),
            feature_lens=pin(self.feature_lens),
        )


@dataclass
class LongPiece:
    """The next normalized feature frames (1, t, F) of a long file; ``last``: its final piece."""

    item: AudioItem
    features: torch.Tensor
    last: bool


@dataclass
class FailedItem:
    """An input that could not be read; ``message`` names it and says why."""

    item: AudioItem
    message: str


def padded_batch(waves: list[torch.Tensor], cfg: FeatureConfig) -> torch.Tensor:
    """Rows (n_b,) -> (B, N): each row followed by the end reflection lhotse's filterbank gives it alone,
    then zeros.

    Alone, a signal of n samples is framed after reflecting its last samples past its end
    (``snip_edges=False``); in a padded batch lhotse reflects only at the batch's end, so a shorter row's
    last frames would read zeros and differ with the batch it lands in. With its own reflection in
    place, every frame of every row is the frame of that file alone: transcripts do not depend on
    which files share a batch.
    """
    window = int(cfg.frame_length_ms / 1000.0 * cfg.sample_rate)  # rounded as lhotse's Wav2Win rounds it
    shift = int(cfg.frame_shift_ms / 1000.0 * cfg.sample_rate)
    rows = []
    for w in waves:
        n = w.numel()
        frames = (n + shift // 2) // shift
        right = (frames - 1) * shift + window - n - (window - shift) // 2  # lhotse's npad_right
        rows.append(torch.cat([w, torch.flip(w[-right:], (0,))]) if right > 0 else w)
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)


def read_samples(item: AudioItem, sample_rate: int) -> np.ndarray:
    """All samples (N,) of ``item``, mono float32 at ``sample_rate``; ``AudioError`` naming it if it fails."""
    return np.concatenate(list(iter_samples(item, sample_rate, block_seconds=max(item.duration, 1.0) + 1.0)))


def iter_samples(item: AudioItem, sample_rate: int, block_seconds: float) -> Iterator[np.ndarray]:
    """``item``'s samples in blocks (N,) of about ``block_seconds``; ``AudioError`` naming it if it fails."""
    if item.cut is None:
        yield from FileSource(item.path, sample_rate, block_seconds)
        return
    cut = to_sample_rate(item.cut, sample_rate)
    start = 0.0
    while start < cut.duration:
        piece = cut if block_seconds >= cut.duration else cut.truncate(offset=start, duration=block_seconds)
        try:
            samples = piece.load_audio()  # (C, N)
        except Exception as e:  # lhotse tries every backend: any failure means the audio is not usable
            raise AudioError(f"{item.path} (cut {item.id}): cannot load its audio ({e})") from e
        yield np.asarray(samples, dtype=np.float32).mean(axis=0)
        start += block_seconds


class BatchAudioDataset(torch.utils.data.IterableDataset):
    """Work units -> ``AudioBatch`` / ``LongPiece`` / ``FailedItem`` (see the module docstring).

    ``front_end``: features in the workers; None: samples, for features on the device.
    """

    def __init__(
        self,
        units: list[BatchUnit | LongUnit],
        cfg: FeatureConfig,
        stats: FeatureStats,
        front_end: FbankFrontEnd | None,
    ) -> None:
        self.units = units
        self.cfg = cfg
        self.stats = stats
        self.front_end = front_end

    def __iter__(self) -> Iterator[AudioBatch | LongPiece | FailedItem]:
        info = torch.utils.data.get_worker_info()
        mine = self.units if info is None else self.units[info.id :: info.num_workers]
        for unit in mine:
            if isinstance(unit, LongUnit):
                yield from self._long(unit.item)
            else:
                yield self._batch(unit)

    def _batch(self, unit: BatchUnit) -> AudioBatch:
        items, failed, waves = [], [], []
        for item in unit.items:
            try:
                samples = read_samples(item, self.cfg.sample_rate)
            except AudioError as e:
                failed.append(FailedItem(item, str(e)))
                continue
            items.append(item)
            waves.append(torch.from_numpy(samples))
        batch = AudioBatch(items, failed)
        if not items:
            return batch
        batch.num_samples = torch.tensor([w.numel() for w in waves], dtype=torch.int64)
        batch.waves = padded_batch(waves, self.cfg)  # (B, N)
        if self.front_end is not None:
            with torch.no_grad():
                batch.features, batch.feature_lens = self.front_end(batch.waves, batch.num_samples)
            batch.waves = batch.num_samples = None
        return batch

    def _long(self, item: AudioItem) -> Iterator[LongPiece | FailedItem]:
        fbank = StreamingFbank(self.cfg, self.stats)
        piece_frames = round(PIECE_SECONDS * 1000 / self.cfg.frame_shift_ms)
        held: list[torch.Tensor] = []
        frames = 0
        try:
            for block in iter_samples(item, self.cfg.sample_rate, block_seconds=PIECE_SECONDS / 4):
                new = fbank.accept(block)  # (t, F)
                held.append(new)
                frames += new.shape[0]
                if frames >= piece_frames:
                    yield LongPiece(item, _finite(torch.cat(held))[None], last=False)
                    held, frames = [], 0
        except AudioError as e:
            yield FailedItem(item, str(e))
            return
        held.append(fbank.flush())
        yield LongPiece(item, _finite(torch.cat(held))[None], last=True)


def _finite(feats: torch.Tensor) -> torch.Tensor:
    """Normalized frames with values that are not finite set to 0 (the global mean)."""
    return torch.where(torch.isfinite(feats), feats, torch.zeros(()))
