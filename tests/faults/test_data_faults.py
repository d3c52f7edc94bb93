"""Faults of data (usmkit.data: manifests, validation, loader, features, statistics)."""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from fault_helpers import SR, speechlike
from lhotse import CutSet, MonoCut, Recording, SupervisionSegment
from lhotse.audio import AudioSource

from usmkit.data.config import DataConfig, FeatureConfig
from usmkit.data.features import feature_storage_dir, precompute_features
from usmkit.data.loader import make_loader, prepare_cuts, split_loader
from usmkit.data.manifests import load_cuts, manifest_path, write_manifest
from usmkit.data.normalize import FeatureStats, load_or_compute_stats, stats_path
from usmkit.data.validate import BadInputError, ValidationReport, validate_cuts
from usmkit.errors import UsageError


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


def _cut(path: Path, cut_id: str, samples: np.ndarray | None = None, subtype: str = "PCM_16", text: str = "hello"):
    """A one-supervision cut over ``path`` (written from ``samples`` first when given)."""
    if samples is not None:
        sf.write(path, samples, SR, subtype=subtype)
    rec = Recording.from_file(path, recording_id=path.stem)
    sup = SupervisionSegment(cut_id, rec.id, 0.0, rec.duration, text=text, language="en", speaker="s")
    return MonoCut(cut_id, 0.0, rec.duration, 0, recording=rec, supervisions=[sup])


def _cfg(root: Path, on_bad: str = "error", precomputed: bool = True) -> DataConfig:
    return DataConfig(
        manifest_dir=str(root), num_workers=0, on_bad_input=on_bad, features=FeatureConfig(precomputed=precomputed)
    )


def test_duplicate_cut_ids_are_refused_before_anything_is_computed(tmp_path, caplog):
    cuts = [
        _cut(tmp_path / "a.wav", "utt-1", speechlike(0.5, 1)),
        _cut(tmp_path / "b.wav", "utt-1", speechlike(0.7, 2), text="another text"),
        _cut(tmp_path / "c.wav", "utt-2", speechlike(0.6, 3)),
    ]
    with pytest.raises(BadInputError) as e:
        prepare_cuts(CutSet.from_cuts(cuts), _cfg(tmp_path), split="train", require_text=True)
    msg = str(e.value)
    assert msg.startswith("duplicate cut id: cut utt-1 in split train: ") and "\n" not in msg
    assert str(tmp_path / "a.wav") in msg and str(tmp_path / "b.wav") in msg and "on_bad_input=skip" in msg
    assert not feature_storage_dir(tmp_path, "train").exists()  # refused before any feature was computed

    with caplog.at_level(logging.WARNING):
        kept, report = prepare_cuts(CutSet.from_cuts(cuts), _cfg(tmp_path, "skip"), split="train", require_text=True)
    assert [c.id for c in kept] == ["utt-1", "utt-2"] and kept[0].supervisions[0].text == "hello"  # the first stays
    assert [p.kind for p in report.problems] == ["duplicate cut id"] and "1 duplicate cut id" in caplog.text
    feats = {c.id: c.load_features() for c in kept}
    assert feats["utt-1"].shape[0] == pytest.approx(50, abs=2)  # a.wav's 0.5 s, not b.wav's 0.7 s


@pytest.mark.parametrize("precomputed", [True, False])
def test_non_finite_audio_is_reported_before_stats_and_never_poisons_them(tmp_path, caplog, precomputed):
    clean = speechlike(1.0, 1)
    bad = speechlike(1.0, 2)
    bad[4000], bad[9000] = np.nan, np.inf
    cuts = CutSet.from_cuts(
        [_cut(tmp_path / "clean.wav", "clean", clean, "FLOAT"), _cut(tmp_path / "bad.wav", "bad", bad, "FLOAT")]
    )
    cfg = _cfg(tmp_path, precomputed=precomputed)
    with caplog.at_level(logging.WARNING):
        kept, report = prepare_cuts(cuts, cfg, split="train", require_text=True)
    assert len(kept) == 2 and report.non_finite == {str(tmp_path / "bad.wav"): 2}  # counted, not dropped
    assert "train: 1 audio files hold NaN/Inf samples (bad.wav: 2)" in caplog.text
    with caplog.at_level(logging.WARNING):
        stats = load_or_compute_stats(kept, cfg)
    left_out = re.search(r"feature statistics leave out (\d+) NaN/Inf frames of 1 cuts \(e.g. cut bad\)", caplog.text)
    assert left_out and 2 <= int(left_out[1]) <= 6  # the frames whose 25 ms window holds one of the 2 samples
    assert stats.finite and bool((stats.std > 0.01).all())
    assert FeatureStats.load(stats_path(tmp_path)).finite  # what was stored for later runs too

    # Non-finite stats are never written; a stored file holding them is computed again, with a warning.
    poisoned = FeatureStats(mean=torch.full((80,), float("nan")), std=torch.ones(80))
    with pytest.raises(BadInputError, match=r"non-finite feature statistics: .*80 of 80 bins are NaN/Inf"):
        poisoned.save(tmp_path / "x.safetensors", cfg.features)
    assert not (tmp_path / "x.safetensors").exists()
    _write_stats_unchecked(poisoned, stats_path(tmp_path), cfg.features)  # as an older run left it
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = load_or_compute_stats(kept, cfg)
    assert "holds NaN/Inf values" in caplog.text and again.finite
    assert torch.allclose(again.mean, stats.mean) and FeatureStats.load(stats_path(tmp_path)).finite


