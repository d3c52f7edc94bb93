"""write_audio: the file appears whole or not at all, and a failed write keeps the old one."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from usmkit.data.audio_files import write_audio


def _tone(n: int, amplitude: int) -> np.ndarray:
    return (amplitude * np.sin(np.arange(n) / 8.0)).astype(np.int16)


def test_write_audio_writes_the_samples_and_leaves_no_temporary_file(tmp_path):
    path = write_audio(tmp_path / "a" / "x.flac", _tone(1600, 1000), 16000, format="FLAC", subtype="PCM_16")
    samples, rate = sf.read(path, dtype="int16")
    assert rate == 16000 and np.array_equal(samples, _tone(1600, 1000))
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.flac"]


def test_a_failed_write_keeps_the_old_file_whole(tmp_path, monkeypatch):
    path = write_audio(tmp_path / "x.flac", _tone(800, 500), 16000)
    before = path.read_bytes()
    real_write = sf.write

    def half_then_fail(file, data, rate, **kwargs):  # a write killed half way
        real_write(file, data[: len(data) // 2], rate, **kwargs)
        raise OSError("No space left on device")

    monkeypatch.setattr(sf, "write", half_then_fail)
    with pytest.raises(OSError, match="No space"):
        write_audio(path, _tone(16000, 2000), 16000)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.flac"]
