"""Optional extra synthesis engines: ``flite`` and ``festival`` binaries, when installed.

A different synthesizer adds acoustic variety the espeak-ng variants cannot. Neither is needed:
the default corpus is espeak-ng only, and these engines are used only when their binaries are on
PATH (then their voices join the training voices; they speak English only).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf


@dataclass(frozen=True)
class ExternalEngine:
    name: str  # "flite" | "festival"
    binary: str  # absolute path of the executable
    voices: tuple[str, ...]


def _flite_voices(binary: str) -> tuple[str, ...]:
    # `flite -lv` prints e.g. "Voices available: kal awb_time kal16 awb rms slt"
    try:
        out = subprocess.run([binary, "-lv"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    _, _, listed = out.partition(":")
    return tuple(sorted(set(listed.split())))


def detect_external_engines() -> list[ExternalEngine]:
    """The extra engines installed on this machine (flite voices, festival's default voice)."""
    engines = []
    flite = shutil.which("flite")
    if flite:
        voices = _flite_voices(flite)
        if voices:
            engines.append(ExternalEngine("flite", flite, voices))
    text2wave = shutil.which("text2wave")  # festival's batch front end
    if text2wave:
        engines.append(ExternalEngine("festival", text2wave, ("default",)))
    return engines


def synthesize_external(engine: str, binary: str, voice: str, text: str, rate: int) -> tuple[np.ndarray, int]:
    """Speak ``text`` with an external engine; returns (int16 samples (N,), sample rate).

    ``rate`` is in words per minute (175 = normal) and maps to flite's duration stretch.
    """
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "out.wav"
        if engine == "flite":
            stretch = f"{175.0 / max(rate, 1):.3f}"
            cmd = [binary, "-voice", voice, "--setf", f"duration_stretch={stretch}", "-t", text, "-o", str(wav)]
            subprocess.run(cmd, check=True, capture_output=True, timeout=60)
        elif engine == "festival":
            subprocess.run([binary, "-o", str(wav)], input=text.encode(), check=True, capture_output=True, timeout=60)
        else:
            raise ValueError(f"unknown external engine {engine!r}; expected 'flite' or 'festival'")
        samples, sample_rate = sf.read(wav, dtype="int16", always_2d=True)
    return samples[:, 0].copy(), int(sample_rate)
