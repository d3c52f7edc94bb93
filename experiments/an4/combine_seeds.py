"""One row's runs from several AN4 recipe reports (e.g. one BEST-RQ pre-training seed each), as mean +- sd.

    PYTHONPATH=. python experiments/an4/combine_seeds.py --variant cb1 \
        experiments/an4/results/an4_cb1_cpu.json experiments/an4/results/an4_cb1_p1_cpu.json \
        --json experiments/an4/results/an4_cb1_2pretrain.json

Each report's rows of ``--variant`` (single models; ensembles are reported apart) are pooled per decoding; the
summary gives, per split, the mean and sample standard deviation over all of them, and how many runs and
pre-training seeds they span. Scores nothing: it reads what the recipe scored.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.results import run_header, write_result  # noqa: E402

SPLITS = ("dev_wer", "test_wer", "test_8k_wer")


def read_report(spec: str) -> dict:
    """A recipe report: ``FILE``, or ``FILE#NAME`` for the report ``NAME`` of a study file that holds several
    (``reports``, or ``folders`` with a ``report`` each: ``pretrain_study.py``'s)."""
    path, _, name = spec.partition("#")
    data = json.loads(Path(path).read_text())
    if not name:
        return data
    return data["reports"][name] if "reports" in data else data["folders"][name]["report"]


def combine(reports: list[dict], variant: str) -> tuple[list[dict], list[dict]]:
    """(rows of ``variant`` from every report, per-decoding summaries)."""
    rows = [r for report in reports for r in report["rows"] if r["variant"] == variant]
    if not rows:
        raise SystemExit(f"no rows of variant {variant!r} in the reports")
    summary = []
    for decode in sorted({r["decode"] for r in rows}):
        mine = [r for r in rows if r["decode"] == decode]
        entry = {"variant": variant, "decode": decode, "runs": len(mine),
                 "pretrain_seeds": sorted({r.get("pretrain_seed") for r in mine}, key=str)}  # fmt: skip
        for split in SPLITS:
            values = [r[split] for r in mine if r.get(split) is not None]
            if len(values) >= 2:
                entry[f"{split}_mean"] = statistics.mean(values)
                entry[f"{split}_sd"] = statistics.stdev(values)
        summary.append(entry)
    return rows, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument("--variant", required=True)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    rows, summary = combine([json.loads(p.read_text()) for p in args.reports], args.variant)
    print(f"{'decode':12s} {'runs':>4s} " + " ".join(f"{s:>16s}" for s in SPLITS))
    for e in summary:
        cells = [
            f"{100 * e[f'{s}_mean']:6.2f} +- {100 * e[f'{s}_sd']:5.2f}" if f"{s}_mean" in e else "-" for s in SPLITS
        ]
        print(f"{e['decode']:12s} {e['runs']:4d} " + " ".join(f"{c:>16s}" for c in cells))
    result = run_header(reports=[str(p) for p in args.reports]) | {"summary": summary, "rows": rows}
    print(f"wrote {write_result(args.json, result)}")


if __name__ == "__main__":
    main()
