"""In-memory speech synthesis with espeak-ng through ctypes.

The ``espeakng-loader`` wheel ships ``libespeak-ng.so`` and its voice data but no Python API, and no
maintained package exposes espeak-ng's in-memory synthesis with voice variants and rate/pitch
control, so we bind the few C functions we need (``speak_lib.h``) ourselves.

Determinism: espeak-ng keeps process-global synthesis state (noise generator, flutter oscillator
phase, echo buffer) that carries over from one utterance to the next. ``espeak_ng_SetRandSeed``
fixes the noise; the rest is only reproducible when the same sequence of utterances is synthesized
in a fresh process. The corpus builder therefore renders each fixed shard of utterances in its own
fresh worker process (see ``build.py``).
"""

from __future__ import annotations

import ctypes
from enum import IntEnum
from functools import cache

import numpy as np

AUDIO_OUTPUT_SYNCHRONOUS = 2  # espeak_AUDIO_OUTPUT: synthesize in espeak_Synth, deliver to the callback
POS_CHARACTER = 1  # espeak_POSITION_TYPE
CHARS_UTF8 = 1  # espeak_Synth flags
INITIALIZE_DONT_EXIT = 0x8000  # return an error instead of calling exit() when the data is missing
EE_OK = 0


class Parameter(IntEnum):
    """``espeak_PARAMETER`` values we set."""

    RATE = 1  # words per minute, 80..450
    VOLUME = 2  # 0..200, 100 = normal
    PITCH = 3  # base pitch 0..100, 50 = normal
    RANGE = 4  # pitch range 0..100, 0 = monotone, 50 = normal
    WORDGAP = 7  # extra pause between words, units of 10 ms at normal rate


class EspeakError(RuntimeError):
    """espeak-ng could not be loaded, or refused a voice or a text."""


_SynthCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class Espeak:
    """The espeak-ng library of this process (it is a process-global singleton in C: use :func:`get_espeak`)."""

    def __init__(self) -> None:
        try:
            import espeakng_loader
        except ImportError as err:  # pragma: no cover - it is a declared dependency
            raise EspeakError("espeakng-loader is not installed: pip install espeakng-loader") from err
        self.library_path = espeakng_loader.get_library_path()
        self.data_path = espeakng_loader.get_data_path()
        try:
            lib = ctypes.CDLL(self.library_path)
        except OSError as err:
            raise EspeakError(f"cannot load libespeak-ng from {self.library_path}: {err}") from err
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [
            ctypes.c_void_p,  # text
            ctypes.c_size_t,  # size in bytes, including the terminating NUL
            ctypes.c_uint,  # position
            ctypes.c_int,  # position type
            ctypes.c_uint,  # end position (0 = none)
            ctypes.c_uint,  # flags
            ctypes.c_void_p,  # unique identifier out-pointer
            ctypes.c_void_p,  # user data
        ]
        lib.espeak_Synth.restype = ctypes.c_int
        lib.espeak_Synchronize.restype = ctypes.c_int
        lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        lib.espeak_ng_SetRandSeed.restype = None
        rate = lib.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, self.data_path.encode(), INITIALIZE_DONT_EXIT)
        if rate <= 0:
            raise EspeakError(f"espeak_Initialize failed (returned {rate}) with data at {self.data_path}")
        self.sample_rate: int = rate
        self._chunks: list[bytes] = []
        self._callback = _SynthCallback(self._collect)  # keep a reference: C holds only the pointer
        lib.espeak_SetSynthCallback(self._callback)
        self._lib = lib

    def _collect(self, wav: ctypes._Pointer, num_samples: int, events: int) -> int:
        if num_samples > 0 and wav:
            self._chunks.append(ctypes.string_at(wav, num_samples * 2))
        return 0  # 0 = continue synthesis

    def seed(self, seed: int) -> None:
        """Seed espeak-ng's noise generator (breath, frication, klatt voices)."""
        self._lib.espeak_ng_SetRandSeed(seed & 0x7FFFFFFF)

    def synthesize(
        self,
        text: str,
        voice: str,
        *,
        rate: int = 175,
        pitch: int = 50,
        pitch_range: int = 50,
        word_gap: int = 0,
        volume: int = 100,
    ) -> np.ndarray:
        """Speak ``text`` with the espeak-ng voice ``voice`` (e.g. ``"en-us+m3"``).

        Returns int16 samples at :attr:`sample_rate` (22050 Hz), shape (N,).
        """
        status = self._lib.espeak_SetVoiceByName(voice.encode())
        if status != EE_OK:
            raise EspeakError(
                f"espeak-ng has no voice {voice!r} (status {status}); voices are '<language>+<variant>', "
                f"languages under {self.data_path}/lang, variants under {self.data_path}/voices/!v"
            )
        for parameter, value in (
            (Parameter.RATE, rate),
            (Parameter.PITCH, pitch),
            (Parameter.RANGE, pitch_range),
            (Parameter.WORDGAP, word_gap),
            (Parameter.VOLUME, volume),
        ):
            self._lib.espeak_SetParameter(int(parameter), int(value), 0)
        data = text.encode("utf-8") + b"\0"
        buffer = ctypes.create_string_buffer(data, len(data))
        self._chunks.clear()
        status = self._lib.espeak_Synth(buffer, len(data), 0, POS_CHARACTER, 0, CHARS_UTF8, None, None)
        if status != EE_OK:
            raise EspeakError(f"espeak_Synth failed with status {status} for voice {voice!r}, text {text[:60]!r}")
        self._lib.espeak_Synchronize()
        samples = np.frombuffer(b"".join(self._chunks), dtype=np.int16).copy()
        self._chunks.clear()
        return samples


@cache
def get_espeak() -> Espeak:
    """The process's espeak-ng engine, initialized on first use."""
    return Espeak()
