"""Which digits the FSDD held-out speaker gets wrong: a confusion count of lexicon-decoded test words.

    PYTHONPATH=. python experiments/baseline_wer/fsdd_errors.py [--checkpoint exp/fsdd_init] [--set test]

Decodes the set the way ``python -m usmkit.cli.evaluate ... decode=ctc_lexicon`` does (same loader,
same lexicon decoder), then counts (reference, hypothesis) pairs of the wrong utterances (one digit
per FSDD file). Prints them and writes ``experiments/baseline_wer/results/fsdd_errors.json``.
"""

from __future__ import annotations

import usmkit.cli  # noqa: F401  (first: the OpenMP wait policy of the entry points, before torch loads)

# isort: split
import argparse
import collections

from tools.results import result_path, run_header, write_result
from usmkit.data.loader import split_loader
from usmkit.inference.batches import transcribe_batches
from usmkit.inference.evaluate import EvalConfig, build_word_decoder
from usmkit.runs import load_trained
from usmkit.streaming.features import checkpoint_feature_stats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", default="exp/fsdd_init")
    ap.add_argument("--set", default="test")
    args = ap.parse_args()
    module, cfg, tokenizer, ckpt = load_trained(args.checkpoint, "cpu")
    data = cfg.data
    stats = checkpoint_feature_stats(ckpt, data)
    decoder = build_word_decoder(EvalConfig(checkpoint=args.checkpoint, decode="ctc_lexicon"), cfg, tokenizer)
    loader, _ = split_loader(data, args.set, tokenizer=tokenizer, stats=stats)
    records, _ = transcribe_batches(module, loader, tokenizer, word_decoder=decoder)
    wrong = [r for r in records if r["ref"] != r["hyp"]]
    pairs = collections.Counter((r["ref"], r["hyp"]) for r in wrong).most_common()
    per_ref = collections.Counter(r["ref"] for r in records)
    print(f"{len(wrong)} of {len(records)} utterances wrong ({100 * len(wrong) / len(records):.1f}%)")
    print(f"{'reference':>10s} {'heard as':>10s} {'count':>6s} {'of takes':>8s}")
    for (ref, hyp), n in pairs:
        print(f"{ref:>10s} {hyp or '(nothing)':>10s} {n:6d} {per_ref[ref]:8d}")
    result = run_header(
        checkpoint=str(ckpt),
        set=args.set,
        utterances=len(records),
        wrong=len(wrong),
        confusions=[{"ref": r, "hyp": h, "count": n, "takes": per_ref[r]} for (r, h), n in pairs],
    )
    print(f"wrote {write_result(result_path(__file__), result)}")


if __name__ == "__main__":
    main()
