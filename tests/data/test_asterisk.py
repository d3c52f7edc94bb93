"""The asterisk recipe on tiny packages written in the test (two languages, every kind of left-out file),
as .deb files and as unpacked folders; one slow test reads the real Debian packages when present."""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from deb_fixtures import unpack_to, write_deb

from usmkit.cli.prepare import main as prepare_main
from usmkit.data.manifests import available_splits, load_cuts

SR = 8000
VOICES = {"en": "en_US_f_Allison", "ru": "ru_RU_f_IvrvoiceRU"}
# key -> (text line or None, seconds); None: a wav without a line
EN = {
    "hello": ("Hello there.", 1.5),
    "press-1": ("Press 1 to continue.", 1.5),
    "digits/1": ("one", 1.0),
    "digits/2": ("two", 1.0),
    "goodbye": ("Goodbye.", 1.0),
    "thanks": ("Thank you.", 1.0),
    "welcome": ("Welcome to the test.", 1.5),
    "again": ("Please try again.", 1.5),
    "later": ("Call back later.", 1.5),
    "conf": ("conf: Doubled key.", 1.0),  # the key written twice: kept, without it
    "beep": ("[beep tone]", 0.5),  # no speech
    "dial": ("Dial 1234 now.", 1.5),  # number
    "star": ("Press * now.", 1.5),  # symbol read aloud
    "joined": ("First one.next-key: Second one.", 2.0),  # two texts on one line
    "fast": ("This text is far too long for the short audio it has.", 0.3),  # text too long for the audio
    "silence/1": (None, 1.0),  # audio without transcript
}
RU = {
    "privet": ("Привет.", 1.0),
    "poka": ("Пока!", 1.0),
    "spasibo": ("Спасибо.", 1.0),
    "zhdite": ("Пожалуйста, ждите.", 1.5),
    "nazhmite": ("Нажмите 1.", 1.0),  # number: no Russian digit table
    "at": ("at [@]", 1.0),  # other script
}
EXTRA_LINES = {"en": ["missing: No audio for this line.", "hello: A second line for hello."], "ru": []}


