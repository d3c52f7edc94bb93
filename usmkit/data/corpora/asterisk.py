"""Asterisk core sounds: telephone-system prompts read by one professional voice per language (en, es, fr,
it, ru), 8 kHz, from Debian's packages.

The packages (``apt-get download`` writes them to the current folder)::

    apt-get download asterisk-core-sounds-{en,es,fr,it,ru}-wav asterisk-core-sounds-{en,es,fr,it,ru}

    asterisk-core-sounds-LANG-wav   usr/share/asterisk/sounds/<voice>/**/*.wav    e.g. en_US_f_Allison/digits/1.wav
    asterisk-core-sounds-LANG       usr/share/doc/asterisk-core-sounds-LANG/core-sounds-LANG.txt.gz
                                    one ``relative/path: text`` line per prompt (``digits/1: one``), ``;`` comments

``debs=DIR`` holds the ``.deb`` files, or each package unpacked to ``DIR/<package>/`` (``usmkit.data.corpora.
debian``). The wav files are extracted under ``{out}/packages/`` and stay 8 kHz there; every cut loads at 16 kHz
(lhotse's ``resample`` in the manifest) and carries ``custom["source_rate"] = 8000``: the whole corpus is
narrowband (a telephone band, like the ``test_8k`` copies of ``prepare bandlimit``).

Transcripts: ``usmkit.data.corpora.prompts.normalize_prompt`` (lowercase, punctuation out, single digits as
the language's words, prompts with other numbers, read-aloud symbols such as ``press *`` or notes such as
``[beep tone]`` left out and counted). A repeated key at the start of a text (``conf-adminmenu: conf-adminmenu:
...``) is dropped; a line holding a second ``key: text`` (a lost line break) is left out. A wav without a
line (es ``digits/10``, whose line is misnamed ``digits/0``) is
counted as ``audio without transcript``; a text line without audio as a text without audio; a second line for
one key as a duplicate text (the first is kept). Splits by text per language: ``prompts.assign_splits``.

Licenses (each package's ``copyright`` file): en, es, fr CC-BY-SA-3.0; it, ru CC-BY-3.0.

CLI: ``python -m usmkit.cli.prepare asterisk out=data/asterisk debs=DIR [languages=[en,es,fr,it,ru]] [seed=0]
[num_jobs=1] [on_error=fail|skip]``
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from usmkit.data.corpora.common import RecipeDrops, RecipeError
from usmkit.data.corpora.debian import Package, package_root
from usmkit.data.corpora.prompts import (
    LanguageCounts,
    LeftOut,
    Prompt,
    checked_arguments,
    finish_corpus,
    normalize_prompt,
    print_summary,
)

CORPUS = "asterisk"
LANGUAGES = ("en", "es", "fr", "it", "ru")
LICENSES = {"en": "CC-BY-SA-3.0", "es": "CC-BY-SA-3.0", "fr": "CC-BY-SA-3.0", "it": "CC-BY-3.0", "ru": "CC-BY-3.0"}
SOUNDS = "usr/share/asterisk/sounds"
NARROWBAND_RATE = 8000
_JOINED = re.compile(r"(?:^|[\s.,;])[a-z][a-z0-9_]*(?:[-/][a-z0-9_]+)+:\s")  # "... dièse.vm-review-nonurgent: Pour"


def text_path(language: str) -> str:
    return f"usr/share/doc/asterisk-core-sounds-{language}/core-sounds-{language}.txt.gz"


def read_prompt_texts(path: Path, counts: LanguageCounts, faults: RecipeDrops) -> dict[str, str]:
    """``{key: raw text}`` of a ``core-sounds-LANG.txt.gz`` (or plain ``.txt``); duplicates counted in
    ``counts``, an unreadable file or a line without ``key:`` in ``faults``."""
    try:
        raw = path.read_bytes()
        data = gzip.decompress(raw) if path.suffix == ".gz" else raw
        text = data.decode("utf-8-sig")
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as e:
        faults.seen()
        faults.drop("unreadable text file", str(path), f"cannot read it as gzip-compressed UTF-8 ({e})")
        return {}
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith(";"):
            continue
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep or not key or " " in key:
            faults.seen()
            faults.drop("text line without key", f"{path}:{lineno}", f"{line[:60]!r} is not 'relative/path: text'")
            continue
        value = value.strip()
        if value.startswith(f"{key}:"):  # the key written twice
            value = value[len(key) + 1 :].strip()
        if key in out:
            counts.duplicate_texts += 1
            continue
        out[key] = value
    return out


def voice_dir(root: Path, language: str) -> Path:
    """``usr/share/asterisk/sounds/<lang>_<region>_<sex>_<name>`` (or ``.../<lang>``) of a wav package."""
    sounds = root / SOUNDS
    found = sorted(p for p in sounds.glob(f"{language}*") if p.is_dir()) if sounds.is_dir() else []
    if not found:
        raise RecipeError(
            f"no {sounds}/{language}_* folder of wav files: is {root} asterisk-core-sounds-{language}-wav?"
        )
    return found[0]


def scan_language(
    language: str, wav_root: Path, text_root: Path, counts: LanguageCounts, faults: RecipeDrops
) -> list[Prompt]:
    """The prompts of one language with a usable transcript; the rest counted in ``counts``/``faults``."""
    voice = voice_dir(wav_root, language)
    texts_file = text_root / text_path(language)
    if not texts_file.is_file():
        raise RecipeError(f"no {texts_file}: is {text_root} the package asterisk-core-sounds-{language}?")
    texts = read_prompt_texts(texts_file, counts, faults)
    prompts, keys = [], set()
    for wav in sorted(voice.rglob("*.wav")):
        key = wav.relative_to(voice).with_suffix("").as_posix()
        keys.add(key)
        counts.audio_files += 1
        if key not in texts:
            counts.left_out["audio without transcript"] += 1
            continue
        if _JOINED.search(texts[key]):
            counts.left_out["two texts on one line"] += 1
            continue
        try:
            text = normalize_prompt(texts[key], language)
        except LeftOut as e:
            counts.left_out[e.kind] += 1
            continue
        prompt_id = f"{CORPUS}-{language}-{key.replace('/', '-')}"
        prompts.append(Prompt(prompt_id, language, voice.name, key, text, wav))
    counts.texts_without_audio = len(set(texts) - keys)
    return prompts


def _want(language: str) -> Callable[[str], bool]:
    def want(path: str) -> bool:
        return (
            (path.startswith(f"{SOUNDS}/") and path.endswith(".wav"))
            or path == text_path(language)
            or path.endswith("/copyright")
        )

    return want


def prepare_asterisk(
    debs: str | Path,
    out_dir: str | Path = Path("data/asterisk"),
    languages: tuple[str, ...] = LANGUAGES,
    seed: int = 0,
    num_jobs: int = 1,
    on_error: str = "fail",
) -> tuple[dict, dict]:
    """Write the asterisk manifests and ``corpus.json`` to ``out_dir``; returns (CutSets by split, summary)."""
    debs, out_dir = checked_arguments(debs, out_dir, languages, LANGUAGES)
    packages: list[Package] = []
    prompts: list[Prompt] = []
    counts = {lang: LanguageCounts() for lang in languages}
    faults = {lang: RecipeDrops(on_error) for lang in languages}  # type: ignore[arg-type]  (checked there)
    for lang in languages:
        wav = package_root(debs, f"asterisk-core-sounds-{lang}-wav", out_dir / "packages", _want(lang))
        text = package_root(debs, f"asterisk-core-sounds-{lang}", out_dir / "packages", _want(lang))
        packages += [wav, text]
        prompts += scan_language(lang, wav.root, text.root, counts[lang], faults[lang])
    return finish_corpus(
        out_dir,
        CORPUS,
        prompts,
        packages,
        counts,
        faults,
        LANGUAGES,
        LICENSES,
        seed,
        num_jobs,
        narrowband={"source_rate": NARROWBAND_RATE, "loaded_at": 16000},
    )


@dataclass(frozen=True)
class AsteriskArgs:
    out: Path = Path("data/asterisk")
    debs: str = ""  # the folder holding the .deb files (or the unpacked packages)
    languages: tuple[str, ...] = LANGUAGES
    seed: int = 0
    num_jobs: int = 1
    on_error: str = "fail"  # fail | skip


USAGE = """\
usage: python -m usmkit.cli.prepare asterisk debs=DIR [key=value ...]

  debs=DIR               folder of asterisk-core-sounds-LANG[-wav]_*.deb (apt-get download ...) or unpacked packages
  out=PATH               output directory (default data/asterisk); the wav files are extracted to out/packages/
  languages=[en,es,...]  the languages to read (default [en,es,fr,it,ru])
  seed=S                 seed of the split of each language's texts into train/dev/test (default 0)
  num_jobs=N             reader threads (default 1)
  on_error=fail|skip     stop at the first unreadable file (default) or leave it out, counted in the summary
"""


def run(args: AsteriskArgs) -> None:
    """``python -m usmkit.cli.prepare asterisk key=value ...`` (``USAGE``)."""
    if not args.debs:
        raise RecipeError(
            "pass debs=DIR, a folder where `apt-get download asterisk-core-sounds-{en,es,fr,it,ru}-wav "
            "asterisk-core-sounds-{en,es,fr,it,ru}` wrote the packages"
        )
    languages = tuple(args.languages)
    cut_sets, data = prepare_asterisk(args.debs, args.out, languages, args.seed, args.num_jobs, args.on_error)
    print_summary(CORPUS, args.out, cut_sets, data)


ARGS = AsteriskArgs
