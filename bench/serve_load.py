"""Load on ``usmkit-serve``: how many real-time streams one server keeps up with.

    PYTHONPATH=. python bench/serve_load.py [--audio /work/shared/data/kathleen/data] [--variants int8,fp32]
    PYTHONPATH=. python bench/serve_load.py --device cuda --variants fp32 --threads 0 --audio synthetic --max-clients 512

For each variant it starts ``python -m usmkit.cli.serve`` in another process on the loopback interface
and, for N = 1, 2, 4, 8, 16, 24, 32, 48, ... clients, streams N real recordings at once at real
time (100 ms messages, as the browser page sends them; start times spread over one chunk), each for
``--seconds`` of audio, then ``{"signal": "end"}``. Per result message the client knows which of its
messages completed the chunk (the server's ``audio_ms``), so the partial-result latency is the time
from sending that message to receiving the result. A stream *falls behind* real time when its
last result comes more than ``--behind-s`` after its end signal (a server that keeps up needs one
chunk's compute for that), or when the client itself could not send on time (then the number says
nothing; it is reported). N passes when the p95 partial latency is below ``--p95-ms`` and no stream
fell behind; each N runs ``--repeats`` times against the same server (3 by default, ``tools.repeats``) and
passes only when every repeat passes; its figures are the median of the repeats, with min and max under
``repeats``. The search stops at the first N that fails.

The model is ``small`` (29M) with random weights unless ``--checkpoint`` names a trained one: the
cost of a chunk does not depend on the weights (with random weights every chunk has a partial
result, which is what is timed). Each variant runs with each ``--threads`` (the server's torch
threads; one leaves the other cores to the event loop and the clients, and a chunk step is small to
share out). Writes ``bench/results/serve_load.json`` (``_cuda`` on a GPU).

``--hostile tiny,fast,idle`` measures instead ``--clients`` real-time streams beside one hostile
client of each kind in turn (another process; each kind with a fresh server, and first a run with no
hostile client to compare):

- ``tiny``: one connection sending 2-byte messages (one sample each) as fast as the server takes them;
- ``fast``: ``--fast-clients`` connections each sending an hour of audio at loopback speed;
- ``idle``: ``--idle-connections`` connections (the server's ``--max-connections``) opened before the
  real-time clients, half never starting, half starting and then sending nothing; the real-time
  clients retry while the server is full, and ``slot_wait_s`` says how long they waited.

The hostile runs' server has ``--max-connections 64 --start-timeout 5 --idle-timeout 5``. Besides the
real-time streams' latencies and whether they kept real time, each kind reports what the hostile
client got through and the server's resident memory (``rss_mb``: after start, peak during the run).
Writes ``bench/results/serve_load_hostile.json``.

    PYTHONPATH=. python bench/serve_load.py --hostile tiny,fast,idle --variants int8 --threads 1 --clients 8 --repeats 2
"""

from __future__ import annotations

import usmkit.cli  # noqa: F401  (first: the OpenMP wait policy of the entry points, before torch loads)

# isort: split
import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import yaml

from tools.repeats import add_repeats_argument, combine
from tools.results import result_path, run_header, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from usmkit.checkpointing.checkpoint import save_checkpoint  # noqa: E402
from usmkit.config import DataConfig, ModelSection, TaskConfig, TrainConfig, TrainerConfig, to_dict  # noqa: E402
from usmkit.data.features import fbank_extractor  # noqa: E402
from usmkit.data.normalize import STATS_FILE, FeatureStats  # noqa: E402
from usmkit.data.tokenizer import Tokenizer, minimum_vocab_size  # noqa: E402
from usmkit.tasks import build_task  # noqa: E402

SR = 16000
BLOCK_MS = 100
SEARCH = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
VARIED = "each repeat streams the same clients' audio, with the same start times, to the same running server"


