"""One client must not stall or exhaust ``usmkit-serve``: tiny messages, audio sent faster than it is
decoded, connections that never start or go silent, web pages of other sites (and pages of other names
that resolve to the server), headers named twice.

``Gate`` holds the server's worker at an encoder step, so that audio piles up in the streams as it does
on a loaded server; what the server does with the pile is then the same on any machine.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from collections import Counter

import pytest
from serve_helpers import (
    SR,
    Gate,
    best_finals,
    messages_until_closed,
    pcm_bytes,
    recognizer_for,
    samples_in,
    settled,
    start_server,
    stream,
    wait_until,
)
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from usmkit.streaming.pipeline import StreamingTranscriber

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models run best on one thread


@pytest.fixture(scope="module")
def recognizer(audio_ckpt):
    return recognizer_for(audio_ckpt)


class FeedLog:
    """Every feature computation of the server's streams: (id of the stream, samples, round it ran in)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []
        self.batcher = None  # set to the server's, to tell the rounds apart

    def per_round(self) -> Counter:
        """Samples featurized per (stream, round)."""
        total = Counter()
        for stream_id, n, round_ in self.calls:
            total[stream_id, round_] += n
        return total


@pytest.fixture
def feeds(monkeypatch) -> FeedLog:
    log = FeedLog()
    feed = StreamingTranscriber.feed_windows  # the server's streams cut their windows here, then featurize together

    def counted(self, samples):
        log.calls.append((id(self), samples.size, log.batcher.stats.rounds if log.batcher else -1))
        return feed(self, samples)

    monkeypatch.setattr(StreamingTranscriber, "feed_windows", counted)
    return log


def round_audio(recognizer) -> int:
    """Samples of two encoder chunks and one feature window: the most a round may featurize for one stream."""
    return 2 * recognizer.model.encoder.subsampling_factor * recognizer.chunk_size * 160 + 400


def audio_ms(messages: list[dict], kind: str) -> list[int]:
    return [m["audio_ms"] for m in messages if m.get("type") == kind]


