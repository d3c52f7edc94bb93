"""Transcript normalization per language and the by-text splits of the multilingual prompt corpora."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from usmkit.data.corpora.common import RecipeError
from usmkit.data.corpora.prompts import LeftOut, Prompt, assign_splits, normalize_prompt


@pytest.mark.parametrize(
    "text, language, expected",
    [
        ("Please press 1 to mute, or 8 to exit.", "en", "please press one to mute or eight to exit"),
        ("Marque 0 para obtener ayuda.", "es", "marque cero para obtener ayuda"),
        ("Pour l\u2019aide, appuyez sur 0.", "fr", "pour l'aide appuyez sur zéro"),  # typographic apostrophe
        ("premere 0 per l'aiuto", "it", "premere zero per l'aiuto"),
        ("Нажмите звёздочку для включения паузы.", "ru", "нажмите звёздочку для включения паузы"),
        ("Počkej, na semaforu svítí červená!", "cs", "počkej na semaforu svítí červená"),
        ("Wat is dit voor raar schip?", "nl", "wat is dit voor raar schip"),
        ("dollar [$]", "en", "dollar"),  # a symbol's explanation
        ("Пробел [ ]", "ru", "пробел"),
        ("“Pour quitter, appuyez sur 8.”", "fr", "pour quitter appuyez sur huit"),
    ],
)
def test_normalize_prompt(text, language, expected):
    assert normalize_prompt(text, language) == expected


@pytest.mark.parametrize(
    "text, language, kind",
    [
        ("[this is a simple beep tone]", "en", "no speech"),
        ("(1 second of silence)", "en", "no speech"),
        ("<beep ascending>", "en", "no speech"),
        ("", "cs", "empty text"),
        ("Il [suo] messaggio è stato salvato.", "it", "bracketed words"),
        ('IAX (note: does not say "2")', "en", "bracketed words"),
        ("press * to toggle pause", "en", "symbol read aloud"),
        ("Konkrétně %1 hodin!", "cs", "symbol read aloud"),
        ("marque 500 para intentar", "es", "number"),
        ("Audio 3D désactivé", "fr", "number"),
        ("Нажмите 1 для справки", "ru", "number"),  # no Russian digit table: the case form is not written
        ("Poseidon 737", "nl", "number"),
        ("at", "ru", "other script"),
        ("Подожди.Počkej", "cs", "other script"),
        ("...", "en", "no speech"),
    ],
)
def test_normalize_prompt_leaves_out(text, language, kind):
    with pytest.raises(LeftOut) as err:
        normalize_prompt(text, language)
    assert err.value.kind == kind


def _prompts(texts_by_language: dict[str, str]) -> list[Prompt]:
    return [
        Prompt(f"{lang}-{i}", lang, "s", f"k{i}", text, Path("a.wav"))
        for lang, texts in texts_by_language.items()
        for i, text in enumerate(texts.split(","))
    ]


def test_assign_splits_by_text_per_language():
    words = [f"w{i}" for i in range(40)]
    prompts = _prompts({"en": ",".join(words + words[:10]), "ru": ",".join(words[:20])})
    split = assign_splits(prompts, seed=0)
    assert split == assign_splits(list(reversed(prompts)), seed=0)  # deterministic, order-free
    assert split != assign_splits(prompts, seed=1)
    for lang, distinct in (("en", 40), ("ru", 20)):
        text_splits: dict[str, set[str]] = {}
        for p in prompts:
            if p.language == lang:
                text_splits.setdefault(p.text, set()).add(split[p.id])
        assert all(len(s) == 1 for s in text_splits.values())  # no text in two splits
        per_split = Counter(next(iter(s)) for s in text_splits.values())
        held = round(distinct / 10)
        assert per_split == {"train": distinct - 2 * held, "dev": held, "test": held}


def test_assign_splits_needs_three_texts():
    with pytest.raises(RecipeError, match="too few"):
        assign_splits(_prompts({"en": "a,b,a"}), seed=0)
