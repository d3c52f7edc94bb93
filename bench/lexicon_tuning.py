"""Tune lexicon decoding's LM weight and word score on a dev set (the CTC log-probs are computed once).

    PYTHONPATH=. python bench/lexicon_tuning.py --checkpoint exp/synth_v2 [--set dev] [--orders 1,2]

Prints a WER table over the grid and writes ``bench/results/lexicon_tuning.json``; use the best
``lexicon.lm_weight`` / ``lexicon.word_score`` with ``python -m usmkit.cli.evaluate ... decode=ctc_lexicon``.
"""

from __future__ import annotations

import usmkit.cli  # noqa: F401  (first: the OpenMP wait policy of the entry points, before torch loads)

# isort: split
import argparse
import itertools
import sys
from dataclasses import replace
from pathlib import Path

import torch
from common import result_path, run_header, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from usmkit.data.loader import split_loader  # noqa: E402
from usmkit.decoding.ctc_lexicon import LexiconConfig  # noqa: E402
from usmkit.inference.evaluate import EvalConfig, build_word_decoder  # noqa: E402
from usmkit.metrics import TextNormConfig, normalize_text, score  # noqa: E402
from usmkit.runs import load_trained  # noqa: E402
from usmkit.streaming.features import checkpoint_feature_stats  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--set", default="dev")
    ap.add_argument("--orders", default="1,2")
    ap.add_argument("--lm-weights", default="0.5,1,1.5,2,3")
    ap.add_argument("--word-scores", default="-2,0,2,4")
    ap.add_argument("--beam-size", type=int, default=LexiconConfig.beam_size)
    ap.add_argument("--beam-threshold", type=float, default=LexiconConfig.beam_threshold)
    ap.add_argument("--output", default=None, help="JSON path (default: bench/results/lexicon_tuning.json)")
    args = ap.parse_args()
    module, cfg, tokenizer, ckpt = load_trained(args.checkpoint, "cuda" if torch.cuda.is_available() else "cpu")
    data = replace(cfg.data, max_duration=200.0)
    stats = checkpoint_feature_stats(ckpt, data)
    loader, _ = split_loader(data, args.set, tokenizer=tokenizer, stats=stats)
    refs, emissions = [], []
    with torch.no_grad():
        for batch in loader:
            batch = batch.to(next(module.parameters()).device)
            enc, lens = module.encode(batch.features, batch.feature_lens)
            emissions.append((module.ctc(enc).float().cpu(), lens.cpu()))
            refs += [normalize_text(t, TextNormConfig()) for t in batch.texts]
    rows = []
    print(f"{'order':>5s} {'lm_w':>5s} {'word':>5s} {'WER %':>7s}")
    for order, lm_w, ws in itertools.product(
        map(int, args.orders.split(",")),
        map(float, args.lm_weights.split(",")),
        map(float, args.word_scores.split(",")),
    ):
        lexicon = LexiconConfig(
            order=order, lm_weight=lm_w, word_score=ws, beam_size=args.beam_size, beam_threshold=args.beam_threshold
        )
        # The decoder usmkit.cli.evaluate builds (same transcripts, same normalization), at this grid point.
        eval_cfg = EvalConfig(checkpoint=args.checkpoint, decode="ctc_lexicon", lexicon=lexicon)
        dec = build_word_decoder(eval_cfg, cfg, tokenizer)
        hyps = [normalize_text(h, TextNormConfig()) for lp, lens in emissions for h in dec(lp, lens)]
        wer = score(refs, hyps).wer
        rows.append({"order": order, "lm_weight": lm_w, "word_score": ws, "wer": wer})
        print(f"{order:5d} {lm_w:5.1f} {ws:5.1f} {100 * wer:7.2f}", flush=True)
    best = min(rows, key=lambda r: r["wer"])
    print(f"best on {args.set}: {best}")
    out = write_result(
        args.output or result_path("lexicon_tuning"),
        run_header(checkpoint=str(ckpt), set=args.set, grid=rows, best=best),
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
