"""usmkit-transcribe on damaged input: non-finite samples, a file failing part way, a low sample rate."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import soundfile as sf
from fault_helpers import SR, speech_silence_speech

from usmkit.cli.transcribe import main

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
