"""Synthetic spoken digits to mix into FSDD training: the ten digit words from many espeak-ng voices.

With one FSDD speaker held out, training hears four people, three of them with a foreign accent:
too few voices to generalize to a fifth. The embedded corpus's encoder (58 espeak voices) helps as
an initialization, but fine-tuning on four speakers narrows it again. These takes keep many voices
in the fine-tuning data itself, saying exactly the words of the task.

Each take is one digit word from a random espeak-ng variant (``VARIANTS``: formants, breathiness,
...) with a random English accent, rate and pitch (:func:`ordinary_voice`, the embedded corpus's
ordinary voices), rendered the way FSDD was recorded: 8 kHz mono WAV, trimmed of silence,
at a random peak level. Files: ``{out}/{digit}_synth_{index}.wav``; ``fsdd.py`` makes their cuts
the way it makes the real ones (16 kHz when loaded), with the speaker ``synth-{variant}``.

Rendering runs in fresh worker processes, one shard each (espeak-ng's global state then starts from
the same point in every build; see ``usmkit.data.synth.render``).
"""

from __future__ import annotations

import multiprocessing as mp
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torchaudio
from tqdm import tqdm

from usmkit.data.audio_files import write_audio
from usmkit.data.synth.espeak import get_espeak
from usmkit.data.synth.voices import VARIANTS, Voice, ordinary_voice

FSDD_SAMPLE_RATE = 8000  # FSDD's own rate: the synthetic takes get the same 4 kHz band
SHARD_SIZE = 100
SPEAKER_PREFIX = "synth-"
TRIM_THRESHOLD_DB = -35.0  # 10-ms frames quieter than this, relative to the loudest, are silence
TRIM_MARGIN_S = 0.03  # kept on each side of the speech, as FSDD's trimmed files have a little


@dataclass(frozen=True)
class DigitTake:
    """One synthetic take: ``word`` (the digit ``digit`` spoken) by ``voice``."""

    index: int
    digit: int
    word: str
    voice: Voice

    @property
    def stem(self) -> str:
        return f"{self.digit}_synth_{self.index:05d}"

    @property
    def speaker(self) -> str:
        return f"{SPEAKER_PREFIX}{self.voice.variant.lower()}"


def plan_digit_takes(words: Sequence[str], takes_per_digit: int, seed: int = 0) -> list[DigitTake]:
    """``takes_per_digit`` takes of each of ``words`` (word i = digit i), each by a fresh random voice.

    Deterministic for a given seed.
    """
    if takes_per_digit < 1:
        raise ValueError(f"takes_per_digit must be >= 1, got {takes_per_digit}")
    rng = random.Random(f"usmkit-fsdd-synth-{seed}")
    takes = []
    for round_index in range(takes_per_digit):
        for digit, word in enumerate(words):
            voice = ordinary_voice(rng.choice(VARIANTS), rng)
            takes.append(DigitTake(round_index * len(words) + digit, digit, word, voice))
    return takes


def trim_silence(wave: np.ndarray, sample_rate: int) -> np.ndarray:
    """``wave`` (N,) without its leading and trailing silence (``TRIM_*``), or unchanged if all silent.

    Our own few lines: torchaudio's ``vad`` trims the front only and is tuned for long recordings.
    """
    frame = sample_rate // 100  # 10 ms
    frames = len(wave) // frame
    if frames == 0:
        return wave
    energy = (wave[: frames * frame].reshape(frames, frame) ** 2).mean(axis=1)  # (frames,)
    loud = np.flatnonzero(energy > energy.max() * 10 ** (TRIM_THRESHOLD_DB / 10))
    if loud.size == 0:
        return wave
    margin = int(TRIM_MARGIN_S * sample_rate)
    start = max(0, loud[0] * frame - margin)
    stop = min(len(wave), (loud[-1] + 1) * frame + margin)
    return wave[start:stop]


def _render_shard(task: tuple[tuple[DigitTake, ...], Path, int]) -> list[tuple[DigitTake, Path]]:
    """Synthesize, band-limit to 8 kHz, trim, level and write every take of the shard."""
    takes, out_dir, seed = task
    torch.set_num_threads(1)
    espeak = get_espeak()
    espeak.seed(seed)
    resample = torchaudio.transforms.Resample(espeak.sample_rate, FSDD_SAMPLE_RATE)
    written = []
    for take in takes:
        voice = take.voice
        samples = espeak.synthesize(
            take.word, voice.espeak_voice("en"), rate=voice.rate, pitch=voice.pitch, pitch_range=voice.pitch_range
        )
        if samples.size == 0:
            raise RuntimeError(f"espeak-ng produced no audio for {take.word!r} with voice {voice.name}")
        with torch.inference_mode():
            wave = resample(torch.from_numpy(samples.astype(np.float32) / 32768.0)).numpy()
        wave = trim_silence(wave, FSDD_SAMPLE_RATE)
        wave = wave * (voice.peak / max(float(np.abs(wave).max()), 1e-9))
        path = out_dir / f"{take.stem}.wav"
        write_audio(path, (wave * 32767.0).round().clip(-32768, 32767).astype(np.int16), FSDD_SAMPLE_RATE)
        written.append((take, path))
    return written


def synthesize_digit_takes(
    out_dir: Path, takes: Sequence[DigitTake], seed: int = 0, workers: int = 2
) -> list[tuple[DigitTake, Path]]:
    """Write every take as ``out_dir/{stem}.wav`` (8 kHz); returns ``(take, path)`` in plan order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shards = [
        (tuple(takes[start : start + SHARD_SIZE]), out_dir, seed * 100_003 + start // SHARD_SIZE)
        for start in range(0, len(takes), SHARD_SIZE)
    ]
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["usmkit.data.corpora.fsdd_synth"])
    written: dict[int, tuple[DigitTake, Path]] = {}
    with (
        context.Pool(processes=max(1, min(workers, len(shards))), maxtasksperchild=1) as pool,
        tqdm(total=len(takes), unit="take", desc="synthetic digits") as bar,
    ):
        for shard in pool.imap_unordered(_render_shard, shards):
            for take, path in shard:
                written[take.index] = (take, path)
            bar.update(len(shard))
    return [written[take.index] for take in takes]
