"""How close a trained MOST model's text path comes to speech, on a split's paired utterances.

    PYTHONPATH=. python experiments/most_study/most_consistency.py CHECKPOINT [CHECKPOINT ...] [--split dev] [--device cpu]

For each stage-2 checkpoint (run or checkpoint directory): its forward on every batch of ``--split``
(evaluation mode, alignments from its own CTC head or its ``align_from`` model, as in training), and
the frame-weighted means of ``consistency_rel`` (the consistency MSE over the variance of the speech
states it is measured against: 0 = the text encoder reproduces the speech encoder's block-k input,
1 = no closer than their mean), ``loss_consistency``, ``dur_abs_log_err`` and ``align_ok_frac``.
Results go to ``experiments/most_study/results/most_consistency.json`` (``$OUT`` when set).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from tools.results import result_path, run_header, write_result

KEYS = ("consistency_rel", "loss_consistency", "dur_abs_log_err", "align_ok_frac")


def measure(checkpoint: str, split: str, device: str) -> dict:
    from usmkit.data.loader import split_loader
    from usmkit.runs import load_trained
    from usmkit.streaming.features import checkpoint_feature_stats

    module, cfg, tokenizer, path = load_trained(checkpoint, device)
    if cfg.task.kind != "most":
        raise SystemExit(f"{checkpoint}: a {cfg.task.kind!r} run, not MOST (stage 2)")
    data = replace(cfg.data, num_workers=0)
    loader, _ = split_loader(data, split, tokenizer=tokenizer, stats=checkpoint_feature_stats(path, data))
    sums = dict.fromkeys(KEYS, 0.0)
    frames = 0
    with torch.no_grad():
        for batch in loader:
            n = int(batch.feature_lens.sum())
            metrics = module(batch.to(device)).metrics
            for k in KEYS:
                sums[k] += float(metrics[k]) * n
            frames += n
    return {"checkpoint": str(path), "text_layer": module.text_layer, "split": split, "feature_frames": frames} | {
        k: round(v / max(frames, 1), 4) for k, v in sums.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    result = run_header(split=args.split, runs=[measure(c, args.split, args.device) for c in args.checkpoints])
    path = write_result(args.json or result_path(__file__), result)
    print(f"{'checkpoint':50s} {'block k':>7s} " + " ".join(f"{k:>16s}" for k in KEYS))
    for r in result["runs"]:
        print(f"{r['checkpoint'][-50:]:50s} {r['text_layer']:7d} " + " ".join(f"{r[k]:16.4f}" for k in KEYS))
    print(f"JSON: {path}")


if __name__ == "__main__":
    main()
