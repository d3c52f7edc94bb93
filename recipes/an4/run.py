"""The USM recipe on CMU AN4, one GPU, every stage a usmkit command (printed as it runs).

    python recipes/an4/run.py [--an4 DIR] [--kathleen DIR] [--out DIR] [--model tiny] \\
        [--variants scratch,cb1,cb16,las] [--pretrain-steps 1000] [--finetune-steps 2000] \\
        [--device cpu --stage1 cb1=DIR cb16=DIR]

Stages (each line below is one or more ``python -m usmkit...`` commands):

0. data: the AN4 and Kathleen recipes; an unlabeled pool = AN4 train audio + Kathleen's training
   prompts' audio (``usmkit.data.corpora.pool``, split ``pool`` of ``data/an4``); never test audio.
1. BEST-RQ (``recipe=stage1``) on the pool with 1 and with 16 codebooks, side by side on the GPU.
2. Fine-tuning on AN4 ``train`` labels only (``recipe=stage3_ctc``, ``data=an4``): from scratch,
   from each BEST-RQ encoder (``init_from``), and joint CTC/LAS from the 16-codebook encoder;
   equal fine-tuning budgets, side by side. The scratch run starts with the pre-training runs (it
   needs none), the others when theirs ends: one GPU serves several such runs at once, since a step
   of a model this small waits mostly on the host.
   Settings: the ``tiny`` encoder, a character-level tokenizer (AN4 spells letters), intermediate
   CTC, 50-s batches, stored features, light SpecAugment (2 time masks). Wider or deeper encoders
   stay in CTC's all-blank phase for far longer on 0.7 h of speech (bench/results/an4_model_size.json).
3. Decoding: CTC greedy; CTC + lexicon and word n-gram built from AN4 train text only (LM order,
   weight and word score tuned on ``dev`` with ``bench/lexicon_tuning.py``); LAS rescoring of the
   CTC n-best for the LAS model. ``test`` is scored once per final configuration.

On one H100 with the defaults: data 1.5 min, BEST-RQ 1.5 min, each CTC fine-tuning 3 min, the
LAS fine-tuning 5.5 min (all side by side), decoding 1-2 min per variant.

The 16-codebook BEST-RQ encoder is also saved as ``OUT/bestrq_encoder/`` (encoder weights only,
``init_from`` reads nothing else): with ``--model tiny`` the starting point of the CPU fine-tuning
path in docs/recipes.md.

Writes ``OUT/an4.json`` (every row: model, decoding, dev and test WER/CER, the command, minutes) and
prints the table last. The corpus folders may be the originals or copies from
``python -m usmkit.cli.prepare pack`` (how the audio travels to a GPU machine).
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
from common import last_step, run_header, write_result  # noqa: E402

PY = sys.executable
T0 = time.time()


def sh(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` (logged to ``log``), raise on failure; returns minutes."""
    print(f"[{(time.time() - T0) / 60:5.1f} min] $ {shlex.join(cmd)}", flush=True)
    start = time.time()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text().splitlines()[-15:]
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n" + "\n".join(tail))
    return (time.time() - start) / 60


def evaluate(exp: Path, split: str, decode: str, extra: list[str], logs: Path, tag: str = "") -> dict:
    name = f"{tag or exp.name}_{split}_{decode}"
    out = exp.parent / f"eval_{name}.json" if tag else exp / f"eval_{split}_{decode}.json"
    cmd = [PY, "-m", "usmkit.cli.evaluate", f"checkpoint={exp}", f"test_sets=[{split}]", f"decode={decode}", *extra]
    sh([*cmd, f"output={out}"], logs / f"{name}.log")
    s = json.loads(out.read_text())["sets"][split]
    return {"wer": s["wer"], "cer": s["cer"], "command": shlex.join(cmd)}


def after(dep: cf.Future | None, cmd: list[str], log: Path) -> float:
    """``sh(cmd, log)`` once ``dep`` (if any) has finished; raises if ``dep`` failed."""
    if dep is not None:
        dep.result()
    return sh(cmd, log)


def save_encoder(exp: Path, dest: Path) -> None:
    """The encoder's weights (``init_from`` reads nothing else) of ``exp``'s best (else latest) checkpoint,
    with its config."""
    from safetensors.torch import load_file, save_file

    from usmkit.checkpointing.checkpoint import MODEL_FILE, resolve_checkpoint

    src = resolve_checkpoint(exp)
    dest.mkdir(parents=True, exist_ok=True)
    weights = {k: v for k, v in load_file(src / MODEL_FILE).items() if k.startswith("encoder.")}
    save_file(weights, dest / MODEL_FILE)
    (dest / "config.yaml").write_text((src / "config.yaml").read_text())


