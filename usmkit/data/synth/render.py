"""Worker side of the corpus build: synthesize one shard of utterances into 16 kHz FLAC files.

Each shard runs in a fresh process (see ``build.py``): espeak-ng's global synthesis state then
starts from the same point in every build, which makes the audio bytes reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch
import torchaudio

from usmkit.data.audio_files import write_audio
from usmkit.data.synth.espeak import get_espeak
from usmkit.data.synth.external import synthesize_external
from usmkit.data.synth.plan import Utterance

SAMPLE_RATE = 16000


@dataclass(frozen=True)
class ShardTask:
    utterances: tuple[Utterance, ...]
    audio_dir: Path  # files go to audio_dir / split / f"{id}.flac"
    seed: int  # espeak-ng noise seed for this shard
    engine_binaries: dict[str, str]  # external engine name -> executable (empty: espeak-ng only)


@dataclass(frozen=True)
class Rendered:
    id: str
    path: Path
    num_samples: int  # at SAMPLE_RATE


def audio_path(audio_dir: Path, utterance: Utterance) -> Path:
    return audio_dir / utterance.split / f"{utterance.id}.flac"


def _speak(utterance: Utterance, engine_binaries: dict[str, str]) -> tuple[np.ndarray, int]:
    voice = utterance.voice
    if voice.engine == "espeak":
        espeak = get_espeak()
        samples = espeak.synthesize(
            utterance.text,
            voice.espeak_voice(utterance.language),
            rate=voice.rate,
            pitch=voice.pitch,
            pitch_range=voice.pitch_range,
            word_gap=voice.word_gap,
        )
        return samples, espeak.sample_rate
    if voice.engine not in engine_binaries:
        raise RuntimeError(f"voice {voice.name} needs the {voice.engine!r} engine, which is not installed here")
    return synthesize_external(voice.engine, engine_binaries[voice.engine], voice.variant, utterance.text, voice.rate)


@cache
def _resampler(sample_rate: int) -> torchaudio.transforms.Resample:
    # The transform computes its sinc kernel once; torchaudio.functional.resample recomputes it per call.
    return torchaudio.transforms.Resample(sample_rate, SAMPLE_RATE)


def to_16k(samples: np.ndarray, sample_rate: int, peak: float) -> np.ndarray:
    """int16 (N,) at ``sample_rate`` -> int16 (M,) at 16 kHz, peak-normalized to ``peak``."""
    wave = torch.from_numpy(samples.astype(np.float32) / 32768.0)
    if sample_rate != SAMPLE_RATE:
        with torch.inference_mode():
            wave = _resampler(sample_rate)(wave)
    top = float(wave.abs().max())
    if top > 0:
        wave = wave * (peak / top)
    return (wave.numpy() * 32767.0).round().clip(-32768, 32767).astype(np.int16)


def render_shard(task: ShardTask) -> list[Rendered]:
    """Synthesize, resample and write every utterance of ``task`` in order."""
    torch.set_num_threads(1)
    get_espeak().seed(task.seed)
    rendered = []
    for utterance in task.utterances:
        samples, sample_rate = _speak(utterance, task.engine_binaries)
        if samples.size == 0:
            raise RuntimeError(
                f"{utterance.voice.engine} produced no audio for {utterance.id} "
                f"(voice {utterance.voice.name}, text {utterance.text!r})"
            )
        audio = to_16k(samples, sample_rate, utterance.voice.peak)
        path = audio_path(task.audio_dir, utterance)
        write_audio(path, audio, SAMPLE_RATE, format="FLAC", subtype="PCM_16")
        rendered.append(Rendered(utterance.id, path, int(audio.shape[0])))
    return rendered
