"""Hostile and damaged data: manifests that would run commands or download, bytes that are not
UTF-8, non-finite samples in the training/evaluation path, a moved corpus."""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from lhotse import CutSet, MonoCut, Recording, SupervisionSegment
from lhotse.audio import AudioSource

from usmkit.data.config import DataConfig, FeatureConfig
from usmkit.data.loader import make_loader, prepare_cuts
from usmkit.data.manifests import load_cuts, manifest_path, write_manifest
from usmkit.data.validate import BadInputError, validate_cuts


def _hostile_cut(kind: str, source: str) -> MonoCut:
    rec = Recording(
        id="rec-1",
        sources=[AudioSource(type=kind, channels=[0], source=source)],
        sampling_rate=16000,
        num_samples=16000,
        duration=1.0,
    )
    sup = SupervisionSegment("sup-1", "rec-1", 0.0, 1.0, text="hello", language="en")
    return MonoCut("cut-evil", 0.0, 1.0, 0, recording=rec, supervisions=[sup])


def test_command_source_is_refused_by_cut_id_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    cuts = CutSet.from_cuts([_hostile_cut("command", f"touch {marker}; cat /dev/zero | head -c 32000")])
    write_manifest(cuts, manifest_path(tmp_path, "x", "cuts", "train"))
    for lazy in (False, True):
        with pytest.raises(BadInputError, match=r"refused recording source: cut cut-evil in .*type 'command'"):
            list(load_cuts(tmp_path, "train", corpus="x", lazy=lazy))
    for on_bad in ("error", "skip"):  # never merely skipped: a manifest that runs commands is refused
        with pytest.raises(BadInputError, match="cut cut-evil"):
            validate_cuts(cuts, require_text=True, on_bad=on_bad)
    assert not marker.exists()


def test_url_source_needs_an_explicit_allow(tmp_path):
    cuts = CutSet.from_cuts([_hostile_cut("url", "http://127.0.0.1:9/a.wav")])
    write_manifest(cuts, manifest_path(tmp_path, "x", "cuts", "train"))
    with pytest.raises(BadInputError, match=r"cut cut-evil .*'url'.*data.allow_urls=true"):
        load_cuts(tmp_path, "train", corpus="x")
    assert [c.id for c in load_cuts(tmp_path, "train", corpus="x", allow_urls=True)] == ["cut-evil"]


def test_non_utf8_manifest_names_the_file(tmp_path):
    path = manifest_path(tmp_path, "x", "cuts", "train")
    with gzip.open(path, "wb") as f:
        f.write(b'{"id": "caf\xe9", "start": 0}\n')
    with pytest.raises(BadInputError, match=rf"unreadable manifest: {path}: byte 0xe9 .*not valid UTF-8"):
        load_cuts(tmp_path, "train", corpus="x")
    path.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(BadInputError, match=rf"unreadable manifest: {path}"):
        load_cuts(tmp_path, "train", corpus="x")


def test_moved_corpus_reads_its_own_files(synth_corpus, tmp_path):
    text = gzip.open(manifest_path(synth_corpus, "synth", "cuts", "train"), "rt").read()
    assert str(synth_corpus) not in text and '"source": "audio/' in text  # relative to the manifest's dir
    moved = tmp_path / "elsewhere" / "corpus"
    shutil.copytree(synth_corpus, moved)
    cut = next(iter(load_cuts(moved, "train")))
    assert cut.recording.sources[0].source.startswith(str(moved))
    assert cut.load_audio().shape[1] == cut.recording.num_samples


def test_moved_feature_cache_reads_its_own_files(synth_corpus, tmp_path):
    corpus = tmp_path / "a"
    shutil.copytree(synth_corpus, corpus)
    cfg = DataConfig(manifest_dir=str(corpus), features=FeatureConfig(precomputed=True))
    prepare_cuts(load_cuts(corpus, "dev"), cfg, split="dev", require_text=True)
    moved = tmp_path / "b"
    shutil.move(corpus, moved)  # the old place is gone
    cfg = DataConfig(manifest_dir=str(moved), features=FeatureConfig(precomputed=True))
    cuts, _ = prepare_cuts(load_cuts(moved, "dev"), cfg, split="dev", require_text=True)
    cut = next(iter(cuts))
    assert cut.features.storage_path.startswith(str(moved)) and cut.load_features().shape[1] == 80


def _wav_cut(path: Path, samples: np.ndarray, cut_id: str, text: str = "hello world") -> MonoCut:
    sf.write(path, samples, 16000, subtype="FLOAT")
    rec = Recording.from_file(path, recording_id=cut_id)
    sup = SupervisionSegment(cut_id, cut_id, 0.0, rec.duration, text=text, language="en", speaker="s")
    return MonoCut(cut_id, 0.0, rec.duration, 0, recording=rec, supervisions=[sup])