def synthetic(count: int = 40) -> tuple[list[np.ndarray], list[str]]:
    """Speech-like recordings of 2-4 s (harmonics of a wandering pitch under a syllable-rate envelope),
    for machines without recordings: with random weights the speed does not depend on the audio."""
    rng = np.random.default_rng(0)
    audio = []
    for _ in range(count):
        t = np.arange(int(rng.uniform(2, 4) * SR)) / SR
        f0 = rng.uniform(100, 220) + 30 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * t)
        phase = 2 * np.pi * np.cumsum(f0) / SR
        voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
        envelope = 0.55 + 0.45 * np.sin(2 * np.pi * rng.uniform(3, 5) * t)
        audio.append((0.08 * envelope * voiced + 0.002 * rng.standard_normal(t.size)).astype(np.float32))
    return audio, []


def recordings(audio_dir: Path, limit: int = 400) -> tuple[list[np.ndarray], list[str]]:
    """Up to ``limit`` 16 kHz recordings (and their transcripts, where a .txt sits beside them)."""
    if str(audio_dir) == "synthetic":
        return synthetic()
    if not audio_dir.is_dir():
        raise SystemExit(f"--audio {audio_dir}: no such directory (or pass --audio synthetic)")
    files = sorted(p for p in audio_dir.iterdir() if p.suffix in (".flac", ".wav"))[:limit]
    if not files:
        raise SystemExit(f"no .flac or .wav recordings in {audio_dir}")
    audio, texts = [], []
    for f in files:
        x, rate = sf.read(f, dtype="float32", always_2d=True)
        if rate != SR:
            raise SystemExit(f"{f} is {rate} Hz; this benchmark streams 16 kHz recordings")
        audio.append(x.mean(axis=1))
        if f.with_suffix(".txt").is_file():
            texts.append(f.with_suffix(".txt").read_text().strip().lower())
    return audio, texts


def make_checkpoint(root: Path, audio: list[np.ndarray], texts: list[str], size: str) -> Path:
    """A streaming ``size`` CTC checkpoint with random weights, a tokenizer of the transcripts and feature stats."""
    texts = texts or ["the quick brown fox jumps over the lazy dog"]
    tokenizer = Tokenizer.train(texts, root / "tokenizer", vocab_size=minimum_vocab_size(texts) + 200)
    cfg = TrainConfig(
        task=TaskConfig(kind="ctc"),
        model=ModelSection(preset=size, chunk_size=16, left_chunks=4, causal_conv=True, dropout=0.0),
        data=DataConfig(manifest_dir=str(root / "no-manifests")),
        trainer=TrainerConfig(exp_dir=str(root)),
        tokenizer=str(tokenizer.path),
    )
    torch.manual_seed(0)
    module = build_task(cfg.task, cfg.model.build_config(input_dim=80), tokenizer.vocab_size)
    save_checkpoint(root / "checkpoints", 1, module, {}, yaml.safe_dump(to_dict(cfg)))
    extractor = fbank_extractor(cfg.data.features)
    feats = torch.cat([torch.as_tensor(extractor.extract(x, SR)) for x in audio[:50]])  # (T, 80)
    FeatureStats(mean=feats.mean(0), std=feats.std(0).clamp_min(1e-5)).save(root / STATS_FILE, cfg.data.features)
    return root


def client_audio(audio: list[np.ndarray], seconds: float, seed: int) -> bytes:
    """About ``seconds`` of recordings (a different order per client) with 0.3 s pauses, as 16-bit PCM."""
    order = random.Random(seed).sample(range(len(audio)), len(audio))
    pieces, total = [], 0
    for i in order:
        pieces += [audio[i], np.zeros(int(0.3 * SR), np.float32)]
        total += audio[i].size + int(0.3 * SR)
        if total >= seconds * SR:
            break
    x = np.concatenate(pieces)[: int(seconds * SR)]
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