def wav_bytes(seconds: float, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    x = 0.2 * np.sin(2 * np.pi * 220 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) + 0.01 * rng.standard_normal(t.size)
    buffer = io.BytesIO()
    sf.write(buffer, x.astype(np.float32), SR, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def package_files(language: str) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(wav package files, text package files) of one language, paths relative to the package root."""
    prompts = EN if language == "en" else RU
    voice = f"usr/share/asterisk/sounds/{VOICES[language]}"
    wavs = {f"{voice}/{key}.wav": wav_bytes(sec, i) for i, (key, (_, sec)) in enumerate(prompts.items())}
    lines = [f"; Core Asterisk Sounds in {language}", ""]
    lines += [f"{key}: {text}" for key, (text, _) in prompts.items() if text is not None] + EXTRA_LINES[language]
    if language == "en":
        wavs[f"{voice}/broken.wav"] = b"RIFF\x10\x00\x00\x00WAVEnot audio"  # unreadable
        lines.append("broken: A broken file.")
    wavs[f"usr/share/doc/asterisk-core-sounds-{language}-wav/copyright"] = b"License: CC-BY-SA-3.0\n"
    doc = f"usr/share/doc/asterisk-core-sounds-{language}"
    text = {f"{doc}/core-sounds-{language}.txt.gz": gzip.compress("\n".join(lines).encode("utf-8"))}
    return wavs, text


def make_debs(folder: Path, unpacked: bool = False) -> Path:
    for language in VOICES:
        wavs, text = package_files(language)
        for name, files in ((f"asterisk-core-sounds-{language}-wav", wavs), (f"asterisk-core-sounds-{language}", text)):
            if unpacked:
                unpack_to(folder / name, files)
            else:
                write_deb(folder, name, files, version="1.6.1-1")
    return folder


def prepare(out: Path, debs: Path, *extra: str) -> int:
    return prepare_main(["asterisk", f"out={out}", f"debs={debs}", "languages=[en,ru]", *extra])


def test_asterisk_recipe_counts_every_file_and_splits_by_text(tmp_path):
    out = tmp_path / "asterisk"
    assert prepare(out, make_debs(tmp_path / "debs"), "on_error=skip") == 0
    summary = json.loads((out / "corpus.json").read_text())
    assert summary["corpus"] == "asterisk"
    en, ru = summary["languages"]["en"], summary["languages"]["ru"]
    assert en["audio_files"] == len(EN) + 1 and ru["audio_files"] == len(RU)
    assert en["left_out"] == {
        "audio without transcript": 1,
        "no speech": 1,
        "number": 1,
        "symbol read aloud": 1,
        "text too long for the audio": 1,
        "two texts on one line": 1,
    }
    assert en["unreadable"] == 1 and en["unreadable_by_kind"] == {"corrupt audio": 1}
    assert en["without_text"] == 1 and en["texts_without_audio"] == 1 and en["duplicate_texts"] == 1
    assert en["used"] == len(EN) - 6 and ru["used"] == len(RU) - 2
    assert ru["left_out"] == {"number": 1, "other script": 1}
    for row in (en, ru):  # the texts of the prompts kept are split, those left out after reading the audio too
        assert [row["splits"][s]["texts"] for s in ("dev", "test")] == [1, 1]
    assert (en["license"], ru["license"]) == ("CC-BY-SA-3.0", "CC-BY-3.0")
    assert {p["name"]: p["version"] for p in summary["packages"]}["asterisk-core-sounds-ru-wav"] == "1.6.1-1"

    splits = set(available_splits(out, "asterisk"))
    assert splits == {"train", "dev", "test", "unlabeled"} | {
        f"{s}_{lang}" for s in ("train", "dev", "test") for lang in VOICES
    }
    seen: dict[tuple[str, str], str] = {}
    texts = {}
    for split in ("train", "dev", "test"):
        cuts = load_cuts(out, split, corpus="asterisk")
        per_language = sum(len(load_cuts(out, f"{split}_{lang}", corpus="asterisk")) for lang in VOICES)
        assert len(cuts) == per_language >= 2  # each language has its own held-out texts
        for cut in cuts:
            sup = cut.supervisions[0]
            assert seen.setdefault((sup.language, sup.text), split) == split  # no text in two splits
            assert sup.speaker == VOICES[sup.language]
            assert cut.recording.sampling_rate == 16000 and cut.custom == {"source_rate": 8000}
            texts[sup.custom["prompt"]] = sup.text
    assert texts["press-1"] == "press one to continue" and texts["conf"] == "doubled key"
    assert texts["digits/1"] == "one" and texts["zhdite"] == "пожалуйста ждите"
    cut = next(iter(load_cuts(out, "train_en", corpus="asterisk")))
    assert cut.load_audio().shape[1] == pytest.approx(cut.duration * 16000, abs=2)
    assert len(load_cuts(out, "unlabeled", corpus="asterisk")) == len(load_cuts(out, "train", corpus="asterisk"))


def test_asterisk_recipe_reads_unpacked_packages_alike(tmp_path):
    from_debs, from_folders = tmp_path / "a", tmp_path / "b"
    assert prepare(from_debs, make_debs(tmp_path / "debs"), "on_error=skip") == 0
    assert prepare(from_folders, make_debs(tmp_path / "unpacked", unpacked=True), "on_error=skip") == 0
    for split in ("train", "dev", "test"):
        a = {c.id: c.supervisions[0].text for c in load_cuts(from_debs, split, corpus="asterisk")}
        b = {c.id: c.supervisions[0].text for c in load_cuts(from_folders, split, corpus="asterisk")}
        assert a == b
    assert not (from_folders / "packages").exists()  # the unpacked audio is read where it is


def test_asterisk_rerun_with_fewer_languages_removes_their_splits(tmp_path):
    out, debs = tmp_path / "asterisk", make_debs(tmp_path / "unpacked", unpacked=True)
    assert prepare(out, debs, "on_error=skip") == 0
    other = out / "asterisk_cuts_test_8k.jsonl.gz"  # another recipe's split (prepare bandlimit) in the folder
    other.write_bytes((out / "asterisk_cuts_test.jsonl.gz").read_bytes())
    assert prepare_main(["asterisk", f"out={out}", f"debs={debs}", "languages=[en]", "on_error=skip"]) == 0
    splits = set(available_splits(out, "asterisk"))
    assert splits == {"train", "dev", "test", "unlabeled", "train_en", "dev_en", "test_en", "test_8k"}
    assert not list(out.glob("asterisk_*_ru.jsonl.gz"))
    assert {c.supervisions[0].language for c in load_cuts(out, "train", corpus="asterisk")} == {"en"}
    assert set(json.loads((out / "corpus.json").read_text())["languages"]) == {"en"}


@pytest.mark.parametrize("seed", range(5))
def test_texts_left_out_after_reading_the_audio_take_no_split_place(tmp_path, seed):
    """Three usable texts and one too long for its audio: whatever the seed, each split gets one usable text."""
    voice = f"usr/share/asterisk/sounds/{VOICES['ru']}"
    prompts = {"a": ("Один.", 1.0), "b": ("Два.", 1.0), "c": ("Три.", 1.0), "d": ("Это слишком длинный текст.", 0.2)}
    wavs = {f"{voice}/{key}.wav": wav_bytes(sec, i) for i, (key, (_, sec)) in enumerate(prompts.items())}
    lines = "\n".join(f"{key}: {text}" for key, (text, _) in prompts.items())
    text = {"usr/share/doc/asterisk-core-sounds-ru/core-sounds-ru.txt.gz": gzip.compress(lines.encode())}
    write_deb(tmp_path / "debs", "asterisk-core-sounds-ru-wav", wavs)
    write_deb(tmp_path / "debs", "asterisk-core-sounds-ru", text)
    out = tmp_path / "out"
    assert prepare_main(["asterisk", f"out={out}", f"debs={tmp_path / 'debs'}", "languages=[ru]", f"seed={seed}"]) == 0
    row = json.loads((out / "corpus.json").read_text())["languages"]["ru"]
    assert row["left_out"] == {"text too long for the audio": 1}
    assert {split: v["texts"] for split, v in row["splits"].items()} == {"train": 1, "dev": 1, "test": 1}


def test_asterisk_recipe_stops_at_an_unreadable_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        prepare(tmp_path / "out", make_debs(tmp_path / "debs"))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "broken.wav" in err and "on_error=skip" in err


def test_asterisk_recipe_refuses_another_corpus_folder(tmp_path, capsys):
    other = tmp_path / "kathleen"
    other.mkdir()
    (other / "kathleen_cuts_train.jsonl.gz").write_bytes(b"")
    with pytest.raises(SystemExit) as exit_:
        prepare(other, make_debs(tmp_path / "debs"), "on_error=skip")
    assert exit_.value.code == 2 and "kathleen" in capsys.readouterr().err
    assert sorted(p.name for p in other.iterdir()) == ["kathleen_cuts_train.jsonl.gz"]


def test_asterisk_recipe_names_the_missing_package(tmp_path, capsys):
    debs = make_debs(tmp_path / "debs")
    next(debs.glob("asterisk-core-sounds-ru_*.deb")).unlink()
    with pytest.raises(SystemExit) as exit_:
        prepare(tmp_path / "out", debs, "on_error=skip")
    assert exit_.value.code == 2
    assert "apt-get download asterisk-core-sounds-ru" in capsys.readouterr().err


REAL_DEBS = Path(os.environ.get("USMKIT_DEBS") or "/nonexistent")  # the folder `apt-get download ...` wrote to


@pytest.mark.slow
@pytest.mark.skipif(not list(REAL_DEBS.glob("asterisk-core-sounds-*.deb")), reason="no asterisk .debs in $USMKIT_DEBS")
def test_asterisk_recipe_on_the_debian_packages(tmp_path):
    out = tmp_path / "asterisk"
    assert prepare_main(["asterisk", f"out={out}", f"debs={REAL_DEBS}", "num_jobs=2"]) == 0
    summary = json.loads((out / "corpus.json").read_text())
    for language, row in summary["languages"].items():
        assert 520 <= row["audio_files"] <= 610 and row["unreadable"] == 0, (language, row)
        assert row["used"] >= 450 and 0.2 < row["hours"] < 0.6, (language, row)
        assert all(s["utterances"] > 30 for s in row["splits"].values()), (language, row)
