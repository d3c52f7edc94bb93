"""Faults of usmkit-transcribe (usmkit.streaming and its offline path): damaged, non-finite and odd audio."""

from __future__ import annotations

import json
import re
import struct

import numpy as np
import pytest
import soundfile as sf
import torch
from fault_helpers import (
    SR,
    UNUSABLE_RATES,
    speech_silence_speech,
    speechlike,
    wav_declaring,
)

from usmkit.cli.transcribe import main
from usmkit.errors import UsageError


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


def test_unusable_sample_rates_are_one_line_in_usmkit_transcribe(ctc_ckpt, tmp_path, capsys):
    """A header saying 1 Hz transcribed for minutes (16000 s of "audio"), 2 GHz printed "no speech detected",
    exit 0, and 44101 Hz ended in "RuntimeError: ... can't allocate memory" (a 44101 x 16000 resampling
    filter, 2.8 GB), exit 1. Now one line naming the file, exit 2; the usual rates still transcribe."""
    from usmkit.cli import transcribe

    common = ["--checkpoint", str(ctc_ckpt), "--step", "eager", "--no-partials"]
    for rate, words in UNUSABLE_RATES.items():
        wav = wav_declaring(tmp_path / f"r{rate}.wav", rate)
        assert transcribe.main([str(wav), *common]) == 2
        err = capsys.readouterr().err
        assert f"error: {wav}: " in err and words in err and "ffmpeg" in err, err
    for rate in (8000, 16000, 22050, 44100, 48000):
        assert transcribe.main([str(wav_declaring(tmp_path / f"ok{rate}.wav", rate)), *common]) == 0
    capsys.readouterr()
    assert transcribe.main(["-", "--sample-rate", "44101", *common]) == 2
    assert "--sample-rate 44101: 44101 Hz cannot be resampled" in capsys.readouterr().err


@pytest.mark.parametrize(
    "option",
    [
        ["--endpoint-blank", "nan"],
        ["--endpoint-silence", "inf"],
        ["--max-segment", "nan"],
        ["--silence-db", "nan"],
        ["--silence-db", "10"],
        ["--lm-weight", "nan", "--lexicon"],
        ["--lm-weight", "-1", "--lexicon"],
        ["--word-score", "inf", "--lexicon"],
        ["--rescore-ctc-weight", "nan", "--decode", "ctc_beam", "--rescore"],
    ],
)
def test_meaningless_numbers_for_usmkit_transcribe_are_one_line(ctc_ckpt, tmp_path, capsys, option):
    """``--endpoint-blank nan`` / ``--max-segment inf`` ended in "ValueError: cannot convert float NaN to
    integer" (exit 1); ``--silence-db nan`` or ``10`` (above full scale) transcribed as if nothing was
    wrong; a NaN/negative LM weight reached the lexicon decoder. Now argparse's check names the option."""
    import soundfile as sf
    from fault_helpers import SR, speechlike

    from usmkit.cli import transcribe

    audio = tmp_path / "talk.wav"
    sf.write(audio, speechlike(1.0), SR)
    assert transcribe.main([str(audio), "--checkpoint", str(ctc_ckpt), "--step", "eager", *option]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"argument {option[0]}: must be" in err, err


FINAL = re.compile(r"^\[(\d\d:\d\d\.\d\d) - (\d\d:\d\d\.\d\d)\] (.+)$")


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv] + ["--threads", "1", "--no-partials"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def finals(out: str) -> list[tuple[str, str, str]]:
    return [m.groups() for m in map(FINAL.match, out.splitlines()) if m]


@pytest.mark.parametrize("mode", [[], ["--no-streaming"]])
def test_non_finite_samples_are_counted_and_zeroed(ctc_ckpt, capsys, tmp_path, mode):
    x = speech_silence_speech()
    sf.write(tmp_path / "clean.wav", x, SR, subtype="FLOAT")
    bad = x.copy()
    bad[SR // 2] = np.nan  # inside the first speech stretch
    bad[SR // 2 + 7] = np.inf
    bad[int(3.0 * SR)] = -np.inf  # inside the second
    sf.write(tmp_path / "bad.wav", bad, SR, subtype="FLOAT")
    code, clean_out, err = run_cli(capsys, tmp_path / "clean.wav", "--checkpoint", ctc_ckpt, *mode)
    assert code == 0, err
    code, out, err = run_cli(
        capsys, tmp_path / "bad.wav", "--checkpoint", ctc_ckpt, *mode, "--json", tmp_path / "b.json"
    )
    assert code == 0, err
    assert f"{tmp_path / 'bad.wav'}: 3 samples were NaN or Inf; they were set to 0" in err
    assert len(finals(out)) == len(finals(clean_out)) == 2  # nothing after the bad samples is lost
    assert finals(out)[-1][1] == finals(clean_out)[-1][1]  # the last segment ends where the clean one does
    assert len(json.loads((tmp_path / "b.json").read_text())["segments"]) == 2


@pytest.mark.parametrize("mode", [[], ["--no-streaming"]])
def test_file_failing_part_way_flushes_what_was_decoded_then_fails(ctc_ckpt, capsys, tmp_path, mode):
    x = np.concatenate([speech_silence_speech(), np.zeros(SR, np.float32), speech_silence_speech()])  # 8.2 s
    sf.write(tmp_path / "full.flac", x, SR)
    data = (tmp_path / "full.flac").read_bytes()
    (tmp_path / "cut.flac").write_bytes(data[: int(len(data) * 0.6)])  # a download cut short
    out_json = tmp_path / "cut.json"
    code, out, err = run_cli(capsys, tmp_path / "cut.flac", "--checkpoint", ctc_ckpt, *mode, "--json", out_json)
    assert code == 2
    assert "cut.flac: decoding failed part way" in err and "Traceback" not in err
    assert "the transcript above covers the audio before the failure" in err
    got = finals(out)
    assert len(got) >= 2, out  # the segments decoded before the damage are printed ...
    record = json.loads(out_json.read_text())  # ... and saved, with the error
    assert len(record["segments"]) == len(got) and "decoding failed part way" in record["error"]
    assert record["audio_seconds"] > 3.0


def test_8khz_input_gets_a_note_on_the_missing_band(ctc_ckpt, capsys, tmp_path):
    sf.write(tmp_path / "phone.wav", speech_silence_speech(sr=8000), 8000, subtype="PCM_16")
    code, out, err = run_cli(capsys, tmp_path / "phone.wav", "--checkpoint", ctc_ckpt)
    assert code == 0, err
    notes = [line for line in err.splitlines() if "8000 Hz audio but the model expects 16000 Hz" in line]
    assert len(notes) == 1 and "above 4000 Hz is empty" in notes[0]
    assert len(finals(out)) == 2
