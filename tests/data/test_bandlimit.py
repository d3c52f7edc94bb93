"""``python -m usmkit.cli.prepare bandlimit``: a split resampled to 8 kHz and back, beside the original, with
nothing above 4 kHz, the same transcripts and lengths, suffixed ids; loadable as an evaluation split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from usmkit.cli.prepare import main as prepare
from usmkit.data.config import DataConfig, FeatureConfig
from usmkit.data.corpora.common import write_split
from usmkit.data.loader import split_loader
from usmkit.data.manifests import load_cuts


def band_db(samples: np.ndarray, sr: int, low: float, high: float | None = None) -> float:
    """Energy (dB) between ``low`` and ``high`` Hz, Hann-windowed: a cut's abrupt ends would otherwise spread
    its low band's energy over every frequency (spectral leakage), which is the analysis, not the audio."""
    power = np.abs(np.fft.rfft(samples.astype(np.float64) * np.hanning(samples.size))) ** 2
    freqs = np.fft.rfftfreq(samples.size, 1 / sr)
    return float(10 * np.log10(power[(freqs > low) & (freqs <= (high or sr / 2))].sum() + 1e-30))


@pytest.fixture
def corpus_dir(tmp_path, build_corpus) -> Path:
    """A corpus folder ``mini`` with a 6-cut ``test`` split of 16-bit WAVs (speech-like tones plus white noise)."""
    out = tmp_path / "mini"
    write_split(out, "mini", "test", build_corpus(tmp_path / "audio_src", {"en": 6}))
    return out


def run(*args: str) -> None:
    assert prepare(["bandlimit", *args]) == 0


def test_the_8k_split_has_nothing_above_4khz_and_the_same_transcripts_and_lengths(corpus_dir):
    run(f"src={corpus_dir}", "split=test")
    original = load_cuts(corpus_dir, "test", corpus="mini")
    limited = load_cuts(corpus_dir, "test_8k", corpus="mini")  # written beside it (out defaults to src)
    assert len(limited) == len(original) == 6
    for a, b in zip(original, limited, strict=True):
        assert b.id == f"{a.id}_8k" and b.recording.id == b.id
        assert [(s.text, s.speaker, s.language, s.start, s.duration) for s in b.supervisions] == [
            (s.text, s.speaker, s.language, s.start, s.duration) for s in a.supervisions
        ]
        assert [s.id for s in b.supervisions] == [f"{s.id}_8k" for s in a.supervisions]
        assert b.num_samples == a.num_samples and b.duration == a.duration and b.sampling_rate == a.sampling_rate
        source = b.recording.sources[0].source
        assert source.endswith(".flac") and Path(source).is_file()
        x, y = a.load_audio()[0], b.load_audio()[0]
        assert band_db(x, 16000, 4000) > band_db(x, 16000, 0, 4000) - 25  # the original has a high band
        assert band_db(y, 16000, 4000) < band_db(x, 16000, 4000) - 60  # gone
        assert abs(band_db(y, 16000, 50, 3500) - band_db(x, 16000, 50, 3500)) < 0.1  # the band below is kept


def test_other_rates_names_and_folders(corpus_dir, tmp_path):
    out = tmp_path / "elsewhere"
    run(f"src={corpus_dir}", "split=test", "rate=4000", f"out={out}", "name=test_phone", "corpus=mini")
    limited = load_cuts(out, "test_phone", corpus="mini")
    original = load_cuts(corpus_dir, "test", corpus="mini")
    assert [c.id for c in limited] == [f"{c.id}_4k" for c in original]
    x, y = original[0].load_audio()[0], limited[0].load_audio()[0]
    assert band_db(y, 16000, 2000) < band_db(x, 16000, 2000) - 60
    run(f"src={corpus_dir}", "split=test", "rate=4000", f"out={out}", "name=test_phone")  # a rerun replaces it


