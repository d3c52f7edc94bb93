"""The low-label study: does BEST-RQ pre-training help CTC fine-tuning on 10% of the labels?

    PYTHONPATH=. python bench/bestrq_study.py [--pretrain-steps 300] [--finetune-steps 300]

Same fine-tuning budget for (a) from scratch, (b) from BEST-RQ with 1 codebook, (c) from BEST-RQ
with 16 codebooks (USM's multi-softmax), on 10% of the embedded corpus's labeled training data;
WER on the held-out-voice ``test`` set. Then the same three on FSDD with 10% of each speaker's labels
(pre-training on the synthetic corpus' unlabeled pool; FSDD is real human speech).
Pre-training uses the ``unlabeled`` pool (1 h, its own utterances). Writes
``bench/results/bestrq_study.json`` with every command and setting.

CPU budget: the codebooks have 1024 entries instead of the paper's 8192 (16 heads of 8192 classes
are 10x the tiny encoder's parameters and dominate a CPU step); the code dimension (16), the 4-frame
stacking, masking (p=0.01, 400 ms spans, N(0, 0.1) noise) are the paper's.
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


def sh(cmd: list[str]) -> float:
    print(f"$ {shlex.join(cmd)}", flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, check=True)
    return time.perf_counter() - start


def train(args: list[str]) -> tuple[list[str], float]:
    cmd = [sys.executable, "-m", "usmkit.train", *args, "trainer.progress=false"]
    return cmd, sh(cmd)


def wer(exp: str, test_set: str) -> dict:
    out = REPO / exp / f"eval_{test_set}.json"
    sh([sys.executable, "-m", "usmkit.evaluate", f"checkpoint={exp}", f"test_sets=[{test_set}]", f"output={out}"])
    s = json.loads(out.read_text())["sets"][test_set]
    return {"wer": s["wer"], "cer": s["cer"], "utterances": s["utterances"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pretrain-steps", type=int, default=300)
    ap.add_argument("--finetune-steps", type=int, default=300)
    ap.add_argument("--fsdd-steps", type=int, default=300)
    ap.add_argument("--codebook-size", type=int, default=1024)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--corpora", default="synth,fsdd", help="fine-tuning corpora to run")
    args = ap.parse_args()
    common = ["model=tiny", "optim.lr=2e-3", "optim.warmup_steps=50", "data.max_duration=100"]
    results: dict = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, CPU only",
        "command": "PYTHONPATH=. python bench/bestrq_study.py " + " ".join(sys.argv[1:]),
        "settings": vars(args) | {"common_overrides": common},
        "pretrain": {},
        "synth": {},
        "fsdd": {},
    }

    def save():
        RESULTS.write_text(json.dumps(results, indent=2))

    for n in (1, 16):
        exp = f"{EXP}/bestrq_cb{n}"
        cmd, secs = train(
            ["recipe=stage1", *common, f"task.bestrq.num_codebooks={n}", f"task.bestrq.codebook_size={args.codebook_size}",
             f"trainer.max_steps={args.pretrain_steps}", "trainer.eval_every=0", f"trainer.save_every={args.pretrain_steps}",
             f"trainer.exp_dir={exp}"]  # fmt: skip
        )
        rows = [json.loads(x) for x in (REPO / exp / "metrics.jsonl").read_text().splitlines()]
        last = [r for r in rows if "train/loss" in r][-1]
        results["pretrain"][f"cb{n}"] = {
            "command": shlex.join(cmd[2:]),
            "minutes": round(secs / 60, 1),
            "final_loss": last["train/loss"],
            "final_masked_acc_mean": last.get("train/acc_mean"),
            "final_code_perplexity_mean": last.get("train/perplexity_mean"),
            "final_pred_perplexity_mean": last.get("train/pred_perplexity_mean"),
        }
        save()

    for corpus, data_args, steps, test_set in (
        ("synth", ["data=synth"], args.finetune_steps, "test"),
        ("fsdd", ["data=fsdd", "data.manifest_dir=data/fsdd", "data.max_duration=60"], args.fsdd_steps, "test"),
    ):
        if corpus not in args.corpora.split(","):
            continue
        for name, init in (("scratch", None), ("bestrq_cb1", f"{EXP}/bestrq_cb1"), ("bestrq_cb16", f"{EXP}/bestrq_cb16")):
            exp = f"{EXP}/{corpus}_ft_{name}"
            cmd, secs = train(
                ["recipe=stage3_ctc", *common, *data_args, f"data.labeled_fraction={args.fraction}",
                 f"trainer.max_steps={steps}", f"trainer.eval_every={steps}", f"trainer.save_every={steps}",
                 f"trainer.exp_dir={exp}", *( [f"init_from={init}"] if init else [])]  # fmt: skip
            )
            results[corpus][name] = {"command": shlex.join(cmd[2:]), "minutes": round(secs / 60, 1), **wer(exp, test_set)}
            save()

    print(f"\n{'corpus':6s} {'init':12s} {'WER %':>7s} {'CER %':>7s}")
    for corpus in ("synth", "fsdd"):
        for name, r in results.get(corpus, {}).items():
            print(f"{corpus:6s} {name:12s} {100 * r['wer']:7.2f} {100 * r['cer']:7.2f}")
    save()


if __name__ == "__main__":
    main()
