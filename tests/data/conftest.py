"""Fixtures: small audio files and lhotse manifests written into tmp_path (nothing downloaded)."""

from __future__ import annotations

import random
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from lhotse import CutSet, MonoCut, Recording, SupervisionSegment
from lhotse.audio import AudioSource

from usmkit.data.config import DataConfig, FeatureConfig, SpecAugmentConfig

WORDS = {
    "en": "the cat sat on a mat and the dog ran to the park with a red ball".split(),
    "de": "der hund lief in den park und die katze sass auf der matte".split(),
    "fr": "le chat est sur le tapis et le chien court dans le parc".split(),
}


def speechlike(seconds: float, sr: int, seed: int) -> np.ndarray:
    """A voiced-ish signal: harmonics of a wandering pitch under a syllable-rate envelope, plus noise."""
    rng = np.random.default_rng(seed)
    n = int(round(seconds * sr))
    t = np.arange(n) / sr
    f0 = 120 + 40 * np.sin(2 * np.pi * rng.uniform(0.5, 2.0) * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = 0.5 * (1 + np.sin(2 * np.pi * 4.0 * t + rng.uniform(0, 6.28)))
    x = 0.1 * envelope * voiced + 0.01 * rng.standard_normal(n)
    return x.astype(np.float32)


def write_wav(path: Path, seconds: float, sr: int = 16000, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, speechlike(seconds, sr, seed), sr, subtype="PCM_16")
    return path


def labeled_cut(audio: Path, cut_id: str, text: str | None, language: str = "en", speaker: str = "spk0") -> MonoCut:
    rec = Recording.from_file(audio, recording_id=cut_id)
    sups = []
    if text is not None:
        sups = [
            SupervisionSegment(
                id=cut_id,
                recording_id=rec.id,
                start=0.0,
                duration=rec.duration,
                text=text,
                language=language,
                speaker=speaker,
            )
        ]
    return MonoCut(id=cut_id, start=0.0, duration=rec.duration, channel=0, recording=rec, supervisions=sups)


def make_corpus(root: Path, per_language: dict[str, int], *, sr: int = 16000, seed: int = 0) -> CutSet:
    """Labeled cuts of 0.4-1.6 s, texts drawn from ``WORDS``; audio written under ``root/audio``."""
    rng = random.Random(seed)
    cuts = []
    for lang, n in per_language.items():
        for i in range(n):
            cut_id = f"{lang}-{sr // 1000}k-{i:03d}"
            seconds = round(rng.uniform(0.4, 1.6), 2)
            audio = write_wav(
                root / "audio" / f"{cut_id}.wav", seconds, sr, seed=zlib.crc32(f"{seed}:{cut_id}".encode())
            )
            text = " ".join(rng.choices(WORDS[lang], k=rng.randint(2, 6)))
            cuts.append(labeled_cut(audio, cut_id, text, language=lang, speaker=f"{lang}-spk{i % 2}"))
    return CutSet.from_cuts(cuts)


def metadata_cuts(per_language: dict[str, int], *, seed: int = 0) -> CutSet:
    """Cuts with durations and languages but no audio on disk: for sampler tests (metadata only)."""
    rng = random.Random(seed)
    cuts = []
    for lang, n in per_language.items():
        for i in range(n):
            cut_id = f"{lang}-{i:05d}"
            dur = round(rng.uniform(0.5, 4.0), 2)
            rec = Recording(
                id=cut_id,
                sources=[AudioSource(type="file", channels=[0], source=f"/nonexistent/{cut_id}.wav")],
                sampling_rate=16000,
                num_samples=int(dur * 16000),
                duration=dur,
            )
            sup = SupervisionSegment(id=cut_id, recording_id=cut_id, start=0.0, duration=dur, text="x", language=lang)
            cuts.append(MonoCut(id=cut_id, start=0.0, duration=dur, channel=0, recording=rec, supervisions=[sup]))
    return CutSet.from_cuts(cuts)


def small_config(tmp_path: Path, **overrides) -> DataConfig:
    """A DataConfig for tiny test corpora: small batches, no worker processes unless asked."""
    base = dict(
        manifest_dir=str(tmp_path),
        max_duration=3.0,
        num_buckets=2,
        num_workers=0,
        features=FeatureConfig(precomputed=False),
        spec_augment=SpecAugmentConfig(),
    )
    base.update(overrides)
    return DataConfig(**base)


@pytest.fixture
def audio_corpus(tmp_path: Path) -> CutSet:
    """12 labeled cuts at 16 kHz: 8 English, 4 German."""
    return make_corpus(tmp_path, {"en": 8, "de": 4})


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A tiny sentencepiece model over the fixture vocabulary (usmkit.data.tokenizer)."""
    from usmkit.data.tokenizer import Tokenizer

    texts = [" ".join(random.Random(i).choices(words, k=8)) for words in WORDS.values() for i in range(50)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "fewer pieces than requested" on a tiny corpus is expected
        return Tokenizer.train(texts, tmp_path_factory.mktemp("tok"), vocab_size=320)


# Helpers as fixtures, so test modules never import ``conftest`` by name (other test folders have one too).


@pytest.fixture
def build_corpus():
    return make_corpus


@pytest.fixture
def build_metadata_cuts():
    return metadata_cuts


@pytest.fixture
def build_config(tmp_path: Path):
    return lambda **overrides: small_config(tmp_path, **overrides)


@pytest.fixture
def wav_writer():
    return write_wav


@pytest.fixture
def cut_builder():
    return labeled_cut
