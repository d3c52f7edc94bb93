"""``usmkit-serve`` stopped by SIGTERM (as a service manager stops it): the streams it has audio of get
their results before it exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from serve_helpers import best_finals, messages_until_closed, pcm_bytes, stream
from websockets.sync.client import connect

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def serve_process(audio_ckpt):
    cmd = [sys.executable, "-m", "usmkit.cli.serve", "--checkpoint", str(audio_ckpt), "--port", "0", "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if "listening on ws://" not in line:
        proc.kill()
        pytest.fail(f"usmkit-serve did not start: {proc.stderr.read()[-3000:]}")
    yield proc, line.split()[3] + "/"
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


def test_sigterm_finishes_the_streams_it_has_audio_of_then_exits(serve_process, wavs):
    proc, url = serve_process
    pcm = pcm_bytes(wavs["a"])  # 3.6 s
    reference, _ = stream(url, pcm)
    with connect(url) as ws:
        ws.send(json.dumps({"signal": "start", "continuous_decoding": True}))
        assert json.loads(ws.recv(timeout=10))["type"] == "server_ready"
        for i in range(0, len(pcm), 3200):
            ws.send(pcm[i : i + 3200])
        before = []  # until the result of the last chunk: the server has all of the audio
        while not before or before[-1].get("audio_ms") != 3600:
            before.append(json.loads(ws.recv(timeout=20)))
        proc.send_signal(signal.SIGTERM)  # no end signal: the client would have sent more
        after, code = messages_until_closed(ws)
    assert proc.wait(timeout=30) == 0
    messages = before + after
    assert code == 1001 and messages[-1]["status"] == "failed" and "stopping" in messages[-1]["message"]
    assert messages[-2]["type"] == "final_result" and messages[-2]["audio_ms"] == 3600
    assert best_finals(messages) == best_finals(reference)  # the last segment too, closed at the stop
    with pytest.raises(OSError):  # and it no longer listens
        connect(url, open_timeout=5)
