"""Padding waste of the training batches: the share of the frames a step computes that are padding.

    PYTHONPATH=. python experiments/padding_waste/padding_waste.py buckets --corpus data/synth:synth \
        --corpus data/an4:an4 [--max-durations 50,200,300] [--num-buckets 10,30] [--pad-to 0,64,128,256] [--json OUT]
    PYTHONPATH=. python experiments/padding_waste/padding_waste.py packing --corpus data/synth:synth \
        --corpus data/an4:an4 [--max-durations 200,300] [--pack-to 1024,2048] [--json OUT]

For each corpus (``MANIFEST_DIR:CORPUS``, its ``train`` split) and each setting, one epoch of the real
training sampler (``usmkit.data.sampling.make_sampler``: lhotse's ``DynamicBucketingSampler``, shuffled
duration buckets) is drawn and every batch is measured as the step computes it. Nothing is loaded but the
manifests: it runs in seconds on a CPU.

``buckets``: batches padded to their longest cut's feature frames, rounded up to a multiple of
``data.pad_to_frames`` (the setting ``trainer.compile=true`` needs), per bucket count. Waste = 1 - valid
frames / (batch size x padded frames); the encoder runs on the same frames subsampled, so the share holds for
its compute too. Sequence packing or finer buckets pay only where the waste is large; the table says where.

``packing``: before and after packing (``data.pack_to_frames``):

- ``pad256``: bucketed batches padded to a multiple of 256 frames (``data.pad_to_frames=256``, what the
  compiled trainer uses);
- ``fixed256``: the same with ``data.fixed_batch_shapes=true`` (CUDA graphs: one batch size per length);
- ``packN``: packed rows of N frames (``data.pack_to_frames=N``), ``max_duration / (N x 10 ms)`` rows a batch.

Padding share = 1 - valid frames / computed frames, in feature frames and in encoder frames at 4x subsampling
(``output_lengths``: the conv front end's own loss at each utterance's end counts as padding in both layouts,
and packing's utterance starts at multiples of 4 frames leave up to two encoder frames between utterances).
Every setting sees the same cuts: those no longer than the longest row (each packed row length drops what it
cannot hold, counted in ``left_out``).
"""

from __future__ import annotations

import usmkit.cli  # noqa: F401  (first: the OpenMP wait policy of the entry points, before torch loads)

# isort: split
import argparse
from dataclasses import replace

import torch
from lhotse import CutSet
from lhotse.utils import compute_num_frames

from tools.results import result_path, run_header, write_result
from usmkit.data.config import DataConfig
from usmkit.data.manifests import load_cuts
from usmkit.data.packing import RowPacker, cut_frames, packed_rows
from usmkit.data.sampling import make_sampler
from usmkit.models.subsampling import output_lengths

SHIFT = 0.01  # feature frame shift (data.features.frame_shift_ms=10)
FACTOR = 4  # subsampling


def waste(cuts, cfg: DataConfig) -> dict:
    """One training epoch of the sampler: batches, mean batch size, distinct padded lengths (with
    ``trainer.compile=true`` each is a compiled shape), padding share."""
    valid = padded = batches = utts = 0
    shapes = set()
    for batch in make_sampler(cuts, cfg, train=True, seed=0):
        lengths = [compute_num_frames(c.duration, SHIFT, c.sampling_rate) for c in batch]
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


def enc(frames: list[int]) -> int:
    """Encoder frames of utterances (or rows) of these feature frames, summed."""
    return int(output_lengths(torch.tensor(frames), FACTOR).sum())