async def admitted(url: str, patience_s: float = 60.0):
    """A connection with its stream started; while the server is full (close 1013) it tries again every
    0.25 s. Returns (connection, seconds waited for a slot)."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    loop = asyncio.get_running_loop()
    first = loop.time()
    while True:
        ws = await connect(url, max_size=None, compression=None, open_timeout=30)
        with contextlib.suppress(ConnectionClosed):  # a refusal may close the socket before the start is sent
            await ws.send(json.dumps({"signal": "start", "nbest": 1, "continuous_decoding": True}))
        try:
            reply = json.loads(await ws.recv())
        except ConnectionClosed:
            reply = {}
        if reply.get("type") == "server_ready":
            return ws, loop.time() - first
        await ws.close()
        if ws.close_code != 1013 or loop.time() - first > patience_s:
            raise RuntimeError(f"the server refused a real-time client: {reply} (close code {ws.close_code})")
        await asyncio.sleep(0.25)


async def one_client(url: str, pcm: bytes, delay: float, behind_s: float) -> dict:
    """Stream ``pcm`` at real time after ``delay`` s; latencies of its results and whether it fell behind."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(delay)
    block = SR * BLOCK_MS // 1000 * 2  # bytes
    sent_at: dict[int, float] = {}  # audio_ms at the end of a message -> when it was sent
    latencies: list[float] = []
    done = asyncio.Event()
    finished_at = None

    ws, slot_wait = await admitted(url)
    async with ws:

        async def receive() -> None:
            nonlocal finished_at
            async for raw in ws:
                m = json.loads(raw)
                now = loop.time()
                if m.get("status") != "ok":
                    raise RuntimeError(f"the server failed a stream: {m}")
                if m["type"] == "partial_result" and m["audio_ms"] in sent_at:
                    latencies.append(now - sent_at[m["audio_ms"]])
                elif m["type"] == "speech_end":
                    finished_at = now
                    done.set()
                    return

        receiver = asyncio.create_task(receive())
        start = loop.time()
        send_lag = 0.0
        for i in range(0, len(pcm), block):
            target = start + i / block * BLOCK_MS / 1000
            wait = target - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            send_lag = max(send_lag, loop.time() - target)
            await ws.send(pcm[i : i + block])
            sent_at[round(1000 * (i + len(pcm[i : i + block])) / 2 / SR)] = loop.time()
        await ws.send(json.dumps({"signal": "end"}))
        ended_at = loop.time()
        await asyncio.wait_for(receiver, timeout=600)
    finish = finished_at - ended_at
    return {
        "latencies": latencies,
        "finish_s": finish,
        "send_lag_s": send_lag,
        "behind": finish > behind_s,
        "slot_wait_s": slot_wait,
    }


async def run_clients(url: str, pcms: list[bytes], behind_s: float, seed: int) -> list[dict]:
    rng = random.Random(seed)
    chunk_s = 0.64
    return await asyncio.gather(*(one_client(url, pcm, rng.uniform(0, chunk_s), behind_s) for pcm in pcms))


# ---------------------------------------------------------------------- hostile clients (in another process)
HOSTILE = ("tiny", "fast", "idle")
HOSTILE_SERVER_FLAGS = ["--max-connections", "64", "--start-timeout", "5", "--idle-timeout", "5"]


