"""The per-language table of issue 60 (one row per language: training hours, test WER and CER of the
single-language models, of the multilingual one, and at 10% of the labels from scratch and pre-trained) and its
plot, from the two studies' reports.

    PYTHONPATH=. python experiments/multilingual/table.py exp/ml/report.json exp/xl/crosslingual.json \
        [--long exp/ml_long/report.json] [--temperature-runs 3=exp/ml/runs/multi_s0 1=exp/ml_t1/multi_s0]

Writes ``results/multilingual.json`` (every row, with both reports whole) and ``results/multilingual_cer.png``,
and prints the Markdown table the README shows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.results import run_header  # noqa: E402
from usmkit.training.curves import metric_series  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def pct(entry: dict[str, Any] | None, key: str) -> str:
    if entry is None:
        return "-"
    sd = entry.get(f"{key}_sd")
    return f"{100 * entry[f'{key}_mean']:.1f}" + ("" if sd is None else f" +- {100 * sd:.1f}")


def chosen_start(xl: dict[str, Any], lang: str, pool: str) -> dict[str, Any] | None:
    """The start the report recommends for ``pool`` (``pool_all`` / ``pool_own``): its plain or ``_frozen``
    fine-tuning, whichever has the lower mean dev CER over the full set of seeds."""
    entries = [e for e in xl["summary"] if e["language"] == lang and e["start"] in (pool, f"{pool}_frozen")]
    full = max((e["runs"] for e in entries), default=0)
    entries = [e for e in entries if e["runs"] == full]
    return min(entries, key=lambda e: e["dev_cer_mean"]) if entries else None


def table_rows(ml: dict[str, Any], xl: dict[str, Any], long: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per language of ``ml`` (the equal-steps report); ``long``: the multilingual model's report at the
    single models' total steps."""
    rows = []
    for lang, hours in ml["train_hours"].items():
        by_model = {e["model"]: e for e in ml["summary"] if e["language"] == lang}
        longer = next((e for e in (long or {}).get("summary", []) if e["language"] == lang), None)
        scratch = next((e for e in xl["summary"] if e["language"] == lang and e["start"] == "scratch"), None)
        rows.append(
            {
                "language": lang,
                "train_hours": hours,
                "single": by_model.get("single"),
                "multilingual": by_model.get("multilingual"),
                "multilingual_long": longer,
                "scratch_10": scratch,
                "pretrained_all_10": chosen_start(xl, lang, "pool_all") if scratch else None,
                "pretrained_own_10": chosen_start(xl, lang, "pool_own") if scratch else None,
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]], labels: float, long_steps: int | None = None) -> str:
    share = f"{labels:.0%}"
    longer = f" multilingual, {long_steps} steps WER | CER |" if long_steps else ""
    head = (
        f"| language | train h | single-language WER | CER | multilingual WER | CER |{longer} "
        f"{share} labels: scratch CER | pre-trained, all audio | pre-trained, own audio |\n"
        "| --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if long_steps else "") + " --- | --- | --- |\n"
    )
    lines = []
    for r in rows:
        cells = [
            r["language"],
            f"{r['train_hours']:.2f}",
            pct(r["single"], "test_wer"),
            pct(r["single"], "test_cer"),
            pct(r["multilingual"], "test_wer"),
            pct(r["multilingual"], "test_cer"),
            *([pct(r["multilingual_long"], "test_wer"), pct(r["multilingual_long"], "test_cer")] if long_steps else []),
            pct(r["scratch_10"], "test_cer"),
            pct(r["pretrained_all_10"], "test_cer"),
            pct(r["pretrained_own_10"], "test_cer"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines)


def plot(rows: list[dict[str, Any]], labels: float, path: Path) -> None:
    """Left: test CER per language, single-language against multilingual; right: the low-label languages."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def bars(ax, rows, series, width):
        for i, (key, label, color) in enumerate(series):
            xs, ys, errs = [], [], []
            for j, r in enumerate(rows):
                if r[key] is not None:
                    xs.append(j + (i - (len(series) - 1) / 2) * width)
                    ys.append(100 * r[key]["test_cer_mean"])
                    errs.append(100 * (r[key]["test_cer_sd"] or 0))
            ax.bar(xs, ys, width, yerr=errs, capsize=2, label=label, color=color)
        ax.set_xticks(range(len(rows)), [r["language"] for r in rows])
        ax.set_ylabel("test CER (%)")
        ax.legend(fontsize=8)

    low = [r for r in rows if r["scratch_10"] is not None]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 1]})
    series = [("single", "one model per language", "tab:gray"), ("multilingual", "one multilingual model", "tab:green")]
    title = "all labels, equal steps"
    if any(r["multilingual_long"] for r in rows):
        series.append(("multilingual_long", "multilingual, the single models' total steps", "tab:olive"))
        title = "all labels: equal steps, and the multilingual model at the single models' total"
    bars(axes[0], rows, series, 0.8 / len(series))
    axes[0].set_title(title + " (mean +- sd over seeds)", fontsize=10)
    series = [("scratch_10", "scratch", "tab:gray"), ("pretrained_all_10", "BEST-RQ, all audio", "tab:blue"),
              ("pretrained_own_10", "BEST-RQ, own audio", "tab:orange")]  # fmt: skip
    bars(axes[1], low, series, 0.26)
    axes[1].set_title(f"{labels:.0%} of the labels")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ml_report", type=Path, help="recipes/multilingual/run.py's report JSON")
    ap.add_argument("xl_report", type=Path, help="experiments/multilingual/crosslingual.py's report JSON")
    ap.add_argument("--long", type=Path, default=None, help="the multilingual model's report at more steps")
    ap.add_argument(
        "--temperature-runs",
        nargs="*",
        default=[],
        metavar="T=RUN",
        help="multilingual runs at several language temperatures (same seed and steps): their dev CER curves",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    ml, xl = json.loads(a.ml_report.read_text()), json.loads(a.xl_report.read_text())
    long = json.loads(a.long.read_text()) if a.long else None
    rows = table_rows(ml, xl, long)
    labels = xl["settings"]["labels"]
    text = markdown(rows, labels, long["settings"]["steps"] if long else None)
    a.out.mkdir(parents=True, exist_ok=True)
    result = {**run_header(), "table": rows, "markdown": text, "multilingual": ml, "multilingual_long": long}
    result["crosslingual"] = xl
    result["temperature_dev"] = {
        temperature: metric_series(Path(run) / "metrics.jsonl", "dev/dev_cer")
        for temperature, _, run in (x.partition("=") for x in a.temperature_runs)
    }
    for temperature, curve in result["temperature_dev"].items():
        print(f"T={temperature}: dev CER " + ", ".join(f"{100 * cer:.1f}% at {step}" for step, cer in curve))
    (a.out / "multilingual.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(rows, labels, a.out / "multilingual_cer.png")
    print(text)
    print(f"wrote {a.out / 'multilingual.json'} and {a.out / 'multilingual_cer.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
