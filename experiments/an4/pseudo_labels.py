"""Pseudo-labels on AN4 at 10% of the labels: a teacher fine-tuned on the speakers of
``recipes/an4/lists/train_10.txt`` transcribes the other 59 speakers' training audio (their labels held back),
the confidence threshold is chosen on those held-back labels (the calibration plot), and students are
fine-tuned on the 10% plus the kept pseudo-labels, against the teacher's own 10%-only runs.

    python recipes/an4/run.py --labels 10 --variants scratch,cb1 --seeds 0,1,2 \
        --stage1 cb1=exp/an4_cb1/runs/bestrq_cb1_p0 --device cpu --jobs 1 --out exp/an4_lc10 --report exp/an4_lc10/an4.json
    PYTHONPATH=. python experiments/an4/pseudo_labels.py --teacher-report exp/an4_lc10/an4.json \
        --stage1 cb1=exp/an4_cb1/runs/bestrq_cb1_p0 --out exp/an4_lc10pl

Every step is a usmkit command (printed); a step whose output exists is skipped, so a rerun goes on.

- The teacher: of the report's single models, the one with the lowest dev WER with the lexicon (test is not
  looked at), decoding with its dev-chosen lexicon settings.
- Calibration: ``python -m usmkit.cli.pseudo_label ... calibrate=true`` on the held-back speakers' cuts.
- The threshold: the lowest whose kept pseudo-labels have a WER of at most ``--max-wer`` on those labels.
- Students: the recipe with ``--labels 10`` and ``data.train_split=train_10pl`` (the 10% and the kept
  pseudo-labels, pooled by ``python -m usmkit.cli.prepare pool labeled=true``), the teacher's variant and
  start, ``--seeds``; decoded and scored by the recipe like every row.

Writes ``experiments/an4/results/an4_pseudo_labels.json`` (+ the calibration plot as ``.png``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.results import run_header  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
REST = ROOT / "recipes" / "an4" / "lists" / "train_10_rest.txt"


def run(cmd: list[str]) -> None:
    print("$", shlex.join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def teacher_of(report: dict) -> dict:
    """The single model with the lowest dev WER decoded with the lexicon, and its lexicon settings."""
    rows = [r for r in report["rows"] if r["decode"] == "ctc_lexicon"]
    return min(rows, key=lambda r: (r["dev_wer"], r["run"]))


def choose_threshold(points: list[dict], max_wer: float) -> dict:
    """The lowest threshold whose kept pseudo-labels score at most ``max_wer``; else the highest kept one."""
    scored = [p for p in points if p["wer"] is not None and p["kept"] > 0]
    good = [p for p in scored if p["wer"] <= max_wer]
    return min(good, key=lambda p: p["threshold"]) if good else max(scored, key=lambda p: p["threshold"])


def summary(report: dict, variant: str) -> dict:
    """The recipe report's mean +- sd test WER of ``variant``, per decoding."""
    return {row["decode"]: {"runs": row["runs"], "test_wer_mean": row["test_wer_mean"], "test_wer_sd": row["test_wer_sd"]}
            for row in report["summary"] if row["variant"] == variant}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher-report", type=Path, required=True, help="the --labels 10 recipe report")
    ap.add_argument("--stage1", default="", help="the recipe's --stage1 for the students (the teacher's start)")
    ap.add_argument("--out", type=Path, default=Path("exp/an4_lc10pl"))
    ap.add_argument("--max-wer", type=float, default=0.15)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--an4", default="", help="the AN4 corpus folder (default $USMKIT_CORPORA/an4)")
    ap.add_argument("--calibrate-only", action="store_true", help="stop after the pseudo-labels and their pool")
    a = ap.parse_args()
    py = sys.executable
    report = json.loads(a.teacher_report.read_text())
    teacher_row = teacher_of(report)
    runs_dir = Path(report["settings"]["runs"] or Path(report["settings"]["out"]) / "runs")
    teacher = runs_dir / teacher_row["run"]
    lexicon = [f"lexicon.{k}={v}" for k, v in teacher_row["lexicon"].items()]
    decoding = ["decode=ctc_lexicon", *lexicon, f"device={a.device}", "progress=false"]
    print(f"teacher {teacher} (dev WER {100 * teacher_row['dev_wer']:.2f}% with the lexicon)", flush=True)

    recipe = [py, "recipes/an4/run.py", "--labels", "10", "--variants", teacher_row["variant"], "--seeds", a.seeds,
              "--device", a.device, "--jobs", "1", "--ensembles", "", "--save-encoder", "", "--out", str(a.out),
              "--report", str(a.out / "an4.json"), "--extra", "data.train_split=train_10pl"]  # fmt: skip
    recipe += ["--an4", a.an4] if a.an4 else []
    recipe += ["--stage1", a.stage1] if a.stage1 else []
    run([*recipe[:2], "prepare", *recipe[2:]])  # the AN4 splits (train_10 too) in OUT/data/an4
    data = a.out / "data" / "an4"
    if not (data / "an4_cuts_train_10_rest.jsonl.gz").is_file():
        run([py, "-m", "usmkit.cli.prepare", "subset", f"src={data}", "split=train", f"speakers={REST}",
             "name=train_10_rest"])  # fmt: skip
    held_back = data / "an4_cuts_train_10_rest.jsonl.gz"
    calib_dir = a.out / "calibration"
    calib_json = calib_dir / "pseudo_calibration_train.json"
    if not calib_json.is_file():
        run([py, "-m", "usmkit.cli.pseudo_label", f"checkpoint={teacher}", f"inputs={held_back}", f"out={calib_dir}",
             "calibrate=true", *decoding])  # fmt: skip
    points = json.loads(calib_json.read_text())["points"]
    chosen = choose_threshold(points, a.max_wer)
    print(f"threshold {chosen['threshold']}: keeps {chosen['kept']} utterances, pseudo-label WER {chosen['wer']:.3f}")
    pseudo = a.out / "pseudo"
    if not (pseudo / "pseudo_cuts_train.jsonl.gz").is_file():
        run([py, "-m", "usmkit.cli.pseudo_label", f"checkpoint={teacher}", f"inputs={held_back}", f"out={pseudo}",
             f"threshold={chosen['threshold']}", *decoding])  # fmt: skip
    if not (data / "an4_cuts_train_10pl.jsonl.gz").is_file():
        run([py, "-m", "usmkit.cli.prepare", "pool", f"out={data}", "corpus=an4", "split=train_10pl", "labeled=true",
             f"inputs=[{data}:an4:train_10,{pseudo}:pseudo:train]"])  # fmt: skip
    if a.calibrate_only:
        return
    run([*recipe[:2], "train", "decode", "report", *recipe[2:]])

    students = json.loads((a.out / "an4.json").read_text())
    result = {
        **run_header(),
        "teacher": {
            "run": str(teacher),
            "variant": teacher_row["variant"],
            "dev_wer": teacher_row["dev_wer"],
            "lexicon": teacher_row["lexicon"],
        },  # fmt: skip
        "held_back": {"speakers_list": str(REST.relative_to(ROOT)), "cuts": str(held_back)},
        "calibration": points,
        "max_wer": a.max_wer,
        "threshold": chosen,
        "students": {"report": students, "summary": summary(students, teacher_row["variant"])},
        "teacher_runs": {"variant": teacher_row["variant"], "summary": summary(report, teacher_row["variant"])},
        "test_configurations": students["test_configurations"],
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "an4_pseudo_labels.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    shutil.copy(calib_json.with_suffix(".png"), out.with_suffix(".png"))
    for name, s in (("10% only", result["teacher_runs"]["summary"]), ("10% + pseudo", result["students"]["summary"])):
        for decode, v in s.items():
            sd = f" +- {100 * v['test_wer_sd']:.2f}" if v["test_wer_sd"] is not None else ""
            print(f"{name:14s} {decode:12s} {v['runs']} runs  test WER {100 * v['test_wer_mean']:.2f}{sd}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