def _write_stats_unchecked(stats: FeatureStats, path: Path, features: FeatureConfig) -> None:
    from safetensors.torch import save_file

    from usmkit.data.normalize import _config_key

    save_file({"mean": stats.mean, "std": stats.std}, str(path), metadata={"feature_config": _config_key(features)})


_KILL_AFTER_TWO_WRITES = textwrap.dedent(
    """
    import os, signal, sys
    import lhotse.features.io as io
    real, written = io.NumpyFilesWriter.write, []
    def write(self, key, value):
        out = real(self, key, value)
        written.append(key)
        if len(written) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    io.NumpyFilesWriter.write = write
    from usmkit.data.config import DataConfig
    from usmkit.data.loader import prepare_cuts
    from usmkit.data.manifests import load_cuts
    prepare_cuts(load_cuts(sys.argv[1], "train"), DataConfig(manifest_dir=sys.argv[1]), split="train", require_text=True)
    """
)


def test_feature_cache_killed_mid_build_is_rebuilt_and_a_foreign_folder_refused(synth_corpus, tmp_path, caplog):
    corpus = tmp_path / "corpus"
    shutil.copytree(synth_corpus, corpus, ignore=shutil.ignore_patterns("feats_*", "feature_stats*"))
    child = subprocess.run([sys.executable, "-c", _KILL_AFTER_TWO_WRITES, str(corpus)], env=os.environ.copy())
    assert child.returncode == -9  # SIGKILL mid-build
    cache = feature_storage_dir(corpus, "train")
    assert len(list(cache.rglob("*.npy"))) == 2 and not (cache / "feature_config.json").exists()

    cfg = DataConfig(manifest_dir=str(corpus), num_workers=0)
    train = load_cuts(corpus, "train")
    with caplog.at_level(logging.WARNING):
        cuts, _ = prepare_cuts(train, cfg, split="train", require_text=True)
    assert "stopped before it finished" in caplog.text and str(cache) in caplog.text
    assert [c.id for c in cuts] == [c.id for c in train] and all(c.load_features().shape[1] == 80 for c in cuts)
    assert len(list(cache.rglob("*.npy"))) == len(train)  # the killed run's arrays are gone

    # A folder under the cache's name holding anything usmkit does not write there is not deleted: one line.
    foreign = feature_storage_dir(corpus, "dev")
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(UsageError) as e:
        prepare_cuts(load_cuts(corpus, "dev"), cfg, split="dev", require_text=True)
    assert str(e.value).startswith(f"not a feature cache: {foreign}: ") and "notes.txt" in str(e.value)
    assert "\n" not in str(e.value) and (foreign / "notes.txt").read_text() == "mine"


def _truncated_flac_corpus(root: Path) -> CutSet:
    root.mkdir(parents=True, exist_ok=True)
    good = _cut(root / "good.flac", "good", speechlike(1.5, 1), subtype="PCM_16")
    damaged = _cut(root / "cut.flac", "damaged", speechlike(3.0, 2), subtype="PCM_16")
    data = (root / "cut.flac").read_bytes()
    (root / "cut.flac").write_bytes(data[: int(len(data) * 0.6)])  # a download cut short
    assert sf.info(root / "cut.flac").frames == 3 * SR  # the header still declares all of it
    return CutSet.from_cuts([good, damaged])