async def _started(url: str, start: bool = True):
    """A hostile connection (started unless ``start`` is false). Its socket's send buffer is small (64 KB), so
    that the client waits for the server instead of spending this machine's CPU on filling megabytes of
    kernel buffer: an attacker runs elsewhere, and its own CPU time is not the server's."""
    import socket
    from urllib.parse import urlsplit

    from websockets.asyncio.client import connect

    address = urlsplit(url)
    sock = socket.create_connection((address.hostname, address.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    ws = await connect(url, sock=sock, max_size=None, compression=None, open_timeout=30, close_timeout=1)
    if start:
        await ws.send(json.dumps({"signal": "start", "nbest": 1, "continuous_decoding": True}))
        reply = json.loads(await ws.recv())
        if reply.get("type") != "server_ready":
            raise RuntimeError(f"a hostile client was refused: {reply}")
    return ws


async def _ignore_replies(ws) -> None:
    """Read and drop what the server sends (the connection keeps answering the server's pings)."""
    with contextlib.suppress(Exception):
        async for _ in ws:
            pass


async def tiny_messages(url: str, ready, stop) -> dict:
    """One stream of 2-byte messages, as many as the server takes."""
    from websockets.exceptions import ConnectionClosed

    ws = await _started(url)
    reader = asyncio.create_task(_ignore_replies(ws))
    sent, closed = 0, None
    try:
        while not stop.is_set():
            for _ in range(100):
                await ws.send(b"\x00\x00")
            sent += 100
            if sent == 1000:
                ready.set()
            await asyncio.sleep(0)
    except ConnectionClosed as e:
        closed = e.rcvd.code if e.rcvd else None
    ready.set()
    reader.cancel()
    await ws.close()
    return {"messages_written": sent, "closed_by_server": closed}


async def fast_senders(url: str, pcm: bytes, count: int, ready, stop) -> dict:
    """``count`` streams each sending up to an hour of audio (``pcm`` over and over) in 100-ms messages, as
    fast as the server takes them."""
    block = SR * BLOCK_MS // 1000 * 2
    pcm = pcm[: len(pcm) // block * block]
    limit = 3600 * SR * 2
    sent = [0] * count

    async def one(k: int) -> None:
        ws = await _started(url)
        reader = asyncio.create_task(_ignore_replies(ws))
        with contextlib.suppress(Exception):
            while not stop.is_set() and sent[k] < limit:
                i = sent[k] % len(pcm)
                await ws.send(pcm[i : i + block])
                sent[k] += block
                if sent[k] % (10 * block) == 0:
                    await asyncio.sleep(0)
        reader.cancel()
        await ws.close()

    async def watch() -> None:
        while min(sent) < 10 * SR * 2 and not stop.is_set():  # each 10 s ahead: in full swing
            await asyncio.sleep(0.05)
        ready.set()

    await asyncio.gather(watch(), *(one(k) for k in range(count)))
    return {"connections": count, "audio_s_written": [round(n / 2 / SR, 1) for n in sent]}


async def idle_connections(url: str, count: int, ready, stop) -> dict:
    """``count`` connections held open: the even ones never start, the odd ones start and then send nothing.
    How long each stayed open, and how the server closed it."""
    loop = asyncio.get_running_loop()
    conns = await asyncio.gather(*(_started(url, start=k % 2 == 1) for k in range(count)), return_exceptions=True)
    opened = loop.time()
    ready.set()
    held = [ws for ws in conns if not isinstance(ws, BaseException)]

    async def closed(ws) -> tuple[float, int | None]:
        with contextlib.suppress(Exception):
            async for _ in ws:
                pass
        return loop.time() - opened, ws.close_code

    waits = [asyncio.create_task(closed(ws)) for ws in held]
    while not stop.is_set() and not all(w.done() for w in waits):
        await asyncio.sleep(0.1)
    ends = [w.result() if w.done() else (None, None) for w in waits]
    for ws in held:
        await ws.close()
    by_server = [t for t, _ in ends if t is not None]
    return {
        "connections_opened": len(held),
        "refused": count - len(held),
        "closed_by_server": len(by_server),
        "close_codes": sorted({code for _, code in ends if code is not None}),
        "held_open_s_max": round(max(by_server), 2) if by_server else None,
    }


def hostile_process(kind: str, url: str, pcm: bytes, args: dict, ready, stop, out) -> None:
    """The hostile client(s) of ``kind``, until ``stop``; what they did goes to ``out``. At the lowest CPU
    priority, for the reason ``_started`` gives."""
    os.nice(19)
    if kind == "tiny":
        work = tiny_messages(url, ready, stop)
    elif kind == "fast":
        work = fast_senders(url, pcm, args["fast_clients"], ready, stop)
    else:
        work = idle_connections(url, args["idle_connections"], ready, stop)
    out.put(asyncio.run(work))


def rss_mb(pid: int) -> dict:
    """Resident memory of a process now and at its peak (MB), from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {"now": int(fields["VmRSS"].split()[0]) // 1024, "peak": int(fields["VmHWM"].split()[0]) // 1024}


def measure_hostile(url: str, pid: int, audio, kind: str, args) -> dict:
    """``args.clients`` real-time streams beside the hostile client(s) of ``kind`` ("none": alone)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    proc, hostile = None, {}
    rss_start = rss_mb(pid)["now"]
    if kind != "none":
        settings = {"fast_clients": args.fast_clients, "idle_connections": args.idle_connections}
        pcm = client_audio(audio, 60.0, seed=7)
        proc = ctx.Process(target=hostile_process, args=(kind, url, pcm, settings, ready, stop, out), daemon=True)
        proc.start()
        if not ready.wait(timeout=180):
            proc.kill()
            raise SystemExit(f"the {kind} hostile client did not get going")
    rss_peak = rss_start
    sampling = True

    def sample() -> None:
        nonlocal rss_peak
        while sampling:
            rss_peak = max(rss_peak, rss_mb(pid)["now"])
            time.sleep(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        row = measure(url, audio, args.clients, args)
    finally:
        sampling = False
        stop.set()
        if proc is not None:
            hostile = out.get(timeout=120)
            proc.join(timeout=30)
        sampler.join(timeout=5)
    row["rss_mb"] = {"start": rss_start, "peak_during_run": rss_peak}
    # What the server read from the hostile client(s): all it read less the real-time streams' share. What
    # they wrote ("_written") includes what still waited in the kernel's socket buffers when they stopped.
    real_time_messages = args.clients * (-(-round(args.seconds * SR) // (SR * BLOCK_MS // 1000)) + 2)
    read = row.pop("server_read")
    hostile["read_by_server"] = {
        "messages": read["messages"] - real_time_messages,
        "audio_s": round(read["audio_s"] - args.clients * args.seconds, 1),
    }
    return {"hostile": kind, **row, "hostile_client": hostile}


def stats_of(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url.replace("ws://", "http://") + "stats", timeout=30) as r:
        return json.loads(r.read())


def start_server(
    checkpoint: Path, flags: list[str], log: Path, switch_interval: float | None = None
) -> tuple[subprocess.Popen, str]:
    repo = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "usmkit.cli.serve"]
    if switch_interval is not None:
        program = (
            f"import sys; sys.setswitchinterval({switch_interval}); from usmkit.cli.serve import main; sys.exit(main())"
        )
        cmd = [sys.executable, "-c", program]
    cmd += ["--checkpoint", str(checkpoint), "--host", "127.0.0.1"]
    cmd += ["--port", "0", "--max-connections", "1024", "--max-batch", "512", *flags]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])},
    )
    line = proc.stdout.readline()
    if "listening on ws://" not in line:
        proc.kill()
        raise SystemExit(f"usmkit-serve did not start ({' '.join(cmd)}):\n{log.read_text()[-3000:]}")
    return proc, line.split()[3] + "/"  # ws://127.0.0.1:PORT/


def measure(url: str, audio, n: int, args) -> dict:
    pcms = [client_audio(audio, args.seconds, seed=1000 * n + i) for i in range(n)]
    before = stats_of(url)
    start = time.perf_counter()
    clients = asyncio.run(run_clients(url, pcms, args.behind_s, seed=n))
    wall = time.perf_counter() - start
    after = stats_of(url)
    lat = np.array([x for c in clients for x in c["latencies"]]) * 1000
    steps = after["steps"] - before["steps"]
    row = {
        "clients": n,
        "partial_latency_ms": {
            "p50": round(float(np.percentile(lat, 50)), 1),
            "p95": round(float(np.percentile(lat, 95)), 1),
            "max": round(float(lat.max()), 1),
        },
        "results_timed": int(lat.size),
        "streams_behind": sum(c["behind"] for c in clients),
        "finish_s_max": round(max(c["finish_s"] for c in clients), 3),
        "client_send_lag_ms_max": round(1000 * max(c["send_lag_s"] for c in clients), 1),
        "slot_wait_s_max": round(max(c["slot_wait_s"] for c in clients), 2),
        "mean_batch": round((after["chunks"] - before["chunks"]) / steps, 2) if steps else 0.0,
        "server_busy_fraction": round((after["busy_s"] - before["busy_s"]) / wall, 3),
        "server_read": {  # all clients' (real-time ones: their audio, and 100-ms messages with start and end)
            "messages": after.get("messages_in", 0) - before.get("messages_in", 0),
            "audio_s": round(after.get("audio_in_s", 0) - before.get("audio_in_s", 0), 1),
        },
        "wall_s": round(wall, 1),
    }
    row["real_time"] = row["partial_latency_ms"]["p95"] < args.p95_ms and row["streams_behind"] == 0
    return row


def run_hostile(checkpoint: Path, audio, kinds: list[str], args, results: dict, tmp: Path) -> None:
    """``--hostile``: each kind (and first none) with a fresh server of the first variant and thread count,
    ``--repeats`` times in turn (a shared machine's load then weighs on every kind alike); ``summary``: per
    kind, the median p95 latency over the repeats and how many of them kept real time."""
    variant, threads = args.variants.split(",")[0], int(args.threads.split(",")[0])
    flags = ["--device", args.device] + (["--quantize", "int8"] if variant == "int8" else [])
    flags += (["--threads", str(threads)] if threads else []) + HOSTILE_SERVER_FLAGS
    del results["variants"]
    results.update(
        real_time_clients=args.clients,
        server_flags=flags,
        hostile_clients={
            "tiny": "one connection sending 2-byte messages as fast as the server takes them",
            "fast": f"{args.fast_clients} connections each sending an hour of audio at loopback speed",
            "idle": f"{args.idle_connections} connections opened first (the server's --max-connections): "
            "half never start, half start and send nothing",
        },
        runs=[],
    )
    out = result_path("serve_load", "hostile")
    print(f"{'hostile':8s} {'N':>4s} {'p50 ms':>8s} {'p95 ms':>8s} {'max ms':>8s} {'behind':>6s} {'slot s':>6s} "
          f"{'batch':>6s} {'busy':>5s} {'rss MB':>11s}  real time")  # fmt: skip
    for repeat, kind in ((r, k) for r in range(args.repeats) for k in ["none", *kinds]):
        proc, url = start_server(checkpoint, flags, tmp / f"server_{kind}.log")
        load = os.getloadavg()[0]
        try:
            row = measure_hostile(url, proc.pid, audio, kind, args)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        row = {"repeat": repeat, **row, "load_average_1min": [round(load, 2), round(os.getloadavg()[0], 2)]}
        results["runs"].append(row)
        rows = [r for r in results["runs"] if r["hostile"] == kind]
        results.setdefault("summary", {})[kind] = {
            "p95_partial_latency_ms_median": round(float(np.median([r["partial_latency_ms"]["p95"] for r in rows])), 1),
            "kept_real_time": f"{sum(r['real_time'] for r in rows)} of {len(rows)}",
            "streams_behind": sum(r["streams_behind"] for r in rows),
        }
        lat, rss = row["partial_latency_ms"], row["rss_mb"]
        print(f"{kind:8s} {row['clients']:4d} {lat['p50']:8.1f} {lat['p95']:8.1f} {lat['max']:8.1f} "
              f"{row['streams_behind']:6d} {row['slot_wait_s_max']:6.1f} {row['mean_batch']:6.2f} "
              f"{row['server_busy_fraction']:5.2f} {rss['start']:5d}>{rss['peak_during_run']:5d}  "
              f"{'yes' if row['real_time'] else 'no'}  {json.dumps(row['hostile_client'])}", flush=True)  # fmt: skip
        write_result(out, results)
    print(f"wrote {out}")


STEP_FLAGS = {  # a variant's server flags besides --device / --quantize
    "eager": ["--step", "eager"],
    "graphs": ["--step", "graphs"],
    "graphs_bf16": ["--step", "graphs", "--bf16"],
    "graphs_si1": ["--step", "graphs"],
}
# Variants whose server runs in a Python with another thread switch interval (s; Python's default is 0.005):
# how long the event loop's thread and the model's worker thread wait for each other's turn with the GIL.
SWITCH_INTERVAL = {"graphs_si1": 0.001}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--audio",
        type=Path,
        default=Path("/work/shared/data/kathleen/data"),
        help="a directory of 16 kHz .flac/.wav recordings, or 'synthetic' (speech-like signals)",
    )
    ap.add_argument("--checkpoint", type=Path, help="a trained streaming checkpoint (default: small, random weights)")
    ap.add_argument("--size", default="small")
    ap.add_argument(
        "--variants",
        default="int8,fp32",
        help="int8 (CPU only), fp32 (the default step: traced on a CPU, CUDA graphs on a GPU), eager (fp32, --step "
        "eager), graphs (CUDA graphs, --step graphs), graphs_bf16 (--step graphs --bf16), graphs_si1 (--step graphs in "
        "a Python whose thread switch interval is 1 ms instead of 5)",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--threads", default="1,0", help="the server's --threads, one run each (0: torch's choice, all cores)"
    )
    ap.add_argument("--seconds", type=float, default=20.0, help="audio per client")
    ap.add_argument("--p95-ms", type=float, default=300.0)
    ap.add_argument("--behind-s", type=float, default=1.0)
    ap.add_argument("--max-clients", type=int, default=64)
    ap.add_argument("--min-clients", type=int, default=1, help="start the search at this many clients")
    ap.add_argument("--max-batch", type=int, default=0, help="the server's --max-batch (0: its default)")
    ap.add_argument("--note", default="", help="e.g. that the machine was shared")
    ap.add_argument(
        "--hostile", default="", help=f"measure beside hostile clients instead: some of {','.join(HOSTILE)}"
    )
    ap.add_argument("--clients", type=int, default=8, help="--hostile: real-time streams beside the hostile client")
    ap.add_argument("--fast-clients", type=int, default=8, help="--hostile fast: streams sending ahead of real time")
    ap.add_argument("--idle-connections", type=int, default=64, help="--hostile idle: connections held open")
    add_repeats_argument(ap)
    args = ap.parse_args()
    kinds = [k for k in args.hostile.split(",") if k]
    if any(k not in HOSTILE for k in kinds):
        raise SystemExit(f"--hostile takes some of {','.join(HOSTILE)}, got {args.hostile}")
    audio, texts = recordings(args.audio)
    results = run_header(
        model=str(args.checkpoint)
        if args.checkpoint
        else f"{args.size}, random weights (speed does not depend on them)",
        chunk_ms=640,
        left_chunks=4,
        audio=str(args.audio),
        seconds_per_client=args.seconds,
        criterion=f"p95 partial latency < {args.p95_ms:g} ms and no stream behind real time "
        f"(last result more than {args.behind_s:g} s after the end signal)",
        note=args.note,
        repeats=args.repeats,
        variants={},
    )
    out = result_path("serve_load", None if args.device == "cpu" else args.device.split(":")[0])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        checkpoint = args.checkpoint or make_checkpoint(tmp / "ckpt", audio, texts, args.size)
        if kinds:
            run_hostile(checkpoint, audio, kinds, args, results, tmp)
            return
        print(f"{'variant':20s} {'N':>4s} {'p50 ms':>8s} {'p95 ms':>8s} {'max ms':>8s} {'behind':>6s} "
              f"{'batch':>6s} {'busy':>5s} {'send lag':>8s}  real time")  # fmt: skip
        settings = [(v, int(t)) for v in args.variants.split(",") for t in args.threads.split(",")]
        for variant, threads in settings:
            if variant == "int8" and args.device != "cpu":
                print(f"skipping int8 on {args.device}: int8 weights run on the CPU only")
                continue
            flags = ["--device", args.device] + (["--quantize", "int8"] if variant == "int8" else [])
            flags += STEP_FLAGS.get(variant, [])
            flags += ["--threads", str(threads)] if threads else []
            flags += ["--max-batch", str(args.max_batch)] if args.max_batch else []
            name = f"{variant}_threads{threads or 'default'}" if args.device == "cpu" else variant
            proc, url = start_server(checkpoint, flags, tmp / f"server_{name}.log", SWITCH_INTERVAL.get(variant))
            rows = []
            try:
                for n in (n for n in SEARCH if args.min_clients <= n <= args.max_clients):
                    row = combine([measure(url, audio, n, args) for _ in range(args.repeats)], VARIED)
                    rows.append(row)
                    lat = row["partial_latency_ms"]
                    print(f"{name:20s} {n:4d} {lat['p50']:8.1f} {lat['p95']:8.1f} {lat['max']:8.1f} "
                          f"{row['streams_behind']:6d} {row['mean_batch']:6.2f} {row['server_busy_fraction']:5.2f} "
                          f"{row['client_send_lag_ms_max']:8.1f}  {'yes' if row['real_time'] else 'no'}", flush=True)  # fmt: skip
                    if not row["real_time"]:
                        break
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            passing = [r["clients"] for r in rows if r["real_time"]]
            results["variants"][name] = {
                "server_flags": flags,
                "switch_interval_s": SWITCH_INTERVAL.get(variant, sys.getswitchinterval()),
                "max_real_time_streams": max(passing) if passing else 0,
                "runs": rows,
            }
            write_result(out, results)  # after each variant: a long run keeps what it measured
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
