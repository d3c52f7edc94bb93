"""Data-loader throughput: seconds of audio per second and batches per second through the whole loader.

    PYTHONPATH=. python bench/data_throughput.py [--corpus-dir DIR] [--batches 30] [--workers 0 1]
    PYTHONPATH=. python bench/data_throughput.py --shar [--shard-size 10] [--workers 1 2]

Train mode end to end (bucketing sampler, audio decode or stored-feature read, fbank, global
normalization, SpecAugment, tokenization, collation into ``Batch``), for three feature paths:
on the fly, on the fly with speed perturbation, and precomputed (lhotse storage). The corpus is the
embedded synthetic one (``python -m usmkit.cli.prepare synth size=tiny``, FLAC at 16 kHz, all audio splits)
built into a temporary folder, or ``--corpus-dir`` (a built synth corpus). Writes
``bench/results/data_throughput.json``.

``--shar``: the same cuts read as one file each (per-file FLAC, the manifests' loader) against lhotse Shar
shards of them (``usmkit.data.shar``, ``SharLoader``: each worker streams its own shards), both with
features on the fly; per loader and per loader worker. Writes ``bench/results/data_throughput_shar.json``.
"""

from __future__ import annotations

import usmkit.cli  # noqa: F401  (first: the OpenMP wait policy of the entry points, before torch loads)

# isort: split
import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from itertools import islice
from pathlib import Path

import lhotse
import torch
import torchaudio
from lhotse import CutSet

from tools.results import result_path, run_header, write_result
from usmkit.data.config import DataConfig, FeatureConfig
from usmkit.data.features import feature_storage_dir, precompute_features
from usmkit.data.loader import AsrLoader, make_loader
from usmkit.data.manifests import available_splits, load_cuts
from usmkit.data.normalize import compute_global_stats
from usmkit.data.shar import shar_cuts, split_shards, write_split
from usmkit.data.tokenizer import Tokenizer
from usmkit.data.validate import validate_cuts

AUDIO_SPLITS = ("train", "dev", "test", "test_other", "unlabeled")


def build_synth(out: Path) -> None:
    cmd = [sys.executable, "-m", "usmkit.cli.prepare", "synth", f"out={out}", "size=tiny", "workers=1"]
    subprocess.run(cmd, check=True, env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[1])})


def load_corpus(corpus_dir: Path) -> CutSet:
    splits = [s for s in AUDIO_SPLITS if s in available_splits(corpus_dir)]
    cuts = CutSet.from_cuts(c for s in splits for c in load_cuts(corpus_dir, s))
    cuts, report = validate_cuts(cuts, require_text=False, on_bad="error")
    return cuts


