"""The browser page in headless Chromium with a fake microphone playing a test recording: its final
text equals ``usmkit-transcribe``'s transcript of the same file. Chromium is driven through the
DevTools protocol (CDP) over its WebSocket, with the ``websockets`` client the server uses anyway.

The recording goes through Chromium's capture (resampled to the audio context's rate) and the
page's own resampler back to 16 kHz, and the page starts a few ms into it, so the samples differ
slightly from the file's: the model is ``word_ckpt`` (one word wherever there is sound), whose
text depends on where the speech is, not on the exact samples. Skipped where chromium is absent
(CI installs it: ``.ci/run``). ``USMKIT_PAGE_SCREENSHOT=path.png`` keeps a screenshot of the page.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from serve_helpers import SR, speech_silence_speech
from websockets.sync.client import connect

from usmkit.cli.transcribe import main as transcribe

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NODE = shutil.which("node")


class Chromium:
    """A headless Chromium with a fake microphone, and one page of it, driven through CDP."""

    def __init__(self, profile: Path, microphone_wav: Path) -> None:
        self.log = profile.parent / "chromium.log"
        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--use-fake-device-for-media-stream",
                "--use-fake-ui-for-media-stream",
                f"--use-file-for-fake-audio-capture={microphone_wav}%noloop",
                "--remote-debugging-port=0",
                "--window-size=1000,760",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
        )
        port_file = profile / "DevToolsActivePort"  # Chromium writes its port and browser path here
        deadline = time.monotonic() + 30
        while not (port_file.is_file() and len(port_file.read_text().split()) == 2):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"chromium did not start; its log:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        port, path = port_file.read_text().split()
        self.ws = connect(f"ws://127.0.0.1:{port}{path}", max_size=None, open_timeout=10)
        self._id = 0
        self.session = None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable")

    def call(self, method: str, **params) -> dict:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if self.session is not None:
            message["sessionId"] = self.session
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv(timeout=30))
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                state = self.evaluate("JSON.stringify(window.usmkit ?? null)")
                raise TimeoutError(f"waited {timeout} s for {expression}; page state: {state}")
            time.sleep(0.1)

    def click(self, selector: str) -> None:
        """A real mouse click (a user gesture, as the audio context wants), not element.click()."""
        x, y = self.evaluate(
            f"(() => {{ const r = document.querySelector('{selector}').getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        try:
            self.session = None
            self.call("Browser.close")
        except Exception:  # noqa: BLE001 - it is going away anyway
            pass
        self.ws.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_server_process(checkpoint: Path, log: Path) -> tuple[subprocess.Popen, int]:
    """``python -m usmkit.cli.serve`` on a free port (the entry point as users run it); returns it and its port."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "usmkit.cli.serve", "--checkpoint", str(checkpoint), "--port", "0", "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    line = proc.stdout.readline()  # "usmkit-serve: listening on ws://127.0.0.1:PORT (page: ...)"
    if "listening on ws://" not in line:
        proc.kill()
        raise RuntimeError(f"usmkit-serve did not start: {line!r}; its log:\n{log.read_text()[-3000:]}")
    return proc, int(line.split("ws://127.0.0.1:")[1].split()[0])


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_page_transcribes_the_microphone_like_the_command_line(word_ckpt, tmp_path):
    wav = tmp_path / "microphone.wav"  # 0.5 s silence, speech, 1.2 s silence, speech, 1 s silence
    audio = np.concatenate([np.zeros(SR // 2, np.float32), speech_silence_speech(), np.zeros(SR, np.float32)])
    sf.write(wav, audio, SR, subtype="PCM_16")
    cli_json = tmp_path / "cli.json"
    assert transcribe([str(wav), "--checkpoint", str(word_ckpt), "--json", str(cli_json), "--no-partials"]) == 0
    cli = json.loads(cli_json.read_text())["segments"]
    assert len(cli) == 2

    server, port = start_server_process(word_ckpt, tmp_path / "server.log")
    browser = None
    try:
        browser = Chromium(tmp_path / "profile", wav)
        browser.call("Page.navigate", url=f"http://127.0.0.1:{port}/")
        browser.wait_for("document.readyState === 'complete' && window.usmkit !== undefined", 30)
        assert browser.evaluate("document.querySelector('#url').value") == f"ws://127.0.0.1:{port}/"
        browser.click("#start")
        browser.wait_for("window.usmkit.phase === 'streaming'", 30)
        time.sleep(audio.size / SR + 0.5)  # the fake microphone plays the file once, then silence
        browser.click("#stop")
        browser.wait_for("['done', 'error'].includes(window.usmkit.phase)", 30)
        state = browser.evaluate("JSON.parse(JSON.stringify(window.usmkit))")
        shown = browser.evaluate("[...document.querySelectorAll('#finals li')].map(li => li.textContent)")
        screenshot = tmp_path / "page.png"
        browser.screenshot(screenshot)
        if os.environ.get("USMKIT_PAGE_SCREENSHOT"):
            shutil.copy(screenshot, os.environ["USMKIT_PAGE_SCREENSHOT"])
    finally:
        if browser is not None:
            browser.close()
        server.terminate()
        server.wait(timeout=30)
    log = (tmp_path / "server.log").read_text()
    assert state["phase"] == "done" and state["error"] is None, log[-2000:]
    assert state["partials"] > 0 and state["inputRate"] > 0
    assert state["samplesSent"] / SR > audio.size / SR - 0.2  # the whole recording went out at 16 kHz
    assert [f["sentence"] for f in state["finals"]] == [s["text"] for s in cli]
    # The page starts a little into the recording (how far depends on how soon streaming began after the fake
    # microphone opened, later on a loaded machine), so its times are the file's shifted by that delay. The
    # fake microphone plays in real time: on a loaded machine its capture can stall between the sentences,
    # which moves a later sentence's shift. Within a sentence every word shares one shift, and each word
    # lasts as long as the command line says.
    for final, segment, text in zip(state["finals"], cli, shown, strict=True):
        words = final["word_pieces"]
        assert [w["word"] for w in words] == [w["word"] for w in segment["words"]]
        times = [t for w in words for t in (w["start"], w["end"])]
        assert times == sorted(times)
        pairs = list(zip(words, segment["words"], strict=True))
        shifts = [1000 * w["start"] - p["start"] for p, w in pairs]  # file time - page time of each start (ms)
        assert all(0 <= s < 2000 for s in shifts) and max(shifts) - min(shifts) <= 80, shifts
        durations = [(1000 * (w["end"] - w["start"]), p["end"] - p["start"]) for p, w in pairs]  # (file, page) ms
        assert all(abs(f - p) <= 80 for f, p in durations), durations
        assert segment["text"] in text
    assert "connect 127.0.0.1" in log and "disconnect 127.0.0.1" in log and "done" in log
    assert screenshot.stat().st_size > 10_000


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_page_resampler_is_block_size_independent_and_band_limits(tmp_path):
    """The page's resampler (run in Node): 48 kHz -> 16 kHz, the same output for any block size, the
    band below 8 kHz kept and a 12 kHz tone removed; equal rates pass through."""
    module = tmp_path / "resampler.mjs"
    shutil.copy(REPO / "usmkit" / "serve" / "page" / "resampler.js", module)
    script = f"""
    import {{ StreamResampler }} from {json.dumps(str(module))};
    const rate = 48000, x = new Float32Array(rate);
    for (let i = 0; i < x.length; i++)
      x[i] = 0.5 * Math.sin(2 * Math.PI * 440 * i / rate) + 0.3 * Math.sin(2 * Math.PI * 3000 * i / rate)
           + 0.3 * Math.sin(2 * Math.PI * 12000 * i / rate);
    const run = (block, from = rate, to = 16000) => {{
      const r = new StreamResampler(from, to), out = [];
      for (let i = 0; i < x.length; i += block) out.push(...r.process(x.subarray(i, i + block)));
      out.push(...r.flush());
      return out;
    }};
    console.log(JSON.stringify({{ b128: run(128), b1000: run(1000), whole: run(x.length), same: run(128, rate, rate).length }}));
    """
    out = subprocess.run([NODE, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert len(r["b128"]) == 16000 and r["b128"] == r["b1000"] == r["whole"] and r["same"] == 48000
    t = np.arange(16000) / 16000
    band = 0.5 * np.sin(2 * np.pi * 440 * t) + 0.3 * np.sin(2 * np.pi * 3000 * t)  # what should remain
    assert np.abs(np.array(r["b128"]) - band)[100:-100].max() < 1e-3
