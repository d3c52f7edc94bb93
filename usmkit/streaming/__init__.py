"""Streaming recognition, audio in and text out: audio inputs, incremental features, the
frame-synchronous decoder, int8 weights, and the pipeline that joins them (``usmkit.streaming.pipeline``).

The encoder's chunk-by-chunk step and its state live with the model (``usmkit.streaming.step``);
the ``usmkit-transcribe`` console script (``usmkit.cli.transcribe``) is the command line on the pipeline.
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
