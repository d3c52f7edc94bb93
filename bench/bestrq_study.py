"""The low-label study: does BEST-RQ pre-training help CTC fine-tuning on 10% of the labels?

    PYTHONPATH=. python bench/bestrq_study.py [--pretrain-steps 300] [--finetune-steps 300]

Same fine-tuning budget for (a) from scratch, (b) from BEST-RQ with 1 codebook, (c) from BEST-RQ
with 16 codebooks (USM's multi-softmax), on 10% of the embedded corpus's labeled training data;
WER on the held-out-voice ``test`` set. Then the same three on FSDD with 10% of each speaker's labels
(pre-training on the synthetic corpus' unlabeled pool; FSDD is real human speech).
Pre-training uses the ``unlabeled`` pool (1 h, its own utterances) or ``--pretrain-split train``
(the 3 h of training audio, labels unused). Each run is added to the ``runs`` list of
``bench/results/bestrq_study.json`` with every command and setting, and the pre-training curves
(masked accuracy, target and prediction code perplexity, masked fraction) to diagnose collapse.

On the CPU use ``--codebook-size 1024`` (16 heads of 8192 classes are 10x the tiny encoder's
parameters and dominate a CPU step). On the lent GPU, ``bash bench/sweeps/bestrq_gpu.sh OUTDIR
--parallel ...`` builds the corpus there and runs the study with the paper's 16 x 8192. The code
dimension (16), the 4-frame stacking and the masking (p=0.01, 400 ms spans, N(0, 0.1) noise) are
the paper's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "bestrq_study.json"
EXP = "exp/study"


def sh_all(cmds: list[list[str]], parallel: bool) -> list[float]:
    """Run the commands (side by side when ``parallel``: one GPU holds several tiny runs); seconds each."""
    for cmd in cmds:
        print(f"$ {shlex.join(cmd)}", flush=True)
    if not parallel:
        out = []
        for cmd in cmds:
            start = time.perf_counter()
            subprocess.run(cmd, cwd=REPO, check=True)
            out.append(time.perf_counter() - start)
        return out
    start = time.perf_counter()
    procs = [subprocess.Popen(cmd, cwd=REPO) for cmd in cmds]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a run failed: exit codes {codes}")
    return [time.perf_counter() - start] * len(cmds)


def train_cmd(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "usmkit.train", *args, "trainer.progress=false"]


def wer(exp: str, test_set: str, decode: str) -> dict:
    out = REPO / exp / f"eval_{test_set}_{decode}.json"
    subprocess.run(
        [sys.executable, "-m", "usmkit.evaluate", f"checkpoint={exp}", f"test_sets=[{test_set}]", f"decode={decode}",
         f"output={out}"], cwd=REPO, check=True)  # fmt: skip
    s = json.loads(out.read_text())["sets"][test_set]
    entry = {"wer": s["wer"], "cer": s["cer"], "utterances": s["utterances"]}
    if "per_language" in s and "en" in s["per_language"]:
        entry["wer_en"] = s["per_language"]["en"]["wer"]
    return entry


def curve(exp: str, keys: tuple[str, ...], points: int = 8) -> list[dict]:
    """A few evenly spaced rows of the run's training metrics (to see collapse or progress over time)."""
    rows = [json.loads(x) for x in (REPO / exp / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "train/loss" in r]
    picked = rows[:: max(1, len(rows) // points)] + rows[-1:]
    return [{"step": r["step"], **{k: round(r[k], 4) for k in keys if k in r}} for r in picked]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pretrain-steps", type=int, default=300)
    ap.add_argument("--finetune-steps", type=int, default=300)
    ap.add_argument("--fsdd-steps", type=int, default=300)
    ap.add_argument("--codebook-size", type=int, default=1024)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--corpora", default="synth,fsdd", help="fine-tuning corpora to run")
    ap.add_argument("--pretrain-duration", type=float, default=100.0, help="seconds of audio per pre-training batch")
    ap.add_argument("--workers", type=int, default=1, help="loader workers per run")
    ap.add_argument(
        "--parallel", action="store_true", help="run the pre-trainings, then the fine-tunings, side by side"
    )
    ap.add_argument("--extra", nargs="*", default=[], help="more overrides for every run, e.g. model.dropout=0.0")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak learning rate of every run")
    ap.add_argument("--pretrain-split", default="unlabeled", help="audio split to pre-train on (labels unused)")
    ap.add_argument("--decodes", default="ctc_greedy", help="decode modes to score, e.g. ctc_greedy,ctc_lexicon")
    args = ap.parse_args()
    common = ["model=tiny", f"optim.lr={args.lr}", "optim.warmup_steps=50", "data.max_duration=100",
              f"data.num_workers={args.workers}", *args.extra]  # fmt: skip
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    results: dict = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": gpu or f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, CPU only",
        "command": "PYTHONPATH=. python bench/bestrq_study.py " + " ".join(sys.argv[1:]),
        "settings": vars(args) | {"common_overrides": common},
        "pretrain": {},
        "synth": {},
        "fsdd": {},
    }

    def save():
        """Add (or replace, for the same command) this run in the file's list of study runs."""
        doc = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
        runs = [r for r in doc.get("runs", []) if r.get("command") != results["command"]]
        doc["runs"] = [*runs, results]
        RESULTS.write_text(json.dumps(doc, indent=2))

    cmds = {
        n: train_cmd(
            [
                "recipe=stage1",
                *common,
                f"data.max_duration={args.pretrain_duration}",
                f"data.train_split={args.pretrain_split}",
                f"task.bestrq.num_codebooks={n}",
                f"task.bestrq.codebook_size={args.codebook_size}",
                f"trainer.max_steps={args.pretrain_steps}",
                "trainer.eval_every=0",
                f"trainer.save_every={args.pretrain_steps}",
                f"trainer.exp_dir={EXP}/bestrq_cb{n}",
            ]
        )  # fmt: skip
        for n in (1, 16)
    }
    seconds = sh_all(list(cmds.values()), args.parallel)
    keys = ("train/loss", "train/acc_mean", "train/perplexity_mean", "train/pred_perplexity_mean", "train/mask_frac")
    for (n, cmd), secs in zip(cmds.items(), seconds, strict=True):
        exp = f"{EXP}/bestrq_cb{n}"
        rows = curve(exp, keys)
        last = rows[-1]
        results["pretrain"][f"cb{n}"] = {
            "command": shlex.join(cmd[2:]),
            "minutes": round(secs / 60, 1),
            "final_loss": last["train/loss"],
            "final_masked_acc_mean": last.get("train/acc_mean"),
            "final_code_perplexity_mean": last.get("train/perplexity_mean"),
            "final_pred_perplexity_mean": last.get("train/pred_perplexity_mean"),
            "curve": rows,
        }
    save()

    for corpus, data_args, steps, test_set in (
        ("synth", ["data=synth"], args.finetune_steps, "test"),
        ("fsdd", ["data=fsdd", "data.manifest_dir=data/fsdd", "data.max_duration=60"], args.fsdd_steps, "test"),
    ):
        if corpus not in args.corpora.split(","):
            continue
        inits = {"scratch": None, "bestrq_cb1": f"{EXP}/bestrq_cb1", "bestrq_cb16": f"{EXP}/bestrq_cb16"}
        cmds = {
            name: train_cmd(
                [
                    "recipe=stage3_ctc",
                    *common,
                    *data_args,
                    f"data.labeled_fraction={args.fraction}",
                    f"trainer.max_steps={steps}",
                    f"trainer.eval_every={steps}",
                    f"trainer.save_every={steps}",
                    f"trainer.exp_dir={EXP}/{corpus}_ft_{name}",
                    *([f"init_from={init}"] if init else []),
                ]
            )  # fmt: skip
            for name, init in inits.items()
        }
        seconds = sh_all(list(cmds.values()), args.parallel)
        for (name, cmd), secs in zip(cmds.items(), seconds, strict=True):
            exp = f"{EXP}/{corpus}_ft_{name}"
            scores = {d: wer(exp, test_set, d) for d in args.decodes.split(",")}
            first = scores[args.decodes.split(",")[0]]
            results[corpus][name] = {"command": shlex.join(cmd[2:]), "minutes": round(secs / 60, 1), **first,
                                     "decodes": scores}  # fmt: skip
        save()

    print(f"\n{'corpus':6s} {'init':12s} {'WER %':>7s} {'CER %':>7s}")
    for corpus in ("synth", "fsdd"):
        for name, r in results.get(corpus, {}).items():
            print(f"{corpus:6s} {name:12s} {100 * r['wer']:7.2f} {100 * r['cer']:7.2f}  {r.get('decodes', '')}")
    save()


if __name__ == "__main__":
    main()