@pytest.mark.parametrize("precomputed", [True, False])
def test_truncated_flac_fails_validation_not_training(tmp_path, caplog, precomputed):
    cuts = _truncated_flac_corpus(tmp_path)
    with pytest.raises(BadInputError) as e:
        prepare_cuts(cuts, _cfg(tmp_path, precomputed=precomputed), split="train", require_text=True)
    assert str(e.value).startswith(f"truncated audio: {tmp_path / 'cut.flac'} (cut damaged in split train): ")
    assert "declares 3.000 s" in str(e.value) and "\n" not in str(e.value)
    with caplog.at_level(logging.WARNING):
        kept, report = prepare_cuts(cuts, _cfg(tmp_path, "skip", precomputed), split="train", require_text=True)
    assert (
        [c.id for c in kept] == ["good"] and report.num_skipped == 1 and "1 truncated audio (cut.flac)" in caplog.text
    )
    batches = list(make_loader(kept, _cfg(tmp_path, "skip", precomputed), stats=None, train=False))
    assert [i for b in batches for i in b.cut_ids] == ["good"]

    # Evaluation goes through the same validation (usmkit.cli.evaluate's loader).
    write_manifest(cuts, manifest_path(tmp_path, "synth", "cuts", "test"))
    with pytest.raises(BadInputError, match="truncated audio: .*cut.flac"):
        split_loader(_cfg(tmp_path, precomputed=precomputed), "test", tokenizer=None, stats=None)


def test_truncated_wav_is_found_by_its_header_even_in_a_manifest_made_after_the_damage(tmp_path):
    """libsndfile (and so lhotse) reports a short WAV's length as what is there, so a manifest made from
    it agrees with it; the header, as usmkit-transcribe reads it, still says more was meant to be there."""
    sf.write(tmp_path / "full.wav", speechlike(3.0, 2), SR, subtype="PCM_16")
    data = (tmp_path / "full.wav").read_bytes()
    (tmp_path / "cut.wav").write_bytes(data[: int(len(data) * 0.6)])
    cuts = CutSet.from_cuts([_cut(tmp_path / "full.wav", "full"), _cut(tmp_path / "cut.wav", "damaged")])
    assert cuts[1].duration == pytest.approx(1.8, abs=0.01)
    with pytest.raises(BadInputError) as e:
        prepare_cuts(cuts, _cfg(tmp_path), split="train", require_text=True)
    assert str(e.value).startswith(f"truncated audio: {tmp_path / 'cut.wav'} (cut damaged in split train): ")
    assert re.search(r"its header declares 3\.000 s but the file holds 1\.79\d s", str(e.value))


def test_feature_cache_reports_audio_it_cannot_decode_by_cut(tmp_path):
    """Damage that validation did not reach: lhotse leaves such a cut out of what it computes; the cache
    names it (error) or leaves it out counted (skip), never a KeyError."""
    cuts = _truncated_flac_corpus(tmp_path)
    with pytest.raises(BadInputError, match=r"corrupt audio: .*cut.flac \(cut damaged\): its audio failed to decode"):
        precompute_features(cuts, FeatureConfig(), tmp_path / "feats")
    report = ValidationReport(total=2)
    kept = precompute_features(cuts, FeatureConfig(), tmp_path / "feats", on_bad="skip", report=report)
    assert [c.id for c in kept] == ["good"] and [p.kind for p in report.problems] == ["corrupt audio"]


def test_cut_shorter_than_a_frame_is_bad_input(tmp_path, caplog):
    cuts = CutSet.from_cuts(
        [_cut(tmp_path / "ok.wav", "ok", speechlike(0.5, 1)), _cut(tmp_path / "one.wav", "one", speechlike(1.0, 2)[:1])]
    )
    with pytest.raises(BadInputError) as e:
        prepare_cuts(cuts, _cfg(tmp_path), split="train", require_text=True)
    assert str(e.value).startswith(f"too short: {tmp_path / 'one.wav'} (cut one in split train): it lasts 0.06 ms")
    assert "25 ms feature frame" in str(e.value) and "\n" not in str(e.value)
    with caplog.at_level(logging.WARNING):
        kept, report = prepare_cuts(cuts, _cfg(tmp_path, "skip"), split="train", require_text=True)
    assert [c.id for c in kept] == ["ok"] and "1 too short (one.wav)" in caplog.text
    assert [i for b in make_loader(kept, _cfg(tmp_path, "skip"), stats=None, train=True) for i in b.cut_ids] == ["ok"]
