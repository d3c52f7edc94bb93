"""What the multilingual prompt corpora (``asterisk``, ``fillets``) share: transcript normalization per
language, splits by prompt text, manifests per language and the ``corpus.json`` summary.

Normalization (``normalize_prompt``): NFC, typographic apostrophes to ``'``, notes in brackets, parentheses or
angle brackets handled (a symbol's explanation such as ``at [@]`` loses its bracket; a prompt that is only a
note, ``[beep tone]`` or ``(1 second of silence)``, is no speech; a note holding words beside other words,
``Il [suo] messaggio`` or ``IAX (note: does not say "2")``, leaves it unknown whether they are read), then ``usmkit.metrics.normalize_text`` (lowercase, punctuation and symbols to spaces, apostrophes kept
inside words, diacritics and Cyrillic kept). Digits: a digit standing alone is written as the language's
word (``DIGIT_WORDS``: en, es, fr, it, the forms each language's own ``digits/N`` prompts use); any other
number (``28.8``, ``1234``, ``3D``, a Russian digit, whose case form the text does not give) leaves the prompt
out, counted, as do symbols that are read aloud (``* # % $ @ & + =``) and letters of another script than
the language's (Latin; Cyrillic for ru). Each is a ``LeftOut`` with its kind. Once the audio is read, a text
of more than ``MAX_CHARS_PER_SECOND`` characters per second of audio (far above fast speech, about 15) is
left out too (``text too long for the audio``): a note written without brackets or two prompts' texts
joined on one line.

Splits (``assign_splits``): per language, the distinct normalized texts in a seeded shuffle; the first 10%
(at least one) go to ``test``, the next 10% to ``dev``, the rest to ``train``, so no text is in two splits
and every language has its own held-out texts. Each split is written for all languages together
(``train``, ``dev``, ``test``; the supervision's ``language`` is the ISO code) and per language
(``train_en``, ``test_cs``, ...), and ``unlabeled`` is ``train``'s audio without transcripts.
"""

from __future__ import annotations

import json
import random
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lhotse import CutSet, MonoCut, SupervisionSegment

from usmkit.data.corpora import print_split_table, split_rows
from usmkit.data.corpora.common import (
    RecipeDrops,
    RecipeError,
    checked_recording,
    unlabeled_cuts,
    write_split,
    write_unlabeled_split,
)
from usmkit.data.manifests import KINDS, manifest_path
from usmkit.metrics import normalize_text

SAMPLE_RATE = 16000
SPLITS = ("train", "dev", "test")
HELD_OUT_PERCENT = 10  # of each language's distinct texts, for dev and for test
SUMMARY = "corpus.json"  # usmkit.checkpointing.output_dir reads its "corpus"

DIGIT_WORDS = {
    "en": ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"),
    "es": ("cero", "uno", "dos", "tres", "cuatro", "cinco", "seis", "siete", "ocho", "nueve"),
    "fr": ("zéro", "un", "deux", "trois", "quatre", "cinq", "six", "sept", "huit", "neuf"),
    "it": ("zero", "uno", "due", "tre", "quattro", "cinque", "sei", "sette", "otto", "nove"),
}
SCRIPTS = {"ru": "CYRILLIC"}  # the letters' Unicode script; every other language: LATIN
SPOKEN_SYMBOLS = set("*#%$@&+=")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})
_BRACKET = re.compile(r"\[([^\[\]]*)\]|\(([^()]*)\)|<([^<>]*)>")
MAX_CHARS_PER_SECOND = 25.0


