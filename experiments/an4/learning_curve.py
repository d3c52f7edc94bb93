"""The labeled-data learning curve on AN4: test WER against the share of AN4 train's labels the fine-tuning
saw, from scratch against from a BEST-RQ encoder (pre-trained on all the unlabeled audio), mean +- sd over
the fine-tuning seeds. Combines recipe reports (each run of ``recipes/an4/run.py --labels N``) into one JSON
and a plot.

    python recipes/an4/run.py --labels 10 --variants scratch,cb1 --seeds 0,1,2 \
        --stage1 cb1=exp/an4_cb1/runs/bestrq_cb1_p0 --device cpu --jobs 1 --ensembles scratch,cb1 \
        --out exp/an4_lc10 --report exp/an4_lc10/an4.json
    PYTHONPATH=. python experiments/an4/learning_curve.py exp/an4_lc10/an4.json \
        experiments/an4/results/an4_cb1_cpu.json experiments/an4/results/an4_narrowband.json#default

``FILE#NAME`` takes the report ``NAME`` of a study file that holds several (``reports``); ``SPEC@LABEL``
names the report's runs ``LABEL`` on the curve instead of by their variant (two encoders' ``cb1`` runs, say),
and runs of one label from several reports are pooled. A report's share of the labels is its
``settings.labels`` (100 for reports written before the option existed). Each curve whose label starts with
``scratch`` is a base the others' relative gains are taken against.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from combine_seeds import read_report  # noqa: E402

from tools.results import run_header  # noqa: E402
from usmkit.training.curves import plot_training_curves, read_metrics  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DECODES = ("ctc_greedy", "ctc_lexicon")


def curve(reports: list[dict]) -> list[dict]:
    """One point per (variant, share of labels, decoding): each seed's test WER, their mean and sd."""
    points: dict[tuple[str, int, str], dict] = {}
    for report in reports:
        labels = report["settings"].get("labels", 100)
        for row in report["rows"]:
            key = (row["variant"], labels, row["decode"])
            point = points.setdefault(key, {"variant": key[0], "labels": labels, "decode": key[2], "runs": []})
            point["runs"].append({"run": row["run"], "dev_wer": row["dev_wer"], "test_wer": row["test_wer"]})
    for point in points.values():
        wers = [r["test_wer"] for r in point["runs"]]
        point["test_wer_mean"] = statistics.mean(wers)
        point["test_wer_sd"] = statistics.stdev(wers) if len(wers) > 1 else None
    return sorted(points.values(), key=lambda p: (p["decode"], p["variant"], p["labels"]))


def relative_gains(points: list[dict], base: str = "scratch") -> list[dict]:
    """Per share and decoding: how much lower each pre-trained curve's mean test WER is than each base's (the
    curves whose label starts with ``base``)."""
    bases = [p for p in points if p["variant"].startswith(base)]
    gains = []
    for p in points:
        if p["variant"].startswith(base):
            continue
        for ref in bases:
            if (ref["labels"], ref["decode"]) == (p["labels"], p["decode"]):
                gain = 1 - p["test_wer_mean"] / ref["test_wer_mean"]
                gains.append({"variant": p["variant"], "base": ref["variant"], "labels": p["labels"],
                              "decode": p["decode"], "relative_gain": gain})  # fmt: skip
    return gains


def read_labeled(spec: str) -> dict:
    """``read_report`` of ``FILE[#NAME][@LABEL]``; with ``LABEL``, every row's variant is ``LABEL``."""
    spec, _, label = spec.partition("@")
    report = read_report(spec)
    if label:
        report = {**report, "rows": [{**row, "variant": label} for row in report["rows"]]}
    return report


def metrics_files(reports: list[dict], below: int = 100) -> dict[str, Path]:
    """``"<labels>% <run>"`` -> the run's ``metrics.jsonl``, for the reports with fewer than ``below`` percent of
    the labels whose runs are still on disk (``settings.out``/runs)."""
    files = {}
    for report in reports:
        labels = report["settings"].get("labels", 100)
        if labels >= below:
            continue
        for row in report["rows"]:
            path = Path(report["settings"]["out"]) / "runs" / row["run"] / "metrics.jsonl"
            if path.is_file():
                files[f"{labels}% {row['variant']} {row['run']}"] = path
    return files


def plot(points: list[dict], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(dict.fromkeys(p["variant"] for p in points))
    colors = dict(zip(variants, itertools.cycle(plt.rcParams["axes.prop_cycle"].by_key()["color"])))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, decode in zip(axes, DECODES, strict=True):
        for variant in variants:
            color = colors[variant]
            line = [p for p in points if p["decode"] == decode and p["variant"] == variant]
            if not line:
                continue
            xs = [p["labels"] for p in line]
            ax.errorbar(xs, [100 * p["test_wer_mean"] for p in line], yerr=[100 * (p["test_wer_sd"] or 0) for p in line],
                        marker="o", capsize=4, color=color, label=variant)  # fmt: skip
            for p in line:
                ax.scatter([p["labels"]] * len(p["runs"]), [100 * r["test_wer"] for r in p["runs"]], s=10,
                           color=color, alpha=0.4)  # fmt: skip
        ax.set_xscale("log")
        ax.set_xticks([10, 30, 100], ["10%", "30%", "100%"])
        ax.set_xlabel("share of AN4 train's labels")
        ax.set_title(f"AN4 test, {decode}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("WER % (mean +- sd of the seeds; dots: each seed)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", help="recipe reports (FILE, or FILE#NAME in a study file)")
    ap.add_argument("--out", type=Path, default=RESULTS / "an4_learning_curve.json")
    args = ap.parse_args()
    reports = [read_labeled(spec) for spec in args.reports]
    points = curve(reports)
    curves = metrics_files(reports)
    result = {
        **run_header(),
        "sources": args.reports,
        "points": points,
        "relative_gains": relative_gains(points),
        "dev_curves": {
            label: [(m["step"], m["dev/dev_wer"]) for m in read_metrics(path) if "dev/dev_wer" in m]
            for label, path in curves.items()
        },
        "test_configurations": sum(r["test_configurations"] for r in reports),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(points, args.out.with_suffix(".png"))
    if curves:
        curves_png = args.out.with_name(args.out.stem + "_curves.png")
        plot_training_curves(curves, curves_png, "AN4 with a share of the labels: scratch vs BEST-RQ (1 codebook)")
    width = max(8, *(len(p["variant"]) for p in points))
    print(f"{'variant':{width}s} {'labels':>6s} {'decode':12s} {'runs':>4s} {'test WER %':>16s}")
    for p in points:
        sd = f" +- {100 * p['test_wer_sd']:5.2f}" if p["test_wer_sd"] is not None else ""
        print(
            f"{p['variant']:{width}s} {p['labels']:5d}% {p['decode']:12s} {len(p['runs']):4d} "
            f"{100 * p['test_wer_mean']:6.2f}{sd}"
        )
    for g in result["relative_gains"]:
        print(
            f"{g['variant']} against {g['base']} at {g['labels']}% labels, {g['decode']}: "
            f"{100 * g['relative_gain']:+.1f}%"
        )
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
