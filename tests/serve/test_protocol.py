"""``usmkit-serve`` over loopback with a real WebSocket client: the message sequence, results equal to
the command line's, concurrent clients, errors, the token, the connection limit, vanished clients."""

from __future__ import annotations

import contextlib
import gc
import json
import socket
import threading
import time
import urllib.request
import weakref
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from serve_helpers import best_finals, messages_until_closed, pcm_bytes, recognizer_for, start_server, stream
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from usmkit.cli.transcribe import main as transcribe

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models run best on one thread


@pytest.fixture(scope="module")
def recognizer(audio_ckpt):
    return recognizer_for(audio_ckpt)  # the default traced step


@pytest.fixture(scope="module")
def server(recognizer):
    running = start_server(recognizer)
    yield running
    running.close()


_cli_cache: dict = {}


def cli_segments(wav: Path, ckpt: Path, *flags: str) -> list[dict]:
    """``usmkit-transcribe WAV --checkpoint CKPT`` (in this process), its segments from ``--json``."""
    key = (wav, ckpt, flags)
    if key not in _cli_cache:
        out = wav.with_suffix(".cli.json")
        assert transcribe([str(wav), "--checkpoint", str(ckpt), "--json", str(out), "--no-partials", *flags]) == 0
        _cli_cache[key] = json.loads(out.read_text())["segments"]
    return _cli_cache[key]


def test_start_partials_finals_end_and_the_command_lines_transcript(server, audio_ckpt, wavs):
    messages, code = stream(server.url, pcm_bytes(wavs["a"]))
    kinds = [m["type"] for m in messages]
    assert all(m["status"] == "ok" for m in messages) and code == 1000
    assert kinds[-1] == "speech_end" and kinds[-2] == "final_result" and "partial_result" in kinds
    assert set(kinds[:-1]) == {"partial_result", "final_result"}
    for m in messages[:-1]:
        assert isinstance(m["nbest"], str)  # WeNet's clients json-parse the string
        paths = json.loads(m["nbest"])
        assert len(paths) == 1 and isinstance(paths[0]["sentence"], str)
        assert ("word_pieces" in paths[0]) == (m["type"] == "final_result")
    audio_ms = [m["audio_ms"] for m in messages[:-1]]
    assert audio_ms == sorted(audio_ms) and audio_ms[-1] == 3600
    finals = best_finals(messages)
    expected = cli_segments(wavs["a"], audio_ckpt)
    assert len(finals) == len(expected) == 2
    assert [f["sentence"] for f in finals] == [s["text"] for s in expected]
    # Word times in ms, increasing, inside the speech; the command line's (in seconds) rounded.
    times = [t for f in finals for w in f["word_pieces"] for t in (w["start"], w["end"])]
    assert times == sorted(times) and all(isinstance(t, int) for t in times) and 0 <= times[0] < times[-1] <= 3600
    for f, s in zip(finals, expected, strict=True):
        assert [(w["word"], w["start"], w["end"]) for w in f["word_pieces"]] == [
            (w["word"], round(1000 * w["start"]), round(1000 * w["end"])) for w in s["words"]
        ]


def test_without_continuous_decoding_the_stream_ends_at_its_first_final(server, wavs):
    messages, code = stream(server.url, pcm_bytes(wavs["a"]), {"signal": "start"})
    kinds = [m["type"] for m in messages]
    assert kinds.count("final_result") == 1 and kinds[-2:] == ["final_result", "speech_end"] and code == 1000
    assert messages[-2]["audio_ms"] < 2400  # the first segment's endpoint, in the silence after the first speech