# ---------------------------------------------------------------------- case 16: tiny messages
def test_tiny_messages_are_joined_before_their_features_are_computed(recognizer, wavs, feeds):
    """2600 messages of 1 ms queued behind a busy worker cost a handful of feature computations, not one
    each, and give the transcript of 100-ms messages, with each result's audio_ms at most one feature
    hop past the end of the message that completed its chunk."""
    pcm = pcm_bytes(wavs["a"])  # 3.6 s
    running = start_server(recognizer, max_messages_per_second=1e6)
    try:
        reference, code = stream(running.url, pcm)
        assert code == 1000
        first, tiny = pcm[: SR * 2], pcm[SR * 2 :]  # 1 s in 100-ms messages, then 2.6 s in 1-ms ones
        with Gate(recognizer) as gate, connect(running.url) as ws:
            ws.send(json.dumps({"signal": "start", "continuous_decoding": True}))
            assert json.loads(ws.recv(timeout=10))["type"] == "server_ready"
            for i in range(0, len(first), 3200):
                ws.send(first[i : i + 3200])
            assert gate.held.wait(timeout=20)  # the worker is busy with the first chunk
            for i in range(0, len(tiny), 32):
                ws.send(tiny[i : i + 32])
            assert wait_until(lambda: samples_in(running) == [len(pcm) // 2])
            feeds.calls.clear()
            gate.release()
            ws.send(json.dumps({"signal": "end"}))
            messages, code = messages_until_closed(ws)
    finally:
        running.close()
    assert code == 1000 and messages[-1]["type"] == "speech_end"
    assert len(feeds.calls) <= 20, f"{len(feeds.calls)} feature computations for {len(tiny) // 32} messages"
    assert [f["sentence"] for f in best_finals(messages)] == [f["sentence"] for f in best_finals(reference)]
    ref_ms, tiny_ms = audio_ms(reference, "partial_result"), audio_ms(messages, "partial_result")
    assert len(ref_ms) == len(tiny_ms)
    for ref, got in zip(ref_ms, tiny_ms, strict=True):  # 100-ms messages end on 100s of ms; 1-ms ones anywhere
        assert ref - 100 < got <= ref + 11 if got > 1000 else got == ref


# ---------------------------------------------------------------------- case 17: faster than real time
def test_a_client_sending_ahead_of_decoding_is_read_only_as_fast_as_it_is_decoded(recognizer, wavs):
    """20 s sent at loopback speed to a server whose worker is busy: the server holds at most
    --max-buffer-seconds of it (and one message) and leaves the rest in the socket; none of it is lost."""
    pcm = b"".join([pcm_bytes(wavs["a"])] * 6)[: 20 * SR * 2]
    running = start_server(recognizer, max_buffer_seconds=2.0)
    result: dict = {}
    try:
        with Gate(recognizer) as gate:
            client = threading.Thread(target=lambda: result.update(r=stream(running.url, pcm)))
            client.start()
            assert gate.held.wait(timeout=20)
            held = settled(lambda: samples_in(running))
            gate.release()
            client.join(timeout=120)
    finally:
        running.close()
    assert len(held) == 1 and held[0] <= 2.0 * SR + 1600, f"the server read {held[0] / SR:.1f} s ahead"
    messages, code = result["r"]
    assert code == 1000 and messages[-1]["type"] == "speech_end"
    assert audio_ms(messages, "final_result")[-1] == 20000  # all of it decoded


def test_a_backlog_is_featurized_a_round_at_a_time_beside_a_real_time_stream(recognizer, wavs, feeds):
    """A stream with 20 s queued gets at most two chunks of audio featurized per round, so that rounds stay
    short for the stream beside it; both transcripts are complete."""
    fast_pcm = b"".join([pcm_bytes(wavs["a"])] * 6)[: 20 * SR * 2]
    running = start_server(recognizer)
    feeds.batcher = running.server.batcher
    results: dict = {}
    try:
        with Gate(recognizer) as gate:
            fast = threading.Thread(target=lambda: results.update(fast=stream(running.url, fast_pcm)))
            fast.start()
            assert gate.held.wait(timeout=20)
            assert wait_until(lambda: samples_in(running) == [len(fast_pcm) // 2])
            good = threading.Thread(
                target=lambda: results.update(good=stream(running.url, pcm_bytes(wavs["b"]), pace_s=0.01))
            )
            good.start()
            gate.release()
            good.join(timeout=120)
            fast.join(timeout=120)
    finally:
        running.close()
    per_round = feeds.per_round()
    assert len({stream_id for stream_id, _ in per_round}) == 2
    assert max(per_round.values()) <= round_audio(recognizer), "a round featurized a stream's whole backlog"
    for name, total_ms in (("fast", 20000), ("good", 2400)):
        messages, code = results[name]
        assert code == 1000 and audio_ms(messages, "final_result")[-1] == total_ms


# ---------------------------------------------------------------------- case 18: slots held by idle clients
def test_connections_that_never_start_are_closed_and_free_their_slots(recognizer, wavs):
    running = start_server(recognizer, max_connections=2, start_timeout=0.5)
    try:
        idle = [connect(running.url), connect(running.url)]
        with connect(running.url) as third:
            _, code = messages_until_closed(third)
        assert code == 1013  # both slots are taken ...
        for ws in idle:
            replies, code = messages_until_closed(ws, timeout=20)  # ... until the start timeout frees them
            assert code == 1008 and replies[-1]["status"] == "failed" and "--start-timeout" in replies[-1]["message"]
        assert wait_until(lambda: running.call(lambda: len(running.server.connections)) == 0)
        messages, code = stream(running.url, pcm_bytes(wavs["b"]))
        assert code == 1000 and best_finals(messages)
    finally:
        running.close()


def test_a_started_stream_that_goes_silent_gets_its_results_then_is_closed(recognizer, wavs):
    pcm = pcm_bytes(wavs["a"])
    running = start_server(recognizer, idle_timeout=0.5)
    try:
        reference, _ = stream(running.url, pcm)
        with connect(running.url) as ws:
            ws.send(json.dumps({"signal": "start", "continuous_decoding": True}))
            for i in range(0, len(pcm), 3200):
                ws.send(pcm[i : i + 3200])
            messages, code = messages_until_closed(ws, timeout=20)  # and no end signal
        assert wait_until(lambda: running.call(lambda: len(running.server.connections)) == 0)
    finally:
        running.close()
    assert code == 1008 and messages[-1]["status"] == "failed" and "--idle-timeout" in messages[-1]["message"]
    assert messages[0]["type"] == "server_ready" and messages[-2]["type"] == "final_result"
    assert best_finals(messages) == best_finals(reference) and audio_ms(messages, "final_result")[-1] == 3600


def test_pages_of_other_sites_cannot_open_sockets(recognizer):
    running = start_server(recognizer, allowed_origins=("https://app.example",))
    own = f"http://127.0.0.1:{running.server.port}"
    try:
        with pytest.raises(InvalidStatus) as refused:
            connect(running.url, origin="https://evil.example", open_timeout=10)
        assert refused.value.response.status_code == 403
        assert b"--allowed-origins" in refused.value.response.body
        for origin in (None, own, "https://app.example"):  # no Origin: not a browser
            with connect(running.url, origin=origin, open_timeout=10) as ws:
                ws.send(json.dumps({"signal": "start"}))
                assert json.loads(ws.recv(timeout=10))["type"] == "server_ready"
    finally:
        running.close()


def test_the_buffer_must_hold_two_rounds_of_audio(recognizer):
    from usmkit.errors import UsageError

    with pytest.raises(UsageError, match="--max-buffer-seconds 0.1 is too small"):
        start_server(recognizer, max_buffer_seconds=0.1)


def handshake(port: int, *headers: str) -> bytes:
    """The server's answer (status line and headers) to a WebSocket handshake with ``headers`` (raw lines)."""
    import socket

    lines = ["GET / HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13",
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", *headers]  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
            data += chunk
        length = re.search(rb"Content-Length: (\d+)", data)
        while length and len(data.partition(b"\r\n\r\n")[2]) < int(length.group(1)):
            data += sock.recv(65536)  # the body
    return data


def test_a_dns_rebinding_page_is_refused_and_allowed_hosts_let_a_name_in(recognizer):
    running = start_server(recognizer, allowed_hosts=("asr.example",))
    port = running.server.port
    try:
        evil = handshake(port, f"Host: evil.example:{port}", f"Origin: http://evil.example:{port}")
        assert evil.startswith(b"HTTP/1.1 403") and b"--allowed-hosts" in evil
        page = urllib.request.Request(running.url.replace("ws:", "http:"), headers={"Host": f"evil.example:{port}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(page, timeout=10)
        refused.value.close()
        assert refused.value.code == 403  # the page and /stats too
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"asr.example:{port}"):
            ok = handshake(port, f"Host: {host}", f"Origin: http://{host}")
            assert ok.startswith(b"HTTP/1.1 101"), (host, ok)
    finally:
        running.close()


@pytest.mark.parametrize(
    "headers",
    [
        ("Host: 127.0.0.1", "Origin: http://127.0.0.1", "Origin: http://evil.example"),
        ("Host: 127.0.0.1", "Host: evil.example", "Origin: http://evil.example"),
        ("Host: 127.0.0.1", "Authorization: Bearer a", "Authorization: Bearer b"),
        ("Host: 127.0.0.1", "Upgrade: websocket"),  # with handshake()'s own: twice
    ],
)
def test_a_header_named_twice_gets_400_without_a_traceback(recognizer, headers, caplog):
    running = start_server(recognizer)
    try:
        reply = handshake(running.server.port, *headers)
    finally:
        running.close()
    assert reply.startswith(b"HTTP/1.1 400") and b"headers: a request carries at most one" in reply
    assert "Traceback" not in caplog.text and "MultipleValuesError" not in caplog.text


def test_a_client_of_tiny_messages_faster_than_real_time_is_paced_and_gets_its_final(recognizer, wavs):
    """2-ms messages sent at loopback speed: the server reads them at --max-messages-per-second, and the
    keepalive pings meanwhile (one every 0.3 s, whose pongs queue behind the audio) do not close the client."""
    pcm = pcm_bytes(wavs["b"])
    plain = start_server(recognizer)
    try:
        reference, _ = stream(plain.url, pcm)  # the same audio in 100-ms messages
    finally:
        plain.close()
    running = start_server(recognizer, max_messages_per_second=300, ping_interval=0.3, ping_timeout=0.3)
    try:
        messages, code = stream(running.url, pcm, block=64)  # 1200 messages: 4 s at 300 a second
        assert wait_until(lambda: running.call(lambda: len(running.server.connections)) == 0)
    finally:
        running.close()
    assert code == 1000, messages[-3:]
    assert messages[-1] == {"status": "ok", "type": "speech_end"} and messages[-2]["type"] == "final_result"
    assert best_finals(messages) == best_finals(reference)
    assert running.server.traffic.messages_in >= len(pcm) // 64
