"""WeNet's WebSocket protocol for streaming recognition: the client's signals and the server's results.

Client -> server (text messages are JSON signals, binary messages are audio)::

    {"signal": "start", "nbest": 1, "continuous_decoding": false}    (both options optional)
    <binary: 16-bit little-endian mono PCM at 16 kHz, any number of bytes per message (up to the server's limit)>
    {"signal": "end"}

Server -> client (text messages, JSON)::

    {"status": "ok", "type": "server_ready"}
    {"status": "ok", "type": "partial_result", "nbest": "[{\\"sentence\\": \\"the cat\\"}]", "audio_ms": 1280}
    {"status": "ok", "type": "final_result",
     "nbest": "[{\\"sentence\\": \\"the cat\\", \\"word_pieces\\": [{\\"word\\": \\"the\\", \\"start\\": 120, \\"end\\": 200}, ...]}]",
     "audio_ms": 2560}
    {"status": "ok", "type": "speech_end"}
    {"status": "failed", "message": "..."}     (then the server closes the connection)

As in WeNet's server (``runtime/core/websocket/websocket_server.cc``), ``nbest`` is a JSON *string*
holding the list, best first, so WeNet's clients parse it unchanged; partial results carry only
``sentence``, final results also ``word_pieces`` with times in milliseconds from the start of the
stream. ``audio_ms`` is ours (clients ignore keys they do not know): the stream's audio, in ms, up to
the end of the message that completed the last chunk in the result, which lets a client measure
how long a result took. Without ``continuous_decoding`` the stream ends after its first final
result (``speech_end``); with it, every endpoint gives a final result and ``{"signal": "end"}``
gives the last one, then ``speech_end``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from usmkit.streaming.decoder import Segment

MAX_NBEST = 100
MAX_SIGNAL_CHARS = 4096  # a signal is a few dozen characters; longer text is refused before it is parsed


class ProtocolError(ValueError):
    """A message the protocol does not allow here; the message says what was expected."""


@dataclass(frozen=True)
class Start:
    nbest: int = 1
    continuous_decoding: bool = False


@dataclass(frozen=True)
class EndSignal:
    pass


def parse_signal(text: str) -> Start | EndSignal:
    """A client's text message -> its signal; raises ``ProtocolError`` naming what is wrong.

    Whatever the text, the answer is a signal or a ``ProtocolError``: text longer than
    ``MAX_SIGNAL_CHARS`` is refused unread, and JSON that nests too deep for the parser
    (``RecursionError``) or holds a number too long to convert (``ValueError``) is malformed too.
    """
    if len(text) > MAX_SIGNAL_CHARS:
        raise ProtocolError(
            f"a text message of {len(text)} characters: text messages are signals of at most {MAX_SIGNAL_CHARS}, "
            '{"signal": "start"} or {"signal": "end"}; audio goes in binary messages'
        )
    try:
        message = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProtocolError(
            f"malformed JSON in a text message ({e.msg} at character {e.pos}): text messages are signals, "
            '{"signal": "start"} or {"signal": "end"}; audio goes in binary messages'
        ) from None
    except (RecursionError, ValueError) as e:
        reason = "nested too deep" if isinstance(e, RecursionError) else str(e)
        raise ProtocolError(
            f"malformed JSON in a text message ({reason}): text messages are signals, "
            '{"signal": "start"} or {"signal": "end"}'
        ) from None
    if not isinstance(message, dict) or "signal" not in message:
        raise ProtocolError(
            f'expected a signal, {{"signal": "start"}} or {{"signal": "end"}}, got {_short(text)}; '
            "audio goes in binary messages"
        )
    signal = message["signal"]
    if signal == "end":
        return EndSignal()
    if signal != "start":
        raise ProtocolError(f'unknown signal {_short(json.dumps(signal))}: expected "start" or "end"')
    nbest = message.get("nbest", 1)
    if isinstance(nbest, bool) or not isinstance(nbest, int) or not 1 <= nbest <= MAX_NBEST:
        raise ProtocolError(f"nbest must be an integer from 1 to {MAX_NBEST}, got {_short(json.dumps(nbest))}")
    continuous = message.get("continuous_decoding", False)
    if not isinstance(continuous, bool):
        raise ProtocolError(f"continuous_decoding must be true or false, got {_short(json.dumps(continuous))}")
    return Start(nbest=nbest, continuous_decoding=continuous)


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class PcmDecoder:
    """Binary messages of 16-bit little-endian PCM -> float32 samples in [-1, 1); a sample split across two
    messages is joined."""

    def __init__(self) -> None:
        self._odd = b""

    def __call__(self, data: bytes) -> np.ndarray:
        data = self._odd + data
        whole = len(data) // 2 * 2
        self._odd = data[whole:]
        return np.frombuffer(data[:whole], dtype="<i2").astype(np.float32) / 32768.0  # (N,)


def _message(kind: str, **fields) -> str:
    return json.dumps({"status": "ok", "type": kind, **fields})


def server_ready() -> str:
    return _message("server_ready")


def speech_end() -> str:
    return _message("speech_end")


def failed(message: str) -> str:
    return json.dumps({"status": "failed", "message": message})


def partial_result(texts: tuple[str, ...] | list[str], audio_ms: int) -> str:
    nbest = [{"sentence": text} for text in texts]
    return _message("partial_result", nbest=json.dumps(nbest), audio_ms=audio_ms)


def word_pieces(segment: Segment) -> list[dict]:
    """The segment's words with start and end in integer milliseconds from the start of the stream."""
    return [{"word": w.text, "start": round(1000 * w.start), "end": round(1000 * w.end)} for w in segment.words]


def final_result(segment: Segment | None, nbest: int, audio_ms: int) -> str:
    """``segment`` and up to ``nbest - 1`` of its alternatives; None: an empty result (nothing new was said)."""
    if segment is None:
        paths = [{"sentence": "", "word_pieces": []}]
    else:
        paths = [{"sentence": s.text, "word_pieces": word_pieces(s)} for s in (segment, *segment.alternatives)[:nbest]]
    return _message("final_result", nbest=json.dumps(paths), audio_ms=audio_ms)
