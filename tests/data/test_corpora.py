"""Corpus recipes (FSDD on the real shared recordings, LibriSpeech on a miniature) and manifest helpers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from usmkit.cli.prepare import main as prepare_main
from usmkit.data.corpora.fsdd import DIGIT_WORDS, default_fsdd_dir, prepare_fsdd
from usmkit.data.corpora.fsdd_synth import plan_digit_takes, trim_silence
from usmkit.data.corpora.librispeech import prepare_librispeech
from usmkit.data.manifests import available_splits, load_cuts, load_text_only, manifest_path
from usmkit.metrics import TextNormConfig, normalize_text

FSDD = default_fsdd_dir()
needs_fsdd = pytest.mark.skipif(not (FSDD / "recordings").is_dir(), reason=f"no FSDD copy at {FSDD}")


def _file_digit(cut) -> int:
    return int(Path(cut.recording.sources[0].source).name.split("_")[0])


@needs_fsdd
def test_fsdd_speaker_split_digit_words_and_16k_audio(tmp_path: Path) -> None:
    cut_sets = prepare_fsdd(out_dir=tmp_path, limit=6)  # takes 0-5: 0-4 -> dev, 5 -> train
    speakers = {split: {s.speaker for c in cuts for s in c.supervisions} for split, cuts in cut_sets.items()}
    assert speakers["test"] == {"theo"}
    assert "theo" not in speakers["train"] | speakers["dev"]
    assert speakers["dev"] == speakers["train"] and len(speakers["train"]) == 4
    assert len(cut_sets["test"]) == 60 and len(cut_sets["dev"]) == 4 * 50 and len(cut_sets["train"]) == 4 * 10
    for cuts in cut_sets.values():
        for cut in cuts:
            (supervision,) = cut.supervisions
            assert supervision.text == DIGIT_WORDS[_file_digit(cut)] and supervision.language == "en"
            assert cut.sampling_rate == 16000
    cut = cut_sets["test"][0]
    audio = cut.load_audio()
    native = sf.info(cut.recording.sources[0].source)
    assert native.samplerate == 8000
    assert audio.shape == (1, cut.num_samples) and abs(audio.shape[1] - 2 * native.frames) <= 2
    assert available_splits(tmp_path, "fsdd") == ["dev", "test", "train"]
    reloaded = load_cuts(tmp_path, "train", corpus="fsdd")
    assert [c.id for c in reloaded] == [c.id for c in cut_sets["train"]] and reloaded[0].sampling_rate == 16000
    for kind in ("recordings", "supervisions"):
        assert manifest_path(tmp_path, "fsdd", kind, "dev").is_file()


@needs_fsdd
def test_fsdd_dev_speakers_cli_and_errors(tmp_path: Path, capsys) -> None:
    assert prepare_main(["fsdd", f"out={tmp_path}", "limit=2", "test_speakers=theo", "dev_speakers=lucas"]) == 0
    assert "fsdd manifests" in capsys.readouterr().out
    dev = load_cuts(tmp_path, "dev", corpus="fsdd")
    train = load_cuts(tmp_path, "train", corpus="fsdd")
    assert {s.speaker for c in dev for s in c.supervisions} == {"lucas"}
    assert {s.speaker for c in train for s in c.supervisions} == {"george", "jackson", "nicolas"}
    with pytest.raises(ValueError, match="not in the corpus"):
        prepare_fsdd(out_dir=tmp_path, test_speakers=("nobody",), limit=1)
    with pytest.raises(ValueError, match="both test_speakers and dev_speakers"):
        prepare_fsdd(out_dir=tmp_path, test_speakers=("theo",), dev_speakers=("theo",), limit=1)
    with pytest.raises(FileNotFoundError, match="no FSDD recordings"):
        prepare_fsdd(corpus_dir=tmp_path / "missing", out_dir=tmp_path)


@needs_fsdd
def test_fsdd_synthetic_digit_takes_join_train_only(tmp_path: Path) -> None:
    cut_sets = prepare_fsdd(out_dir=tmp_path, limit=6, synth_takes=2, synth_seed=3)
    synthetic = [c for c in cut_sets["train"] if c.supervisions[0].speaker.startswith("synth-")]
    assert len(cut_sets["train"]) == 4 * 10 + 20 and len(synthetic) == 20
    assert len(cut_sets["dev"]) == 200 and len(cut_sets["test"]) == 60  # real speech only
    assert sorted(c.supervisions[0].text for c in synthetic) == sorted(DIGIT_WORDS * 2)
    assert len({c.supervisions[0].speaker for c in synthetic}) > 5
    for cut in synthetic:
        assert cut.supervisions[0].text == DIGIT_WORDS[_file_digit(cut)]
        native = sf.info(cut.recording.sources[0].source)
        assert native.samplerate == 8000 and 0.1 < native.duration < 1.5  # FSDD-like: 8 kHz, trimmed
        audio = cut.load_audio()
        assert cut.sampling_rate == 16000 and audio.shape == (1, cut.num_samples) and np.abs(audio).max() > 0.1
    reloaded = load_cuts(tmp_path, "train", corpus="fsdd")
    assert [c.id for c in reloaded] == [c.id for c in cut_sets["train"]]
    with pytest.raises(ValueError, match="synth_takes"):
        prepare_fsdd(out_dir=tmp_path, limit=1, synth_takes=-1)


def test_digit_take_plan_is_seeded_and_varied() -> None:
    first, again = plan_digit_takes(DIGIT_WORDS, 3, seed=1), plan_digit_takes(DIGIT_WORDS, 3, seed=1)
    assert first == again and first != plan_digit_takes(DIGIT_WORDS, 3, seed=2)
    assert [t.word for t in first[:10]] == list(DIGIT_WORDS) and len({t.stem for t in first}) == 30
    assert len({(t.voice.variant, t.voice.rate, t.voice.pitch) for t in first}) == 30
    with pytest.raises(ValueError, match="takes_per_digit"):
        plan_digit_takes(DIGIT_WORDS, 0)


def test_trim_silence_keeps_the_speech_and_a_margin() -> None:
    rate = 8000
    speech = np.sin(np.arange(2000) * 0.3).astype(np.float32)
    wave = np.concatenate([np.zeros(4000, np.float32), speech, np.full(3000, 1e-4, np.float32)])
    trimmed = trim_silence(wave, rate)
    margin = int(0.03 * rate)
    assert len(speech) <= len(trimmed) <= len(speech) + 2 * margin + 2 * rate // 100
    assert np.abs(trimmed).max() == np.abs(speech).max()
    silent = np.zeros(1000, np.float32)
    assert np.array_equal(trim_silence(silent, rate), silent)


def test_fsdd_rejects_foreign_file_names(tmp_path: Path) -> None:
    recordings = tmp_path / "corpus" / "recordings"
    recordings.mkdir(parents=True)
    sf.write(recordings / "7_ann_0.wav", np.zeros(800, dtype=np.float32), 8000)
    sf.write(recordings / "notes.wav", np.zeros(800, dtype=np.float32), 8000)
    with pytest.raises(ValueError, match="notes.wav"):
        prepare_fsdd(corpus_dir=tmp_path / "corpus", out_dir=tmp_path / "out", test_speakers=("ann",))


# (speaker, chapter, utterance, transcript) of the miniature LibriSpeech
MINI = {
    "dev-clean": [
        (1272, 128104, 0, "MISTER QUILTER IS THE APOSTLE"),
        (1272, 128104, 1, "NOR IS MISTER QUILTER'S MANNER"),
    ],
    "test-clean": [(1089, 134686, 0, "HE HOPED THERE WOULD BE STEW FOR DINNER")],
}


def _write_mini_librispeech(root: Path) -> Path:
    base = root / "LibriSpeech"
    for part, utterances in MINI.items():
        lines: dict[Path, list[str]] = {}
        for i, (speaker, chapter, utt, text) in enumerate(utterances):
            chapter_dir = base / part / str(speaker) / str(chapter)
            chapter_dir.mkdir(parents=True, exist_ok=True)
            utt_id = f"{speaker}-{chapter}-{utt:04d}"
            t = np.arange(int(16000 * (1.0 + 0.25 * i))) / 16000
            sf.write(chapter_dir / f"{utt_id}.flac", (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000)
            lines.setdefault(chapter_dir / f"{speaker}-{chapter}.trans.txt", []).append(f"{utt_id} {text}")
        for path, content in lines.items():
            path.write_text("\n".join(content) + "\n")
    return base


def test_librispeech_miniature(tmp_path: Path) -> None:
    base = _write_mini_librispeech(tmp_path / "corpus")
    cut_sets = prepare_librispeech(base.parent, tmp_path / "out")  # the parent of LibriSpeech/ is found too
    assert sorted(cut_sets) == ["dev_clean", "test_clean"]
    assert available_splits(tmp_path / "out", "librispeech") == ["dev_clean", "test_clean"]
    dev = load_cuts(tmp_path / "out", "dev_clean", corpus="librispeech")
    texts = {c.supervisions[0].text for c in dev}
    assert texts == {"mister quilter is the apostle", "nor is mister quilter's manner"}
    assert {c.supervisions[0].language for c in dev} == {"en"}
    assert {c.supervisions[0].speaker for c in dev} == {"1272"}
    cut = next(iter(load_cuts(tmp_path / "out", "test_clean", corpus="librispeech")))
    assert cut.sampling_rate == 16000 and cut.load_audio().shape == (1, 16000)
    for kind in ("recordings", "supervisions", "cuts"):
        assert manifest_path(tmp_path / "out", "librispeech", kind, "test_clean").is_file()
    only_dev = prepare_librispeech(base, tmp_path / "out2", parts=["dev-clean"])
    assert list(only_dev) == ["dev_clean"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prepare_librispeech(tmp_path / "nope", tmp_path / "out3")
    with pytest.raises(ValueError, match="no LibriSpeech part found"):
        prepare_librispeech(tmp_path / "out", tmp_path / "out3")


def test_manifest_helpers(tmp_path: Path) -> None:
    assert manifest_path(tmp_path, "synth", "cuts", "train") == tmp_path / "synth_cuts_train.jsonl.gz"
    with pytest.raises(ValueError, match="kind"):
        manifest_path(tmp_path, "synth", "features", "train")
    with pytest.raises(ValueError, match="path separators"):
        manifest_path(tmp_path, "synth", "cuts", "../train")
    assert available_splits(tmp_path / "absent") == []
    with pytest.raises(FileNotFoundError, match="python -m usmkit.cli.prepare synth"):
        load_cuts(tmp_path, "train")
    with pytest.raises(FileNotFoundError, match="synth_text_only.jsonl.gz"):
        load_text_only(tmp_path)
    with gzip.open(tmp_path / "synth_text_only.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "a b", "language": "en"}) + "\n" + json.dumps({"text": "c"}) + "\n")
    with pytest.raises(ValueError, match="line 2"):
        load_text_only(tmp_path)


def test_transcripts_are_normalized_as_scoring_normalizes_them() -> None:
    assert normalize_text("Hello, World!  It's  ME.", TextNormConfig(keep_apostrophes=False)) == "hello world it s me"
    assert normalize_text("L'ÉCOLE d'été") == "l'école d'été"
