"""What a BEST-RQ run learned to predict: per logged batch, the prediction accuracy over its masked frames, the
perplexity of the target codes over all its frames (how many of the codebook's codes the quantizer hands out),
that of the model's predictions over the masked frames (how many it tells apart) and the masked share of the
frames, against the step. Reads the runs' ``metrics.jsonl``; writes the series to JSON and a plot.

    PYTHONPATH=. python experiments/an4/bestrq_codes.py "first encoder, seed 0=exp/an4_las07/runs/bestrq_cb1_p0" \
        --out experiments/an4/results/an4_bestrq_codes.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.results import run_header  # noqa: E402
from usmkit.training.curves import read_metrics  # noqa: E402

SERIES = {  # metrics.jsonl key -> what the plot calls it
    "train/acc_mean": "masked accuracy",
    "train/perplexity_mean": "target codes' perplexity",
    "train/pred_perplexity_mean": "predictions' perplexity",
    "train/mask_frac": "masked share",  # absent from the metrics of older runs: a table cell of nan
}


def series(metrics: Path) -> dict[str, list[tuple[int, float]]]:
    rows = read_metrics(metrics)
    return {name: [(r["step"], r[key]) for r in rows if key in r] for key, name in SERIES.items()}


def plot(runs: dict[str, dict[str, list]], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, s in runs.items():
        axes[0].plot(*zip(*s["masked accuracy"], strict=True), label=label)
        for name, style in (("target codes' perplexity", "-"), ("predictions' perplexity", "--")):
            axes[1].plot(*zip(*s[name], strict=True), style, label=f"{label}: {name}")
    axes[0].set(xlabel="step", ylabel="accuracy on masked frames", title="masked prediction")
    axes[1].set(xlabel="step", ylabel="perplexity (codes in use)", yscale="log", title="codebook usage")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="LABEL=RUN_DIR", help="BEST-RQ run folders (their metrics.jsonl)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default=None, help="the machine the runs trained on (default: this one)")
    args = ap.parse_args()
    runs = {}
    for spec in args.runs:
        label, _, run = spec.rpartition("=")
        runs[label or run] = series(Path(run) / "metrics.jsonl")
    header = run_header(trained_on=args.device)
    args.out.write_text(json.dumps({**header, "runs": runs}, indent=1) + "\n")
    plot(runs, args.out.with_suffix(".png"))
    print(f"{'run':32s} {'step':>5s} " + " ".join(f"{n:>24s}" for n in SERIES.values()))
    for label, s in runs.items():
        last = [s[n][-1][1] if s[n] else float("nan") for n in SERIES.values()]
        print(f"{label:32s} {s['masked accuracy'][-1][0]:5d} " + " ".join(f"{v:24.3f}" for v in last))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
