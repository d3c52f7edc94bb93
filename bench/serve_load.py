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
fell behind; the search stops at the first N that fails.

The model is ``small`` (29M) with random weights unless ``--checkpoint`` names a trained one: the
cost of a chunk does not depend on the weights (with random weights every chunk has a partial
result, which is what is timed). Each variant runs with each ``--threads`` (the server's torch
threads; one leaves the other cores to the event loop and the clients, and a chunk step is small to
share out). Writes ``bench/results/serve_load.json`` (``_cuda`` on a GPU).
"""

from __future__ import annotations

import usmkit.cli  # noqa: F401  (first: the OpenMP wait policy of the entry points, before torch loads)

# isort: split
import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import yaml
from common import result_path, run_header, write_result

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


async def one_client(url: str, pcm: bytes, delay: float, behind_s: float) -> dict:
    """Stream ``pcm`` at real time after ``delay`` s; latencies of its results and whether it fell behind."""
    from websockets.asyncio.client import connect

    loop = asyncio.get_running_loop()
    await asyncio.sleep(delay)
    block = SR * BLOCK_MS // 1000 * 2  # bytes
    sent_at: dict[int, float] = {}  # audio_ms at the end of a message -> when it was sent
    latencies: list[float] = []
    done = asyncio.Event()
    finished_at = None

    async with connect(url, max_size=None, compression=None, open_timeout=30) as ws:
        await ws.send(json.dumps({"signal": "start", "nbest": 1, "continuous_decoding": True}))
        assert json.loads(await ws.recv())["type"] == "server_ready"

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
    }


async def run_clients(url: str, pcms: list[bytes], behind_s: float, seed: int) -> list[dict]:
    rng = random.Random(seed)
    chunk_s = 0.64
    return await asyncio.gather(*(one_client(url, pcm, rng.uniform(0, chunk_s), behind_s) for pcm in pcms))


def stats_of(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url.replace("ws://", "http://") + "stats", timeout=30) as r:
        return json.loads(r.read())


def start_server(checkpoint: Path, flags: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    repo = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "usmkit.cli.serve", "--checkpoint", str(checkpoint), "--host", "127.0.0.1"]
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
        "mean_batch": round((after["chunks"] - before["chunks"]) / steps, 2) if steps else 0.0,
        "server_busy_fraction": round((after["busy_s"] - before["busy_s"]) / wall, 3),
        "wall_s": round(wall, 1),
    }
    row["real_time"] = row["partial_latency_ms"]["p95"] < args.p95_ms and row["streams_behind"] == 0
    return row


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
    ap.add_argument("--variants", default="int8,fp32", help="int8 (CPU only), fp32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--threads", default="1,0", help="the server's --threads, one run each (0: torch's choice, all cores)"
    )
    ap.add_argument("--seconds", type=float, default=20.0, help="audio per client")
    ap.add_argument("--p95-ms", type=float, default=300.0)
    ap.add_argument("--behind-s", type=float, default=1.0)
    ap.add_argument("--max-clients", type=int, default=64)
    ap.add_argument("--note", default="", help="e.g. that the machine was shared")
    args = ap.parse_args()
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
        variants={},
    )
    out = result_path("serve_load", None if args.device == "cpu" else args.device.split(":")[0])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        checkpoint = args.checkpoint or make_checkpoint(tmp / "ckpt", audio, texts, args.size)
        print(f"{'variant':20s} {'N':>4s} {'p50 ms':>8s} {'p95 ms':>8s} {'max ms':>8s} {'behind':>6s} "
              f"{'batch':>6s} {'busy':>5s} {'send lag':>8s}  real time")  # fmt: skip
        settings = [(v, int(t)) for v in args.variants.split(",") for t in args.threads.split(",")]
        for variant, threads in settings:
            if variant == "int8" and args.device != "cpu":
                print(f"skipping int8 on {args.device}: int8 weights run on the CPU only")
                continue
            flags = ["--device", args.device] + (["--quantize", "int8"] if variant == "int8" else [])
            flags += ["--threads", str(threads)] if threads else []
            name = f"{variant}_threads{threads or 'default'}" if args.device == "cpu" else variant
            proc, url = start_server(checkpoint, flags, tmp / f"server_{name}.log")
            rows = []
            try:
                for n in (n for n in SEARCH if n <= args.max_clients):
                    row = measure(url, audio, n, args)
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
                "max_real_time_streams": max(passing) if passing else 0,
                "runs": rows,
            }
            write_result(out, results)  # after each variant: a long run keeps what it measured
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