class LeftOut(Exception):
    """A prompt that cannot be used as a transcript; ``kind`` names why (counted by kind)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


def normalize_prompt(text: str, language: str) -> str:
    """A prompt's text as the words read (module docstring); ``LeftOut`` when that is not knowable.

    >>> normalize_prompt("Please press 1, or # to exit.", "fr")
    Traceback (most recent call last):
    ...
    usmkit.data.corpora.prompts.LeftOut: symbol read aloud: '#' in 'Please press 1, or # to exit.'
    >>> normalize_prompt("Pour l’aide, appuyez sur 0.", "fr"), normalize_prompt("at [@]", "en")
    ("pour l'aide appuyez sur zéro", 'at')
    """
    text = unicodedata.normalize("NFC", text).translate(_APOSTROPHES).strip()
    if not text:
        raise LeftOut("empty text", "the prompt's text is empty")
    notes = ["".join(groups) for groups in _BRACKET.findall(text)]
    if notes and not _BRACKET.sub("", text).strip(" .,;:!?\"'"):
        raise LeftOut("no speech", f"only a note: {text!r}")
    if any(any(ch.isalpha() for ch in note) for note in notes):
        raise LeftOut("bracketed words", f"not known whether they are read: {text!r}")
    text = _BRACKET.sub(" ", text)
    symbols = sorted(SPOKEN_SYMBOLS & set(text))
    if symbols:
        raise LeftOut("symbol read aloud", f"{''.join(symbols)!r} in {text!r}")
    words = []
    for word in normalize_text(text).split():
        if word.isdigit() and len(word) == 1 and language in DIGIT_WORDS:
            words.append(DIGIT_WORDS[language][int(word)])
        elif any(ch.isdigit() for ch in word):
            raise LeftOut("number", f"{word!r} in {text!r}: its spoken form is not written")
        else:
            words.append(word)
    script = SCRIPTS.get(language, "LATIN")
    foreign = sorted(
        {ch for w in words for ch in w if ch.isalpha() and not unicodedata.name(ch, "").startswith(script)}
    )
    if foreign:
        raise LeftOut("other script", f"{''.join(foreign)!r} in a {language} prompt: {text!r}")
    if not words:
        raise LeftOut("no speech", f"no words in {text!r}")
    return " ".join(words)


@dataclass(frozen=True)
class Prompt:
    """One recording with its transcript. ``key``: its path in the package, the text's name for it."""

    id: str  # asterisk-en-digits-1
    language: str  # ISO 639-1
    speaker: str
    key: str
    text: str  # normalized
    audio: Path


@dataclass
class LanguageCounts:
    """What a recipe did with one language's files, for the summary."""

    audio_files: int = 0
    left_out: Counter[str] = field(default_factory=Counter)  # kind -> files, e.g. "audio without transcript"
    texts_without_audio: int = 0
    duplicate_texts: int = 0  # a second text for one key (the first is kept)
    unreadable: Counter[str] = field(default_factory=Counter)  # RecipeDrops kinds: corrupt audio, ...


def assign_splits(prompts: Iterable[Prompt], seed: int) -> dict[str, str]:
    """``{prompt id: split}``, by text per language (module docstring); deterministic for a seed.

    >>> ps = [Prompt(f"p{i}", "en", "s", "k", t, Path("a.wav")) for i, t in enumerate("abcdefghijab")]
    >>> split = assign_splits(ps, seed=0)
    >>> split["p0"] == split["p10"], sorted(Counter(split.values()).items())
    (True, [('dev', 1), ('test', 1), ('train', 10)])
    """
    texts: dict[str, set[str]] = {}
    prompts = list(prompts)
    for p in prompts:
        texts.setdefault(p.language, set()).add(p.text)
    split_of: dict[tuple[str, str], str] = {}
    for language, distinct in texts.items():
        order = sorted(distinct)
        random.Random(f"{seed}:{language}").shuffle(order)
        held = max(1, round(len(order) * HELD_OUT_PERCENT / 100))
        if len(order) < 3:
            raise RecipeError(f"{language}: {len(order)} distinct texts, too few for train, dev and test (3 at least)")
        for i, text in enumerate(order):
            split_of[language, text] = "test" if i < held else "dev" if i < 2 * held else "train"
    return {p.id: split_of[p.language, p.text] for p in prompts}


