"""usmkit.data.corpora.audio_folder: a folder of audio without transcripts as one unlabeled split."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from usmkit.cli.prepare import main as prepare_main
from usmkit.data.manifests import load_cuts


def _tone(path, seconds: float, rate: int = 16000) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * rate)) / rate
    sf.write(path, (0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate)


def _prepare(src, out, *extra: str) -> int:
    """The command's exit status (a refusal exits through SystemExit)."""
    try:
        return prepare_main(["audio_folder", f"corpus_dir={src}", f"out={out}", "corpus=clips", *extra])
    except SystemExit as e:
        return int(e.code)


def test_every_file_at_any_depth_is_one_cut_at_16k_with_its_language(tmp_path):
    src = tmp_path / "src"
    _tone(src / "a" / "1-2-3.wav", 1.0)
    _tone(src / "b.flac", 1.5, rate=8000)
    (src / "notes.txt").write_text("not audio")
    assert _prepare(src, tmp_path / "out", "language=cs") == 0
    cuts = {c.id: c for c in load_cuts(tmp_path / "out", "unlabeled", corpus="clips")}
    assert sorted(cuts) == ["a-1-2-3", "b"]
    assert all(not c.supervisions and c.custom["language"] == "cs" for c in cuts.values())
    assert cuts["b"].sampling_rate == 16000 and cuts["b"].load_audio().shape[-1] == 24000
    assert cuts["a-1-2-3"].duration == pytest.approx(1.0)


def test_a_corrupt_file_stops_the_recipe_naming_it_or_is_counted_with_skip(tmp_path, capsys):
    src = tmp_path / "src"
    _tone(src / "good.wav", 1.0)
    (src / "bad.wav").write_bytes(b"RIFF1234WAVEjunk")
    assert _prepare(src, tmp_path / "out") != 0
    err = capsys.readouterr().err
    assert "bad.wav" in err and "Traceback" not in err
    assert _prepare(src, tmp_path / "out", "on_error=skip") == 0
    assert "skipped 1 of 2 files" in capsys.readouterr().out
    assert [c.id for c in load_cuts(tmp_path / "out", "unlabeled", corpus="clips")] == ["good"]


def test_short_files_are_left_out_and_counted_and_a_folder_without_audio_is_one_line(tmp_path, capsys):
    src = tmp_path / "src"
    _tone(src / "long.wav", 1.0)
    _tone(src / "blip.wav", 0.1)
    assert _prepare(src, tmp_path / "out") == 0
    assert "1 shorter than min_duration=0.5 s left out" in capsys.readouterr().out
    assert [c.id for c in load_cuts(tmp_path / "out", "unlabeled", corpus="clips")] == ["long"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _prepare(empty, tmp_path / "out2") != 0
    err = capsys.readouterr().err
    assert "no audio files" in err and str(empty) in err and len(err.strip().splitlines()) == 1


def test_two_files_that_would_share_an_id_are_refused(tmp_path, capsys):
    src = tmp_path / "src"
    _tone(src / "x.wav", 1.0)
    _tone(src / "x.flac", 1.0)
    assert _prepare(src, tmp_path / "out") != 0
    assert "would both be cut 'x'" in capsys.readouterr().err


def test_out_inside_the_audio_folder_is_refused(tmp_path, capsys):
    src = tmp_path / "src"
    _tone(src / "a.wav", 1.0)
    for out in (src, src / "manifests"):
        assert _prepare(src, out) != 0
        assert "is inside corpus_dir" in capsys.readouterr().err
    assert sorted(p.name for p in src.iterdir()) == ["a.wav"]