def padded(cuts: CutSet, cfg: DataConfig, fixed: bool) -> dict:
    """One epoch of bucketed batches padded to ``cfg.pad_to_frames``."""
    counts = []  # per batch: (valid, computed, valid encoder, computed encoder) frames
    shapes = set()
    for batch in make_sampler(cuts, cfg, train=True, seed=0, fixed_shapes=fixed):
        lengths = [cut_frames(c, SHIFT) for c in batch]
        T = -(-max(lengths) // cfg.pad_to_frames) * cfg.pad_to_frames
        shapes.add((len(lengths), T))
        counts.append((sum(lengths), T * len(lengths), enc(lengths), enc([T]) * len(lengths)))
    return summary(counts, len(shapes))


def packed(cuts: CutSet, cfg: DataConfig) -> dict:
    """One epoch of packed rows (``cfg.pack_to_frames``)."""
    rows = packed_rows(cfg.max_duration, SHIFT, cfg.pack_to_frames)
    packer = RowPacker(rows, cfg.pack_to_frames, FACTOR)
    fits = CutSet.from_cuts(c for c in cuts if packer.fits(cut_frames(c, SHIFT)))
    counts = []
    for batch in make_sampler(fits, cfg, train=True, seed=0, packer=packer):
        lengths = [cut_frames(c, SHIFT) for c in batch]
        assert len(packer.assign(lengths)) <= rows
        counts.append((sum(lengths), rows * packer.frames, enc(lengths), rows * enc([packer.frames])))
    return summary(counts, 1) | {"rows": rows, "left_out": len(cuts) - len(fits)}


def summary(counts: list[tuple[int, int, int, int]], shapes: int) -> dict:
    """Padding shares over the epoch, and over all batches but its last (packing's last one holds what
    is left of the epoch: on a small corpus it weighs in)."""

    def share(rows, valid, computed):
        return round(1 - sum(r[valid] for r in rows) / sum(r[computed] for r in rows), 4)

    return {
        "batches": len(counts),
        "shapes": shapes,
        "padding": share(counts, 0, 1),
        "padding_encoder": share(counts, 2, 3),
        "padding_but_last_batch": share(counts[:-1], 0, 1),
    }


def add_buckets_parser(sub) -> None:
    ap = sub.add_parser("buckets", help="padded batches per data.pad_to_frames and bucket count")
    ap.add_argument("--corpus", action="append", required=True, help="MANIFEST_DIR:CORPUS (its train split)")
    ap.add_argument("--max-durations", default="50,200,300")
    ap.add_argument("--num-buckets", default="10,30")
    ap.add_argument("--pad-to", default="0,64,128,256")
    ap.add_argument("--json", default=result_path(__file__))
    ap.set_defaults(run=buckets)


def buckets(args) -> None:
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


def add_packing_parser(sub) -> None:
    ap = sub.add_parser("packing", help="bucketed and fixed-shape batches against packed rows")
    ap.add_argument("--corpus", action="append", required=True, help="MANIFEST_DIR:CORPUS (its train split)")
    ap.add_argument("--max-durations", default="200,300", help="seconds of audio per batch")
    ap.add_argument("--pack-to", default="1024,2048", help="packed row lengths in feature frames")
    ap.add_argument("--num-buckets", type=int, default=10)
    ap.add_argument("--json", default=result_path(__file__, "packing"))
    ap.set_defaults(run=packing)


def packing(args) -> None:
    pack_to = [int(n) for n in args.pack_to.split(",")]
    result = run_header(corpora={})
    print(
        f"{'corpus':8s} {'max_dur':>7s} {'setting':>10s} {'batches':>7s} {'shapes':>6s} {'padding':>8s} "
        f"{'encoder':>8s} {'but last':>8s}"
    )
    for spec in args.corpus:
        manifest_dir, corpus = spec.split(":")
        cuts = load_cuts(manifest_dir, "train", corpus=corpus)
        longest_row = max(pack_to) * SHIFT
        kept = CutSet.from_cuts(c for c in cuts if c.duration <= longest_row)
        durations = [c.duration for c in kept]
        entry = {
            "manifest_dir": manifest_dir,
            "utterances": len(durations),
            "left_out_longer_than_a_row": len(cuts) - len(durations),
            "hours": round(sum(durations) / 3600, 2),
            "duration_s": {"min": round(min(durations), 2), "max": round(max(durations), 2)},
            "settings": [],
        }
        result["corpora"][corpus] = entry
        base = DataConfig(manifest_dir=manifest_dir, corpus=corpus, num_buckets=args.num_buckets)
        for max_duration in map(float, args.max_durations.split(",")):
            cfg = replace(base, max_duration=max_duration, max_cut_duration=longest_row)
            rows = {
                "pad256": padded(kept, replace(cfg, pad_to_frames=256), fixed=False),
                "fixed256": padded(kept, replace(cfg, pad_to_frames=256, fixed_batch_shapes=True), fixed=True),
            }
            for n in pack_to:
                rows[f"pack{n}"] = packed(kept, replace(cfg, pack_to_frames=n, max_cut_duration=n * SHIFT))
            for name, row in rows.items():
                entry["settings"].append({"max_duration": max_duration, "setting": name} | row)
                print(
                    f"{corpus:8s} {max_duration:7.0f} {name:>10s} {row['batches']:7d} {row['shapes']:6d} "
                    f"{100 * row['padding']:7.1f}% {100 * row['padding_encoder']:7.1f}% "
                    f"{100 * row['padding_but_last_batch']:7.1f}%",
                    flush=True,
                )
    write_result(args.json, result)
    print(f"wrote {args.json}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(required=True)
    add_buckets_parser(sub)
    add_packing_parser(sub)
    args = ap.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
