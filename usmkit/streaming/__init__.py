"""Streaming recognition: incremental features, audio inputs, and the frame-synchronous decoder.

The encoder's chunk-by-chunk state lives with the model (``usmkit.models.streaming``); the
``usmkit-transcribe`` console script (``usmkit.transcribe``) puts the pieces together.
"""

from usmkit.streaming.audio import AudioError, FileSource, LevelMeter, MicrophoneSource, RawPcmSource, StreamResampler
from usmkit.streaming.decoder import DecoderConfig, EndpointConfig, GreedySearch, Segment, StreamingDecoder, Word
from usmkit.streaming.features import StatsNotFoundError, StreamingFbank, find_feature_stats, load_feature_stats

__all__ = [
    "AudioError",
    "DecoderConfig",
    "EndpointConfig",
    "FileSource",
    "GreedySearch",
    "LevelMeter",
    "MicrophoneSource",
    "RawPcmSource",
    "Segment",
    "StatsNotFoundError",
    "StreamResampler",
    "StreamingDecoder",
    "StreamingFbank",
    "Word",
    "find_feature_stats",
    "load_feature_stats",
]