def export_run(exp: Path, dest: Path) -> None:
    """What decoding ``exp`` needs, nothing more: its best (else latest) checkpoint's weights and config, the
    run's tokenizer and feature statistics, and its metrics; ``dest`` then decodes as ``exp`` would."""
    import shutil

    from usmkit.checkpointing.checkpoint import BEST_FILE, CONFIG_FILE, MODEL_FILE, resolve_checkpoint

    src = resolve_checkpoint(exp)
    ckpt = dest / "checkpoints" / src.name
    ckpt.mkdir(parents=True, exist_ok=True)
    for f in (MODEL_FILE, CONFIG_FILE):
        shutil.copy2(src / f, ckpt / f)
    best = src.parent / BEST_FILE  # how the copy is found: as its run's best checkpoint
    best_json = json.loads(best.read_text()) if best.is_file() else {}
    if best_json.get("path") != src.name:
        best_json = {"path": src.name, "metric": "latest", "value": None, "step": None}
    (ckpt.parent / BEST_FILE).write_text(json.dumps(best_json))
    for f in ("tokenizer.model", "feature_stats.safetensors", "metrics.jsonl"):
        shutil.copy2(exp / f, dest / f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--an4", default=str(ROOT.parent / "shared/data/an4"))
    ap.add_argument("--kathleen", default=str(ROOT.parent / "shared/data/kathleen"))
    ap.add_argument("--out", default=os.environ.get("OUT", "exp/an4_recipe"))
    ap.add_argument("--data", default="data")
    ap.add_argument("--exp", default="exp/an4")
    ap.add_argument("--model", default="tiny")
    ap.add_argument(
        "--model-overrides", default="{subsampling_channels: 32}", help="model.overrides for every run ('' for none)"
    )
    ap.add_argument("--variants", default="scratch,cb1,cb16,las")
    ap.add_argument("--pretrain-steps", type=int, default=1000)
    ap.add_argument("--finetune-steps", type=int, default=2000)
    ap.add_argument("--finetune-lr", type=float, default=2.5e-3)
    ap.add_argument("--finetune-warmup", type=int, default=300)
    ap.add_argument("--pretrain-lr", type=float, default=2e-3)
    ap.add_argument("--max-duration", type=float, default=50.0)
    ap.add_argument("--vocab-size", type=int, default=290, help="290: the specials, byte fallback and the letters")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--workers", type=int, default=2, help="loader workers per training run")
    ap.add_argument(
        "--speed-perturb",
        action="store_true",
        help="fine-tune with 0.9/1.0/1.1 speed perturbation (features on the fly: loader-bound steps)",
    )
    ap.add_argument(
        "--stage1",
        nargs="*",
        default=[],
        metavar="NAME=DIR",
        help="start these variants from encoders pre-trained before (e.g. cb16=DIR, a --save-encoder output) "
        "instead of pre-training them here; with --device cpu the CPU fine-tuning path",
    )
    ap.add_argument("--pretrain-max-duration", type=float, default=100.0)
    ap.add_argument("--stage2-steps", type=int, default=400, help="MOST steps of the 'most' variant")
    ap.add_argument("--most-from", default="cb16", help="the BEST-RQ encoder the 'most' variant starts from")
    ap.add_argument("--las-from", default="cb16", help="the BEST-RQ encoder the 'las' variant starts from")
    ap.add_argument(
        "--seeds", default="0", help="fine-tuning seeds (trainer.seed); a seed s > 0 runs as <variant>_s<s>"
    )
    ap.add_argument("--seed-variants", default="scratch,cb1", help="the variants that run every seed (others: seed 0)")
    ap.add_argument("--train-only", action="store_true", help="stop after training (decode the runs elsewhere)")
    ap.add_argument(
        "--export",
        default="",
        help="copy each fine-tuned run's best checkpoint, tokenizer, feature stats and metrics here (to decode "
        "the runs on another machine with usmkit.cli.evaluate)",
    )
    ap.add_argument("--text-count", type=int, default=20000, help="generated AN4-style sentences for MOST")
    ap.add_argument(
        "--minutes",
        type=float,
        nargs=3,
        default=(0.0, 0.0, 0.0),
        metavar=("PRETRAIN", "STAGE2", "FINETUNE"),
        help="trainer.max_minutes of BEST-RQ, MOST and every fine-tuning (a safety net under a time limit; 0 = none)",
    )
    ap.add_argument(
        "--save-encoder",
        default="cb16",
        help="save this BEST-RQ encoder's weights to OUT/bestrq_encoder (the CPU path's start; '' for none)",
    )
    ap.add_argument(
        "--decode-only",
        action="store_true",
        help="decode the fine-tuned runs already in --exp (e.g. an --export copy from a GPU machine), train nothing",
    )
    ap.add_argument(
        "--ensembles",
        nargs="*",
        default=[],
        metavar="NAME=RUN+RUN[+...]",
        help="also decode these ensembles of fine-tuned runs (CTC + lexicon, its settings tuned on dev)",
    )
    ap.add_argument("--extra", default="", help="more overrides for every fine-tuning run")
    ap.add_argument("--pretrain-extra", default="", help="more overrides for every BEST-RQ run")
    args = ap.parse_args()
    out, data, exp = Path(args.out), Path(args.data), Path(args.exp)
    logs = out / "logs"
    variants = args.variants.split(",")
    codebooks = {"cb1": 1, "cb16": 16}
    given = dict(kv.split("=", 1) for kv in args.stage1 if "=" in kv)
    if len(given) != len(args.stage1) or not set(given) <= set(codebooks):
        ap.error(f"--stage1 takes NAME=DIR with NAME in {sorted(codebooks)}, got {args.stage1}")
    stage1_dir = {name: Path(given.get(name, exp / f"stage1_{name}")) for name in codebooks}
    seeds = [int(x) for x in args.seeds.split(",")]
    seeded = set(args.seed_variants.split(","))
    runs = {v if s == 0 else f"{v}_s{s}": (v, s) for v in variants for s in seeds if s == 0 or v in seeded}
    wanted = {v for v in variants if v in codebooks} | ({args.las_from} if "las" in variants else set())
    wanted |= {args.most_from} if "most" in variants else set()
    wanted -= set(given)  # the encoders pre-trained here
    if args.decode_only:
        wanted = set()
    for d in (out, logs, exp):
        d.mkdir(parents=True, exist_ok=True)
    an4 = data / "an4"
    common = [f"model={args.model}", f"trainer.device={args.device}", "trainer.progress=false", "trainer.log_every=50"]
    if args.model_overrides:
        common.append(f"model.overrides={args.model_overrides}")

    # 0. data
    minutes = {
        "data": sh(
            [PY, "-m", "usmkit.cli.prepare", "an4", f"out={an4}", f"corpus_dir={args.an4}", "num_jobs=8"],
            logs / "an4.log",
        )
    }
    if wanted:  # the unlabeled pool, for pre-training only
        minutes["data"] += sh(
            [PY, "-m", "usmkit.cli.prepare", "kathleen", f"out={data / 'kathleen'}", f"corpus_dir={args.kathleen}", "num_jobs=8"],
            logs / "kathleen.log",
        )  # fmt: skip
        pool = [f"inputs=[{an4}:an4:unlabeled,{data / 'kathleen'}:kathleen:unlabeled]"]
        minutes["data"] += sh(
            [PY, "-m", "usmkit.cli.prepare", "pool", f"out={an4}", "corpus=an4", "split=pool", *pool], logs / "pool.log"
        )
    if "most" in variants and not args.decode_only:  # MOST's text-only data: AN4 train text + generated sentences
        minutes["data"] += sh(
            [PY, "-m", "usmkit.cli.prepare", "an4_text", f"out={an4}", f"count={args.text_count}"],
            logs / "an4_text.log",
        )
    # the tokenizer (AN4 train text) and the fine-tuning statistics once, before runs share them
    ft = [
        "recipe=stage3_ctc", "data=an4", f"data.manifest_dir={an4}", *common, f"vocab_size={args.vocab_size}", f"data.max_duration={args.max_duration}",
        f"data.num_workers={args.workers}", f"trainer.max_steps={args.finetune_steps}", f"optim.lr={args.finetune_lr}",
        f"optim.warmup_steps={args.finetune_warmup}", "task.inter_ctc_weight=0.3", f"trainer.eval_every={max(1, args.finetune_steps // 5)}",
        f"trainer.save_every={max(1, args.finetune_steps // 5)}", "trainer.keep_last=1", "data.spec_augment.time_masks=2",
        f"trainer.max_minutes={args.minutes[2]}",
        "data.spec_augment.freq_width=15", *args.extra.split(),
    ]  # fmt: skip
    if not args.speed_perturb:
        ft += ["data.features.precomputed=true", "data.speed_perturb=[]"]
    pt = [
        "recipe=stage1", "data=an4", f"data.manifest_dir={an4}", *common, "data.train_split=pool", "data.features.precomputed=true",
        "data.speed_perturb=[]", f"data.max_duration={args.pretrain_max_duration}", f"data.num_workers={args.workers}",
        f"trainer.max_steps={args.pretrain_steps}", f"optim.lr={args.pretrain_lr}", "optim.warmup_steps=500",
        f"trainer.eval_every={args.pretrain_steps}", f"trainer.save_every={args.pretrain_steps}", "trainer.keep_last=1",
        f"trainer.max_minutes={args.minutes[0]}", *args.pretrain_extra.split(),
    ]  # fmt: skip
    # one after the other: the feature statistics (of AN4 train, computed by the first) are the corpus's, shared by both stages
    if not args.decode_only:
        minutes["data"] += sh(
            [PY, "-m", "usmkit.cli.train", *ft, "trainer.max_steps=0", f"trainer.exp_dir={exp / 'prep_ft'}"],
            logs / "prep_ft.log",
        )
    if wanted:
        minutes["data"] += sh(
            [PY, "-m", "usmkit.cli.train", *pt, "trainer.max_steps=0", f"trainer.exp_dir={exp / 'prep_pt'}"],
            logs / "prep_pt.log",
        )

    # 1. BEST-RQ, with the scratch fine-tuning alongside
    first = {
        "stage1_" + name: (
            [
                PY,
                "-m",
                "usmkit.cli.train",
                *pt,
                f"task.bestrq.num_codebooks={n}",
                f"trainer.exp_dir={exp / ('stage1_' + name)}",
            ],
            logs / f"stage1_{name}.log",
        )
        for name, n in codebooks.items()
        if name in wanted
    }
    finetune = {}
    for name, (v, seed) in runs.items():
        cmd = [PY, "-m", "usmkit.cli.train", *ft, f"trainer.seed={seed}", f"trainer.exp_dir={exp / name}"]
        if v in codebooks:
            cmd.append(f"init_from={stage1_dir[v]}")
        if v == "las":
            cmd = [c.replace("recipe=stage3_ctc", "recipe=stage3_las") for c in cmd] + [
                f"init_from={stage1_dir[args.las_from]}"
            ]
        if v == "most":  # stage 3 from the MOST model (its CTC head too: same tokenizer)
            cmd.append(f"init_from={exp / 'stage2'}")
        finetune[name] = (cmd, logs / f"finetune_{name}.log")
    stage2 = [
        PY, "-m", "usmkit.cli.train", "recipe=stage2", *[c for c in ft if not c.startswith(("recipe=", "trainer.max_steps=",
        "trainer.eval_every=", "trainer.save_every=", "trainer.max_minutes=", "task.inter_ctc_weight="))],
        "task.most.unlabeled_split=pool", f"task.most.text_only={an4 / 'an4_text_only.jsonl.gz'}",
        "task.bestrq.num_codebooks=" + str(codebooks[args.most_from]), f"trainer.max_steps={args.stage2_steps}",
        f"trainer.eval_every={max(1, args.stage2_steps // 4)}", f"trainer.save_every={max(1, args.stage2_steps // 4)}",
        f"task.most.align_warmup_steps={args.stage2_steps // 4}", f"task.most.text_warmup_steps={args.stage2_steps // 3}",
        f"trainer.max_minutes={args.minutes[1]}", f"init_from={stage1_dir[args.most_from]}", f"trainer.exp_dir={exp / 'stage2'}",
    ]  # fmt: skip
    # Each fine-tuning run starts as soon as the encoder it starts from is ready.
    finetune_now = {} if args.decode_only else finetune  # (with --decode-only nothing is pre-trained either)
    with cf.ThreadPoolExecutor(len(first) + len(finetune) + 1) as pool:
        futures = {name: pool.submit(sh, cmd, log) for name, (cmd, log) in first.items()}
        if "most" in finetune_now:
            futures["stage2"] = pool.submit(after, futures.get(f"stage1_{args.most_from}"), stage2, logs / "stage2.log")
        for name, (cmd, log) in finetune_now.items():
            v = runs[name][0]
            dep = futures.get({"las": f"stage1_{args.las_from}", "most": "stage2"}.get(v, f"stage1_{v}"))
            futures[name] = pool.submit(after, dep, cmd, log)
        minutes_of = {name: f.result() for name, f in futures.items()}
    if args.save_encoder and f"stage1_{args.save_encoder}" in first:
        save_encoder(exp / f"stage1_{args.save_encoder}", out / "bestrq_encoder")
    pre_minutes = {k.removeprefix("stage1_"): m for k, m in minutes_of.items() if k.startswith("stage1_")}
    pre_minutes["most"] = pre_minutes.get(args.most_from, 0.0) + minutes_of.get("stage2", 0.0)
    pre_minutes["las"] = pre_minutes.get(args.las_from, 0.0)
    ft_minutes = {name: minutes_of.get(name, 0.0) for name in finetune}
    if args.export:
        for name in finetune:
            export_run(exp / name, Path(args.export) / name)
    if args.train_only:
        print(f"trained {', '.join(finetune)} in {(time.time() - T0) / 60:.1f} min (--train-only: not decoded)")
        return

    # 3. decoding: dev for choices, test once per final configuration (the models side by side)
    def decode_variant(name: str) -> list[dict]:
        e, v = exp / name, runs[name][0]
        tune_out = out / f"lexicon_{name}.json"
        sh(
            [PY, str(ROOT / "bench/lexicon_tuning.py"), "--checkpoint", str(e), "--set", "dev", "--orders", "1,2",
             "--lm-weights", "0.5,1", "--word-scores=0,1", "--output", str(tune_out)],
            logs / f"lexicon_{name}.log",
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
                    "model": name, "decode": decode, "seed": runs[name][1], "dev_wer": dev["wer"], "test_wer": test["wer"], "test_cer": test["cer"],
                    "finetune_steps_done": last_step(e),
                    "eval_command": test["command"], "pretrain_minutes": round(pre_minutes.get(v, 0.0), 2),
                    "finetune_minutes": round(ft_minutes[name], 2), "finetune_command": shlex.join(finetune[name][0]),
                }
            )  # fmt: skip
        return rows

    def decode_ensemble(spec: str) -> list[dict]:
        """``NAME=RUN+RUN[+...]``: the runs as one CTC ensemble (usmkit.cli.evaluate's ``ensemble=``), lexicon
        settings chosen on dev over the same grid as a single run's, then test once."""
        name, members = spec.split("=", 1)
        first_run, *others = [exp / m for m in members.split("+")]
        ens = [f"ensemble=[{','.join(map(str, others))}]"]
        grid = [(o, w, ws) for o in (1, 2) for w in (0.5, 1.0) for ws in (0.0, 1.0)]
        scored = []
        for o, w, ws in grid:
            lex = [f"lexicon.order={o}", f"lexicon.lm_weight={w}", f"lexicon.word_score={ws}"]
            dev = evaluate(first_run, "dev", "ctc_lexicon", [*ens, *lex], logs, tag=f"{name}_{o}_{w}_{ws}")
            scored.append((dev["wer"], lex))
        dev_wer, lex = min(scored, key=lambda x: x[0])
        test = evaluate(first_run, "test", "ctc_lexicon", [*ens, *lex], logs, tag=name)
        return [{"model": name, "decode": "ctc_lexicon", "ensemble": members.split("+"), "dev_wer": dev_wer,
                 "test_wer": test["wer"], "test_cer": test["cer"], "eval_command": test["command"]}]  # fmt: skip

    # Stored features: the first evaluation of a split stores its features, so the first variant goes alone.
    # The table is rewritten as each variant's rows come in (a run cut short keeps what it scored).
    rows = []

    def save(new_rows: list[dict]) -> None:
        rows.extend(new_rows)
        write_result(out / "an4.json", run_header(args=vars(args), minutes=minutes, rows=rows))

    names = list(runs)
    save(decode_variant(names[0]))
    with cf.ThreadPoolExecutor(len(names)) as pool:
        for rows_v in pool.map(decode_variant, names[1:]):
            save(rows_v)
        for rows_e in pool.map(decode_ensemble, args.ensembles):
            save(rows_e)
    print(f"\n{'model':<8} {'decode':<12} {'dev WER':>8} {'test WER':>9} {'test CER':>9}")
    for r in rows:
        print(
            f"{r['model']:<8} {r['decode']:<12} {100 * r['dev_wer']:8.2f} {100 * r['test_wer']:9.2f} {100 * r['test_cer']:9.2f}"
        )
    print(f"total {(time.time() - T0) / 60:.1f} min; {len(rows)} configurations scored on test")


if __name__ == "__main__":
    main()
