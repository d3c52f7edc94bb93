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

A folder whose runs were also scored on ``test_tel`` (test through a telephone line: ``decode/<run>/<decode>_tel.json``,
as ``experiments/an4/gpu_studies.sh`` writes them) adds ``test_tel_wer`` to its rows and summary. ``--name`` names
the output files (default ``an4_narrowband``), ``--device`` the machine the runs trained on (default: this one),
``--command`` what trained them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.results import run_header  # noqa: E402
from usmkit.training.curves import plot_training_curves, read_metrics  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def dev_curve(metrics: Path) -> list[tuple[int, float]]:
    """A run's (step, dev WER greedy) from its ``metrics.jsonl``: the trainer's own evaluations."""
    return [(m["step"], m["dev/dev_wer"]) for m in read_metrics(metrics) if "dev/dev_wer" in m]


def plot_wers(reports: dict[str, dict], out_png: Path, title: str = "") -> None:
    """Test, test_8k (and test_tel) WER per run (dots) and their means (bars), greedy and lexicon, per training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(4 + 2.2 * len(reports), 4), sharey=True)
    for ax, decode in zip(axes, ("ctc_greedy", "ctc_lexicon"), strict=True):
        x = 0
        ticks, labels, named = [], [], set()
        for name, report in reports.items():
            first = x
            for test_set, color in (("test", "tab:blue"), ("test_8k", "tab:orange"), ("test_tel", "tab:green")):
                wers = [
                    100 * r[f"{test_set}_wer"]
                    for r in report["rows"]
                    if r["decode"] == decode and f"{test_set}_wer" in r
                ]
                if not wers:
                    continue
                ax.bar(x, sum(wers) / len(wers), color=color, alpha=0.5, label=None if test_set in named else test_set)
                ax.scatter([x] * len(wers), wers, color="black", s=12, zorder=3)
                named.add(test_set)
                x += 1
            ticks.append((first + x - 1) / 2)
            labels.append(name.replace("_", "\n"))
            x += 0.5
        ax.set_xticks(ticks, labels, fontsize=8)
        ax.set(title=decode, ylabel="WER (%)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
    suptitle = f"AN4, tiny model, 3 seeds: wideband test and test through narrowband channels{title}"
    fig.suptitle(textwrap.fill(suptitle, width=int(12 * fig.get_figwidth())))  # about 12 characters an inch
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)


def plot_dev_curves(dev_curves: dict[str, list], names: list[str], out_png: Path, title: str = "") -> None:
    """Dev WER (greedy) against steps: one panel per training, one line per seed (labels ``"<training> <run>"``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), sharey=True, squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for label, points in dev_curves.items():
            if label.split(" ", 1)[0] == name and points:
                steps, wers = zip(*points, strict=True)
                ax.plot(steps, [100 * w for w in wers], marker="o", ms=3, label=label.split(" ", 1)[1])
        ax.set(title=name, xlabel="step", yscale="log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("dev WER, greedy (%)")
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.suptitle(f"AN4: dev WER while training{title}")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)


def add_telephone(report: dict, out: Path) -> None:
    """``test_tel_wer`` in the rows of ``report`` whose run was scored on test_tel with their decoding, and its mean
    and sd in the summary (no row is scored here: the scores are read from ``out/decode``)."""
    for row in report["rows"]:
        path = out / "decode" / row["run"] / f"{row['decode']}_tel.json"
        if path.is_file():
            row["test_tel_wer"] = json.loads(path.read_text())["sets"]["test_tel"]["wer"]
    for entry in report["summary"]:
        wers = [r["test_tel_wer"] for r in report["rows"] if r["decode"] == entry["decode"] and "test_tel_wer" in r]
        if len(wers) >= 2:
            entry["test_tel_wer_mean"], entry["test_tel_wer_sd"] = statistics.fmean(wers), statistics.stdev(wers)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="+", required=True, metavar="NAME=OUT", help="recipe --out folders")
    ap.add_argument("--name", default="an4_narrowband", help="the output files' name")
    ap.add_argument("--device", default=None, help="the machine the runs trained on (default: this one)")
    ap.add_argument("--command", default=None, help="the commands that trained them")
    ap.add_argument("--title", default="", help="added to the plots' titles")
    a = ap.parse_args()
    outs = dict(item.split("=", 1) for item in a.runs)
    reports = {name: json.loads((Path(out) / "an4.json").read_text()) for name, out in outs.items()}
    for name, out in outs.items():
        add_telephone(reports[name], Path(out))
    curves = {}
    for name, out in outs.items():
        for row in reports[name]["rows"]:
            metrics = Path(out) / "runs" / row["run"] / "metrics.jsonl"
            curves[f"{name} {row['run']}"] = metrics
    header = run_header(trained_on=a.device)
    result = {
        **header,
        **({"trained_by": a.command} if a.command else {}),
        "reports": reports,
        "dev_curves": {label: dev_curve(path) for label, path in curves.items()},
        "test_configurations": sum(r["test_configurations"] for r in reports.values())
        + sum("test_tel_wer" in r for report in reports.values() for r in report["rows"]),  # one per run and decoding
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{a.name}.json").write_text(json.dumps(result, indent=1))
    plot_wers(reports, RESULTS / f"{a.name}.png", a.title)
    if len(curves) <= 12:
        plot_training_curves(curves, RESULTS / f"{a.name}_curves.png", f"AN4: training loss and dev WER{a.title}")
    else:  # one panel per training: one figure of this many lines would not read
        plot_dev_curves(result["dev_curves"], list(outs), RESULTS / f"{a.name}_curves.png", a.title)
    for name, report in reports.items():
        for s in report["summary"]:
            tel = (
                f"   test_tel {100 * s['test_tel_wer_mean']:6.2f} +- {100 * s['test_tel_wer_sd']:5.2f}"
                if "test_tel_wer_mean" in s
                else ""
            )
            print(f"{name:<10} {s['decode']:<16} dev {100 * s['dev_wer_mean']:6.2f}"
                  f"   test {100 * s['test_wer_mean']:6.2f} +- {100 * s['test_wer_sd']:5.2f}"
                  f"   test_8k {100 * s['test_8k_wer_mean']:6.2f} +- {100 * s['test_8k_wer_sd']:5.2f}{tel}")  # fmt: skip


if __name__ == "__main__":
    main()
