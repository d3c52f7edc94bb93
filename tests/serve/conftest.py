"""The server tests' fixtures live in serve_helpers.py (conftest module names collide across test folders)."""

from serve_helpers import audio_ckpt, las_ckpt, wavs, word_ckpt  # noqa: F401
