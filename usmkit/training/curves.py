"""Pictures people would rather see than read: training curves from a run's ``metrics.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def metric_series(path: Path, key: str) -> list[tuple[int, float]]:
    """(step, value) of every row of a ``metrics.jsonl`` that holds ``key`` (e.g. ``dev/dev_cer``)."""
    return [(int(row["step"]), float(row[key])) for row in read_metrics(path) if key in row]


def plot_training_curves(runs: dict[str, Path], out_png: Path, title: str = "") -> Path:
    """One figure: train loss (left) and dev WER (right) against steps, one line per run.

    ``runs`` maps a label to a ``metrics.jsonl`` written by the trainer.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_wer) = plt.subplots(1, 2, figsize=(11, 4))
    for label, path in runs.items():
        rows = read_metrics(path)
        train = [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]
        dev = [(r["step"], 100 * r["dev/dev_wer"]) for r in rows if "dev/dev_wer" in r]
        if train:
            ax_loss.plot(*zip(*train, strict=True), label=label)
        if dev:
            ax_wer.plot(*zip(*dev, strict=True), marker="o", label=label)
    ax_loss.set(xlabel="step", ylabel="train loss", yscale="log", title="training loss")
    ax_wer.set(xlabel="step", ylabel="dev WER (%)", title="dev WER (greedy CTC)")
    for ax in (ax_loss, ax_wer):
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