def timed_epochs(loader: AsrLoader, batches: int, warmup: int) -> tuple[float, int, float]:
    """Iterate epochs until ``warmup + batches`` batches; time the last ``batches``.

    Returns (elapsed seconds, batches timed, seconds of audio in them (valid frames x 10 ms)).
    """

    def stream():
        epoch = 0
        while True:
            loader.set_epoch(epoch)
            yield from loader
            epoch += 1

    it = stream()
    for _ in islice(it, warmup):
        pass
    frames, n = 0, 0
    start = time.perf_counter()
    for batch in islice(it, batches):
        frames += batch.num_frames
        n += 1
    elapsed = time.perf_counter() - start
    return elapsed, n, frames * 0.01


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "loadavg_at_start": list(os.getloadavg()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchaudio": torchaudio.__version__,
        "lhotse": lhotse.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus-dir", type=Path, help="a built synth corpus (default: build size=tiny in a temp dir)")
    ap.add_argument("--batches", type=int, default=30, help="timed batches per run")
    ap.add_argument("--warmup", type=int, default=3, help="untimed batches first (worker start-up)")
    ap.add_argument("--max-duration", type=float, default=60.0, help="seconds of audio per batch")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1], help="DataLoader worker counts to measure")
    ap.add_argument("--repeats", type=int, default=3, help="runs per setting; the median is reported")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads in the main process (DataLoader workers always use 1); on 2 shared cores "
        "2 threads oversubscribe and make the workers=0 numbers erratic",
    )
    ap.add_argument("--shar", action="store_true", help="per-file FLAC against Shar shards of the same cuts")
    ap.add_argument("--shard-size", type=int, default=10, help="cuts per shard (--shar)")
    ap.add_argument("--out", type=Path, help="default: bench/results/data_throughput[_shar].json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    info = machine()
    if args.shar:
        return shar_main(args, info)
    args.out = args.out or result_path("data_throughput")

    with tempfile.TemporaryDirectory(prefix="usmkit_bench_") as tmp:
        tmp = Path(tmp)
        corpus_dir = args.corpus_dir
        if corpus_dir is None:
            corpus_dir = tmp / "synth"
            build_synth(corpus_dir)
        cuts = load_corpus(corpus_dir)
        tokenizer = Tokenizer.load(corpus_dir / "tokenizer")
        hours = sum(c.duration for c in cuts) / 3600
        print(f"corpus: {corpus_dir} ({len(cuts)} cuts, {hours * 60:.1f} min of audio)")

        base = DataConfig(
            manifest_dir=str(tmp), max_duration=args.max_duration, features=FeatureConfig(precomputed=False)
        )
        stats = compute_global_stats(cuts, base.features)

        t0 = time.perf_counter()
        stored = precompute_features(cuts, replace(base.features, precomputed=True), feature_storage_dir(tmp, "bench"))
        precompute_s = time.perf_counter() - t0
        storage_mb = sum(f.stat().st_size for f in feature_storage_dir(tmp, "bench").rglob("*.npy")) / 2**20

        settings = {
            "on_the_fly": (cuts, base),
            "on_the_fly+speed_perturb": (cuts, replace(base, speed_perturb=(0.9, 1.0, 1.1))),
            "precomputed": (stored, replace(base, features=FeatureConfig(precomputed=True))),
        }
        results = []
        for workers in args.workers:
            for name, (set_cuts, cfg) in settings.items():
                cfg = replace(cfg, num_workers=workers)
                runs = []
                for r in range(args.repeats):
                    loader = make_loader(set_cuts, cfg, tokenizer=tokenizer, stats=stats, train=True, seed=r)
                    runs.append(timed_epochs(loader, args.batches, args.warmup))
                    del loader
                audio_per_s = statistics.median(a / e for e, _, a in runs)
                batches_per_s = statistics.median(n / e for e, n, _ in runs)
                results.append(
                    {
                        "features": name,
                        "num_workers": workers,
                        "audio_s_per_s": round(audio_per_s, 1),
                        "batches_per_s": round(batches_per_s, 3),
                        "runs_audio_s_per_s": [round(a / e, 1) for e, _, a in runs],
                    }
                )
                print(f"  {name:26s} workers={workers}: {audio_per_s:8.1f} s audio/s {batches_per_s:6.2f} batches/s")

    def rate(name: str, workers: int) -> float:
        return next(r["audio_s_per_s"] for r in results if r["features"] == name and r["num_workers"] == workers)

    ratios = {str(w): round(rate("precomputed", w) / rate("on_the_fly", w), 2) for w in args.workers}
    faster = "precomputed" if all(v > 1 for v in ratios.values()) else "on_the_fly"
    print()
    print(f"{'features':28s} {'workers':>7s} {'audio s/s':>10s} {'batches/s':>10s}")
    for r in results:
        print(f"{r['features']:28s} {r['num_workers']:7d} {r['audio_s_per_s']:10.1f} {r['batches_per_s']:10.2f}")
    print(
        f"precomputed / on-the-fly (audio s/s): {ratios}  -> default FeatureConfig.precomputed = {faster == 'precomputed'}"
    )
    print(f"one-off precompute: {precompute_s:.1f} s for {hours * 60:.1f} min of audio, {storage_mb:.1f} MiB stored")

    record = run_header(
        **{
            "machine": info,
            "corpus": {
                "source": "usmkit.data.synth size=tiny (FLAC, 16 kHz), splits " + ",".join(AUDIO_SPLITS)
                if args.corpus_dir is None
                else str(args.corpus_dir),
                "cuts": len(cuts),
                "audio_minutes": round(hours * 60, 2),
            },
            "config": {
                "batches_timed": args.batches,
                "warmup_batches": args.warmup,
                "repeats": args.repeats,
                "data": asdict(base),
                "mode": "train (bucketing, features, normalization, SpecAugment, tokens)",
            },
            "results": results,
            "precomputed_over_on_the_fly": ratios,
            "faster": faster,
            "precompute_one_off_s": round(precompute_s, 2),
            "precomputed_storage_mib": round(storage_mb, 2),
            "storage": "lhotse NumpyFilesWriter (float32 .npy per cut)",
        }
    )
    print(f"wrote {write_result(args.out, record)}")
    return 0


def shar_main(args: argparse.Namespace, info: dict) -> int:
    """Per-file FLAC (one file opened per cut, in the sampler's order) against Shar shards of the same cuts."""
    with tempfile.TemporaryDirectory(prefix="usmkit_bench_") as tmp:
        tmp = Path(tmp)
        corpus_dir = args.corpus_dir
        if corpus_dir is None:
            corpus_dir = tmp / "synth"
            build_synth(corpus_dir)
        cuts = load_corpus(corpus_dir)
        tokenizer = Tokenizer.load(corpus_dir / "tokenizer")
        hours = sum(c.duration for c in cuts) / 3600
        t0 = time.perf_counter()
        entry = write_split(cuts, tmp / "shar" / "train", shard_size=args.shard_size)
        convert_s = time.perf_counter() - t0
        shar_mb = sum(f.stat().st_size for f in (tmp / "shar").rglob("*")) / 2**20
        print(
            f"corpus: {corpus_dir} ({len(cuts)} cuts, {hours * 60:.1f} min); {entry['shards']} shards in {convert_s:.1f} s"
        )
        base = DataConfig(
            manifest_dir=str(tmp), max_duration=args.max_duration, features=FeatureConfig(precomputed=False)
        )
        stats = compute_global_stats(cuts, base.features)
        meta = shar_cuts(split_shards(tmp / "shar", "train"), audio=False)
        settings = {
            "per_file_flac": (cuts, base),
            "shar": (meta, replace(base, shar_dir=str(tmp / "shar"))),
        }
        results = []
        for workers in args.workers:
            for name, (set_cuts, cfg) in settings.items():
                cfg = replace(cfg, num_workers=workers)
                runs = []
                for r in range(args.repeats):
                    loader = make_loader(set_cuts, cfg, tokenizer=tokenizer, stats=stats, train=True, seed=r)
                    runs.append(timed_epochs(loader, args.batches, args.warmup))
                    loader.close()
                audio_per_s = statistics.median(a / e for e, _, a in runs)
                results.append(
                    {
                        "reader": name,
                        "num_workers": workers,
                        "audio_s_per_s": round(audio_per_s, 1),
                        "audio_s_per_s_per_worker": round(audio_per_s / max(1, workers), 1),
                        "batches_per_s": round(statistics.median(n / e for e, n, _ in runs), 3),
                        "audio_s_per_batch": round(statistics.median(a / n for _, n, a in runs), 1),
                        "runs_audio_s_per_s": [round(a / e, 1) for e, _, a in runs],
                    }
                )
                print(
                    f"  {name:14s} workers={workers}: {audio_per_s:8.1f} s audio/s ({audio_per_s / max(1, workers):.1f} per worker)"
                )

    def rate(name: str, workers: int) -> float:
        return next(r["audio_s_per_s"] for r in results if r["reader"] == name and r["num_workers"] == workers)

    ratios = {str(w): round(rate("shar", w) / rate("per_file_flac", w), 2) for w in args.workers}
    print(f"shar / per-file FLAC (audio s/s): {ratios}")
    record = run_header(
        machine=info,
        corpus={
            "source": str(args.corpus_dir or "usmkit.data.synth size=tiny (FLAC, 16 kHz)"),
            "cuts": len(cuts),
            "audio_minutes": round(hours * 60, 2),
        },  # fmt: skip
        shar={
            "shards": entry["shards"],
            "shard_size": args.shard_size,
            "convert_s": round(convert_s, 2),
            "mib": round(shar_mb, 2),
            "audio": "FLAC in tar shards (lhotse CutSet.to_shar)",
        },  # fmt: skip
        config={
            "batches_timed": args.batches,
            "warmup_batches": args.warmup,
            "repeats": args.repeats,
            "data": asdict(base),
            "node": "one process (the loader and its workers) on this machine",
            "mode": "train (bucketing, audio decode, fbank, normalization, SpecAugment, tokens)",
        },  # fmt: skip
        results=results,
        shar_over_per_file=ratios,
        note="local disk, corpus in the page cache: the per-file reads cost little here; Shar's sequential "
        "reads are for shared storage, where opening one small file per cut is the wall. On this tiny corpus "
        "each Shar stream buckets only its own shards' cuts per epoch, so more of its batches end partly "
        "filled (audio_s_per_batch) than the manifests' loader's, which buckets the whole split",
    )
    print(f"wrote {write_result(args.out or result_path('data_throughput', 'shar'), record)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