def test_evaluation_loads_the_new_split_like_any_other(corpus_dir):
    run(f"src={corpus_dir}")
    cfg = DataConfig(
        manifest_dir=str(corpus_dir), corpus="mini", num_workers=0, features=FeatureConfig(precomputed=True)
    )
    texts = {}
    for split in ("test", "test_8k"):
        loader, report = split_loader(cfg, split, tokenizer=None, stats=None)
        batches = list(loader)
        assert report.num_skipped == 0
        texts[split] = sorted(t for b in batches for t in b.texts)
        frames = sorted(int(n) for b in batches for n in b.feature_lens)
        texts[split + "_frames"] = frames
    assert texts["test"] == texts["test_8k"] and texts["test_frames"] == texts["test_8k_frames"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["split=train"], "has no split 'train' of corpus mini (splits: test)"),
        (["rate=16000"], "is at 16000 Hz, not above rate=16000"),
        (["rate=0"], "rate must be > 0"),
        (["name=test"], "would replace the split it is made from"),
    ],
)
def test_bad_arguments_are_one_line_and_write_nothing(corpus_dir, capsys, args, message):
    before = sorted(p.name for p in corpus_dir.iterdir())
    with pytest.raises(SystemExit) as e:
        prepare(["bandlimit", f"src={corpus_dir}", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert sorted(p.name for p in corpus_dir.iterdir()) == before


def test_src_and_out_are_checked(corpus_dir, tmp_path, capsys, build_corpus):
    other = tmp_path / "other"
    write_split(other, "other", "test", build_corpus(tmp_path / "audio_other", {"de": 1}))
    with pytest.raises(SystemExit):
        prepare(["bandlimit", f"src={corpus_dir}", f"out={other}"])  # another corpus's folder
    err = capsys.readouterr().err
    assert "is the corpus folder of other" in err and "not the corpus folder of mini" in err
    write_split(corpus_dir, "other", "dev", build_corpus(tmp_path / "audio_other2", {"de": 1}))
    with pytest.raises(SystemExit):
        prepare(["bandlimit", f"src={corpus_dir}"])  # two corpora in src: which one?
    assert "holds the manifests of mini, other: name the one to use with corpus=NAME" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        prepare(["bandlimit", f"src={tmp_path / 'missing'}"])
    assert "bandlimit needs src=DIR" in capsys.readouterr().err


def test_unreadable_audio_stops_it_or_is_skipped_and_counted(corpus_dir, capsys):
    first = load_cuts(corpus_dir, "test", corpus="mini")[0]
    Path(first.recording.sources[0].source).write_bytes(b"not audio")
    with pytest.raises(SystemExit) as e:
        prepare(["bandlimit", f"src={corpus_dir}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"unreadable audio: {first.id}" in err and "on_error=skip" in err
    run(f"src={corpus_dir}", "on_error=skip")
    assert "skipped 1 of 6 cuts" in " ".join(capsys.readouterr().out.split())
    assert [c.id for c in load_cuts(corpus_dir, "test_8k", corpus="mini")] == [
        f"{c.id}_8k" for c in load_cuts(corpus_dir, "test", corpus="mini")[1:]
    ]


@pytest.mark.slow
def test_train_with_the_augmentation_then_evaluate_both_splits(synth_corpus, tmp_path):
    """The documented workflow end to end: build ``test_8k`` beside ``test``, train a few steps with the waveform
    augmentation on, and ``usmkit.cli.evaluate ... test_sets=[test,test_8k]`` scores both."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    corpus = tmp_path / "corpus"
    shutil.copytree(synth_corpus, corpus)  # the session's corpus is read-only by convention
    run(f"src={corpus}", "split=test")
    env = dict(
        os.environ, PYTHONPATH=f"{Path(__file__).resolve().parents[2]}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    )
    env["OMP_NUM_THREADS"] = "1"

    def cli(module: str, *args: str) -> None:
        proc = subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]

    exp = tmp_path / "exp"
    cli(
        "usmkit.cli.train", "recipe=stage3_ctc", f"data.manifest_dir={corpus}", f"trainer.exp_dir={exp}", "model=tiny",
        "model.overrides={d_model: 64, num_layers: 2, num_heads: 2}", "data.max_duration=20", "data.num_workers=0",
        "trainer.progress=false", "trainer.max_steps=3", "trainer.eval_every=0", "trainer.save_every=3",
        "data.features.precomputed=false", "data.narrowband_prob=0.4", "data.lowpass_prob=0.3", "data.reverb_prob=0.2",
    )  # fmt: skip
    out = tmp_path / "eval.json"
    cli("usmkit.cli.evaluate", f"checkpoint={exp}", "test_sets=[test,test_8k]", f"output={out}")
    sets = json.loads(out.read_text())["sets"]
    assert sets["test"]["utterances"] == sets["test_8k"]["utterances"] > 0


def test_the_telephone_channel_keeps_the_telephone_band_and_names_the_split_tel(corpus_dir):
    """channel=telephone: the 3.4 kHz band through mu-law, written as ``test_tel`` with ids ending ``_tel``, the same
    transcripts and lengths; nothing much left above 4 kHz, the band below kept (the codec's noise aside)."""
    run(f"src={corpus_dir}", "split=test", "channel=telephone")
    original = load_cuts(corpus_dir, "test", corpus="mini")
    phone = load_cuts(corpus_dir, "test_tel", corpus="mini")
    assert [c.id for c in phone] == [f"{c.id}_tel" for c in original]
    for a, b in zip(original, phone, strict=True):
        assert b.num_samples == a.num_samples and [s.text for s in b.supervisions] == [s.text for s in a.supervisions]
        x, y = a.load_audio()[0], b.load_audio()[0]
        assert band_db(y, 16000, 4500) < band_db(x, 16000, 4500) - 40
        assert abs(band_db(y, 16000, 300, 3000) - band_db(x, 16000, 300, 3000)) < 1.5
    with pytest.raises(SystemExit):
        prepare(["bandlimit", f"src={corpus_dir}", "channel=radio"])
