"""Faults of the corpus recipes (usmkit.data.corpora via usmkit.cli.prepare): fail and skip modes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from usmkit.cli.prepare import main as prepare_main
from usmkit.data.corpora.librispeech import prepare_librispeech
from usmkit.data.manifests import load_cuts
from usmkit.data.validate import BadInputError
from usmkit.errors import UsageError


def _write_corpus(root: Path) -> Path:
    """dev-clean: chapter 1 is fine (3 utts) but one line has no audio, one FLAC has no line, one FLAC
    is truncated; chapter 2 has no trans.txt."""
    base = root / "LibriSpeech" / "dev-clean"
    ch1, ch2 = base / "11" / "100", base / "22" / "200"
    ch1.mkdir(parents=True)
    ch2.mkdir(parents=True)
    t = np.arange(16000) / 16000
    tone = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    for utt in range(3):
        sf.write(ch1 / f"11-100-{utt:04d}.flac", np.tile(tone, 2), 16000)
    data = (ch1 / "11-100-0002.flac").read_bytes()
    (ch1 / "11-100-0002.flac").write_bytes(data[: len(data) // 2])  # truncated
    sf.write(ch1 / "11-100-0007.flac", tone, 16000)  # no transcript line
    lines = [f"11-100-{u:04d} HELLO WORLD" for u in (0, 1, 2, 5)]  # 0005: no audio
    (ch1 / "11-100.trans.txt").write_text("\n".join(lines) + "\n")
    sf.write(ch2 / "22-200-0000.flac", tone, 16000)  # chapter without trans.txt
    return root


def test_librispeech_fail_mode_names_the_first_bad_file(tmp_path):
    root = _write_corpus(tmp_path / "c")
    with pytest.raises(BadInputError, match=r"audio without transcript: .*11-100-0007.flac: .*on_error=skip"):
        prepare_librispeech(root, tmp_path / "out")


def test_librispeech_skip_mode_counts_every_left_out_file(tmp_path, capsys):
    root = _write_corpus(tmp_path / "c")
    code = prepare_main(["librispeech", f"corpus_dir={root}", f"out={tmp_path / 'out'}", "on_error=skip"])
    assert code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "skipped 4 of 6 files:" in out
    for kind in ("1 chapter without trans.txt", "1 audio without transcript", "1 missing audio", "1 corrupt audio"):
        assert kind in out
    kept = load_cuts(tmp_path / "out", "dev_clean", corpus="librispeech")
    assert sorted(c.id for c in kept) == ["11-100-0000", "11-100-0001"]


def test_recipe_bad_argument_is_one_line_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        prepare_main(["librispeech", f"corpus_dir={tmp_path / 'nope'}", "on_error=skip"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: LibriSpeech directory") and "Traceback" not in err


def _write_fsdd(root: Path) -> Path:
    """3 speakers x digits 0-1 x takes 0-5 of 8 kHz tones; one take empty, one corrupt, one misnamed file."""
    rec = root / "recordings"
    rec.mkdir(parents=True)
    t = np.arange(4000) / 8000
    for speaker in ("ann", "bob", "theo"):
        for digit in (0, 1):
            for take in range(6):
                tone = 0.2 * np.sin(2 * np.pi * (200 + 50 * digit + 10 * take) * t)
                sf.write(rec / f"{digit}_{speaker}_{take}.wav", tone.astype(np.float32), 8000, subtype="PCM_16")
    (rec / "1_bob_5.wav").write_bytes(b"")
    (rec / "0_ann_5.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    (rec / "notes.wav").write_bytes((rec / "0_ann_1.wav").read_bytes())
    return root


def test_fsdd_fail_and_skip_modes(tmp_path, capsys):
    from usmkit.cli.prepare import main as prepare_main
    from usmkit.data.corpora.fsdd import prepare_fsdd

    root = _write_fsdd(tmp_path / "fsdd")
    with pytest.raises(UsageError, match=r"notes.wav: FSDD file names must look like .*on_error=skip"):
        prepare_fsdd(root, tmp_path / "out")
    (root / "recordings" / "notes.wav").rename(tmp_path / "notes.wav")
    with pytest.raises(BadInputError, match=r"corrupt audio: .*0_ann_5.wav: cannot read it as audio.*on_error=skip"):
        prepare_fsdd(root, tmp_path / "out")
    (tmp_path / "notes.wav").rename(root / "recordings" / "notes.wav")
    assert prepare_main(["fsdd", f"corpus_dir={root}", f"out={tmp_path / 'out'}", "on_error=skip"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "skipped 3 of 37 files:" in out
    for kind in ("1 unexpected file name (notes.wav)", "1 corrupt audio (0_ann_5.wav)", "1 empty audio (1_bob_5.wav)"):
        assert kind in out
    cuts = [c.id for split in ("train", "dev", "test") for c in load_cuts(tmp_path / "out", split, corpus="fsdd")]
    assert len(cuts) == 34 and "fsdd-0_ann_5" not in cuts
