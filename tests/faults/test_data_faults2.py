"""Damaged data and long inputs, second probe (issue 40, cases 3, 5, 6, 8, 11, 12 and 14a): duplicate cut
ids, truncated WAV and FLAC files, NaN/Inf audio and the stored feature statistics, a feature cache
killed mid-build, a cut shorter than a frame, and ``--no-streaming`` on long inputs."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from fault_helpers import SR, speech_silence_speech, speechlike
from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

from usmkit.cli.transcribe import main
from usmkit.data.config import DataConfig, FeatureConfig
from usmkit.data.features import feature_storage_dir, precompute_features
from usmkit.data.loader import make_loader, prepare_cuts, split_loader
from usmkit.data.manifests import load_cuts, manifest_path, write_manifest
from usmkit.data.normalize import FeatureStats, load_or_compute_stats, stats_path
from usmkit.data.validate import BadInputError, ValidationReport
from usmkit.errors import UsageError

FINAL_PREFIX = "["


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


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv] + ["--threads", "1", "--no-partials"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def finals(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(FINAL_PREFIX)]


# ---- 3: two cuts with one id ----------------------------------------------------------------------


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


# ---- 5: a WAV truncated after its header was written ------------------------------------------------


@pytest.mark.parametrize("mode", [[], ["--no-streaming"]])
def test_truncated_wav_transcribes_what_is_there_then_exits_2(ctc_ckpt, capsys, tmp_path, mode):
    x = np.concatenate([speech_silence_speech(), speech_silence_speech()])  # 7.2 s
    sf.write(tmp_path / "full.wav", x, SR, subtype="PCM_16")
    data = (tmp_path / "full.wav").read_bytes()
    (tmp_path / "cut.wav").write_bytes(data[: int(len(data) * 0.6)])  # the header still declares 7.2 s
    out_json = tmp_path / "cut.json"
    code, out, err = run_cli(capsys, tmp_path / "cut.wav", "--checkpoint", ctc_ckpt, *mode, "--json", out_json)
    assert code == 2, err
    line = [ln for ln in err.splitlines() if "error:" in ln]
    assert (
        len(line) == 1 and f"{tmp_path / 'cut.wav'}: truncated: its header declares 7.20 s but only 4.32 s" in line[0]
    )
    assert "the transcript above covers the audio before the failure (4.32 s)" in err
    assert len(finals(out)) >= 2  # the speech that is there is transcribed, and saved with the error
    record = json.loads(out_json.read_text())
    assert len(record["segments"]) == len(finals(out)) and "truncated" in record["error"]

    # A WAV written to a pipe declares a placeholder length: nothing is missing, nothing is reported.
    stream = bytearray(data)
    data_at = stream.find(b"data")
    stream[4:8] = stream[data_at + 4 : data_at + 8] = struct.pack("<I", 0xFFFFFFFF)
    (tmp_path / "piped.wav").write_bytes(bytes(stream))
    code, out, err = run_cli(capsys, tmp_path / "piped.wav", "--checkpoint", ctc_ckpt, *mode)
    assert code == 0 and "truncated" not in err
    assert finals(out) == finals(run_cli(capsys, tmp_path / "full.wav", "--checkpoint", ctc_ckpt, *mode)[1])


# ---- 6: NaN/Inf audio and the stored feature statistics ---------------------------------------------


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


# ---- 8: a feature cache killed during its first build -----------------------------------------------

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


# ---- 12: a FLAC cut short whose header declares its whole length -------------------------------------


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


# ---- 14a: a cut shorter than one feature frame -----------------------------------------------------


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


# ---- 11: --no-streaming on long inputs ---------------------------------------------------------------


@pytest.mark.parametrize(("causal", "chunk", "left", "window"), [(True, 4, 2, 1), (False, 3, 0, 2), (False, 2, 1, 3)])
def test_windowed_offline_encoding_equals_the_full_forward(causal, chunk, left, window):
    from usmkit.models.config import ConformerConfig
    from usmkit.models.conformer import ConformerEncoder
    from usmkit.streaming.windowed import WindowedEncoder

    torch.manual_seed(0)
    cfg = ConformerConfig(
        d_model=32, num_layers=3, num_heads=2, chunk_size=chunk, left_chunks=left, causal_conv=causal, dropout=0.0
    )
    encoder = ConformerEncoder(cfg).eval()
    feats = torch.randn(1, 203, 80)  # (1, t, F): 49 encoder frames, a last chunk cut short
    windowed = WindowedEncoder(encoder, chunk, left, window_chunks=window)
    pieces = [windowed.accept(feats[:, a : a + 37]) for a in range(0, 203, 37)] + [windowed.flush()]
    with torch.no_grad():
        full, _ = encoder(feats, torch.tensor([203]))  # (1, T', D)
    out = torch.cat(pieces, dim=1)
    assert out.shape == full.shape and torch.allclose(out, full, atol=1e-5)


def test_no_streaming_encodes_long_files_in_windows_of_flat_size(ctc_ckpt, capsys, tmp_path, monkeypatch):
    from usmkit.models.conformer import ConformerBlock

    audio = np.tile(speech_silence_speech(), 17)  # 61.2 s: 1530 encoder frames
    sf.write(tmp_path / "long.flac", audio, SR)
    seen: list[int] = []
    forward = ConformerBlock.forward
    monkeypatch.setattr(ConformerBlock, "forward", lambda self, x, *a: seen.append(x.shape[1]) or forward(self, x, *a))
    code, out, err = run_cli(capsys, tmp_path / "long.flac", "--checkpoint", ctc_ckpt, "--no-streaming")
    assert code == 0, err
    assert "61.20 s of audio" in err
    # Windows of ~512 frames (whole chunks of 4) with 2 left chunks and the convolution's chunk of context:
    # no block ever sees the whole file, and the most it sees does not depend on the file's length.
    assert seen and max(seen) <= 512 + 4 * 4 < 1530
    # The stream (exactly the full forward under the trained mask, as the windows are) gives the same transcript.
    code, streamed, err = run_cli(capsys, tmp_path / "long.flac", "--checkpoint", ctc_ckpt)
    assert code == 0 and len(finals(out)) > 10 and finals(out) == finals(streamed)


def test_full_attention_offline_refuses_what_cannot_fit_and_points_to_streaming(ctc_ckpt, monkeypatch):
    from usmkit.streaming import pipeline
    from usmkit.streaming.decoder import DecoderConfig
    from usmkit.streaming.features import StreamingFbank

    loaded = pipeline.load_model(ctc_ckpt)
    heads = loaded.model.encoder.cfg.num_heads
    monkeypatch.setattr(pipeline, "FULL_ATTENTION_BYTES", (8 * heads + 1) * 100**2)  # 100 frames: 4 s

    def offline(chunk_size, left_chunks):
        fbank = StreamingFbank(loaded.cfg.data.features, loaded.stats)
        return pipeline.OfflineTranscriber(
            loaded.model, loaded.tokenizer, fbank, DecoderConfig(), chunk_size, left_chunks
        )

    full = offline(None, 0)
    assert full.max_seconds == pytest.approx(4.0)
    full.accept(speechlike(3.0))
    with pytest.raises(UsageError, match=r"too long to encode at once under full attention .*drop --no-streaming"):
        full.accept(speechlike(2.0))
    # Chunk-wise attention has no such limit: windows of whole chunks.
    chunked = offline(4, 2)
    assert chunked.max_seconds is None
    segments = chunked.accept(speechlike(6.0)) + chunked.finish()
    assert len(segments) == 1 and chunked.stats.audio_s == pytest.approx(6.0)