def test_two_concurrent_clients_get_their_own_transcripts_in_one_batch(server, wavs):
    alone = {name: best_finals(stream(server.url, pcm_bytes(wav))[0]) for name, wav in wavs.items()}
    assert alone["a"] and alone["b"] and alone["a"] != alone["b"]
    before = server.call(lambda: server.server.stats())
    together: dict = {}
    # Both streams started before either sends audio, and all of it at once: each has chunks waiting
    # while the other's are stepped, however the threads are scheduled on a busy machine.
    ready = threading.Barrier(len(wavs))

    def client(name: str) -> None:
        together[name] = best_finals(stream(server.url, pcm_bytes(wavs[name]), ready=ready)[0])

    threads = [threading.Thread(target=client, args=(name,)) for name in wavs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert together == alone
    stats = server.call(lambda: server.server.stats())
    assert stats["max_batch"] == 2 and stats["chunks"] - before["chunks"] > stats["steps"] - before["steps"]


@pytest.mark.parametrize(
    "messages,expected",
    [
        (["this is not json"], "malformed JSON"),
        (['{"hello": 1}'], 'expected a signal, {"signal": "start"}'),
        (['{"signal": "go"}'], 'unknown signal "go"'),
        ([b"\x00\x01" * 100], "audio before the start signal"),
        (['{"signal": "end"}'], "end signal before the start signal"),
        (['{"signal": "start", "nbest": "3"}'], "nbest must be an integer"),
        (['{"signal": "start", "continuous_decoding": 1}'], "continuous_decoding must be true or false"),
        (['{"signal": "start"}', '{"signal": "start"}'], "already started"),
        (['{"signal": "start"}', "some text where audio belongs"], "malformed JSON"),
        (['{"signal": "start"}', '{"signal": "end"}', b"\x00\x00"], "audio after the end signal"),
        (["[" * 2000 + "]" * 2000], "nested too deep"),  # past the JSON parser's recursion limit
        (['{"signal": "start", "nbest": ' + "1" * 5000 + "}"], "text messages are signals of at most 4096"),
        (['{"signal": "start"}', "x" * 500_000], "a text message of 500000 characters"),
    ],
)
def test_each_bad_message_gets_an_error_and_the_server_serves_others(server, wavs, messages, expected):
    """A client that breaks the protocol gets {"status": "failed"} and a closed connection, while a
    good client streaming at the same time is not disturbed."""
    good: dict = {}
    t = threading.Thread(target=lambda: good.update(r=stream(server.url, pcm_bytes(wavs["b"]), pace_s=0.002)))
    t.start()
    with connect(server.url) as ws:
        for m in messages:
            try:
                ws.send(m)
            except ConnectionClosed:  # the race below, lost before the last send
                break
        replies, code = messages_until_closed(ws)
    t.join(timeout=60)
    failure = replies[-1]
    kinds = [r.get("type") for r in replies]  # a failure has a status and a message, no type
    if expected == "audio after the end signal" and kinds[-1:] == ["speech_end"]:
        # A race the client can lose on a loaded machine: the empty stream ended (its results sent, the
        # socket closing) before the late audio reached the server, which then had nothing to refuse.
        assert kinds[0] == "server_ready" and set(kinds[1:-1]) <= {"final_result"} and code == 1000
    else:
        assert failure["status"] == "failed" and expected in failure["message"] and code == 1008
        assert [r["type"] for r in replies[:-1]] in ([], ["server_ready"])
    good_messages, good_code = good["r"]
    assert good_code == 1000 and best_finals(good_messages) and good_messages[-1]["type"] == "speech_end"


def test_a_vanished_client_frees_its_stream(server, wavs):
    pcm = pcm_bytes(wavs["a"])
    ws = connect(server.url)
    ws.send(json.dumps({"signal": "start", "continuous_decoding": True}))
    ws.recv(timeout=10)
    for i in range(0, len(pcm) // 2, 3200):
        ws.send(pcm[i : i + 3200])
    ws.recv(timeout=10)  # a partial result: the stream is running
    streams = server.call(lambda: [weakref.ref(c.stream) for c in server.server.connections])
    assert len(streams) == 1 and streams[0]() is not None
    ws.socket.close()  # gone, mid-stream, without a closing handshake
    deadline = time.monotonic() + 10
    while server.call(lambda: len(server.server.connections)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.call(lambda: (len(server.server.connections), server.server.batcher.streams)) == (0, 0)
    deadline = time.monotonic() + 10  # a round that had the stream in hand ends first
    while server.call(gc.collect) is not None and streams[0]() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert streams[0]() is None  # its features, encoder state and decoder are gone
    assert best_finals(stream(server.url, pcm_bytes(wavs["b"]))[0])  # and the server goes on


def test_token_is_required_when_set(recognizer, wavs):
    running = start_server(recognizer, token="s3cret")
    try:
        for url in (running.url, running.url + "?token=wrong"):
            with connect(url) as ws:
                replies, code = messages_until_closed(ws)
            assert replies == [{"status": "failed", "message": replies[0]["message"]}] and code == 1008
            assert "token" in replies[0]["message"]
        assert best_finals(stream(running.url + "?token=s3cret", pcm_bytes(wavs["b"]))[0])
        with connect(running.url, additional_headers={"Authorization": "Bearer s3cret"}) as ws:
            ws.send(json.dumps({"signal": "start"}))
            assert json.loads(ws.recv(timeout=10))["type"] == "server_ready"
        page = urllib.request.urlopen(running.url.replace("ws://", "http://"), timeout=10).read().decode()
        assert "app.js" in page  # the page itself needs no token; its socket does
    finally:
        running.close()


def test_stats_need_the_token_too_and_the_bearer_scheme_is_case_insensitive(recognizer):
    running = start_server(recognizer, token="s3cret")
    stats = running.url.replace("ws://", "http://") + "stats"
    try:
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(stats, timeout=10)
        for request in (
            stats + "?token=s3cret",
            urllib.request.Request(stats, headers={"Authorization": "bearer s3cret"}),
        ):
            with urllib.request.urlopen(request, timeout=10) as r:
                assert "connections" in json.loads(r.read())
        for auth in ("bearer s3cret", "BEARER  s3cret"):
            with connect(running.url, additional_headers={"Authorization": auth}) as ws:
                ws.send(json.dumps({"signal": "start"}))
                assert json.loads(ws.recv(timeout=10))["type"] == "server_ready"
    finally:
        running.close()


def test_one_message_of_over_32_s_as_wenets_performance_tool_sends_a_file(server, audio_ckpt, wavs, tmp_path):
    """WeNet's tools/websocket/performance-ws.py sends each file as one binary message; the transcript is the
    command line's."""
    pcm = pcm_bytes(wavs["a"]) * 12  # 43.2 s, 1.4 MB: over 1 MiB
    wav = tmp_path / "long.wav"
    sf.write(wav, np.frombuffer(pcm, "<i2"), 16000, subtype="PCM_16")
    with connect(server.url, max_size=None) as ws:
        ws.send(json.dumps({"signal": "start", "nbest": 1, "continuous_decoding": True}))
        assert json.loads(ws.recv(timeout=10))["type"] == "server_ready"
        ws.send(pcm)
        ws.send(json.dumps({"signal": "end"}))
        messages, code = messages_until_closed(ws, timeout=120)
    assert code == 1000 and messages[-1]["type"] == "speech_end"
    assert messages[-2]["audio_ms"] == 43200
    assert [f["sentence"] for f in best_finals(messages)] == [s["text"] for s in cli_segments(wav, audio_ckpt)]


def test_head_gets_the_headers_of_get_without_a_body_and_other_methods_405(server):
    def exchange(request: bytes) -> tuple[bytes, bytes]:
        with socket.create_connection(("127.0.0.1", server.server.port), timeout=10) as sock:
            sock.sendall(request)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        return head, body

    get_head, get_body = exchange(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head, body = exchange(b"HEAD / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and body == b"" and get_body
    assert f"Content-Length: {len(get_body)}".encode() in head and b"Content-Length" in get_head
    head, _ = exchange(b"DELETE / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405") and b"Allow: GET, HEAD" in head


def test_max_connections_refuses_the_next_client_until_one_leaves(recognizer):
    running = start_server(recognizer, max_connections=2)
    try:
        first, second = connect(running.url), connect(running.url)
        for ws in (first, second):
            ws.send(json.dumps({"signal": "start"}))
            assert json.loads(ws.recv(timeout=10))["type"] == "server_ready"
        with connect(running.url) as third:
            replies, code = messages_until_closed(third)
        assert code == 1013 and replies[0]["status"] == "failed" and "at most 2 connections" in replies[0]["message"]
        first.close()
        deadline = time.monotonic() + 10
        while running.call(lambda: len(running.server.connections)) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        with connect(running.url) as fourth:
            fourth.send(json.dumps({"signal": "start"}))
            assert json.loads(fourth.recv(timeout=10))["type"] == "server_ready"
        second.close()
    finally:
        running.close()


def test_max_seconds_decodes_up_to_the_limit_then_fails(recognizer, wavs):
    running = start_server(recognizer, max_seconds=3.0)
    try:
        messages, code = stream(running.url, pcm_bytes(wavs["a"]))
    finally:
        running.close()
    assert code == 1008 and messages[-1]["status"] == "failed" and "--max-seconds" in messages[-1]["message"]
    results = messages[:-1]
    assert results[-1]["type"] == "final_result" and max(m["audio_ms"] for m in results) == 3000
    assert len(best_finals(results)) == 2  # the first segment, and the start of the second up to the limit


def test_nbest_with_beam_search_and_las_rescoring_at_endpoints(las_ckpt, wavs):
    recognizer = recognizer_for(las_ckpt, "--rescore", "--beam-size", "4", "--step", "eager")
    running = start_server(recognizer)
    try:
        messages, code = stream(
            running.url, pcm_bytes(wavs["a"]), {"signal": "start", "nbest": 3, "continuous_decoding": True}
        )
    finally:
        running.close()
    assert code == 1000
    partials = [json.loads(m["nbest"]) for m in messages if m["type"] == "partial_result"]
    assert max(len(p) for p in partials) == 3 and all(1 <= len(p) <= 3 for p in partials)
    finals = [json.loads(m["nbest"]) for m in messages if m["type"] == "final_result"]
    assert len(finals) == 2 and all(2 <= len(paths) <= 3 for paths in finals)
    assert all(p["word_pieces"] for paths in finals for p in paths)
    expected = cli_segments(wavs["a"], las_ckpt, "--rescore", "--beam-size", "4")
    assert [paths[0]["sentence"] for paths in finals] == [s["text"] for s in expected]
    assert all(s["rescored"] for s in expected)


def test_http_serves_the_page_and_stats_and_404s_the_rest(server):
    base = server.url.replace("ws://", "http://")
    with urllib.request.urlopen(base, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/html") and b'src="app.js"' in r.read()
    for name in ("app.js", "pcm-worklet.js", "resampler.js"):
        with urllib.request.urlopen(base + name, timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/javascript") and r.read()
    with urllib.request.urlopen(base + "stats", timeout=10) as r:
        assert {"connections", "streams", "steps", "mean_batch"} <= json.loads(r.read()).keys()
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(base + "nothing-here", timeout=10)


def test_command_line_errors_exit_2_with_one_line(tmp_path, capsys, recognizer, audio_ckpt):
    from usmkit.cli.serve import main

    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", str(tmp_path / "missing")])
    assert e.value.code == 2 and "cannot load checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", "x", "--max-connections", "0"])
    assert e.value.code == 2 and "--max-connections" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # the streaming options are usmkit-transcribe's, checks included
        main(["--checkpoint", "x", "--left-chunks", "-1"])
    assert e.value.code == 2 and "--left-chunks: must be >= 0" in capsys.readouterr().err
    for flag, value in (("--idle-timeout", "0"), ("--start-timeout", "inf"), ("--max-buffer-seconds", "nan")):
        with pytest.raises(SystemExit) as e:
            main(["--checkpoint", "x", flag, value])
        err = capsys.readouterr().err
        assert e.value.code == 2 and flag in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as e:  # known only once the model's chunk is
        main(["--checkpoint", str(audio_ckpt), "--max-buffer-seconds", "0.1", "--port", "0"])
    assert e.value.code == 2 and "--max-buffer-seconds 0.1 is too small" in capsys.readouterr().err
    running = start_server(recognizer)
    try:
        with pytest.raises(Exception, match="cannot listen on 127.0.0.1:"):
            start_server(recognizer, port=running.server.port)
    finally:
        running.close()


def test_the_websocket_layers_closes_are_explained_with_failed_first(recognizer):
    """Text that is not UTF-8 (1007) and a message over the size limit (1009) get the documented ``failed``
    message before the close, as the server's own refusals do (a long signal: ``failed`` and 1008)."""
    running = start_server(recognizer, max_buffer_seconds=1.0)  # 32,000-byte messages at most
    try:
        with connect(running.url, open_timeout=10) as ws:
            ws.send(b'{"signal": "start", "x": "\xff\xfe"}', text=True)
            invalid, code = messages_until_closed(ws)
        assert code == 1007 and invalid[-1]["status"] == "failed" and "not UTF-8" in invalid[-1]["message"]
        with connect(running.url, open_timeout=10) as ws:
            with contextlib.suppress(ConnectionClosed):
                ws.send(json.dumps({"signal": "start", "pad": "x" * 40_000}))
            big, code = messages_until_closed(ws)
        assert code == 1009 and big[-1]["status"] == "failed" and "limit of 32000 bytes" in big[-1]["message"]
        with connect(running.url, open_timeout=10) as ws:
            ws.send(json.dumps({"signal": "start", "pad": "x" * 5000}))
            long, code = messages_until_closed(ws)
        assert code == 1008 and long[-1]["status"] == "failed"
    finally:
        running.close()


def test_a_client_refused_as_busy_after_sending_audio_is_closed_at_once(recognizer, wavs):
    """A client whose start and audio arrive with its handshake, before the server refuses it as busy: its
    answer to the close comes behind that audio, which the server reads and drops to see it."""
    from websockets.client import ClientProtocol
    from websockets.frames import Frame, Opcode
    from websockets.uri import parse_uri

    running = start_server(recognizer, max_connections=1)
    try:
        with connect(running.url, open_timeout=10) as first:
            first.send(json.dumps({"signal": "start"}))
            assert json.loads(first.recv(timeout=10))["type"] == "server_ready"
            client = ClientProtocol(parse_uri(running.url))
            client.send_request(client.connect())
            frames = [Frame(Opcode.TEXT, json.dumps({"signal": "start"}).encode())]
            frames += [Frame(Opcode.BINARY, pcm_bytes(wavs["a"])[:3200])] * 20
            with socket.create_connection(("127.0.0.1", running.server.port), timeout=20) as sock:
                sock.sendall(b"".join([*client.data_to_send(), *(f.serialize(mask=True) for f in frames)]))
                began, replies = time.monotonic(), []
                while data := sock.recv(65536):
                    client.receive_data(data)
                    events = client.events_received()
                    replies += [json.loads(e.data) for e in events if isinstance(e, Frame) and e.opcode is Opcode.TEXT]
                    sock.sendall(b"".join(client.data_to_send()))  # our close, answering the server's
                took = time.monotonic() - began
        assert client.close_rcvd is not None and client.close_rcvd.code == 1013
        assert replies[0]["status"] == "failed" and "busy" in replies[0]["message"]
        assert took < 3.0, f"the close took {took:.1f} s"
    finally:
        running.close()