def load_cuts_of(
    prompts: Sequence[Prompt],
    faults: Mapping[str, RecipeDrops],
    counts: Mapping[str, LanguageCounts],
    num_jobs: int,
    custom: Mapping[str, Any] | None = None,
) -> list[MonoCut]:
    """One cut per prompt whose audio decodes to the end, loaded at 16 kHz (lhotse's ``resample`` in the
    manifest, the file untouched); the others go to their language's ``faults``, and a text too long for its
    audio (``MAX_CHARS_PER_SECOND``) to its ``counts``. ``custom`` goes on every cut; a cut whose file has
    another rate also gets ``{"source_rate": HZ}``."""

    def load(p: Prompt) -> MonoCut | None:
        recording = checked_recording(p.audio, p.id, faults[p.language])
        if recording is None:
            return None
        extra = dict(custom or {})
        if recording.sampling_rate != SAMPLE_RATE:
            extra["source_rate"] = recording.sampling_rate
            recording = recording.resample(SAMPLE_RATE)
        sup = SupervisionSegment(
            id=p.id,
            recording_id=p.id,
            start=0.0,
            duration=recording.duration,
            channel=0,
            text=p.text,
            language=p.language,
            speaker=p.speaker,
            custom={"prompt": p.key},
        )
        return MonoCut(p.id, 0.0, recording.duration, 0, recording=recording, supervisions=[sup], custom=extra or None)

    with ThreadPoolExecutor(max(1, num_jobs)) as pool:
        loaded = [c for c in pool.map(load, prompts) if c is not None]
    cuts = []
    for cut in loaded:
        sup = cut.supervisions[0]
        if len(sup.text) > MAX_CHARS_PER_SECOND * cut.duration:
            counts[sup.language].left_out["text too long for the audio"] += 1
        else:
            cuts.append(cut)
    return cuts


def write_corpus(
    out_dir: Path,
    corpus: str,
    cuts: Sequence[MonoCut],
    split_of: Mapping[str, str],
    languages: Sequence[str],
    known: Sequence[str] = (),
) -> dict[str, CutSet]:
    """Write every split (all ``languages``, and ``{split}_{language}``) and ``unlabeled``; returns them by name.
    The per-language manifests of the ``known`` languages (the recipe's) not in this run, left by an earlier
    run, are removed, so that every split in ``out_dir`` comes from this run."""
    result: dict[str, CutSet] = {}
    for split in SPLITS:
        chosen = [c for c in cuts if split_of[c.id] == split]
        for language in languages:
            part = [c for c in chosen if c.supervisions[0].language == language]
            if not part:
                raise RecipeError(f"{corpus} split {split}_{language} is empty: too few usable {language} prompts")
            result[f"{split}_{language}"] = CutSet.from_cuts(part)
        result[split] = CutSet.from_cuts(chosen)
    for language in sorted(set(known) - set(languages)):
        for split in SPLITS:
            for kind in KINDS:
                manifest_path(out_dir, corpus, kind, f"{split}_{language}").unlink(missing_ok=True)
    for name, cut_set in result.items():
        write_split(out_dir, corpus, name, cut_set)
    result["unlabeled"] = unlabeled_cuts(result["train"], language="")
    write_unlabeled_split(out_dir, corpus, "unlabeled", result["unlabeled"])
    return result


def summary(
    corpus: str,
    cut_sets: Mapping[str, CutSet],
    counts: Mapping[str, LanguageCounts],
    packages: Sequence[Mapping[str, str]],
    licenses: Mapping[str, str],
    seed: int,
) -> dict[str, Any]:
    """The ``corpus.json`` of a prompt corpus: per language its files, what was left out and why, and per
    split its utterances, hours and distinct texts; the packages read and the licenses."""
    languages: dict[str, Any] = {}
    for language, c in sorted(counts.items()):
        splits = {}
        for split in SPLITS:
            cuts = cut_sets.get(f"{split}_{language}", CutSet())
            splits[split] = {
                "utterances": len(cuts),
                "hours": round(sum(cut.duration for cut in cuts) / 3600, 4),
                "texts": len({s.text for cut in cuts for s in cut.supervisions}),
            }
        used = sum(s["utterances"] for s in splits.values())
        languages[language] = {
            "license": licenses[language],
            "audio_files": c.audio_files,
            "used": used,
            "hours": round(sum(s["hours"] for s in splits.values()), 4),
            "without_text": c.left_out.get("audio without transcript", 0),
            "unreadable": sum(c.unreadable.values()),
            "left_out": dict(sorted(c.left_out.items())),
            "unreadable_by_kind": dict(sorted(c.unreadable.items())),
            "texts_without_audio": c.texts_without_audio,
            "duplicate_texts": c.duplicate_texts,
            "splits": splits,
        }
    return {
        "corpus": corpus,
        "sample_rate": SAMPLE_RATE,
        "split_seed": seed,
        "held_out_percent": HELD_OUT_PERCENT,
        "packages": list(packages),
        "languages": languages,
    }


