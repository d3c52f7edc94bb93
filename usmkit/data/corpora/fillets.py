"""Fish Fillets NG: the game's spoken dialogue in Czech and Dutch (several voice actors, Ogg Vorbis at
22-44 kHz), from Debian's packages.

The packages (``apt-get download fillets-ng-data-cs fillets-ng-data-nl fillets-ng-data``)::

    fillets-ng-data-LANG   usr/share/games/fillets-ng/sound/<level>/LANG/<id>.ogg     (share/<group>/LANG/ too)
    fillets-ng-data        usr/share/games/fillets-ng/script/<level>/dialogs_LANG.lua (script/share/*_dialogs_LANG.lua)

A dialogue file pairs each line's id with its text::

    dialogId("let-m-divna", "font_small", "What kind of strange ship is that?")   -- the English original
    dialogStr("Co je to za divnou loď?")                                           -- the LANG text

``debs=DIR`` holds the ``.deb`` files, or each package unpacked to ``DIR/<package>/`` (``usmkit.data.corpora.
debian``); the ogg files and the dialogue files are extracted under ``{out}/packages/``. Cuts load at 16 kHz
(lhotse's ``resample`` in the manifest).

The text of ``sound/<level>/LANG/<id>.ogg`` is the ``dialogStr`` after ``dialogId("<id>", ...)``; an id with
different texts in several files takes the one of ``script/<level>/``, and is ``ambiguous text`` when none
or several of those are there. The speaker is the id's middle part per language (``let-m-divna``: ``cs-m``, the
small fish; ``v``: the big fish; other letters: the other characters). Transcripts:
``usmkit.data.corpora.prompts.normalize_prompt`` (no digit table for cs and nl: a line with a number is left
out, counted, as are read-aloud symbols such as the ``%1`` placeholders). An ogg without a text is counted as
``audio without transcript``. Splits by text per language: ``prompts.assign_splits``.

License: GPL-2 (the packages' ``copyright`` files).

CLI: ``python -m usmkit.cli.prepare fillets out=data/fillets debs=DIR [languages=[cs,nl]] [seed=0] [num_jobs=1]
[on_error=fail|skip]``
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

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

CORPUS = "fillets"
LANGUAGES = ("cs", "nl")
LICENSES = {"cs": "GPL-2", "nl": "GPL-2"}
GAME = "usr/share/games/fillets-ng"
_STRING = r'"(?:[^"\\]|\\.)*"'
_DIALOG = re.compile(
    rf'dialogId\(\s*"(?P<id>[^"\\]*)"(?:[^()"]|{_STRING})*\)\s*dialogStr\(\s*"(?P<text>(?:[^"\\]|\\.)*)"\s*\)'
)
_ESCAPE = re.compile(r"\\(.)", re.S)


def lua_unescape(text: str) -> str:
    r"""A Lua string literal's content: ``\n``/``\t`` as spaces, any other escaped character as itself.

    >>> lua_unescape(r'say \"hi\"\nnow \\ ok')
    'say "hi" now \\ ok'
    """
    return _ESCAPE.sub(lambda m: " " if m[1] in "nt" else m[1], text)


def read_dialogues(path: Path, faults: RecipeDrops) -> dict[str, str]:
    """``{id: text}`` of one ``dialogs_LANG.lua`` (the first text of an id repeated in the file)."""
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        faults.seen()
        faults.drop("unreadable text file", str(path), f"cannot read it as UTF-8 ({e})")
        return {}
    out: dict[str, str] = {}
    for match in _DIALOG.finditer(source):
        out.setdefault(match["id"], lua_unescape(match["text"]))
    return out


def level_of(path: PurePosixPath, top: str) -> str:
    """The level folder of a game file: ``sound/airplane/cs/x.ogg`` -> ``airplane``, ``script/share/...`` -> ``share``."""
    parts = path.parts
    return parts[parts.index(top) + 1]


def dialogue_texts(root: Path, language: str, faults: RecipeDrops) -> dict[str, dict[str, str]]:
    """``{id: {level: text}}`` over every ``script/**/*dialogs_LANG.lua`` under the data package."""
    script = root / GAME / "script"
    files = sorted(script.rglob(f"*dialogs_{language}.lua")) if script.is_dir() else []
    if not files:
        raise RecipeError(f"no {script}/<level>/dialogs_{language}.lua: is {root} the package fillets-ng-data?")
    texts: dict[str, dict[str, str]] = {}
    for path in files:
        level = level_of(PurePosixPath(path.relative_to(root).as_posix()), "script")
        for dialog_id, text in read_dialogues(path, faults).items():
            texts.setdefault(dialog_id, {}).setdefault(level, text)
    return texts


def text_for(dialog_id: str, level: str, texts: dict[str, dict[str, str]]) -> str | None:
    """The id's text: the only one, or the one of the sound's own level; None when absent or ambiguous."""
    by_level = texts.get(dialog_id, {})
    if len(set(by_level.values())) == 1:
        return next(iter(by_level.values()))
    return by_level.get(level)


def speaker_of(dialog_id: str, language: str) -> str:
    """``let-m-divna`` -> ``cs-m``; ``cs-?`` for an id without the middle part."""
    parts = dialog_id.split("-")
    return f"{language}-{parts[1] if len(parts) >= 3 else '?'}"


def scan_language(
    language: str, sound_root: Path, texts: dict[str, dict[str, str]], counts: LanguageCounts
) -> list[Prompt]:
    sound = sound_root / GAME / "sound"
    oggs = sorted(p for p in sound.rglob("*.ogg") if p.parent.name == language) if sound.is_dir() else []
    if not oggs:
        raise RecipeError(
            f"no {sound}/<level>/{language}/*.ogg: is {sound_root} the package fillets-ng-data-{language}?"
        )
    prompts, ids = [], set()
    for ogg in oggs:
        rel = PurePosixPath(ogg.relative_to(sound).as_posix())
        dialog_id, level = ogg.stem, rel.parts[0]
        ids.add(dialog_id)
        counts.audio_files += 1
        raw = text_for(dialog_id, level, texts)
        if raw is None:
            kind = "ambiguous text" if dialog_id in texts else "audio without transcript"
            counts.left_out[kind] += 1
            continue
        try:
            text = normalize_prompt(raw, language)
        except LeftOut as e:
            counts.left_out[e.kind] += 1
            continue
        key = rel.with_suffix("").as_posix()
        prompt_id = f"{CORPUS}-{key.replace('/', '-')}"
        prompts.append(Prompt(prompt_id, language, speaker_of(dialog_id, language), key, text, ogg))
    counts.texts_without_audio = len(set(texts) - ids)
    return prompts


def _want(languages: tuple[str, ...]) -> Callable[[str], bool]:
    def want(path: str) -> bool:
        if path.endswith("/copyright"):
            return True
        if path.startswith(f"{GAME}/script/"):
            return any(path.endswith(f"dialogs_{lang}.lua") for lang in languages)
        return path.startswith(f"{GAME}/sound/") and path.endswith(".ogg") and path.split("/")[-2] in languages

    return want


def prepare_fillets(
    debs: str | Path,
    out_dir: str | Path = Path("data/fillets"),
    languages: tuple[str, ...] = LANGUAGES,
    seed: int = 0,
    num_jobs: int = 1,
    on_error: str = "fail",
) -> tuple[dict, dict]:
    """Write the fillets manifests and ``corpus.json`` to ``out_dir``; returns (CutSets by split, summary)."""
    debs, out_dir = checked_arguments(debs, out_dir, languages, LANGUAGES)
    want = _want(languages)
    data_pkg = package_root(debs, "fillets-ng-data", out_dir / "packages", want)
    packages: list[Package] = [data_pkg]
    prompts: list[Prompt] = []
    counts = {lang: LanguageCounts() for lang in languages}
    faults = {lang: RecipeDrops(on_error) for lang in languages}  # type: ignore[arg-type]  (checked there)
    for lang in languages:
        sound_pkg = package_root(debs, f"fillets-ng-data-{lang}", out_dir / "packages", want)
        packages.append(sound_pkg)
        texts = dialogue_texts(data_pkg.root, lang, faults[lang])
        prompts += scan_language(lang, sound_pkg.root, texts, counts[lang])
    return finish_corpus(out_dir, CORPUS, prompts, packages, counts, faults, LANGUAGES, LICENSES, seed, num_jobs)


@dataclass(frozen=True)
class FilletsArgs:
    out: Path = Path("data/fillets")
    debs: str = ""  # the folder holding the .deb files (or the unpacked packages)
    languages: tuple[str, ...] = LANGUAGES
    seed: int = 0
    num_jobs: int = 1
    on_error: str = "fail"  # fail | skip


USAGE = """\
usage: python -m usmkit.cli.prepare fillets debs=DIR [key=value ...]

  debs=DIR               folder of fillets-ng-data-{cs,nl}_*.deb and fillets-ng-data_*.deb (apt-get download ...)
                         or of the unpacked packages
  out=PATH               output directory (default data/fillets); the ogg files are extracted to out/packages/
  languages=[cs,nl]      the languages to read (default [cs,nl])
  seed=S                 seed of the split of each language's texts into train/dev/test (default 0)
  num_jobs=N             reader threads (default 1)
  on_error=fail|skip     stop at the first unreadable file (default) or leave it out, counted in the summary
"""


def run(args: FilletsArgs) -> None:
    """``python -m usmkit.cli.prepare fillets key=value ...`` (``USAGE``)."""
    if not args.debs:
        raise RecipeError(
            "pass debs=DIR, a folder where `apt-get download fillets-ng-data-cs fillets-ng-data-nl fillets-ng-data` "
            "wrote the packages"
        )
    languages = tuple(args.languages)
    cut_sets, data = prepare_fillets(args.debs, args.out, languages, args.seed, args.num_jobs, args.on_error)
    print_summary(CORPUS, args.out, cut_sets, data)


ARGS = FilletsArgs
