"""The AN4 results table: every seed's row of the staged recipe's reports, and each table row's mean +- sd.

    PYTHONPATH=. python experiments/an4/table.py            # -> bench/results/an4.json, and the table printed

Each table row names the recipe reports it pools (``FILE`` or ``FILE#NAME`` for the report ``NAME`` of a study
file that holds several) and the variant it takes from them; every run of that variant is one seed's row
(single models only: ensembles are reported apart, in their reports). Per decoding, the summary gives the
mean and sample standard deviation over the runs of dev, test and test_8k WER, and how many runs and
pre-training seeds they span. The README's results table is this script's markdown. Scores nothing: it reads
what the recipe scored, so the test sets were scored once per configuration, by the runs themselves.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from combine_seeds import combine, read_report  # noqa: E402
from common import RESULTS as BENCH_RESULTS  # noqa: E402
from common import run_header, write_result  # noqa: E402

HERE = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Row:
    """One line of the table: ``label``, the reports it pools, the variant taken from them, and the decoding
    whose WER is the line's best (``best``; greedy is always shown beside it)."""

    key: str
    label: str
    reports: tuple[str, ...]
    variant: str
    best: str = "ctc_lexicon"


ROWS = (
    Row("scratch", "from scratch", ("an4_narrowband.json#default",), "scratch"),
    Row(
        "scratch_packed",
        "from scratch, on packed rows (`data.pack_to_frames=1024`)",
        ("an4_packed_cpu.json",),
        "scratch",
    ),
    Row(
        "cb1",
        "from a BEST-RQ encoder (1 codebook, 1000 steps on AN4 train audio)",
        ("an4_cb1_cpu.json", "an4_cb1_p1_cpu.json"),
        "cb1",
    ),
    Row(
        "las_ctc03", "joint CTC/LAS from that encoder, CTC weight 0.3", ("an4_las_cpu.json",), "las", "lexicon_rescore"
    ),
    Row(
        "las_ctc07",
        "joint CTC/LAS from that encoder, CTC weight 0.7",
        ("an4_las07_cpu.json",),
        "las",
        "lexicon_rescore",
    ),
    Row(
        "scratch_aug",
        "from scratch, waveform augmentation (narrowband, low-pass, reverb) from epoch 10",
        ("an4_narrowband.json#late",),
        "scratch",
    ),
    Row("scratch_10", "10% of the labels (7 speakers), from scratch", ("an4_labels10.json",), "scratch"),
    Row("cb1_10", "10% of the labels, from the BEST-RQ encoder", ("an4_labels10.json",), "cb1"),
    Row("scratch_30", "30% of the labels (20 speakers), from scratch", ("an4_labels30.json",), "scratch"),
    Row("cb1_30", "30% of the labels, from the BEST-RQ encoder", ("an4_labels30.json",), "cb1"),
)


def pooled(row: Row, results: Path) -> tuple[list[dict], list[dict]]:
    """(every run's rows of ``row``, each with its row and source, per-decoding summaries: ``combine``'s)."""
    reports = []
    for spec in row.reports:
        report = read_report(str(results / spec))
        reports.append({"rows": [{"row": row.key, "source": spec, **r} for r in report["rows"]]})
    runs, summary = combine(reports, row.variant)
    return runs, [{"row": row.key, **e} for e in summary]


def cell(entry: dict | None, split: str = "test_wer") -> str:
    if entry is None or f"{split}_mean" not in entry:
        return "-"
    return f"{100 * entry[f'{split}_mean']:.2f} +- {100 * entry[f'{split}_sd']:.2f}"


def markdown(rows: tuple[Row, ...], summaries: dict[str, list[dict]]) -> str:
    lines = [
        "| AN4 `tiny` model | test WER, best decoding | greedy | 8 kHz channel, best | runs |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        by = {e["decode"]: e for e in summaries[row.key]}
        best = by.get(row.best)
        runs = best["runs"] if best else 0
        seeds = [s for s in best["pretrain_seeds"] if s is not None] if best else []
        over = f"{runs}" + (
            f" ({len(seeds)} pre-training x {runs // len(seeds)} fine-tuning seeds)" if len(seeds) > 1 else ""
        )
        lines.append(
            f"| {row.label} | {cell(best)} | {cell(by.get('ctc_greedy'))} | {cell(best, 'test_8k_wer')} | {over} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=HERE, help="the folder of the recipe reports")
    ap.add_argument("--json", type=Path, default=BENCH_RESULTS / "an4.json")
    args = ap.parse_args()
    rows, summaries = [], {}
    for row in ROWS:
        runs, summaries[row.key] = pooled(row, args.results)
        rows += runs
    table = markdown(ROWS, summaries)
    print(table)
    result = run_header() | {
        "claim": "AN4 test WER of the staged recipe's rows, mean +- sd over seeds (CPU-trained runs); each run's row",
        "table": {row.key: {"label": row.label, "reports": list(row.reports), "best": row.best} for row in ROWS},
        "summary": [e for row in ROWS for e in summaries[row.key]],
        "rows": rows,
        "markdown": table,
    }
    print(f"wrote {write_result(args.json, result)}")


if __name__ == "__main__":
    main()