def checked_arguments(
    debs: str | Path, out_dir: str | Path, languages: Sequence[str], known: Sequence[str]
) -> tuple[Path, Path]:
    """(``debs``, ``out_dir``) as paths, ``out_dir`` created; ``RecipeError`` for a language not in ``known``
    or a ``debs`` that is not a folder."""
    unknown = sorted(set(languages) - set(known))
    if unknown or not languages:
        raise RecipeError(f"languages={','.join(languages)}: choose among {','.join(known)}")
    debs, out_dir = Path(debs), Path(out_dir)
    if not debs.is_dir():
        raise RecipeError(f"debs={debs} is not a folder; pass the folder where `apt-get download ...` wrote the .debs")
    out_dir.mkdir(parents=True, exist_ok=True)
    return debs, out_dir


def finish_corpus(
    out_dir: Path,
    corpus: str,
    prompts: Sequence[Prompt],
    packages: Sequence[Any],
    counts: Mapping[str, LanguageCounts],
    faults: Mapping[str, Any],
    known: Sequence[str],
    licenses: Mapping[str, str],
    seed: int,
    num_jobs: int,
    **extra: Any,
) -> tuple[dict, dict]:
    """Read the prompts' audio, split the texts of those kept, write the manifests and ``corpus.json``
    (``extra`` keys added to it): the shared end of the prompt corpora's recipes. Returns (CutSets by
    split, summary)."""
    languages = tuple(counts)
    cuts = load_cuts_of(prompts, faults, counts, num_jobs)
    for lang in languages:
        counts[lang].unreadable.update(faults[lang].counts())
    usable = {cut.id for cut in cuts}  # split the texts of the prompts kept, so that no split is left empty
    split_of = assign_splits([p for p in prompts if p.id in usable], seed)
    cut_sets = write_corpus(out_dir, corpus, cuts, split_of, languages, known)
    meta = [{"name": p.name, "version": p.version, "source": p.source} for p in packages]
    data = summary(corpus, cut_sets, counts, meta, licenses, seed) | extra
    write_summary(out_dir, data)
    return cut_sets, data


def write_summary(out_dir: Path, data: Mapping[str, Any]) -> None:
    (out_dir / SUMMARY).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def print_summary(corpus: str, out_dir: Path, cut_sets: Mapping[str, CutSet], data: Mapping[str, Any]) -> None:
    """The split table of all languages, then one line per language: files, used, left out by kind."""
    rows = split_rows({name: cut_sets[name] for name in (*SPLITS, "unlabeled")})
    lines = []
    for language, row in data["languages"].items():
        left = ", ".join(f"{n} {kind}" for kind, n in row["left_out"].items()) or "none"
        bad = ", ".join(f"{n} {kind}" for kind, n in row["unreadable_by_kind"].items()) or "none"
        per_split = ", ".join(f"{s} {v['utterances']} ({v['texts']} texts)" for s, v in row["splits"].items())
        lines.append(
            f"{language}: {row['audio_files']} audio files, {row['used']} used ({row['hours']:.3f} h: {per_split}); "
            f"left out: {left}; unreadable: {bad}; {row['texts_without_audio']} texts without audio"
        )
    print_split_table(f"{corpus} manifests in {out_dir}", rows, footer="\n".join(lines))
