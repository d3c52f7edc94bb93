"""The embedded synthetic corpus: a tiny build, its splits, voices, audio, held-out words, determinism."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from usmkit.cli.prepare import main as prepare_main
from usmkit.data.manifests import available_splits, load_cuts, load_text_only, manifest_path
from usmkit.data.synth import SynthConfig, build_corpus
from usmkit.data.synth.espeak import EspeakError, get_espeak
from usmkit.data.synth.external import detect_external_engines
from usmkit.data.synth.plan import AUDIO_SPLITS, plan_corpus
from usmkit.data.synth.text import LANGUAGES
from usmkit.data.tokenizer import Tokenizer
from usmkit.metrics import normalize_text

HELD_OUT_VOICE_SPLITS = ("train", "dev", "test", "test_other")


def _build(out: Path, seed: int = 0, workers: int = 2):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny text: "fewer pieces than requested" is expected
        return build_corpus(SynthConfig(out=out, size="tiny", seed=seed, workers=workers, external_engines=False))


@pytest.fixture(scope="module")
def corpus(synth_corpus: Path) -> Path:
    return synth_corpus  # tests/conftest.py: built once per session with _build's settings (seed 0, 2 workers)


def _speakers(out: Path, split: str) -> set[str]:
    cuts = load_cuts(out, split)
    if split == "unlabeled":
        return {c.custom["speaker"] for c in cuts}
    return {s.speaker for c in cuts for s in c.supervisions}


def _texts(out: Path, split: str) -> list[str]:
    return [s.text for c in load_cuts(out, split) for s in c.supervisions]


def test_tiny_build_writes_all_manifests(corpus: Path) -> None:
    assert available_splits(corpus) == sorted(AUDIO_SPLITS)
    for split in AUDIO_SPLITS:
        assert manifest_path(corpus, "synth", "recordings", split).is_file()
        assert manifest_path(corpus, "synth", "cuts", split).is_file()
        assert manifest_path(corpus, "synth", "supervisions", split).is_file() == (split != "unlabeled")
        assert len(load_cuts(corpus, split)) > 0
    summary = json.loads((corpus / "corpus.json").read_text())
    assert summary["seed"] == 0 and summary["size"] == "tiny"
    for split in AUDIO_SPLITS:
        assert summary["splits"][split]["utterances"] == len(load_cuts(corpus, split))
        assert summary["splits"][split]["hours"] > 0
    assert len(load_text_only(corpus)) == summary["text_only"]["sentences"] > 0
    tokenizer = Tokenizer.load(corpus / "tokenizer")
    ids = tokenizer.encode(_texts(corpus, "train")[0])
    assert ids and tokenizer.unk_id not in ids


def test_voices_are_disjoint_between_train_dev_test_and_test_other(corpus: Path) -> None:
    speakers = {split: _speakers(corpus, split) for split in AUDIO_SPLITS}
    for i, a in enumerate(HELD_OUT_VOICE_SPLITS):
        for b in HELD_OUT_VOICE_SPLITS[i + 1 :]:
            assert not speakers[a] & speakers[b], (a, b)
    assert speakers["test_textonly"] <= set(_voice_names(corpus, "test"))
    assert speakers["unlabeled"] <= set(_voice_names(corpus, "train"))
    voices = json.loads((corpus / "corpus.json").read_text())["voices"]
    variants = {group: {v["variant"] for v in vs} for group, vs in voices.items()}
    for i, a in enumerate(HELD_OUT_VOICE_SPLITS):
        for b in HELD_OUT_VOICE_SPLITS[i + 1 :]:
            assert not variants[a] & variants[b], (a, b)
    assert sum(len(vs) for vs in voices.values()) >= 16
    ordinary = [v["rate"] for g in ("train", "dev", "test") for v in voices[g]]
    extreme = voices["test_other"]
    assert all(v["rate"] < min(ordinary) or v["rate"] > max(ordinary) for v in extreme)


def _voice_names(out: Path, group: str) -> list[str]:
    return [v["name"] for v in json.loads((out / "corpus.json").read_text())["voices"][group]]


def test_audio_is_16k_mono_flac_with_plausible_durations(corpus: Path) -> None:
    for split in AUDIO_SPLITS:
        cuts = load_cuts(corpus, split)
        for cut in cuts:
            assert cut.sampling_rate == 16000 and cut.num_channels == 1
            assert 0.5 < cut.duration < 30.0, (cut.id, cut.duration)
        cut = cuts[0]
        info = sf.info(cut.recording.sources[0].source)
        assert (info.samplerate, info.channels, info.format) == (16000, 1, "FLAC")
        audio = cut.load_audio()
        assert audio.shape == (1, cut.num_samples)
        assert float(np.sqrt((audio**2).mean())) > 0.01  # speech, not silence


def test_languages_and_text_normalization(corpus: Path) -> None:
    train = load_cuts(corpus, "train")
    assert {s.language for c in train for s in c.supervisions} == set(LANGUAGES)
    assert {s.language for c in load_cuts(corpus, "test_textonly") for s in c.supervisions} == {"en"}
    assert {c.custom["language"] for c in load_cuts(corpus, "unlabeled")} <= set(LANGUAGES)
    for split in AUDIO_SPLITS:
        for text in _texts(corpus, split):
            assert text == normalize_text(text) and len(text.split()) >= 3
    assert {r["language"] for r in load_text_only(corpus)} == set(LANGUAGES)


def test_heldout_words_only_in_text_only_and_test_textonly(corpus: Path) -> None:
    heldout = set(json.loads((corpus / "corpus.json").read_text())["heldout_words"])
    assert len(heldout) == 100
    plan = plan_corpus(0, "tiny")
    for split in ("train", "dev", "test", "test_other", "unlabeled"):  # unlabeled: the text it was synthesized from
        for u in plan.utterances[split]:
            assert not heldout & set(u.text.split()), (split, u.text)
    for text in _texts(corpus, "test_textonly"):
        assert heldout & set(text.split()), text
    text_only = load_text_only(corpus)
    assert len({w for r in text_only for w in r["text"].split()} & heldout) >= 20
    eval_texts = {t for split in ("dev", "test", "test_other", "test_textonly") for t in _texts(corpus, split)}
    assert not eval_texts & {r["text"] for r in text_only}


def _digests(out: Path) -> dict[str, str]:
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in sorted((out / "audio").rglob("*.flac"))}


def test_same_seed_same_texts_and_audio_bytes(corpus: Path, tmp_path: Path) -> None:
    again = tmp_path / "b"
    _build(again, workers=1)  # another process count: shards, not workers, fix the audio
    for split in AUDIO_SPLITS:
        assert _texts(again, split) == _texts(corpus, split)
    first, second = _digests(corpus), _digests(again)
    assert len(first) == sum(len(load_cuts(corpus, s)) for s in AUDIO_SPLITS)
    assert first == second
    other = plan_corpus(1, "tiny")
    assert [u.text for u in other.utterances["train"]] != _texts(corpus, "train")


def test_second_run_is_skipped(corpus: Path, capsys) -> None:
    before = (corpus / "corpus.json").stat().st_mtime_ns
    assert prepare_main(["synth", f"out={corpus}", "size=tiny", "seed=0"]) == 0
    assert "already built" in capsys.readouterr().out
    assert (corpus / "corpus.json").stat().st_mtime_ns == before


def test_cli_help_and_bad_arguments(capsys) -> None:
    with pytest.raises(SystemExit) as ok:
        prepare_main(["synth", "--help"])
    assert ok.value.code == 0 and "default|demo|english|tiny" in capsys.readouterr().out
    for bad in (["size"], ["colour=red"], ["seed=abc"]):
        with pytest.raises(SystemExit) as err:
            prepare_main(["synth", *bad])
        assert err.value.code == 2
    with pytest.raises(ValueError, match="unknown corpus size 'huge'"):
        build_corpus(SynthConfig(out=Path("unused"), size="huge"))


def test_espeak_binding_speaks_and_rejects_unknown_voices() -> None:
    espeak = get_espeak()
    samples = espeak.synthesize("three seven one", "en-us+m3", rate=175)
    assert samples.dtype == np.int16 and espeak.sample_rate == 22050
    assert 0.5 < samples.size / espeak.sample_rate < 5.0
    slow = espeak.synthesize("three seven one", "en-us+m3", rate=90)
    assert slow.size > 1.4 * samples.size
    with pytest.raises(EspeakError, match="no voice 'xx-nope\\+m3'"):
        espeak.synthesize("hello", "xx-nope+m3")


def test_external_engines_detected_only_when_installed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect_external_engines() == []
    flite = tmp_path / "flite"
    flite.write_text('#!/bin/sh\necho "Voices available: kal slt awb"\n')
    flite.chmod(flite.stat().st_mode | stat.S_IEXEC)
    engines = detect_external_engines()
    assert [(e.name, e.voices) for e in engines] == [("flite", ("awb", "kal", "slt"))]
    assert os.path.samefile(engines[0].binary, flite)
