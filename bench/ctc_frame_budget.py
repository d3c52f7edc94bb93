"""How many encoder frames CTC has per label at 4x and 8x subsampling, on real manifests and tokenizers.

    PYTHONPATH=. python bench/ctc_frame_budget.py --corpus an4:data/an4:exp/an4/scratch/tokenizer.model \\
        --corpus synth:data/demo:exp/demo_ctc/tokenizer/tokenizer.model

CTC needs at least one frame per label plus one per repeated neighbour (the blank between them); an
utterance with fewer frames has no alignment and contributes nothing (``zero_infinity``). For each
corpus and factor: the median of frames / needed, the share of training utterances that cannot be
aligned, and the share under 1.5 frames per needed label (tight: few blanks to spare). This is the
cost of FastConformer-style 8x subsampling that a speed table does not show: with a character-level
tokenizer the shorter sequences stop fitting the transcripts. Writes ``bench/results/ctc_frame_budget.json``.
"""

from __future__ import annotations

import argparse

import sentencepiece as spm
import torch
from common import result_path, run_header, write_result

from usmkit.data.manifests import load_cuts
from usmkit.models.subsampling import output_lengths
from usmkit.ssl.alignment import frames_needed


def budget(manifest_dir: str, corpus: str, tokenizer: str, split: str, factors: list[int]) -> dict:
    sp = spm.SentencePieceProcessor(model_file=tokenizer)
    frames, needed = [], []
    for cut in load_cuts(manifest_dir, split, corpus=corpus):
        needed.append(frames_needed(sp.encode(" ".join(s.text for s in cut.supervisions))))
        frames.append(round(cut.duration * 100))  # 10-ms feature frames
    t, need = torch.tensor(frames), torch.tensor(needed, dtype=torch.float)
    out = {"utterances": len(frames), "vocab_size": sp.get_piece_size()}
    for f in factors:
        ratio = output_lengths(t, f) / need
        out[f"{f}x"] = {
            "median_frames_per_needed": round(ratio.median().item(), 3),
            "unalignable_pct": round(100 * (ratio < 1).float().mean().item(), 2),
            "tight_pct": round(100 * (ratio < 1.5).float().mean().item(), 2),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", action="append", required=True, help="NAME:MANIFEST_DIR:TOKENIZER (repeatable)")
    ap.add_argument("--split", default="train")
    ap.add_argument("--factors", default="4,8")
    args = ap.parse_args()
    factors = [int(f) for f in args.factors.split(",")]
    rows = {}
    print(f"{'corpus':<8} {'factor':>6} {'frames/needed':>14} {'unalignable %':>14} {'tight %':>8}")
    for spec in args.corpus:
        name, manifest_dir, tokenizer = spec.split(":")
        rows[name] = budget(manifest_dir, name, tokenizer, args.split, factors)
        for f in factors:
            r = rows[name][f"{f}x"]
            print(
                f"{name:<8} {f:>5}x {r['median_frames_per_needed']:>14.2f} {r['unalignable_pct']:>14.1f} "
                f"{r['tight_pct']:>8.1f}"
            )
    write_result(result_path("ctc_frame_budget"), run_header(split=args.split, corpora=rows))


if __name__ == "__main__":
    main()
