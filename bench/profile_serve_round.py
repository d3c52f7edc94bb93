"""The server's worker round, phase by phase: where its time goes per stream, without the network.

    PYTHONPATH=. python bench/profile_serve_round.py --device cuda --step graphs --streams 16,64,256
    PYTHONPATH=. python bench/profile_serve_round.py --device cpu --step eager --streams 2,8    # plumbing

Builds ``serve_load.py``'s checkpoint (``small`` by default, random weights, 640-ms chunks, 4 left chunks)
and the recognizer ``usmkit-serve`` builds from it, then N streams that each receive one chunk of audio
(16-bit PCM, as a real-time client sends it) before every round. The batcher's worker round
(``Batcher._round``) runs in process on all N streams at once, as in a server whose worker is saturated
(no stream counts as live: they all run ahead of the clock here, and every ready chunk runs).
Each phase is timed by wrapping the methods the round calls: windows (``ServerStream.windows``: PCM
decoding, levels, each stream's feature windows), features (``Recognizer.featurize``: the frames of
every stream's windows in one computation and one copy to the device), queue (``take_frames``), chunk
(``next_chunk``), step (``Recognizer.run``: stacking the states, the encoder step, splitting them), head
(``Recognizer.log_probs``: the CTC head and the copy to the host), decode (``ServerStream.encoded``),
wrap-up; ``rest`` is the round's time outside them. The step and the head end in a host sync, so their time
includes the GPU's.

Printed and written (``bench/results/profile_serve_round[_DEVICE].json``): per N, ms per round and per
stream in each phase, the streams one worker could keep at real time (chunk duration over the round's
time per stream: the ceiling that the network side, the event loop in the same process, lowers), and
cProfile's functions with the most own time per round (printed for the smallest and largest N).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from serve_load import SR, make_checkpoint, recordings

from tools.phase_timer import PhaseTimer
from tools.results import result_path, run_header, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from usmkit.cli.serve import build_parser, build_recognizer  # noqa: E402
from usmkit.serve.batcher import Batcher  # noqa: E402
from usmkit.serve.session import Recognizer, ServerStream  # noqa: E402

PHASES = {
    "windows": (ServerStream, "windows"),
    "features": (Recognizer, "featurize"),
    "queue": (ServerStream, "take_frames"),
    "chunk": (ServerStream, "next_chunk"),
    "step": (Recognizer, "run"),
    "head": (Recognizer, "log_probs"),
    "decode": (ServerStream, "encoded"),
    "wrap_up": (ServerStream, "wrap_up"),
}


def pcm_blocks(audio: list[np.ndarray], n: int, block: int, rounds: int) -> list[list[bytes]]:
    """Per stream, ``rounds`` consecutive blocks of ``block`` samples of its own audio (16-bit PCM)."""
    joined = np.concatenate(audio)
    out = []
    for i in range(n):
        start = (i * 7919 * block) % joined.size
        x = np.roll(joined, -start)[: rounds * block]
        x = np.resize(x, rounds * block)
        pcm = (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()
        out.append([pcm[2 * k * block : 2 * (k + 1) * block] for k in range(rounds)])
    return out


def profile(recognizer: Recognizer, audio, n: int, rounds: int, warm: int, max_batch: int, top: int = 0) -> dict:
    """Rounds of ``n`` streams, each given one chunk of audio before every round; the phases of the last
    ``rounds - warm`` rounds (and with ``top``, cProfile's ``top`` functions by own time over them)."""
    batcher = Batcher(recognizer, max_batch=max_batch)
    chunk_samples = recognizer.round_samples // 2  # one chunk of audio (round_samples covers two)
    streams = [recognizer.new_stream(continuous=True) for _ in range(n)]
    blocks = pcm_blocks(audio, n, chunk_samples, rounds)
    timer_total = 0.0
    profiler = cProfile.Profile()
    with PhaseTimer(PHASES) as timer:
        for r in range(rounds):
            if r == warm:
                timer.seconds.clear()
                timer_total = 0.0
                if top:
                    profiler.enable()
            for stream, pieces in zip(streams, blocks, strict=True):
                stream.push(pieces[r])
            work = [(s, s.collect()) for s in streams]
            start = time.perf_counter()
            # Not real_time_attached: the streams here run ahead of the clock, and every ready chunk is to run.
            results, _ = batcher._round(work, real_time_attached=False)
            timer_total += time.perf_counter() - start
            failed = [e for _, events in results for e in events if type(e).__name__ == "Error"]
            if failed:
                raise SystemExit(f"a stream failed: {failed[0]}")
    profiler.disable()
    measured = rounds - warm
    phases = dict(timer.seconds)
    phases["rest"] = timer_total - sum(phases.values())
    round_ms = 1000 * timer_total / measured
    chunk_s = chunk_samples / SR
    batcher.close()
    functions = []
    if top:
        stats = pstats.Stats(profiler).sort_stats("tottime")
        for (file, line, name), (_, calls, own, cumulative, _) in list(stats.stats.items()):
            functions.append({"function": f"{Path(file).name}:{line}({name})", "calls_per_round": calls / measured,
                              "own_ms_per_round": 1000 * own / measured, "cum_ms_per_round": 1000 * cumulative / measured})  # fmt: skip
        functions = sorted(functions, key=lambda f: -f["own_ms_per_round"])[:top]
    return {
        "streams": n,
        "rounds": measured,
        "round_ms": round(round_ms, 2),
        "per_stream_ms": {k: round(1000 * phases.get(k, 0.0) / measured / n, 3) for k in [*PHASES, "rest"]},
        "per_round_ms": {k: round(1000 * phases.get(k, 0.0) / measured, 2) for k in [*PHASES, "rest"]},
        "streams_one_worker_keeps": int(chunk_s * 1000 / (round_ms / n)),
        "top_functions": functions,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--step", default="graphs", help="the server's --step (graphs: CUDA only)")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="the server's --threads (0: its default)")
    ap.add_argument("--size", default="small")
    ap.add_argument("--streams", default="16,64,256", help="streams per round, a comma list")
    ap.add_argument("--rounds", type=int, default=12, help="rounds per N (the first --warm not timed)")
    ap.add_argument("--warm", type=int, default=4)
    ap.add_argument("--audio", type=Path, default=Path("synthetic"))
    ap.add_argument("--top", type=int, default=15, help="cProfile's functions by own time, printed for the largest N")
    args = ap.parse_args()
    counts = [int(n) for n in args.streams.split(",")]
    audio, texts = recordings(args.audio)
    results = run_header(step=args.step, bf16=args.bf16, size=args.size, chunk_ms=640, runs=[])
    out = result_path("profile_serve_round", None if args.device == "cpu" else args.device.split(":")[0])
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_checkpoint(Path(tmp) / "ckpt", audio, texts, args.size)
        flags = ["--checkpoint", str(ckpt), "--device", args.device, "--step", args.step,
                 "--max-batch", str(max(counts))] + (["--bf16"] if args.bf16 else [])  # fmt: skip
        flags += ["--threads", str(args.threads)] if args.threads else []
        recognizer = build_recognizer(build_parser().parse_args(flags))
        recognizer.warm_up()
        results["threads"] = torch.get_num_threads()
        names = [*PHASES, "rest"]
        print(f"{'N':>5s} {'round ms':>9s} " + " ".join(f"{p[:8]:>8s}" for p in names) + "  (ms per stream)  keeps")
        for n in counts:
            row = profile(recognizer, audio, n, args.rounds, args.warm, max(counts), top=args.top)
            results["runs"].append(row)
            print(f"{n:5d} {row['round_ms']:9.2f} " + " ".join(f"{row['per_stream_ms'][p]:8.3f}" for p in names)
                  + f"  {row['streams_one_worker_keeps']:>14d}", flush=True)  # fmt: skip
            write_result(out, results)
        for n in (counts[0], counts[-1]):
            print(f"N={n}: cProfile, ms per round (own, cumulative), calls per round")
            for f in next(r for r in results["runs"] if r["streams"] == n)["top_functions"]:
                print(
                    f"  {f['own_ms_per_round']:8.3f} {f['cum_ms_per_round']:8.3f} {f['calls_per_round']:8.1f}  {f['function']}"
                )
    print(f"wrote {out}")


if __name__ == "__main__":
    with torch.inference_mode(False):
        main()
