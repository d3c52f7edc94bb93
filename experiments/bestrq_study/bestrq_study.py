"""The low-label study: does BEST-RQ pre-training help CTC fine-tuning on 10% of the labels?

    PYTHONPATH=. python experiments/bestrq_study/bestrq_study.py [--pretrain-steps 300] [--finetune-steps 300]

Same fine-tuning budget for (a) from scratch, (b) from BEST-RQ with 1 codebook, (c) from BEST-RQ
with 16 codebooks (USM's multi-softmax), on 10% of the embedded corpus's labeled training data;
WER on the held-out-voice ``test`` set. Then the same three on FSDD with 10% of each speaker's labels
(pre-training on the synthetic corpus' unlabeled pool; FSDD is real human speech).
Pre-training uses the ``unlabeled`` pool (1 h, its own utterances) or ``--pretrain-split train``
(the 3 h of training audio, labels unused). Each run is added to the ``runs`` list of
``experiments/bestrq_study/results/bestrq_study.json`` with every command and setting, and the pre-training curves
(masked accuracy, target and prediction code perplexity, masked fraction) to diagnose collapse.

On the CPU use ``--codebook-size 1024`` (16 heads of 8192 classes are 10x the tiny encoder's
parameters and dominate a CPU step); on a GPU run it with the paper's 16 x 8192. The code
dimension (16), the 4-frame stacking and the masking (p=0.01, 400 ms spans, N(0, 0.1) noise) are
the paper's.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time

from tools.results import REPO, result_path, run_header

RESULTS = result_path(__file__)
EXP = "exp/study"


def run_jobs(jobs: dict[str, list[list[str]]], parallel: bool, done=None) -> dict[str, float]:
    """Run each job's commands in order; jobs side by side when ``parallel`` (one GPU holds several
    tiny runs). ``done(name)`` is called as each job finishes (to save results early). Seconds per job."""
    for cmds in jobs.values():
        for cmd in cmds:
            print(f"$ {shlex.join(cmd)}", flush=True)

    def one(name: str) -> float:
        start = time.perf_counter()
        for cmd in jobs[name]:
            subprocess.run(cmd, cwd=REPO, check=True)
        if done is not None:
            done(name)
        return time.perf_counter() - start

    if not parallel:
        return {name: one(name) for name in jobs}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(jobs)) as pool:  # threads only wait on the subprocesses
        futures = {name: pool.submit(one, name) for name in jobs}
        return {name: f.result() for name, f in futures.items()}


def train_cmd(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "usmkit.cli.train", *args, "trainer.progress=false"]


def eval_cmd(exp: str, test_set: str, decode: str) -> list[str]:
    out = REPO / exp / f"eval_{test_set}_{decode}.json"
    return [sys.executable, "-m", "usmkit.cli.evaluate", f"checkpoint={exp}", f"test_sets=[{test_set}]",
            f"decode={decode}", f"output={out}"]  # fmt: skip


def read_wer(exp: str, test_set: str, decode: str) -> dict:
    s = json.loads((REPO / exp / f"eval_{test_set}_{decode}.json").read_text())["sets"][test_set]
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
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="another pre-training run, NAME:OVERRIDES (space-separated), e.g. "
        "'cb16_slow:task.bestrq.num_codebooks=16 optim.lr=5e-4 optim.warmup_steps=1000'",
    )
    args = ap.parse_args()
    common = ["model=tiny", f"optim.lr={args.lr}", "optim.warmup_steps=50", "data.max_duration=100",
              f"data.num_workers={args.workers}", *args.extra]  # fmt: skip
    results: dict = run_header(settings=vars(args) | {"common_overrides": common}, pretrain={}, synth={}, fsdd={})

    def save():
        """Add (or replace, for the same command) this run in the file's list of study runs."""
        doc = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
        runs = [r for r in doc.get("runs", []) if r.get("command") != results["command"]]
        doc["runs"] = [*runs, results]
        RESULTS.write_text(json.dumps(doc, indent=2))

    # Pre-training variants: the paper's two (1 and 16 codebooks) and any --variant NAME:OVERRIDES.
    variants = {"cb1": ["task.bestrq.num_codebooks=1"], "cb16": ["task.bestrq.num_codebooks=16"]}
    for v in args.variant:
        name, _, overrides = v.partition(":")
        variants[name] = overrides.split()
    pre_jobs = {
        name: [
            train_cmd(
                [
                    "recipe=stage1",
                    *common,
                    f"data.max_duration={args.pretrain_duration}",
                    f"data.train_split={args.pretrain_split}",
                    f"task.bestrq.codebook_size={args.codebook_size}",
                    f"trainer.max_steps={args.pretrain_steps}",
                    "trainer.eval_every=0",
                    f"trainer.save_every={args.pretrain_steps}",
                    f"trainer.exp_dir={EXP}/bestrq_{name}",
                    *overrides,
                ]
            )
        ]  # fmt: skip
        for name, overrides in variants.items()
    }
    keys = ("train/loss", "train/acc_mean", "train/perplexity_mean", "train/pred_perplexity_mean", "train/mask_frac")

    def pretrained(name: str) -> None:
        rows = curve(f"{EXP}/bestrq_{name}", keys)
        last = rows[-1]
        results["pretrain"][name] = {
            "command": shlex.join(pre_jobs[name][0][2:]),
            "final_loss": last["train/loss"],
            "final_masked_acc_mean": last.get("train/acc_mean"),
            "final_code_perplexity_mean": last.get("train/perplexity_mean"),
            "final_pred_perplexity_mean": last.get("train/pred_perplexity_mean"),
            "curve": rows,
        }
        save()

    for name, secs in run_jobs(pre_jobs, args.parallel, done=pretrained).items():
        results["pretrain"][name]["minutes"] = round(secs / 60, 1)
    save()

    decodes = args.decodes.split(",")
    for corpus, data_args, steps, test_set in (
        ("synth", ["data=synth"], args.finetune_steps, "test"),
        ("fsdd", ["data=fsdd", "data.manifest_dir=data/fsdd", "data.max_duration=60"], args.fsdd_steps, "test"),
    ):
        if corpus not in args.corpora.split(","):
            continue
        inits = {"scratch": None, **{f"bestrq_{name}": f"{EXP}/bestrq_{name}" for name in variants}}
        jobs = {}
        for name, init in inits.items():
            exp = f"{EXP}/{corpus}_ft_{name}"
            train = train_cmd(
                [
                    "recipe=stage3_ctc",
                    *common,
                    *data_args,
                    f"data.labeled_fraction={args.fraction}",
                    f"trainer.max_steps={steps}",
                    f"trainer.eval_every={steps}",
                    f"trainer.save_every={steps}",
                    f"trainer.exp_dir={exp}",
                    *([f"init_from={init}"] if init else []),
                ]
            )  # fmt: skip
            jobs[name] = [train, *(eval_cmd(exp, test_set, d) for d in decodes)]

        def finetuned(name: str, corpus=corpus, test_set=test_set, jobs=jobs) -> None:
            exp = f"{EXP}/{corpus}_ft_{name}"
            scores = {d: read_wer(exp, test_set, d) for d in decodes}
            results[corpus][name] = {"command": shlex.join(jobs[name][0][2:]), **scores[decodes[0]], "decodes": scores}
            save()

        for name, secs in run_jobs(jobs, args.parallel, done=finetuned).items():
            results[corpus][name]["minutes"] = round(secs / 60, 1)  # training and its evaluations
        save()

    print(f"\n{'corpus':6s} {'init':12s} {'WER %':>7s} {'CER %':>7s}")
    for corpus in ("synth", "fsdd"):
        for name, r in results.get(corpus, {}).items():
            print(f"{corpus:6s} {name:12s} {100 * r['wer']:7.2f} {100 * r['cer']:7.2f}  {r.get('decodes', '')}")
    save()


if __name__ == "__main__":
    main()