def test_non_finite_samples_in_the_training_path_are_counted_and_repaired(tmp_path, caplog):
    rng = np.random.default_rng(0)
    clean = (0.1 * rng.standard_normal(16000 * 2)).astype(np.float32)
    bad = clean.copy()
    bad[16000] = np.nan
    bad[16001] = np.inf
    cuts = CutSet.from_cuts([_wav_cut(tmp_path / "a.wav", clean, "clean"), _wav_cut(tmp_path / "b.wav", bad, "bad")])
    cfg = DataConfig(manifest_dir=str(tmp_path), num_workers=0, features=FeatureConfig(precomputed=False))
    cuts, _ = prepare_cuts(cuts, cfg, split="train", require_text=False)
    with caplog.at_level(logging.WARNING):
        batches = list(make_loader(cuts, cfg, stats=None, train=False))
    feats = {i: b.features[j, : b.feature_lens[j]] for b in batches for j, i in enumerate(b.cut_ids)}
    assert all(bool(f.isfinite().all()) for f in feats.values())
    assert "cut bad: " in caplog.text and "feature frames are NaN/Inf" in caplog.text and "cut clean" not in caplog.text
    n = int(caplog.text.split("cut bad: ")[1].split()[0])
    assert 1 <= n <= 4  # the frames whose 25 ms window holds one of the two samples
    assert (feats["bad"] == 0).all(-1).sum() == n  # only those frames changed


def test_8khz_training_audio_gets_a_note(tmp_path, caplog):
    t = np.arange(8000) / 8000
    sf.write(tmp_path / "phone.wav", (0.1 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 8000)
    rec = Recording.from_file(tmp_path / "phone.wav", recording_id="p").resample(16000)
    cut = MonoCut("p", 0.0, rec.duration, 0, recording=rec)
    with caplog.at_level(logging.WARNING):
        kept, _ = validate_cuts(CutSet.from_cuts([cut]), require_text=False)
    assert "1 cuts hold 8000 Hz audio; the model expects 16000 Hz speech" in caplog.text
    assert len(kept) == 1


def test_manifest_paths_relative_inside_absolute_outside(tmp_path):
    # write_manifest's output is plain lhotse JSONL: other tools read it
    (tmp_path / "m" / "audio").mkdir(parents=True)
    inside = _wav_cut(tmp_path / "m" / "audio" / "a.wav", np.zeros(1600, np.float32), "a")
    outside = _wav_cut(tmp_path / "b.wav", np.zeros(1600, np.float32), "b")  # a corpus elsewhere
    path = write_manifest(CutSet.from_cuts([inside, outside]), tmp_path / "m" / "c.jsonl.gz")
    sources = [json.loads(line)["recording"]["sources"][0]["source"] for line in gzip.open(path, "rt")]
    assert sources == ["audio/a.wav", str(tmp_path / "b.wav")]


def test_user_errors_exit_codes_and_debug(monkeypatch, capsys):
    from usmkit.checkpointing.checkpoint import CheckpointWriteError
    from usmkit.errors import DEBUG_ENV, UsageError, strip_debug_flag, user_errors

    monkeypatch.setenv(DEBUG_ENV, "")  # recorded: strip_debug_flag below sets it, the teardown undoes that
    for error, code in ((UsageError("bad value x=1; pass x=2"), 2), (CheckpointWriteError("disk full"), 1)):
        with pytest.raises(SystemExit) as e, user_errors():
            raise error
        assert e.value.code == code and capsys.readouterr().err == f"error: {error}\n"
    with pytest.raises(SystemExit), user_errors():
        open("/nonexistent/file.wav")
    assert capsys.readouterr().err == "error: /nonexistent/file.wav: No such file or directory\n"
    assert strip_debug_flag(["a=1", "--debug"]) == ["a=1"]
    with pytest.raises(UsageError), user_errors():  # --debug (or USMKIT_DEBUG=1): the traceback
        raise UsageError("shown with its traceback")


@pytest.mark.parametrize("storage", ["memory_raw", "kaldiio"])
def test_feature_storages_that_unpickle_or_run_commands_are_refused(tmp_path, storage):
    import pickle

    from lhotse import Features

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    cut = _wav_cut(tmp_path / "a.wav", np.zeros(1600, np.float32), "a")
    feats = Features(
        type="fbank",
        num_frames=10,
        num_features=80,
        frame_shift=0.01,
        sampling_rate=16000,
        start=0.0,
        duration=0.1,
        storage_type=storage,
        storage_path=f"touch {marker} |" if storage == "kaldiio" else "",
        storage_key=pickle.dumps(Payload()) if storage == "memory_raw" else "a",
    )
    hostile = CutSet.from_cuts([_with_features(cut, feats)])
    data = hostile[0].to_dict()
    data["features"]["storage_key"] = "x"  # (bytes are not JSON: a manifest file carries a string)
    with gzip.open(manifest_path(tmp_path, "x", "cuts", "train"), "wt") as f:
        f.write(json.dumps(data) + "\n")
    with pytest.raises(BadInputError, match=rf"refused feature storage: cut a .*'{storage}'"):
        load_cuts(tmp_path, "train", corpus="x")
    with pytest.raises(BadInputError, match=rf"refused feature storage: cut a .*'{storage}'"):
        validate_cuts(hostile, require_text=False, on_bad="skip")
    assert not marker.exists()


def _with_features(cut: MonoCut, feats) -> MonoCut:
    from dataclasses import replace

    return replace(cut, features=feats)


def test_concurrent_writers_of_one_manifest_leave_a_whole_file(tmp_path):
    """Parallel runs that fill one feature cache write its manifest at once: each renames a whole file of its
    own, so the manifest that remains is complete (a shared temporary name let one rename another's half)."""
    from concurrent.futures import ThreadPoolExecutor

    cuts = CutSet.from_cuts(_hostile_cut("file", f"/nonexistent/{i}.wav").with_id(f"cut-{i}") for i in range(3000))
    path = manifest_path(tmp_path, "x", "cuts", "train")
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: write_manifest(cuts, path), range(8)))
    assert len(load_cuts(tmp_path, "train", corpus="x")) == 3000
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
