"""The USM recipe on CMU AN4, one GPU, every stage a usmkit command (printed as it runs).

    python recipes/an4/run.py [--an4 DIR] [--kathleen DIR] [--out DIR] [--model small] \\
        [--variants scratch,cb1,cb16,las] [--pretrain-steps 1500] [--finetune-steps 1500]

Stages (each line below is one or more ``python -m usmkit...`` commands):

0. data: the AN4 and Kathleen recipes; an unlabeled pool = AN4 train audio + Kathleen's training
   prompts' audio (``usmkit.data.recipes.pool``, split ``pool`` of ``data/an4``); never test audio.
1. BEST-RQ (``recipe=stage1``) on the pool with 1 and with 16 codebooks, side by side on the GPU.
2. Fine-tuning on AN4 ``train`` labels only (``recipe=stage3_ctc``, ``data=an4``): from scratch,
   from each BEST-RQ encoder (``init_from``), and joint CTC/LAS from the 16-codebook encoder;
   equal fine-tuning budgets, side by side.
3. Decoding: CTC greedy; CTC + lexicon and word n-gram built from AN4 train text only (LM order,
   weight and word score tuned on ``dev`` with ``bench/lexicon_tuning.py``); LAS rescoring of the
   CTC n-best for the LAS model. ``test`` is scored once per final configuration.

Writes ``OUT/an4.json`` (every row: model, decoding, dev and test WER/CER, the command, minutes) and
prints the table last. The corpus folders may be the originals or copies from
``python -m usmkit.data.recipes.pack`` (how the audio travels to a GPU machine).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from common import run_header, write_result  # noqa: E402

PY = sys.executable
T0 = time.time()


def sh(cmd: list[str], log: Path, env: dict | None = None) -> float:
    """Run ``cmd`` (logged to ``log``), raise on failure; returns minutes."""
    print(f"[{(time.time() - T0) / 60:5.1f} min] $ {shlex.join(cmd)}", flush=True)
    start = time.time()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        tail = log.read_text().splitlines()[-15:]
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n" + "\n".join(tail))
    return (time.time() - start) / 60


def parallel(jobs: dict[str, tuple[list[str], Path]]) -> dict[str, float]:
    with cf.ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(sh, cmd, log) for name, (cmd, log) in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


def evaluate(exp: Path, split: str, decode: str, extra: list[str], logs: Path) -> dict:
    out = exp / f"eval_{split}_{decode}.json"
    cmd = [PY, "-m", "usmkit.evaluate", f"checkpoint={exp}", f"test_sets=[{split}]", f"decode={decode}", *extra]
    sh([*cmd, f"output={out}"], logs / f"{exp.name}_{split}_{decode}.log")
    s = json.loads(out.read_text())["sets"][split]
    return {"wer": s["wer"], "cer": s["cer"], "command": shlex.join(cmd)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--an4", default=str(ROOT.parent / "shared/data/an4"))
    ap.add_argument("--kathleen", default=str(ROOT.parent / "shared/data/kathleen"))
    ap.add_argument("--out", default=os.environ.get("OUT", "exp/an4_recipe"))
    ap.add_argument("--data", default="data")
    ap.add_argument("--exp", default="exp/an4")
    ap.add_argument("--model", default="small")
    ap.add_argument("--variants", default="scratch,cb1,cb16,las")
    ap.add_argument("--pretrain-steps", type=int, default=1500)
    ap.add_argument("--finetune-steps", type=int, default=1500)
    ap.add_argument("--finetune-lr", type=float, default=1e-3)
    ap.add_argument("--pretrain-lr", type=float, default=1e-3)
    ap.add_argument("--max-duration", type=float, default=150.0)
    ap.add_argument("--vocab-size", type=int, default=300)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--workers", type=int, default=3, help="loader workers per training run")
    ap.add_argument(
        "--stored-features",
        action="store_true",
        help="fine-tune on stored features without speed perturbation (GPU-bound steps instead of loader-bound)",
    )
    ap.add_argument("--extra", default="", help="more overrides for every fine-tuning run")
    ap.add_argument("--pretrain-extra", default="", help="more overrides for every BEST-RQ run")
    args = ap.parse_args()
    out, data, exp = Path(args.out), Path(args.data), Path(args.exp)
    logs = out / "logs"
    for d in (out, logs, exp):
        d.mkdir(parents=True, exist_ok=True)
    variants = args.variants.split(",")
    an4 = data / "an4"
    common = [f"model={args.model}", f"trainer.device={args.device}", "trainer.progress=false", "trainer.log_every=50"]

    # 0. data
    minutes = {
        "data": sh(
            [PY, "-m", "usmkit.data.recipes.an4", f"out={an4}", f"corpus_dir={args.an4}", "num_jobs=8"],
            logs / "an4.log",
        )
    }
    minutes["data"] += sh(
        [
            PY,
            "-m",
            "usmkit.data.recipes.kathleen",
            f"out={data / 'kathleen'}",
            f"corpus_dir={args.kathleen}",
            "num_jobs=8",
        ],
        logs / "kathleen.log",
    )
    pool = [f"inputs=[{an4}:an4:unlabeled,{data / 'kathleen'}:kathleen:unlabeled]"]
    minutes["data"] += sh(
        [PY, "-m", "usmkit.data.recipes.pool", f"out={an4}", "corpus=an4", "split=pool", *pool], logs / "pool.log"
    )
    # the tokenizer (AN4 train text) and the fine-tuning statistics once, before runs share them
    ft = [
        "recipe=stage3_ctc", "data=an4", f"data.manifest_dir={an4}", *common, f"vocab_size={args.vocab_size}", f"data.max_duration={args.max_duration}",
        f"data.num_workers={args.workers}", f"trainer.max_steps={args.finetune_steps}", f"optim.lr={args.finetune_lr}",
        "optim.warmup_steps=300", "task.inter_ctc_weight=0.3", f"trainer.eval_every={max(1, args.finetune_steps // 5)}",
        f"trainer.save_every={max(1, args.finetune_steps // 5)}", "trainer.keep_last=1", *args.extra.split(),
    ]  # fmt: skip
    if args.stored_features:
        ft += ["data.features.precomputed=true", "data.speed_perturb=[]"]
    pt = [
        "recipe=stage1", "data=an4", f"data.manifest_dir={an4}", *common, "data.train_split=pool", "data.features.precomputed=true",
        "data.speed_perturb=[]", f"data.max_duration={args.max_duration}", f"data.num_workers={args.workers}",
        f"trainer.max_steps={args.pretrain_steps}", f"optim.lr={args.pretrain_lr}", "optim.warmup_steps=500",
        f"trainer.eval_every={args.pretrain_steps}", f"trainer.save_every={args.pretrain_steps}", "trainer.keep_last=1", *args.pretrain_extra.split(),
    ]  # fmt: skip
    # one after the other: the feature statistics (of AN4 train, computed by the first) are the corpus's, shared by both stages
    minutes["data"] += sh(
        [PY, "-m", "usmkit.train", *ft, "trainer.max_steps=0", f"trainer.exp_dir={exp / 'prep_ft'}"],
        logs / "prep_ft.log",
    )
    minutes["data"] += sh(
        [PY, "-m", "usmkit.train", *pt, "trainer.max_steps=0", f"trainer.exp_dir={exp / 'prep_pt'}"],
        logs / "prep_pt.log",
    )

    # 1. BEST-RQ
    codebooks = {"cb1": 1, "cb16": 16}
    wanted = {v for v in variants if v in codebooks} | ({"cb16"} if "las" in variants else set())
    jobs = {
        name: (
            [
                PY,
                "-m",
                "usmkit.train",
                *pt,
                f"task.bestrq.num_codebooks={n}",
                f"trainer.exp_dir={exp / ('stage1_' + name)}",
            ],
            logs / f"stage1_{name}.log",
        )
        for name, n in codebooks.items()
        if name in wanted
    }
    pre_minutes = parallel(jobs) if jobs else {}

    # 2. fine-tuning
    jobs = {}
    for v in variants:
        cmd = [PY, "-m", "usmkit.train", *ft, f"trainer.exp_dir={exp / v}"]
        if v in codebooks:
            cmd.append(f"init_from={exp / ('stage1_' + v)}")
        if v == "las":
            cmd = [c.replace("recipe=stage3_ctc", "recipe=stage3_las") for c in cmd] + [
                f"init_from={exp / 'stage1_cb16'}"
            ]
        jobs[v] = (cmd, logs / f"finetune_{v}.log")
    ft_minutes = parallel(jobs)

    # 3. decoding: dev for choices, test once per final configuration (the models side by side)
    def decode_variant(v: str) -> list[dict]:
        e = exp / v
        tune_out = out / f"lexicon_{v}.json"
        sh(
            [PY, str(ROOT / "bench/lexicon_tuning.py"), "--checkpoint", str(e), "--set", "dev", "--orders", "1,2",
             "--lm-weights", "0.3,0.6,1,1.5", "--word-scores=-1,0,1,2", "--output", str(tune_out)],
            logs / f"lexicon_{v}.log",
        )  # fmt: skip
        best = json.loads(tune_out.read_text())["best"]
        lex = [
            f"lexicon.order={best['order']}",
            f"lexicon.lm_weight={best['lm_weight']}",
            f"lexicon.word_score={best['word_score']}",
        ]
        decodes = {"ctc_greedy": [], "ctc_lexicon": lex}
        if v == "las":
            decodes["rescore"] = []
        rows = []
        for decode, extra in decodes.items():
            dev, test = evaluate(e, "dev", decode, extra, logs), evaluate(e, "test", decode, extra, logs)
            rows.append(
                {
                    "model": v, "decode": decode, "dev_wer": dev["wer"], "test_wer": test["wer"], "test_cer": test["cer"],
                    "eval_command": test["command"], "pretrain_minutes": round(pre_minutes.get("cb16" if v == "las" else v, 0.0), 2),
                    "finetune_minutes": round(ft_minutes[v], 2), "finetune_command": shlex.join(jobs[v][0]),
                }
            )  # fmt: skip
        return rows

    # Stored features: the first evaluation of a split stores its features, so the variants go one by one.
    with cf.ThreadPoolExecutor(1 if args.stored_features else len(variants)) as pool:
        rows = [r for rows_v in pool.map(decode_variant, variants) for r in rows_v]
    write_result(out / "an4.json", run_header(args=vars(args), minutes=minutes, rows=rows))
    print(f"\n{'model':<8} {'decode':<12} {'dev WER':>8} {'test WER':>9} {'test CER':>9}")
    for r in rows:
        print(
            f"{r['model']:<8} {r['decode']:<12} {100 * r['dev_wer']:8.2f} {100 * r['test_wer']:9.2f} {100 * r['test_cer']:9.2f}"
        )
    print(f"total {(time.time() - T0) / 60:.1f} min; {len(rows)} configurations scored on test")


if __name__ == "__main__":
    main()
