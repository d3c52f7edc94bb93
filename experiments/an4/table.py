"""The AN4 results table: every seed's row of the staged recipe's reports, and each table row's mean +- sd.

    PYTHONPATH=. python experiments/an4/table.py            # -> experiments/an4/results/an4_table.json, and the table printed

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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from combine_seeds import combine, read_report  # noqa: E402

from tools.results import run_header, write_result  # noqa: E402

HERE = Path(__file__).resolve().parent / "results"
# The GPU studies' files (experiments/an4/gpu_studies.sh STUDY):
GPU = "an4_gpu_pool17.json"  # pool17, pool17_more: the rows trained on one H200
COPIES = "an4_narrowband_copies.json"  # narrowband, narrowband4000, las4000 (experiments/an4/narrowband.py)
SYNTH = "an4_synth_pool.json"  # synth_pool, synth_pool_seed1: the pool at 10% (experiments/an4/pretrain_study.py)
MASKING = "an4_masking_size.json"  # masking_size, masking_more: the masking and the encoder's size at 10%
FROZEN = "frozen 500 steps, then at half the learning rate"


@dataclass(frozen=True)
class Row:
    """One line of the table: ``label``, the reports it pools, the variant taken from them, the decoding
    whose WER is the line's best (``best``; greedy is always shown beside it), and which of the README's short
    tables shows it (``group``, a key of ``GROUPS``, under the label ``short``; every row is in the JSON)."""

    key: str
    label: str
    reports: tuple[str, ...]
    variant: str
    best: str = "ctc_lexicon"
    group: str = ""
    short: str = ""


# The README's tables, one per training budget and machine: (key, heading).
GROUPS = (
    ("cpu2000", "2000 steps, 2 CPU cores, all labels"),
    ("gpu2000", "2000 steps, one H200, all labels"),
    ("cpu_longer", "Longer training, 2 CPU cores"),
    ("gpu4000", "4000 steps, one H200"),
    ("cpu_fewer", "Fewer labels, 2000 steps, 2 CPU cores"),
)


ROWS = (
    Row("scratch", "from scratch", ("an4_narrowband.json#default",), "scratch", group="cpu2000", short="from scratch"),
    Row(
        "scratch_packed",
        "from scratch, on packed rows (`data.pack_to_frames=1024`)",
        ("an4_packed_cpu.json",),
        "scratch",
    ),
    Row(
        "cb1",
        "from a BEST-RQ encoder (the first: 1 codebook, 1000 x 100 s on AN4 train audio, 0.7 h)",
        ("an4_cb1_cpu.json", "an4_cb1_p1_cpu.json"),
        "cb1",
        group="cpu2000",
        short="BEST-RQ encoder A",
    ),
    Row(
        "cb1_pool17",
        "from a second BEST-RQ encoder, pre-trained longer on more audio (3000 x 200 s on AN4 + Kathleen, 1.7 h; H200)",
        (f"{GPU}#cb1",),
        "cb1",
        group="gpu2000",
        short="BEST-RQ encoder B",
    ),
    Row(
        "las_ctc03",
        "joint CTC/LAS from the first encoder, CTC weight 0.3",
        ("an4_las_cpu.json",),
        "las",
        "lexicon_rescore",
    ),
    Row(
        "las_ctc07",
        "joint CTC/LAS from the first encoder, CTC weight 0.7",
        ("an4_las07_cpu.json",),
        "las",
        "lexicon_rescore",
        group="cpu2000",
        short="joint CTC/LAS from encoder A, CTC weight 0.7",
    ),
    Row(
        "las_pool17",
        "joint CTC/LAS from the second encoder, CTC weight 0.7 (H200)",
        (f"{GPU}#las",),
        "las",
        "lexicon_rescore",
    ),
    Row(
        "las_pool17_sp",
        "joint CTC/LAS from the second encoder, CTC weight 0.7, speed perturbation 0.9/1.0/1.1 (H200)",
        (f"{GPU}#lsp",),
        "las",
        "lexicon_rescore",
        group="gpu2000",
        short="joint CTC/LAS from B, speed perturbation",
    ),
    Row("scratch_h200", "from scratch (H200)", (f"{COPIES}#default",), "scratch"),
    Row(
        "scratch_4000",
        "from scratch, 4000 steps",
        ("an4_steps4000_cpu.json",),
        "scratch",
        group="cpu_longer",
        short="from scratch, 4000 steps",
    ),
    Row(
        "scratch_6000",
        "from scratch, 6000 steps",
        ("an4_steps6000_cpu.json",),
        "scratch",
        group="cpu_longer",
        short="from scratch, 6000 steps",
    ),
    Row("scratch_4000_h200", "from scratch, 4000 steps (H200)", (f"{COPIES}#steps4000",), "scratch"),
    Row(
        "scratch_copies_h200",
        "from scratch, on train and its 8 kHz-channel copy (`--narrowband-copies`; H200)",
        (f"{COPIES}#copies",),
        "scratch",
    ),
    Row(
        "scratch_copies_4000_h200",
        "from scratch, on train and its 8 kHz-channel copy (`--narrowband-copies`), 4000 steps (H200)",
        (f"{COPIES}#copies4000",),
        "scratch",
    ),
    Row(
        "scratch_copies_6000",
        "from scratch, on train and its 8 kHz-channel copy (`--narrowband-copies`), 6000 steps",
        ("an4_copies6000_cpu.json#copies6000",),
        "scratch",
        group="cpu_longer",
        short="from scratch + 8 kHz copies, 6000 steps",
    ),
    Row(
        "las_h200",
        "joint CTC/LAS from an encoder of the first kind, CTC weight 0.7 (H200)",
        (f"{COPIES}#las",),
        "las",
        "lexicon_rescore",
    ),
    Row(
        "las_4000_h200",
        "joint CTC/LAS from an encoder of the first kind, 4000 steps (H200)",
        (f"{COPIES}#las4000",),
        "las",
        "lexicon_rescore",
    ),
    Row(
        "las_copies_h200",
        "joint CTC/LAS from an encoder of the first kind, with the 8 kHz copies (H200)",
        (f"{COPIES}#las_copies",),
        "las",
        "lexicon_rescore",
    ),
    Row(
        "las_copies_4000_h200",
        "joint CTC/LAS from an encoder of the first kind, with the 8 kHz copies, 4000 steps (H200)",
        (f"{COPIES}#las_copies4000",),
        "las",
        "lexicon_rescore",
        group="gpu4000",
        short="joint CTC/LAS from an A-type encoder + 8 kHz copies",
    ),
    Row(
        "scratch_otf",
        "from scratch, features computed on the fly (the augmentation's feature path, no augmentation)",
        ("an4_features_otf_cpu.json",),
        "scratch",
        group="cpu2000",
        short="from scratch, features computed on the fly",
    ),
    Row(
        "scratch_aug",
        "from scratch, waveform augmentation (narrowband, low-pass, reverb) from epoch 10",
        ("an4_narrowband.json#late",),
        "scratch",
        group="cpu2000",
        short="from scratch, waveform augmentation from epoch 10",
    ),
    Row(
        "scratch_10",
        "10% of the labels (7 speakers), from scratch",
        ("an4_labels10.json",),
        "scratch",
        group="cpu_fewer",
        short="10% of the labels (7 speakers), from scratch",
    ),
    Row("scratch_10_h200", "10% of the labels, from scratch (H200)", (f"{GPU}#s10",), "scratch"),
    Row(
        "scratch_10_h200_fp32",
        "10% of the labels, from scratch, fp32 (`trainer.precision=fp32`; H200)",
        ("an4_labels10_fp32_h200.json",),
        "scratch",
    ),
    Row("cb1_10", "10% of the labels, from the first encoder", ("an4_labels10.json",), "cb1"),
    Row("cb1p_10", "10% of the labels, from the second encoder (H200)", (f"{GPU}#l10",), "cb1"),
    Row(
        "cb1p_10_frozen_cpu",
        "10% of the labels, from the second encoder, frozen 500 steps, then at half the learning rate",
        ("an4_labels10_frozen_cpu.json",),
        "cb1",
        group="cpu_fewer",
        short="10%, encoder B, frozen 500 steps, then lr / 2",
    ),
    Row(
        "cb1p_10_frozen",
        "10% of the labels, from the second encoder, frozen 500 steps, then at half the learning rate (H200)",
        (f"{GPU}#l10f",),
        "cb1",
    ),
    Row(
        "cb1p_10_frozen1000",
        "10% of the labels, from the second encoder, frozen 1000 steps, then at a quarter (H200)",
        (f"{GPU}#l10g",),
        "cb1",
    ),
    Row(
        "cb1_10_an4_frozen",
        f"10% of the labels, BEST-RQ 1000 x 100 s on AN4 train audio, {FROZEN} (H200)",
        (f"{SYNTH}#an", f"{SYNTH}#an1"),
        "cb1",
    ),
    Row(
        "cb1_10_synth_frozen",
        f"10% of the labels, BEST-RQ on AN4 train audio + 7.8 h of synthetic English, {FROZEN} (H200)",
        (f"{SYNTH}#syn", f"{SYNTH}#syn1"),
        "cb1",
    ),
    Row(
        "cb1_synth",
        "from the BEST-RQ encoder of AN4 train audio + synthetic English (H200)",
        (f"{SYNTH}#syn100",),
        "cb1",
    ),
    Row(
        "cb1_10_mask05",
        f"10% of the labels, BEST-RQ on AN4 train audio, masked spans from 0.5% of the frames, {FROZEN} (H200)",
        (f"{MASKING}#mk05",),
        "cb1",
    ),
    Row(
        "cb1_10_mask2",
        f"10% of the labels, BEST-RQ on AN4 train audio, masked spans from 2% of the frames, {FROZEN} (H200)",
        (f"{MASKING}#mk2", f"{MASKING}#mk21"),
        "cb1",
    ),
    Row(
        "cb1_10_mask4",
        f"10% of the labels, BEST-RQ on AN4 train audio, masked spans from 4% of the frames, {FROZEN} (H200)",
        (f"{MASKING}#mk4",),
        "cb1",
    ),
    Row(
        "cb1_10_d256",
        f"10% of the labels, a d256 x 12 encoder (20M), BEST-RQ on AN4 train audio, {FROZEN} (H200)",
        (f"{MASKING}#big",),
        "cb1",
    ),
    Row(
        "scratch_10_d256",
        "10% of the labels, a d256 x 12 encoder (20M), from scratch (H200)",
        (f"{MASKING}#bigs",),
        "scratch",
    ),
    Row(
        "scratch_30",
        "30% of the labels (20 speakers), from scratch",
        ("an4_labels30.json",),
        "scratch",
        group="cpu_fewer",
        short="30% of the labels (20 speakers), from scratch",
    ),
    Row(
        "cb1_30",
        "30% of the labels, from the first encoder",
        ("an4_labels30.json",),
        "cb1",
        group="cpu_fewer",
        short="30%, encoder A",
    ),
    Row("cb1p_30", "30% of the labels, from the second encoder (H200)", (f"{GPU}#l30",), "cb1"),
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
    """The README's tables: one per ``GROUPS`` entry, under its heading."""
    lines = []
    for key, heading in GROUPS:
        lines += ["", f"**{heading}**", ""] + group_table([r for r in rows if r.group == key], summaries)
    return "\n".join(lines[1:])


def group_table(rows: list[Row], summaries: dict[str, list[dict]]) -> list[str]:
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
            f"| {row.short} | {cell(best)} | {cell(by.get('ctc_greedy'))} | {cell(best, 'test_8k_wer')} | {over} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=HERE, help="the folder of the recipe reports")
    ap.add_argument("--json", type=Path, default=HERE / "an4_table.json")
    args = ap.parse_args()
    rows, summaries = [], {}
    for row in ROWS:
        runs, summaries[row.key] = pooled(row, args.results)
        rows += runs
    table = markdown(ROWS, summaries)
    print(table)
    result = run_header() | {
        "claim": "AN4 test WER of the staged recipe's rows, mean +- sd over seeds (trained on 2 CPU cores, or on one H200"
        " where the label says so); each run's row",
        "table": {row.key: {"label": row.label, "reports": list(row.reports), "best": row.best} for row in ROWS},
        "summary": [e for row in ROWS for e in summaries[row.key]],
        "rows": rows,
        "markdown": table,
    }
    print(f"wrote {write_result(args.json, result)}")


if __name__ == "__main__":
    main()
