"""What changes BEST-RQ's help at 10% of AN4's labels (the frozen start: encoder frozen 500 steps, then at half the
learning rate): the pre-training pool (``experiments/an4/gpu_studies.sh synth_pool`` and ``synth_pool_seed1``: AN4 train audio
with and without the synthesizer's English corpus), the masking and the encoder's size (``masking_size`` and
``masking_more``). Combines the recipe folders those studies leave into one JSON (reports, each run's dev curve, each pre-training's last loss, accuracy
and code perplexity) and two plots. Scores nothing: it reads what the recipe scored.

    PYTHONPATH=. python experiments/an4/pretrain_study.py --runs syn=exp/g/syn an=exp/g/an s10=exp/g/s10 \
        syn100=exp/g/syn100 syn1=exp/g/syn1 an1=exp/g/an1 --base s10
    PYTHONPATH=. python experiments/an4/pretrain_study.py --name an4_masking_size --base s10 --base-of big=bigs \
        --keep experiments/an4/results/an4_synth_pool.json:s10,an1 --runs mk2=exp/g/mk2 ...

A folder without a report (its decoding was stopped) contributes its runs' dev curves (greedy, the trainer's own
evaluations) only. ``--base`` names the scratch folder the relative gains are taken against (``--base-of``: another
one for some folders, e.g. a larger encoder's own scratch runs). ``--keep FILE:NAMES`` takes those folders from an
earlier output of this script, for recipe folders that are no longer on this machine (a ``--runs`` folder of the
same name replaces its kept entry).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from narrowband import dev_curve, plot_dev_curves  # noqa: E402

from tools.results import run_header  # noqa: E402
from usmkit.training.curves import read_metrics  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PRETRAIN_KEYS = ("train/loss", "train/acc_mean", "train/perplexity_mean")


def folder_summary(out: Path) -> dict:
    """One recipe folder: its report (when decoded), each fine-tuning run's dev curve and last dev WER, and the
    pre-training's last loss, accuracy and code perplexity."""
    report_path = out / "an4.json"
    entry: dict = {"report": json.loads(report_path.read_text()) if report_path.is_file() else None}
    entry["dev_curves"], entry["pretrain"] = {}, {}
    for run in sorted((out / "runs").glob("*/metrics.jsonl")):
        name = run.parent.name
        if name.startswith("bestrq_"):
            entry["pretrain"][name] = {k: m[k] for m in read_metrics(run) for k in PRETRAIN_KEYS if k in m}
        elif not name.startswith("prep_"):
            entry["dev_curves"][name] = dev_curve(run)
    last_dev = [points[-1][1] for points in entry["dev_curves"].values() if points]
    if len(last_dev) >= 2:
        entry["dev_greedy_last_mean"], entry["dev_greedy_last_sd"] = (
            statistics.fmean(last_dev),
            statistics.stdev(last_dev),
        )
    return entry


def lexicon(entry: dict) -> dict | None:
    """The report's CTC + lexicon summary, or None without a report."""
    if entry["report"] is None:
        return None
    return next(s for s in entry["report"]["summary"] if s["decode"] == "ctc_lexicon")


def plot_test(folders: dict[str, dict], out_png: Path, title: str) -> None:
    """Test WER (CTC + lexicon) per run (dots) and their mean (bars), per training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    named = [(name, entry) for name, entry in folders.items() if entry["report"] is not None]
    fig, ax = plt.subplots(figsize=(2 + 1.3 * len(named), 4))
    for x, (_, entry) in enumerate(named):
        wers = [100 * r["test_wer"] for r in entry["report"]["rows"] if r["decode"] == "ctc_lexicon"]
        ax.bar(x, statistics.fmean(wers), color="tab:blue", alpha=0.5)
        ax.scatter([x] * len(wers), wers, color="black", s=12, zorder=3)
    ax.set_xticks(range(len(named)), [name for name, _ in named])
    ax.set(ylabel="test WER, CTC + lexicon (%)", title=f"AN4{title}")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", required=True, metavar="NAME=OUT", help="recipe --out folders")
    ap.add_argument("--base", required=True, help="the scratch folder's NAME")
    ap.add_argument("--base-of", nargs="*", default=[], metavar="NAME=BASE", help="another base for these folders")
    ap.add_argument("--keep", nargs="*", default=[], metavar="FILE:NAMES", help="folders of an earlier output")
    ap.add_argument("--title", default=": BEST-RQ pool with and without synthetic speech", help="the plots' title")
    ap.add_argument("--name", default="an4_synth_pool", help="the output files' name")
    ap.add_argument("--device", default=None, help="the machine the runs trained on (default: this one)")
    ap.add_argument("--command", default=None, help="the commands that trained them")
    a = ap.parse_args()
    folders = {}
    for item in a.keep:
        path, names = item.rsplit(":", 1)
        earlier = json.loads(Path(path).read_text())["folders"]
        folders |= {name: earlier[name] for name in names.split(",")}
    outs = dict(item.split("=", 1) for item in a.runs)
    folders |= {name: folder_summary(Path(out)) for name, out in outs.items()}
    base_of = dict(item.split("=", 1) for item in a.base_of)
    bases = set(base_of.values()) | {a.base}
    gains = {}  # against its base, for the folders fine-tuned on the same share of the labels as it
    for name, entry in folders.items():
        mine, base = lexicon(entry), folders[base_of.get(name, a.base)]
        same_share = mine is not None and entry["report"]["settings"]["labels"] == base["report"]["settings"]["labels"]
        if same_share and name not in bases:
            gains[name] = 1 - mine["test_wer_mean"] / lexicon(base)["test_wer_mean"]
    header = run_header(trained_on=a.device)
    result = {
        **header,
        **({"trained_by": a.command} if a.command else {}),
        "folders": folders,
        "relative_gain_vs_base": gains,
        "base_of": {name: base_of.get(name, a.base) for name in gains},
        "test_configurations": sum(e["report"]["test_configurations"] for e in folders.values() if e["report"]),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{a.name}.json").write_text(json.dumps(result, indent=1))
    plot_test(folders, RESULTS / f"{a.name}.png", a.title)
    curves = {f"{name} {run}": points for name, e in folders.items() for run, points in e["dev_curves"].items()}
    plot_dev_curves(curves, list(folders), RESULTS / f"{a.name}_curves.png", a.title)
    print(f"{'training':8s} {'labels':>6s} {'dev greedy':>14s} {'dev lexicon':>14s} {'test lexicon':>14s} {'gain':>6s}")
    for name, entry in folders.items():
        lex = lexicon(entry)
        labels = entry["report"]["settings"]["labels"] if entry["report"] else "-"
        dev_g = f"{100 * entry['dev_greedy_last_mean']:6.2f} +- {100 * entry['dev_greedy_last_sd']:5.2f}"
        dev_l = f"{100 * lex['dev_wer_mean']:6.2f} +- {100 * lex['dev_wer_sd']:5.2f}" if lex else "-"
        test = f"{100 * lex['test_wer_mean']:6.2f} +- {100 * lex['test_wer_sd']:5.2f}" if lex else "-"
        gain = f"{100 * gains[name]:5.1f}%" if name in gains else "-"
        print(f"{name:8s} {labels!s:>6s} {dev_g:>14s} {dev_l:>14s} {test:>14s} {gain:>6s}")
    print(f"{result['test_configurations']} configurations scored on test; wrote {RESULTS / (a.name + '.json')}")


if __name__ == "__main__":
    main()
