"""The synthetic speakers ("voices") and their assignment to splits.

A voice is an espeak-ng variant (a file under ``espeak-ng-data/voices/!v``: formants, pitch,
breathiness, ...) plus fixed rate, pitch, pitch range, word gap, loudness and English accent.
Every voice speaks every corpus language (the variant applies to any language's phonemes).

Split design (variants are disjoint between these four, so a held-out voice is a different variant,
not the same variant with other settings):

- ``train``: 40 voices, ordinary settings. ``unlabeled`` reuses them.
- ``dev``, ``test``: 6 held-out voices each, ordinary settings. ``test_textonly`` uses the test voices.
- ``test_other``: 6 held-out voices at extreme rates and pitches.

Each held-out split gets 2 female variants (read from the variant file's ``gender`` line).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from usmkit.data.synth.external import ExternalEngine

# espeak-ng variants that sound like a speaker. Left out: novelty voices (robots, whisper,
# "Demonic", "croak", ...), and "iven"/"Jacky" which clip heavily.
VARIANTS: tuple[str, ...] = (
    *(f"m{i}" for i in range(1, 9)),
    *(f"f{i}" for i in range(1, 6)),
    "klatt",
    *(f"klatt{i}" for i in range(2, 7)),
    "Alex", "Alicia", "Andrea", "Andy", "Annie", "Denis", "Diogo", "Gene", "Gene2", "Henrique", "Hugo",
    "Lee", "Mario", "Michael", "Mike", "Nguyen", "Reed", "adam", "anika", "announcer", "antonio", "aunty",
    "belinda", "benjamin", "boris", "caleb", "david", "ed", "edward", "edward2", "grandma", "grandpa",
    "gustave", "ian", "iven2", "iven3", "iven4", "john", "linda", "marcelo", "max", "michel", "miguel",
    "mike2", "norbert", "pablo", "paul", "pedro", "quincy", "rob", "robert", "sandro", "shelby", "steph",
    "steph2", "steph3", "travis", "victor", "zac",
)  # fmt: skip

# espeak-ng voice for each non-English language (English accents vary per voice, below).
LANGUAGE_VOICES: dict[str, str] = {"de": "de", "es": "es", "fr": "fr", "it": "it"}
ENGLISH_ACCENTS: tuple[tuple[str, float], ...] = (
    ("en-us", 0.35),
    ("en", 0.2),  # British English
    ("en-gb-x-rp", 0.1),
    ("en-gb-scotland", 0.1),
    ("en-029", 0.1),  # Caribbean
    ("en-us-nyc", 0.15),
)

HELD_OUT_SPLITS: tuple[str, ...] = ("dev", "test", "test_other")
VOICES_PER_SPLIT: dict[str, int] = {"train": 40, "dev": 6, "test": 6, "test_other": 6}
FEMALE_PER_HELD_OUT_SPLIT = 2


@dataclass(frozen=True)
class Voice:
    """One synthetic speaker. ``name`` is the speaker id written to the supervisions."""

    name: str
    engine: str  # "espeak", "flite" or "festival"
    variant: str  # espeak-ng variant, or the external engine's voice name
    english: str  # espeak-ng English voice (accent), e.g. "en-us"
    rate: int  # words per minute (espeak-ng default 175)
    pitch: int  # base pitch 0..100 (default 50)
    pitch_range: int  # 0..100 (default 50)
    word_gap: int  # extra pause between words, 10 ms units
    peak: float  # peak amplitude of every utterance after normalization, in (0, 1)
    languages: tuple[str, ...] = ("en", "de", "es", "fr", "it")

    def espeak_voice(self, language: str) -> str:
        """The espeak-ng voice name for ``language``, e.g. ``"en-us+m3"``."""
        base = self.english if language == "en" else LANGUAGE_VOICES[language]
        return f"{base}+{self.variant}"


@cache
def variant_is_female(variant: str) -> bool:
    """Whether the espeak-ng variant file declares ``gender female``."""
    import espeakng_loader

    path = Path(espeakng_loader.get_data_path()) / "voices" / "!v" / variant
    if not path.is_file():
        raise FileNotFoundError(f"espeak-ng variant {variant!r} not found at {path}; check VARIANTS in {__file__}")
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].lower() == "gender":
            return fields[1].lower() == "female"
    return False


def ordinary_voice(variant: str, rng: random.Random) -> Voice:
    accents, weights = zip(*ENGLISH_ACCENTS, strict=True)
    rate = rng.randint(135, 205)
    pitch = rng.randint(25, 75)
    return Voice(
        name=f"espeak-{variant.lower()}-r{rate}-p{pitch}",
        engine="espeak",
        variant=variant,
        english=rng.choices(accents, weights)[0],
        rate=rate,
        pitch=pitch,
        pitch_range=rng.randint(25, 80),
        word_gap=rng.choice((0, 0, 0, 1, 2)),
        peak=round(rng.uniform(0.3, 0.9), 3),
    )


def _extreme_voice(variant: str, index: int, rng: random.Random) -> Voice:
    # Alternate slow/fast and low/high so test_other covers all four corners.
    rate = rng.randint(80, 105) if index % 2 == 0 else rng.randint(255, 310)
    pitch = rng.randint(0, 12) if (index // 2) % 2 == 0 else rng.randint(88, 99)
    accents, weights = zip(*ENGLISH_ACCENTS, strict=True)
    return Voice(
        name=f"espeak-{variant.lower()}-r{rate}-p{pitch}",
        engine="espeak",
        variant=variant,
        english=rng.choices(accents, weights)[0],
        rate=rate,
        pitch=pitch,
        pitch_range=rng.choice((rng.randint(0, 15), rng.randint(85, 100))),
        word_gap=rng.choice((0, 1, 3)),
        peak=round(rng.uniform(0.2, 0.95), 3),
    )


def plan_voices(seed: int, external: list[ExternalEngine] | None = None) -> dict[str, tuple[Voice, ...]]:
    """Assign voices to ``train``, ``dev``, ``test`` and ``test_other`` (disjoint variants).

    Deterministic for a given seed (and set of installed external engines, whose voices are added
    to ``train``).
    """
    rng = random.Random(f"usmkit-synth-voices-{seed}")
    female = [v for v in VARIANTS if variant_is_female(v)]
    other = [v for v in VARIANTS if not variant_is_female(v)]
    rng.shuffle(female)
    rng.shuffle(other)
    plan: dict[str, tuple[Voice, ...]] = {}
    for split in HELD_OUT_SPLITS:
        n_female = FEMALE_PER_HELD_OUT_SPLIT
        n_other = VOICES_PER_SPLIT[split] - n_female
        variants = [female.pop() for _ in range(n_female)] + [other.pop() for _ in range(n_other)]
        if split == "test_other":
            plan[split] = tuple(_extreme_voice(v, i, rng) for i, v in enumerate(variants))
        else:
            plan[split] = tuple(ordinary_voice(v, rng) for v in variants)
    remaining = sorted(female + other, key=VARIANTS.index)
    rng.shuffle(remaining)
    train = [ordinary_voice(v, rng) for v in remaining[: VOICES_PER_SPLIT["train"]]]
    for engine in external or []:
        for voice_name in engine.voices:
            rate = rng.randint(150, 195)
            train.append(
                Voice(
                    name=f"{engine.name}-{voice_name}-r{rate}",
                    engine=engine.name,
                    variant=voice_name,
                    english="en",
                    rate=rate,
                    pitch=50,
                    pitch_range=50,
                    word_gap=0,
                    peak=round(rng.uniform(0.3, 0.9), 3),
                    languages=("en",),
                )
            )
    plan["train"] = tuple(train)
    return {split: plan[split] for split in ("train", "dev", "test", "test_other")}
