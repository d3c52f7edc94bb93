"""Audio inputs for streaming: files (any format libsndfile reads, any rate), raw 16-bit PCM on stdin, a microphone.

Every source yields mono float32 blocks (N,) in [-1, 1] at the model's sample rate, block by block,
so a file is decoded the way a live stream would be (memory stays flat for hours of audio).

Files are read with soundfile (libsndfile: WAV, FLAC, OGG/Opus, MP3 with libsndfile >= 1.1, ...):
``torchaudio.load`` needs the separate torchcodec package since torchaudio 2.9, soundfile does not.
Resampling is torchaudio's windowed-sinc ``resample``; ``StreamResampler`` applies it to a stream
(see there). The microphone needs the optional ``sounddevice`` package (``pip install 'usmkit[mic]'``).
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import soundfile as sf
import torch
import torchaudio.functional as AF

from usmkit.data.audio_files import declared_frames, rate_problem
from usmkit.errors import UsageError

CLIP_LEVEL = 0.999  # |sample| at or above this counts as clipped (full scale)
TRUNCATION_TOLERANCE_S = 0.025  # audio may decode this much shorter than declared (lhotse's tolerance)


class AudioError(UsageError, ValueError):
    """An input that cannot be read as audio; the message names it and says what to do."""


class StreamResampler:
    """Resample a stream block by block; equal to resampling the whole signal at once.

    torchaudio's ``resample`` is a polyphase filter: with ``g = gcd(orig, new)`` every ``orig / g``
    input samples give exactly ``new / g`` output samples, each reading a window of ``width`` inputs
    around its position. So blocks whose length is a multiple of ``orig / g``, resampled together with
    ``context`` real input samples on each side (a multiple of ``orig / g`` too, >= the filter width),
    give the whole-signal output for the block's span; the start and end of the stream see the same
    zeros the whole-signal call pads with. Output lags input by ``context`` samples.
    """

    def __init__(self, orig_rate: int, new_rate: int) -> None:
        if orig_rate <= 0 or new_rate <= 0:
            raise ValueError(f"sample rates must be > 0, got {orig_rate} -> {new_rate}")
        g = math.gcd(orig_rate, new_rate)
        self.orig, self.new = orig_rate // g, new_rate // g
        # torchaudio: width = ceil(lowpass_filter_width * orig / (min(orig, new) * rolloff)), defaults 6 and 0.99
        width = math.ceil(6 * self.orig / (min(self.orig, self.new) * 0.99))
        self.context = math.ceil((width + self.orig) / self.orig) * self.orig  # input samples each side
        self._left = torch.zeros(self.context)  # the `context` inputs before the pending ones (zeros at start)
        self._pending = torch.zeros(0)  # inputs not yet resampled
        self._total_in = 0
        self._total_out = 0

    def _resample(self, x: torch.Tensor) -> torch.Tensor:
        return AF.resample(x, self.orig, self.new)

    def accept(self, x: torch.Tensor) -> torch.Tensor:
        """x (N,) at the original rate -> the output samples that became computable (M,)."""
        if self.orig == self.new:
            return x
        self._total_in += x.numel()
        self._pending = torch.cat([self._pending, x])
        # Resample whole groups of `orig` inputs, keeping `context` real inputs after them as right context.
        ready = (self._pending.numel() - self.context) // self.orig * self.orig
        if ready <= 0:
            return torch.zeros(0)
        window = torch.cat([self._left, self._pending[: ready + self.context]])
        skip = self.context // self.orig * self.new
        out = self._resample(window)[skip : skip + ready // self.orig * self.new]
        self._left = window[ready : ready + self.context]
        self._pending = self._pending[ready:]
        self._total_out += out.numel()
        return out

    def flush(self) -> torch.Tensor:
        """The last output samples (the whole-signal output has ``ceil(N * new / orig)`` samples)."""
        if self.orig == self.new:
            return torch.zeros(0)
        total = math.ceil(self._total_in * self.new / self.orig)
        n = self._pending.numel()
        window = torch.cat([self._left, self._pending, torch.zeros(self.context + (-n) % self.orig)])
        skip = self.context // self.orig * self.new
        out = self._resample(window)[skip : skip + total - self._total_out]
        self._pending = torch.zeros(0)
        self._total_out += out.numel()
        return out


def repair_non_finite(block: np.ndarray) -> tuple[np.ndarray, int]:
    """``block`` with NaN and +-Inf samples set to 0, and how many there were. One such sample would
    otherwise turn every feature frame it reaches (and the model state after it) into NaN."""
    bad = block.size - int(np.count_nonzero(np.isfinite(block)))
    if bad:
        block = np.where(np.isfinite(block), block, np.float32(0)).astype(np.float32, copy=False)
    return block, bad


def rate_note(describe: str, input_rate: int, model_rate: int) -> str | None:
    """A one-line note when the input's rate is below the model's: upsampling adds no speech band."""
    if input_rate >= model_rate:
        return None
    return (
        f"{describe} is {input_rate} Hz audio but the model expects {model_rate} Hz speech: it was upsampled, "
        f"so the band above {input_rate // 2} Hz is empty; expect more errors than on {model_rate} Hz recordings"
    )


class AudioSource(ABC):
    """Iterable of mono float32 blocks at ``sample_rate``; ``describe`` names the input in messages."""

    sample_rate: int
    describe: str
    non_finite: int = 0  # NaN/Inf samples found in the input (and set to 0)

    @abstractmethod
    def __iter__(self) -> Iterator[np.ndarray]: ...

    def notes(self) -> list[str]:
        """Things to tell the user after the stream ended (e.g. a truncated sample)."""
        return []

    def _repaired(self, blocks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        for block in blocks:
            block, bad = repair_non_finite(block)
            self.non_finite += bad
            yield block

    def _non_finite_note(self) -> list[str]:
        if not self.non_finite:
            return []
        return [f"{self.describe}: {self.non_finite} samples were NaN or Inf; they were set to 0 (silence)"]


def _resampled(blocks: Iterator[np.ndarray], orig: int, new: int) -> Iterator[np.ndarray]:
    if orig == new:
        yield from blocks
        return
    rs = StreamResampler(orig, new)
    for block in blocks:
        out = rs.accept(torch.from_numpy(block))
        if out.numel():
            yield out.numpy()
    tail = rs.flush()
    if tail.numel():
        yield tail.numpy()


class FileSource(AudioSource):
    """An audio file, checked when opened: missing, empty, undecodable or sample-less files raise ``AudioError``.

    Damage found while decoding (a file that stops decoding part way, or a file cut short, which decodes
    fewer samples than its header declares) raises ``AudioError`` from the iteration, after the blocks
    that decoded: a transcriber shows the transcript of the audio before it, then reports the error
    (``usmkit-transcribe``: exit 2). A truncated file is refused rather than warned about because it is
    the same damage as a FLAC that loses sync part way: audio the file was meant to hold is missing, and
    a script that reads only the exit status must not take a part for the whole. A WAV header written
    before its length was known (a pipe) declares a placeholder, not a length, and is not reported.
    """

    def __init__(self, path: str | os.PathLike[str], sample_rate: int, block_seconds: float = 0.16) -> None:
        self.path = Path(path)
        self.sample_rate = sample_rate
        self.describe = str(self.path)
        if not self.path.exists():
            raise AudioError(f"{self.path}: no such file")
        if not self.path.is_file():
            raise AudioError(f"{self.path}: not a regular file (a directory?); pass an audio file, '-' or --mic")
        if self.path.stat().st_size == 0:
            raise AudioError(f"{self.path}: the file is empty (0 bytes); nothing to transcribe")
        try:
            info = sf.info(str(self.path))
        except (sf.LibsndfileError, RuntimeError, TypeError) as e:
            raise AudioError(
                f"{self.path}: cannot decode it as audio ({e}); the file is corrupt or its format is unsupported. "
                f"Readable formats: WAV, FLAC, OGG/Opus, MP3 and the rest of libsndfile's {sf.__libsndfile_version__} list; "
                "convert others first, e.g. ffmpeg -i IN -ar 16000 -ac 1 OUT.wav"
            ) from e
        if info.frames == 0:
            raise AudioError(f"{self.path}: the file holds no audio samples (a header only); nothing to transcribe")
        problem = rate_problem(info.samplerate, sample_rate)
        if problem:
            raise AudioError(f"{self.path}: {problem}")
        self.info = info
        self.declared_frames = declared_frames(info)
        self.block_frames = max(1, round(block_seconds * info.samplerate))

    def _blocks(self) -> Iterator[np.ndarray]:
        decoded = 0
        rate = self.info.samplerate
        try:
            for block in sf.blocks(str(self.path), blocksize=self.block_frames, dtype="float32", always_2d=True):
                decoded += block.shape[0]
                yield block.mean(axis=1, dtype=np.float32)  # (N,) mono: the channel average
        except (sf.LibsndfileError, RuntimeError) as e:
            raise AudioError(
                f"{self.path}: decoding failed part way, at {decoded / rate:.2f} s of the {self.declared_frames / rate:.2f} s "
                f"its header declares ({e}); the file is damaged"
            ) from e
        if decoded < self.declared_frames - TRUNCATION_TOLERANCE_S * rate:
            raise AudioError(
                f"{self.path}: truncated: its header declares {self.declared_frames / rate:.2f} s but only "
                f"{decoded / rate:.2f} s decode (a copy or recording cut short); copy it again from its source"
            )

    def __iter__(self) -> Iterator[np.ndarray]:
        return _resampled(self._repaired(self._blocks()), self.info.samplerate, self.sample_rate)

    def notes(self) -> list[str]:
        rate = rate_note(self.describe, self.info.samplerate, self.sample_rate)
        return self._non_finite_note() + ([rate] if rate else [])


class RawPcmSource(AudioSource):
    """Raw signed 16-bit little-endian mono PCM at ``input_rate`` from a binary stream (stdin).

    Reads what is available (``read1``), so a live pipe is decoded as it comes. End of stream at any
    point ends the transcription normally; an odd trailing byte (a cut 16-bit sample) is dropped and noted.
    """

    def __init__(
        self,
        stream: BinaryIO,
        input_rate: int,
        sample_rate: int,
        block_seconds: float = 0.16,
        describe: str = "stdin",
    ) -> None:
        if input_rate <= 0:
            raise AudioError(f"--sample-rate must be a positive number of Hz, got {input_rate}")
        problem = rate_problem(input_rate, sample_rate)
        if problem:
            raise AudioError(f"--sample-rate {input_rate}: {problem}")
        self.stream = stream
        self.input_rate = input_rate
        self.sample_rate = sample_rate
        self.describe = describe
        self.block_bytes = 2 * max(1, round(block_seconds * input_rate))
        self.bytes_read = 0
        self._dropped = 0

    def _blocks(self) -> Iterator[np.ndarray]:
        read = getattr(self.stream, "read1", self.stream.read)
        leftover = b""
        while True:
            try:
                data = read(self.block_bytes)
            except OSError as e:
                raise AudioError(f"{self.describe}: reading failed ({e})") from e
            if not data:
                break
            self.bytes_read += len(data)
            data = leftover + data
            whole = len(data) // 2 * 2
            leftover = data[whole:]
            if whole:
                yield np.frombuffer(data[:whole], dtype="<i2").astype(np.float32) / 32768.0
        self._dropped = len(leftover)

    def __iter__(self) -> Iterator[np.ndarray]:
        return _resampled(self._blocks(), self.input_rate, self.sample_rate)

    def notes(self) -> list[str]:
        notes = []
        rate = rate_note(self.describe, self.input_rate, self.sample_rate)
        if rate:
            notes.append(rate)
        if self._dropped:
            notes.append(
                f"{self.describe} ended in the middle of a 16-bit sample: dropped the last {self._dropped} byte"
            )
        return notes


class MicrophoneSource(AudioSource):
    """The default input device through ``sounddevice`` (PortAudio), until Ctrl-C."""

    def __init__(self, sample_rate: int, block_seconds: float = 0.16, device: str | int | None = None) -> None:
        try:
            import sounddevice
        except (ImportError, OSError) as e:  # OSError: the package is there but PortAudio is not
            raise AudioError(
                f"the microphone needs the optional sounddevice package and PortAudio ({e}); "
                "install them with: pip install 'usmkit[mic]'"
            ) from e
        self._sd = sounddevice
        self.sample_rate = sample_rate
        self.device = device
        self.describe = "microphone"
        self.block_frames = max(1, round(block_seconds * sample_rate))

    def __iter__(self) -> Iterator[np.ndarray]:
        try:
            with self._sd.InputStream(
                samplerate=self.sample_rate,
                channels=1,
                dtype="float32",
                blocksize=self.block_frames,
                device=self.device,
            ) as stream:
                while True:
                    block, _overflowed = stream.read(self.block_frames)
                    yield block[:, 0].copy()
        except self._sd.PortAudioError as e:
            raise AudioError(f"microphone: {e}; check the input device (python -m sounddevice lists them)") from e


class LevelMeter:
    """Per-frame energy (dBFS) and clipping of a sample stream.

    ``accept(block)`` returns the energy of every complete ``frame_samples`` frame (RMS in dB relative
    to full scale; digital silence is -inf), carrying partial frames over; ``flush`` the last partial one.
    """

    def __init__(self, frame_samples: int) -> None:
        self.frame_samples = frame_samples
        self._rest = np.zeros(0, dtype=np.float32)
        self.samples = 0
        self.clipped = 0

    def _db(self, frames: np.ndarray) -> np.ndarray:
        power = np.mean(np.square(frames, dtype=np.float64), axis=-1)
        with np.errstate(divide="ignore"):
            return 10.0 * np.log10(power)

    def accept(self, block: np.ndarray) -> np.ndarray:
        self.samples += block.size
        self.clipped += int(np.count_nonzero(np.abs(block) >= CLIP_LEVEL))
        x = np.concatenate([self._rest, block])
        n = x.size // self.frame_samples
        self._rest = x[n * self.frame_samples :]
        return self._db(x[: n * self.frame_samples].reshape(n, self.frame_samples))  # (n,)

    def flush(self) -> np.ndarray:
        rest, self._rest = self._rest, np.zeros(0, dtype=np.float32)
        return self._db(rest[None]) if rest.size else np.zeros(0)

    @property
    def clipped_fraction(self) -> float:
        return self.clipped / max(self.samples, 1)
