"""Padding share of the training batches, before and after packing (``data.pack_to_frames``).

    PYTHONPATH=. python bench/padding_waste.py --corpus data/synth:synth --corpus data/an4:an4 \
        [--max-durations 200,300] [--pack-to 1024,2048] [--json OUT]

For each corpus (``MANIFEST_DIR:CORPUS``, its ``train`` split; manifests only, seconds on a CPU), one epoch
of the real training sampler (``usmkit.data.sampling.make_sampler``) per setting, each batch measured as the
step computes it:

- ``pad256``: bucketed batches padded to a multiple of 256 frames (``data.pad_to_frames=256``, what the
  compiled trainer uses);
- ``fixed256``: the same with ``data.fixed_batch_shapes=true`` (CUDA graphs: one batch size per length);
- ``packN``: packed rows of N frames (``data.pack_to_frames=N``), ``max_duration / (N x 10 ms)`` rows a batch.

Padding share = 1 - valid frames / computed frames, in feature frames and in encoder frames at 4x subsampling
(``output_lengths``: the conv front end's own loss at each utterance's end counts as padding in both layouts,
and packing's utterance starts at multiples of 4 frames leave up to two encoder frames between utterances).
Every setting sees the same cuts: those no longer than the longest row (``--pack-to``'s largest is not
required; each packed row length drops what it cannot hold, counted in ``left_out``).
"""

from __future__ import annotations

import usmkit.cli  # noqa: F401  (first: the OpenMP wait policy of the entry points, before torch loads)

# isort: split
import argparse
from dataclasses import replace

import torch
from lhotse import CutSet

from tools.results import result_path, run_header, write_result
from usmkit.data.config import DataConfig
from usmkit.data.manifests import load_cuts
from usmkit.data.packing import RowPacker, cut_frames, packed_rows
from usmkit.data.sampling import make_sampler
from usmkit.models.subsampling import output_lengths

SHIFT = 0.01  # feature frame shift (data.features.frame_shift_ms=10)
FACTOR = 4  # subsampling


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", action="append", required=True, help="MANIFEST_DIR:CORPUS (its train split)")
    ap.add_argument("--max-durations", default="200,300", help="seconds of audio per batch")
    ap.add_argument("--pack-to", default="1024,2048", help="packed row lengths in feature frames")
    ap.add_argument("--num-buckets", type=int, default=10)
    ap.add_argument("--json", default=result_path("padding_waste"))
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
