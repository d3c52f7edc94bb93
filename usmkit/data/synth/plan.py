"""The corpus plan: which voice says what, in which split, before any audio exists.

The plan is a pure function of (seed, size, installed external engines), so two builds with the
same seed write the same texts, voices and audio.

Splits (voices: see ``voices.py``):

    train          paired speech, 40 training voices, ~70% English by utterances
    dev, test      paired speech, held-out voices
    test_other     paired speech, held-out voices at extreme rates and pitches
    test_textonly  English speech by the test voices, every utterance with 1-2 held-out words
    unlabeled      audio only (BEST-RQ pre-training), training voices
    text_only      text only (text injection): includes the held-out words, excludes all eval texts
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from usmkit.data.synth.external import ExternalEngine
from usmkit.data.synth.text import LANGUAGE_SHARES, Lexicon, SentenceSampler, build_lexicon
from usmkit.data.synth.voices import Voice, plan_voices

AUDIO_SPLITS: tuple[str, ...] = ("train", "dev", "test", "test_other", "test_textonly", "unlabeled")
EVAL_SPLITS: tuple[str, ...] = ("dev", "test", "test_other", "test_textonly")
# Which voice group speaks each audio split.
SPLIT_VOICES: dict[str, str] = {
    "train": "train",
    "dev": "dev",
    "test": "test",
    "test_other": "test_other",
    "test_textonly": "test",
    "unlabeled": "train",
}


@dataclass(frozen=True)
class SizePreset:
    """Utterances per audio split, sentences in the text-only pool, and what the texts draw from.

    ``default`` is calibrated for ~3 h of train audio (mean utterance ~3.1 s), ~12 min per
    evaluation split, ~1 h unlabeled, in five languages. ``demo`` is English only, over the
    ``english_vocabulary`` most frequent English words: few enough words that a tiny model trained
    for minutes on a 2-core CPU hears each of them often enough to learn it (``make demo``).
    ``english`` is the same kind of corpus at GPU scale (1000 words, ~4.5 h of paired speech, a larger
    ``test_textonly``): the MOST study's (``experiments/most_study/``).
    """

    name: str
    utterances: Mapping[str, int]
    text_only: int
    languages: Mapping[str, float] = field(default_factory=lambda: dict(LANGUAGE_SHARES))  # language -> share
    english_vocabulary: int | None = None  # the N most frequent English words only; None = the whole list


SIZES: dict[str, SizePreset] = {
    "tiny": SizePreset(
        "tiny",
        {"train": 40, "dev": 12, "test": 12, "test_other": 12, "test_textonly": 10, "unlabeled": 16},
        text_only=200,
    ),
    "default": SizePreset(
        "default",
        {"train": 3500, "dev": 240, "test": 240, "test_other": 200, "test_textonly": 200, "unlabeled": 1170},
        text_only=20000,
    ),
    "english": SizePreset(
        "english",
        {"train": 6000, "dev": 200, "test": 200, "test_other": 100, "test_textonly": 200, "unlabeled": 3000},
        text_only=20000,
        languages={"en": 1.0},
        english_vocabulary=1000,
    ),
    "demo": SizePreset(
        "demo",
        {"train": 2400, "dev": 120, "test": 120, "test_other": 60, "test_textonly": 60, "unlabeled": 400},
        text_only=4000,
        languages={"en": 1.0},
        english_vocabulary=400,
    ),
}


@dataclass(frozen=True)
class Utterance:
    id: str  # also the recording and supervision id
    split: str
    voice: Voice
    language: str  # ISO 639-1
    text: str  # normalized transcript (also synthesized for unlabeled audio, but not written)


@dataclass(frozen=True)
class CorpusPlan:
    seed: int
    size: SizePreset
    voices: dict[str, tuple[Voice, ...]]  # voice group -> voices
    utterances: dict[str, tuple[Utterance, ...]]  # audio split -> utterances
    text_only: tuple[tuple[str, str], ...]  # (text, language)
    heldout_words: tuple[str, ...]


def get_size(name: str) -> SizePreset:
    if name not in SIZES:
        raise ValueError(f"unknown corpus size {name!r}; choose one of {sorted(SIZES)}")
    return SIZES[name]


def language_schedule(count: int, rng: random.Random, shares: Mapping[str, float] = LANGUAGE_SHARES) -> list[str]:
    """``count`` languages in the ``shares`` proportions (largest remainder), shuffled.

    Exact quotas rather than independent draws, so that even a tiny split has every language.
    """
    exact = {lang: share * count for lang, share in shares.items()}
    quota = {lang: int(x) for lang, x in exact.items()}
    by_remainder = sorted(exact, key=lambda lang: (exact[lang] - quota[lang], lang), reverse=True)
    for lang in by_remainder[: count - sum(quota.values())]:
        quota[lang] += 1
    schedule = [lang for lang in shares for _ in range(quota[lang])]
    rng.shuffle(schedule)
    return schedule


def _split_utterances(
    split: str, count: int, voices: tuple[Voice, ...], sampler: SentenceSampler, shares: Mapping[str, float]
) -> list[Utterance]:
    languages = ["en"] * count if split == "test_textonly" else language_schedule(count, sampler.rng, shares)
    utterances = []
    for i in range(count):
        voice = voices[i % len(voices)]  # round robin: every voice speaks the same amount
        language = languages[i] if languages[i] in voice.languages else "en"
        if split == "test_textonly":
            text = sampler.heldout_sentence()
        else:
            text = sampler.utterance(language)
        utterances.append(Utterance(f"synth-{split}-{i:06d}", split, voice, language, text))
    return utterances


def _text_only(
    count: int, sampler: SentenceSampler, excluded: set[str], shares: Mapping[str, float]
) -> list[tuple[str, str]]:
    texts: list[tuple[str, str]] = []
    while len(texts) < count:
        for language in language_schedule(count - len(texts), sampler.rng, shares):
            text = sampler.utterance(language, include_heldout=True)
            if text not in excluded:
                texts.append((text, language))
    return texts


def plan_corpus(seed: int, size: str, external: list[ExternalEngine] | None = None) -> CorpusPlan:
    """Every utterance of the corpus (deterministic for ``seed``, ``size`` and the external engines)."""
    preset = get_size(size)
    lexicon: Lexicon = build_lexicon(preset.english_vocabulary)
    voices = plan_voices(seed, external)
    utterances: dict[str, tuple[Utterance, ...]] = {}
    for split in AUDIO_SPLITS:
        sampler = SentenceSampler(lexicon, random.Random(f"usmkit-synth-{seed}-{split}"))
        group = voices[SPLIT_VOICES[split]]
        utterances[split] = tuple(_split_utterances(split, preset.utterances[split], group, sampler, preset.languages))
    eval_texts = {u.text for split in EVAL_SPLITS for u in utterances[split]}
    sampler = SentenceSampler(lexicon, random.Random(f"usmkit-synth-{seed}-text_only"))
    text_only = tuple(_text_only(preset.text_only, sampler, eval_texts, preset.languages))
    return CorpusPlan(seed, preset, voices, utterances, text_only, lexicon.heldout)


def shard_seed(seed: int, split: str, index: int) -> int:
    """A stable 31-bit seed for espeak-ng's noise generator in one shard."""
    return zlib.crc32(f"{seed}-{split}-{index}".encode()) & 0x7FFFFFFF
