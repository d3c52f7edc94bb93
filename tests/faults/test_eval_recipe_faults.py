"""usmkit.cli.evaluate and the corpus recipes under faults: a misspelled test set, a decode mode the model
cannot serve, a failure after some sets were scored; missing, corrupt and untranscribed corpus files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import usmkit.inference.evaluate as ev
from usmkit.cli.prepare import main as prepare_main
from usmkit.data.corpora.librispeech import prepare_librispeech
from usmkit.data.manifests import load_cuts
from usmkit.data.validate import BadInputError
from usmkit.decoding.ctc_lexicon import LexiconConfig
from usmkit.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def corpus(synth_corpus, tmp_path) -> Path:
    out = tmp_path / "corpus"
    shutil.copytree(synth_corpus, out)
    return out


def test_misspelled_test_set_is_refused_before_decoding(ctc_ckpt, corpus, monkeypatch):
    monkeypatch.setattr(ev, "transcribe_batches", lambda *a, **k: pytest.fail("decoding started"))
    cfg = ev.EvalConfig(checkpoint=str(ctc_ckpt), test_sets=("dev", "tset", "test", "tst"), manifest_dir=str(corpus))
    with pytest.raises(UsageError, match=r"test set\(s\) \['tset', 'tst'\] have no manifest .*'dev', .*'test'"):
        ev.evaluate(cfg)


def test_las_decoding_of_a_ctc_model_is_refused_before_decoding(ctc_ckpt, corpus, monkeypatch):
    monkeypatch.setattr(ev, "transcribe_batches", lambda *a, **k: pytest.fail("decoding started"))
    for mode in ("las_beam", "rescore", "lexicon_rescore"):
        cfg = ev.EvalConfig(
            checkpoint=str(ctc_ckpt), decode=mode, manifest_dir=str(corpus), lexicon=LexiconConfig(nbest=10)
        )
        with pytest.raises(UsageError, match=rf"decode={mode} needs an attention \(LAS\) decoder"):
            ev.evaluate(cfg)


def test_lexicon_rescoring_needs_an_nbest_list_and_a_weight_in_range():
    with pytest.raises(ValueError, match=r"lexicon_rescore .* set lexicon.nbest=10"):
        ev.EvalConfig(checkpoint="x", decode="lexicon_rescore")
    with pytest.raises(ValueError, match=r"rescore_ctc_weight must be in \[0, 1\]"):
        ev.EvalConfig(checkpoint="x", decode="rescore", rescore_ctc_weight=1.5)


def test_each_set_is_written_as_it_finishes(ctc_ckpt, corpus, monkeypatch, tmp_path):
    real = ev.transcribe_batches
    calls = []

    def failing_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory (simulated)")
        return real(*args, **kwargs)

    monkeypatch.setattr(ev, "transcribe_batches", failing_second)
    out = tmp_path / "eval.json"
    cfg = ev.EvalConfig(checkpoint=str(ctc_ckpt), test_sets=("dev", "test"), manifest_dir=str(corpus), output=str(out))
    written = []

    def write(results):
        out.write_text(json.dumps(results))
        written.append(sorted(results["sets"]))

    with pytest.raises(RuntimeError, match="simulated"):
        ev.evaluate(cfg, on_set=write)
    assert written == [["dev"]] and "wer" in json.loads(out.read_text())["sets"]["dev"]


def test_evaluate_command_prints_one_line_and_exits_2(ctc_ckpt, corpus, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "usmkit.cli.evaluate",
        f"checkpoint={ctc_ckpt}",
        f"manifest_dir={corpus}",
        "test_sets=[dev,tset]",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: test set(s) ['tset'] have no manifest") and "Traceback" not in proc.stderr


# ---- LibriSpeech layout with every kind of damage ------------------------------------------------


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


# ---- FSDD layout with damaged files --------------------------------------------------------------


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
