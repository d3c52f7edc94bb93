"""The narrowband study: AN4 recipe runs (scratch, 3 seeds each), the defaults against training with waveform
augmentation (from the first step, and from epoch 10 at full and half probabilities), all scored on ``test`` and ``test_8k`` (test through an
8 kHz channel). Combines their reports into one JSON with each run's dev curve, and draws the WERs and the curves.

    python recipes/an4/run.py --variants scratch --seeds 0,1,2 --pool an4 --device cpu --jobs 1 \
        --ensembles scratch --out exp/an4_cpu --report exp/an4_cpu/an4.json
    python recipes/an4/run.py (the same) --out exp/an4_nb --report exp/an4_nb/an4.json \
        --extra data.features.precomputed=false data.narrowband_prob=0.25 data.lowpass_prob=0.25 data.reverb_prob=0.1
    python recipes/an4/run.py (the same) --out exp/an4_nbw --report exp/an4_nbw/an4.json --extra (the same) \
        data.waveform_augment_from_epoch=10
    python recipes/an4/run.py (the same) --out exp/an4_nbh --report exp/an4_nbh/an4.json --extra \
        data.features.precomputed=false data.narrowband_prob=0.125 data.lowpass_prob=0.125 data.reverb_prob=0.05 \
        data.waveform_augment_from_epoch=10
    PYTHONPATH=. python experiments/an4/narrowband.py --runs default=exp/an4_cpu augmented=exp/an4_nb late=exp/an4_nbw \
        late_half=exp/an4_nbh
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from common import run_header  # noqa: E402

from usmkit.training.curves import plot_training_curves, read_metrics  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def plot_wers(reports: dict[str, dict], out_png: Path) -> None:
    """Test and test_8k WER per run (dots) and their means (bars), greedy and lexicon, per training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(4 + 2.2 * len(reports), 4), sharey=True)
    for ax, decode in zip(axes, ("ctc_greedy", "ctc_lexicon"), strict=True):
        x = 0
        ticks, labels = [], []
        for name, report in reports.items():
            for test_set, color in (("test", "tab:blue"), ("test_8k", "tab:orange")):
                wers = [100 * r[f"{test_set}_wer"] for r in report["rows"] if r["decode"] == decode]
                ax.bar(x, sum(wers) / len(wers), color=color, alpha=0.5, label=test_set if x < 2 else None)
                ax.scatter([x] * len(wers), wers, color="black", s=12, zorder=3)
                ticks.append(x)
                labels.append(f"{name}\n{test_set}")
                x += 1
            x += 0.5
        ax.set_xticks(ticks, labels, fontsize=8)
        ax.set(title=decode, ylabel="WER (%)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
    fig.suptitle("AN4, tiny CTC from scratch, 3 seeds: wideband test and test through an 8 kHz channel")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="+", required=True, metavar="NAME=OUT", help="recipe --out folders")
    a = ap.parse_args()
    outs = dict(item.split("=", 1) for item in a.runs)
    reports = {name: json.loads((Path(out) / "an4.json").read_text()) for name, out in outs.items()}
    curves = {}
    for name, out in outs.items():
        for row in reports[name]["rows"]:
            metrics = Path(out) / "runs" / row["run"] / "metrics.jsonl"
            curves[f"{name} {row['run']}"] = metrics
    result = {
        **run_header(),
        "reports": reports,
        "dev_curves": {
            label: [(m["step"], m["dev/dev_wer"]) for m in read_metrics(path) if "dev/dev_wer" in m]
            for label, path in curves.items()
        },
        "test_configurations": sum(r["test_configurations"] for r in reports.values()),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "an4_narrowband.json").write_text(json.dumps(result, indent=1))
    plot_wers(reports, RESULTS / "an4_narrowband.png")
    plot_training_curves(
        curves, RESULTS / "an4_narrowband_curves.png", "AN4 scratch: defaults vs waveform augmentation"
    )
    for name, report in reports.items():
        for s in report["summary"]:
            print(f"{name:<10} {s['decode']:<12} test {100 * s['test_wer_mean']:6.2f} +- {100 * s['test_wer_sd']:5.2f}"
                  f"   test_8k {100 * s['test_8k_wer_mean']:6.2f} +- {100 * s['test_8k_wer_sd']:5.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
