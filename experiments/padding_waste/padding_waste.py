"""Padding waste of the training batches: the share of the frames a step computes that are padding.

    PYTHONPATH=. python experiments/padding_waste/padding_waste.py --corpus data/synth:synth --corpus data/an4:an4 \
        [--max-durations 50,200,300] [--num-buckets 10,30] [--pad-to 0,64,128,256] [--json OUT]

For each corpus (``MANIFEST_DIR:CORPUS``, its ``train`` split) and each setting, one epoch of the
training sampler (``usmkit.data.sampling.make_sampler``: lhotse's ``DynamicBucketingSampler``, shuffled
duration buckets) is drawn and every batch is measured as the loader would pad it: to its longest cut's
feature frames, rounded up to a multiple of ``data.pad_to_frames`` (the setting ``trainer.compile=true``
needs). Waste = 1 - valid frames / (batch size x padded frames). The encoder runs on the same frames
subsampled, so the share holds for its compute too. Nothing is loaded but the manifests: it runs in
seconds on a CPU.

Sequence packing or finer buckets pay only where the waste is large; the table says where it is.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import usmkit.cli  # noqa: F401  (first: the OpenMP wait policy)
from tools.results import result_path, run_header, write_result

# isort: split
from lhotse.utils import compute_num_frames

from usmkit.data.config import DataConfig
from usmkit.data.manifests import load_cuts
from usmkit.data.sampling import make_sampler

HOP_S = 0.01  # feature frame shift (data.features.frame_shift_ms=10)


def waste(cuts, cfg: DataConfig) -> dict:
    """One training epoch of the sampler: batches, mean batch size, distinct padded lengths (with
    ``trainer.compile=true`` each is a compiled shape), padding share."""
    valid = padded = batches = utts = 0
    shapes = set()
    for batch in make_sampler(cuts, cfg, train=True, seed=0):
        lengths = [compute_num_frames(c.duration, HOP_S, c.sampling_rate) for c in batch]
        T = max(lengths)
        if cfg.pad_to_frames:
            T = -(-T // cfg.pad_to_frames) * cfg.pad_to_frames
        shapes.add(T)
        valid += sum(lengths)
        padded += T * len(lengths)
        batches += 1
        utts += len(lengths)
    return {
        "batches": batches,
        "mean_batch": round(utts / batches, 1),
        "padded_lengths": len(shapes),
        "waste": round(1 - valid / padded, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", action="append", required=True, help="MANIFEST_DIR:CORPUS (its train split)")
    ap.add_argument("--max-durations", default="50,200,300")
    ap.add_argument("--num-buckets", default="10,30")
    ap.add_argument("--pad-to", default="0,64,128,256")
    ap.add_argument("--json", default=result_path(__file__))
    args = ap.parse_args()
    result = run_header(corpora={})
    print(
        f"{'corpus':10s} {'max_dur':>7s} {'buckets':>7s} {'pad_to':>6s} {'batches':>7s} {'mean B':>7s} {'lengths':>7s} {'waste':>7s}"
    )
    for spec in args.corpus:
        manifest_dir, corpus = spec.split(":")
        cuts = load_cuts(manifest_dir, "train", corpus=corpus)
        durations = [c.duration for c in cuts]
        entry = {
            "manifest_dir": manifest_dir,
            "utterances": len(durations),
            "hours": round(sum(durations) / 3600, 2),
            "duration_s": {"min": round(min(durations), 2), "max": round(max(durations), 2)},
            "settings": [],
        }
        result["corpora"][corpus] = entry
        for max_duration in map(float, args.max_durations.split(",")):
            for buckets in map(int, args.num_buckets.split(",")):
                for pad_to in map(int, args.pad_to.split(",")):
                    cfg = replace(
                        DataConfig(manifest_dir=manifest_dir, corpus=corpus),
                        max_duration=max_duration,
                        num_buckets=buckets,
                        pad_to_frames=pad_to,
                    )
                    row = {"max_duration": max_duration, "num_buckets": buckets, "pad_to_frames": pad_to}
                    row |= waste(cuts, cfg)
                    entry["settings"].append(row)
                    print(
                        f"{corpus:10s} {max_duration:7.0f} {buckets:7d} {pad_to:6d} {row['batches']:7d} "
                        f"{row['mean_batch']:7.1f} {row['padded_lengths']:7d} {100 * row['waste']:6.1f}%",
                        flush=True,
                    )
        write_result(args.json, result)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
