"""The fillets recipe on tiny packages written in the test (Lua dialogue files, Ogg Vorbis lines in two
languages); one slow test reads the real Debian packages when present."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from deb_fixtures import write_deb

from usmkit.cli.prepare import main as prepare_main
from usmkit.data.corpora.common import RecipeDrops
from usmkit.data.corpora.fillets import lua_unescape, read_dialogues
from usmkit.data.manifests import load_cuts

GAME = "usr/share/games/fillets-ng"
SR = 22050
# level -> [(id, cs text, nl text)]; a None text: no dialogStr for that id
LINES = {
    "airplane": [
        ("let-m-divna", "Co je to za divnou loď?", "Wat is dit voor raar schip?"),
        ("let-v-oko", "Vidíš to oko?", "Zie je dat oog?"),
        ("let-v-vrak", "To je vrak letadla Poseidon 737.", "Dat is het wrak van de Poseidon 737."),  # number
        ("let-m-hlas", 'Řekl: \\"Ahoj\\"', 'Hij zei: \\"Hallo\\"'),  # escaped quotes
        ("let-m-dva", "Jedna věta.", "Een zin."),
    ],
    "broom": [
        ("kos-m-zamet", "Zameť to!", "Veeg het op!"),
        ("kos-v-koste", "Koště je tady.", "De bezem is hier."),
        ("kos-v-hodiny", "Konkrétně %1 hodin!", "Precies %1 uur!"),  # symbol read aloud
        ("kos-m-prazdno", "", ""),  # empty text
        ("kos-m-dva", "Jiná věta.", "Een andere zin."),  # also in airplane with another text: its level's wins
    ],
    "share": [("sp-smrt", "Jsem mrtvá.", "Ik ben dood.")],
}
NO_TEXT = {"cs": "airplane/cs/let-m-bez.ogg", "nl": "broom/nl/kos-m-bez.ogg"}


def lua(level: str, language: str) -> bytes:
    index = 1 if language == "cs" else 2
    parts = ['dialogLoad("script/"..codename.."/")', ""]
    for line in LINES[level]:
        parts.append(f'dialogId("{line[0]}", "font_small", "English (with parens) text")')
        parts.append(f'dialogStr(\n"{line[index]}")\n')
    if level == "airplane":  # an id of the other level, with another text
        parts += ['dialogId("kos-m-dva", "font_big", "x")', f'dialogStr("{"Jiná" if index == 1 else "Andere"}.")']
    return "\n".join(parts).encode("utf-8")


def ogg(seconds: float, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    x = 0.2 * np.sin(2 * np.pi * 180 * t) + 0.01 * rng.standard_normal(t.size)
    buffer = io.BytesIO()
    sf.write(buffer, x.astype(np.float32), SR, format="OGG", subtype="VORBIS")
    return buffer.getvalue()


def make_debs(folder: Path) -> Path:
    scripts = {}
    for level in LINES:
        for language in ("cs", "nl"):
            name = f"{level}/dialogs_{language}.lua" if level != "share" else f"share/bore_dialogs_{language}.lua"
            scripts[f"{GAME}/script/{name}"] = lua(level, language)
    scripts[f"{GAME}/script/airplane/dialogs_de.lua"] = b'dialogId("let-m-divna", "f", "x")\ndialogStr("Was?")'
    write_deb(folder, "fillets-ng-data", scripts, version="1.0.1-1.1")
    for language in ("cs", "nl"):
        sounds = {}
        for level, lines in LINES.items():
            sub = f"{level}/{language}" if level != "share" else f"share/bore/{language}"
            for i, (dialog_id, *_) in enumerate(lines):
                sounds[f"{GAME}/sound/{sub}/{dialog_id}.ogg"] = ogg(1.5, i)
        sounds[f"{GAME}/sound/{NO_TEXT[language]}"] = ogg(1.0, 99)
        write_deb(folder, f"fillets-ng-data-{language}", sounds, compression="gz", version="1.0.1-1.1")
    return folder


def test_read_dialogues_and_lua_strings(tmp_path):
    path = tmp_path / "dialogs_cs.lua"
    path.write_bytes(lua("airplane", "cs"))
    texts = read_dialogues(path, RecipeDrops("fail"))
    assert texts["let-m-divna"] == "Co je to za divnou loď?"
    assert texts["let-m-hlas"] == 'Řekl: "Ahoj"' and texts["kos-m-dva"] == "Jiná."
    assert lua_unescape(r"a\nb\\c") == "a b\\c"


def test_fillets_recipe_pairs_audio_with_its_text(tmp_path):
    out = tmp_path / "fillets"
    assert prepare_main(["fillets", f"out={out}", f"debs={make_debs(tmp_path / 'debs')}"]) == 0
    summary = json.loads((out / "corpus.json").read_text())
    for language in ("cs", "nl"):
        row = summary["languages"][language]
        assert row["audio_files"] == 12 and row["license"] == "GPL-2"
        assert row["left_out"] == {"audio without transcript": 1, "empty text": 1, "number": 1, "symbol read aloud": 1}
        assert row["used"] == 8 and row["unreadable"] == 0
    texts, seen = {}, {}
    for split in ("train", "dev", "test"):
        for cut in load_cuts(out, split, corpus="fillets"):
            sup = cut.supervisions[0]
            texts[sup.language, sup.custom["prompt"]] = sup.text
            assert seen.setdefault((sup.language, sup.text), split) == split
            assert cut.recording.sampling_rate == 16000 and cut.custom == {"source_rate": SR}
    assert texts["cs", "airplane/cs/let-m-divna"] == "co je to za divnou loď"
    assert texts["nl", "airplane/nl/let-m-hlas"] == "hij zei hallo"
    assert texts["cs", "broom/cs/kos-m-dva"] == "jiná věta"  # the sound's own level
    assert texts["cs", "airplane/cs/let-m-dva"] == "jedna věta"
    assert texts["nl", "share/bore/nl/sp-smrt"] == "ik ben dood"
    speakers = {c.supervisions[0].speaker for c in load_cuts(out, "train_cs", corpus="fillets")}
    assert speakers <= {"cs-m", "cs-v", "cs-?"}


REAL_DEBS = Path(os.environ.get("USMKIT_DEBS") or "/nonexistent")  # the folder `apt-get download ...` wrote to


@pytest.mark.slow
@pytest.mark.skipif(not list(REAL_DEBS.glob("fillets-ng-data*.deb")), reason="no fillets .debs in $USMKIT_DEBS")
def test_fillets_recipe_on_the_debian_packages(tmp_path):
    out = tmp_path / "fillets"
    assert prepare_main(["fillets", f"out={out}", f"debs={REAL_DEBS}", "num_jobs=2"]) == 0
    summary = json.loads((out / "corpus.json").read_text())
    for language, row in summary["languages"].items():
        assert 1500 <= row["audio_files"] <= 1900 and row["unreadable"] == 0, (language, row)
        assert row["used"] >= 1500 and 1.3 < row["hours"] < 2.0, (language, row)
