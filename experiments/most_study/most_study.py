"""The MOST study: does stage 2 (text injection) help stage-3 CTC, above all on words only text has seen?

    PYTHONPATH=. python experiments/most_study/most_study.py                       # the GPU run (one H100, <= 10 minutes)

Steps, each with its budget on the command line:

1. the embedded corpus (``python -m usmkit.cli.prepare synth out=<corpus> size=<size> workers=<workers>``, by default
   ``size=english``; skipped when already built), its stored features and statistics and a character-level
   tokenizer of its paired transcripts (once, before any training, so parallel runs only read them; pieces
   keep CTC all-blank in these budgets, experiments/ctc_blank_phase/results/vocab_escape_english.json);
2. stage 1, BEST-RQ on the unlabeled pool (``--stage1-steps``);
3. side by side on the one GPU (separate processes):
   (a) ``ctc``:      stage 3 CTC from stage 1 (``--stage3-steps``);
   (b) ``most_ctc``: stage 2 MOST from stage 1 (``--stage2-steps``), then stage 3 CTC from it (``--stage3-steps``);
   (c) ``ctc_long``: stage 3 CTC from stage 1 for ``--stage2-steps + --stage3-steps`` (the control: as many
       supervised steps on the paired data as (b), without the text);
4. greedy-CTC WER of every model (and of the stage-2 model itself) on ``test`` and on ``test_textonly``,
   whose utterances each hold 1-2 held-out words that occur in the text-only pool but never in paired speech,
   and the share of those held-out words each model gets right ("held-out words %").

``--most-variants NAME=OVERRIDES ...`` runs several stage-2 variants as (b), side by side (e.g.
``det=task.most.text_detach_encoder=true``); ``--align-from-ctc NAME ...`` makes those variants align the
paired data with (a), the finished stage-3 model from stage 1 (``task.most.align_from``, from their first
step: ``task.most.align_warmup_steps=0``), so their stage 2 starts once (a) has trained; ``--joint NAME ...``
fine-tunes those variants jointly instead of with CTC alone (``recipe=stage3_joint``: the stage-2 objective without BEST-RQ, paired CTC plus the text-only loss, so
what text taught is still trained while the paired data is); ``--also-joint NAME ...`` fine-tunes those variants'
stage 2 both ways, ``NAME_ctc`` and ``NAME_joint`` side by side. ``--results NAME`` writes
``most_study_NAME.json`` (a second study beside the first). The same command run again continues the study: every
finished step left ``<log>.done`` and is skipped, and the training runs resume from their checkpoints
(``resume=true``), so a study longer than one GPU call runs as two calls on one machine.

Budgets compared: (a) and (b) have equal stage-3 budgets; (b) has ``--stage2-steps`` more pre-training, in
which it also sees the paired data (CTC loss) besides unlabeled audio and text; (c) gives CTC alone those
steps. Results go to ``experiments/most_study/results/most_study.json`` (``$OUT/most_study.json`` when ``$OUT`` is set),
rewritten after each phase; the stage-2 curves (consistency loss, duration error, text and CTC losses) and
the stage-3 dev-WER curves to ``most_study_curves.png`` beside it. The table is printed last.

CPU dry run of the whole script (tiny corpus, tiny model, a few steps; about 2 minutes on 2 cores)::

    OUT=/tmp/most_dry/out PYTHONPATH=. python experiments/most_study/most_study.py --size tiny --vocab-size 330 --workers 2 \\
        --corpus /tmp/most_dry/synth --exp /tmp/most_dry/exp --model tiny --model-overrides '' --device cpu --num-workers 0 \\
        --stage1-steps 3 --stage2-steps 4 --stage3-steps 3 --eval-every 2 --text-warmup 2 --align-warmup 1 \\
        --max-duration 20 --num-codebooks 2 --codebook-size 64 --lr 1e-3 --warmup 2 --extra trainer.log_every=1

The CPU-scale study (tiny, about an hour on 2 cores) is the command in ``experiments/most_study/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from tools.results import REPO, result_path, run_header, write_result
from tools.train_runs import last_step

TEST_SETS = ("test", "test_textonly")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default="data/english", help="corpus directory (built here if missing)")
    ap.add_argument("--size", default="english", help="corpus size preset (usmkit/data/synth/plan.py)")
    ap.add_argument("--vocab-size", type=int, default=512, help="pieces of the corpus's own tokenizer (built with it)")
    ap.add_argument(
        "--tokenizer",
        default="char",
        help="'char': a character-level tokenizer of the paired transcripts (<corpus>/tokenizer_char); "
        "'corpus': the corpus's own; else a sentencepiece model's path",
    )
    ap.add_argument("--inter-ctc", type=float, default=0.3, help="task.inter_ctc_weight of the stage-3 runs")
    ap.add_argument("--workers", type=int, default=16, help="processes for synthesis and feature extraction")
    ap.add_argument("--exp", default="exp/most_study", help="where the runs go")
    ap.add_argument("--model", default="small", help="encoder preset")
    ap.add_argument("--model-overrides", default="{num_layers: 12}", help="model.overrides ('' for none)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--num-workers", type=int, default=3, help="loader workers per run (3 runs side by side)")
    ap.add_argument("--stage1-steps", type=int, default=800)
    ap.add_argument("--stage2-steps", type=int, default=600)
    ap.add_argument("--stage3-steps", type=int, default=800)
    ap.add_argument("--no-control", action="store_true", help="leave out (c), the longer CTC-only run")
    ap.add_argument("--eval-every", type=int, default=200, help="dev WER every N steps (picks the best checkpoint)")
    ap.add_argument("--max-duration", type=float, default=200.0, help="seconds of audio per batch (per stream)")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument(
        "--minutes",
        type=float,
        nargs=3,
        default=(0.0, 0.0, 0.0),
        metavar=("S1", "S2", "S3"),
        help="trainer.max_minutes of stages 1, 2 and 3 (a safety net under a call's time limit; 0 = none)",
    )
    ap.add_argument("--warmup", type=int, default=100, help="learning-rate warm-up steps of every stage")
    ap.add_argument("--num-codebooks", type=int, default=16, help="BEST-RQ codebooks (stages 1 and 2)")
    ap.add_argument("--codebook-size", type=int, default=8192)
    ap.add_argument("--text-layer", default="null", help="task.most.text_layer (null = a third of the blocks)")
    ap.add_argument("--text-warmup", type=int, default=150, help="task.most.text_warmup_steps")
    ap.add_argument("--align-warmup", type=int, default=100, help="task.most.align_warmup_steps")
    ap.add_argument("--extra", nargs="*", default=[], help="more overrides for every training run")
    ap.add_argument(
        "--stage2-extra", nargs="*", default=[], help="more overrides for stage 2, e.g. task.most.text_ratio=2"
    )
    ap.add_argument(
        "--most-variants",
        nargs="*",
        default=["most="],
        metavar="NAME=OVERRIDES",
        help="stage-2 variants, each run side by side as its own (b): NAME=space-separated overrides for its "
        "stage 2 (after --stage2-extra); 'most' keeps the names stage2 / most_ctc, another NAME gives "
        "stage2_NAME / NAME_ctc",
    )
    ap.add_argument(
        "--joint",
        nargs="*",
        default=[],
        metavar="NAME",
        help="variants whose stage 3 is joint fine-tuning instead of CTC alone: recipe=stage3_joint from their "
        "stage 2 (paired CTC, duration, consistency and the text-only loss, from step 0); their runs are named NAME_joint",
    )
    ap.add_argument(
        "--also-joint",
        nargs="*",
        default=[],
        metavar="NAME",
        help="variants fine-tuned both ways from their one stage 2: NAME_ctc (CTC alone) and NAME_joint (as --joint), "
        "side by side once the stage 2 is trained",
    )
    ap.add_argument(
        "--align-from-ctc",
        nargs="*",
        default=[],
        metavar="NAME",
        help="variants whose stage 2 aligns the paired data with the trained (a) (task.most.align_from, no "
        "alignment warm-up) instead of with its own CTC head; they start when (a) has trained",
    )
    ap.add_argument(
        "--results", default="", help="results name suffix: experiments/most_study/results/most_study_<NAME>.json"
    )
    ap.add_argument("--sequential", action="store_true", help="run (a), (b), (c) one after another")
    args = ap.parse_args()
    names = {v.partition("=")[0] for v in args.most_variants}
    for flag, chosen in (("--joint", args.joint), ("--align-from-ctc", args.align_from_ctc)):
        if unknown := set(chosen) - names:
            ap.error(f"{flag} {' '.join(sorted(unknown))}: not among --most-variants")
    if args.align_from_ctc and args.sequential:
        ap.error("--align-from-ctc waits for (a) to train while the other runs go on: leave out --sequential")
    return args


def run(cmd: list[str], log: Path) -> None:
    """Run ``cmd`` from the repository root, its output into ``log``; a failure shows the log's tail.

    A command that finished once (``<log>.done`` exists) is not run again, so the study started again with
    the same arguments, e.g. in a second call on the same machine, continues where it stopped: the
    training runs resume from their last checkpoint (``resume=true``)."""
    done = log.with_suffix(".done")
    if done.exists():
        print(f"done before: {shlex.join(cmd)}", flush=True)
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"$ {shlex.join(cmd)}", flush=True)
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    with open(log, "a") as f:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text().splitlines()[-40:]
        raise SystemExit(f"failed ({proc.returncode}): {shlex.join(cmd)}\n" + "\n".join(tail))
    done.touch()


def train_cmd(*overrides: str) -> list[str]:
    return [sys.executable, "-m", "usmkit.cli.train", *overrides, "trainer.progress=false", "resume=true"]


def eval_cmd(exp: Path, out: Path, device: str) -> list[str]:
    return [sys.executable, "-m", "usmkit.cli.evaluate", f"checkpoint={exp}", f"test_sets=[{','.join(TEST_SETS)}]",
            "decode=ctc_greedy", f"output={out}", f"device={device}"]  # fmt: skip


def prepare_data(args: argparse.Namespace) -> dict:
    """Build the corpus, then store every split's features and the statistics once, with all workers."""
    start = time.perf_counter()
    corpus = REPO / args.corpus
    run([sys.executable, "-m", "usmkit.cli.prepare", "synth", f"out={corpus}", f"size={args.size}", f"workers={args.workers}",
         f"vocab_size={args.vocab_size}"], REPO / args.exp / "logs" / "corpus.log")  # fmt: skip
    built = time.perf_counter()
    import torch

    from usmkit.data.config import DataConfig
    from usmkit.data.loader import prepare_cuts
    from usmkit.data.manifests import load_cuts
    from usmkit.data.normalize import load_or_compute_stats

    data = DataConfig(manifest_dir=str(corpus))
    # lhotse spawns num_jobs feature workers, each importing torch afresh: one OpenMP thread each, or
    # num_jobs x cores threads contend for the cores (a crawl that looks like a hang on 16 cores)
    threads, torch_threads = os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)  # lhotse warns of such a deadlock while this process has several threads
    for split in ("train", "unlabeled", "dev", *TEST_SETS):
        cuts, _ = prepare_cuts(load_cuts(corpus, split), data, split=split, require_text=split != "unlabeled",
                               num_jobs=args.workers)  # fmt: skip
        if split == "train":
            load_or_compute_stats(cuts, data)
            if (
                args.tokenizer == "char" and not (corpus / "tokenizer_char" / "tokenizer.model").is_file()
            ):  # before the parallel runs
                from usmkit.data.tokenizer import Tokenizer, minimum_vocab_size

                texts = [s.text for c in cuts for s in c.supervisions]
                Tokenizer.train(texts, corpus / "tokenizer_char", vocab_size=minimum_vocab_size(texts))
    if threads is None:
        os.environ.pop("OMP_NUM_THREADS")
    else:
        os.environ["OMP_NUM_THREADS"] = threads
    torch.set_num_threads(torch_threads)
    return {
        "corpus_minutes": round((built - start) / 60, 2),
        "features_minutes": round((time.perf_counter() - built) / 60, 2),
    }


def read_eval(path: Path) -> dict:
    sets = json.loads(path.read_text())["sets"]
    return {name: {"wer": s["wer"], "cer": s["cer"], "utterances": s["utterances"]} for name, s in sets.items()}


def heldout_recall(ckpt: Path, corpus: Path, device: str) -> dict:
    """On ``test_textonly``: of the held-out words in the references (those only the text-only pool has),
    the share the greedy hypothesis holds too (per utterance, counts clipped as in BLEU)."""
    from collections import Counter
    from dataclasses import replace

    from usmkit.data.loader import split_loader
    from usmkit.device import resolve_device
    from usmkit.inference.batches import transcribe_batches
    from usmkit.runs import load_trained
    from usmkit.streaming.features import checkpoint_feature_stats

    words = set(json.loads((corpus / "corpus.json").read_text())["heldout_words"])
    module, cfg, tokenizer, path = load_trained(str(ckpt), resolve_device(device))
    data = replace(cfg.data, num_workers=0, manifest_dir=str(corpus))
    loader, _ = split_loader(data, "test_textonly", tokenizer=tokenizer, stats=checkpoint_feature_stats(path, data))
    records, _ = transcribe_batches(module, loader, tokenizer)
    found = total = 0
    for r in records:
        ref = Counter(w for w in r["ref"].split() if w in words)
        hyp = Counter(r["hyp"].split())
        found += sum(min(n, hyp[w]) for w, n in ref.items())
        total += sum(ref.values())
    return {"heldout_word_recall": found / max(total, 1), "heldout_words_in_refs": total}


def curve(exp: Path, prefix: str, keys: tuple[str, ...]) -> list[dict]:
    """Every logged row of ``metrics.jsonl`` that has a ``prefix`` key, with ``keys`` (those present)."""
    rows = [json.loads(x) for x in (exp / "metrics.jsonl").read_text().splitlines()]
    return [
        {"step": r["step"], **{k: round(r[k], 4) for k in keys if k in r}}
        for r in rows
        if any(k.startswith(prefix) for k in r)
    ]


STAGE2_KEYS = ("train/loss_consistency", "train/consistency_rel", "train/dur_abs_log_err", "train/loss_duration",
               "train/loss_text", "train/loss_ctc", "train/loss_bestrq", "train/align_ok_frac",
               "train/dur_mean_frames")  # fmt: skip


def plot(results: dict, exps: dict[str, Path], png: Path) -> Path:
    """Stage 2's consistency loss, duration error, text and CTC losses; the stage-3 runs' dev WER."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    panels = (
        ("train/loss_consistency", "consistency loss (MSE)"),
        ("train/dur_abs_log_err", "duration error |log pred - log aligned|"),
        ("train/loss_text", "CTC losses: text-only (solid), paired (dashed)"),
    )
    for variant, stage2 in results["stage2"].items():
        rows = stage2["curve"]
        for ax, (key, title) in zip(axes, panels, strict=False):
            points = [(r["step"], r[key]) for r in rows if key in r]
            if points:
                line = ax.plot(*zip(*points, strict=True), marker=".", label=variant)
                if key == "train/loss_text":
                    ctc = [(r["step"], r["train/loss_ctc"]) for r in rows if "train/loss_ctc" in r]
                    if ctc:
                        ax.plot(*zip(*ctc, strict=True), ls="--", color=line[0].get_color())
            ax.set(xlabel="stage-2 step", title=title)
            ax.grid(alpha=0.3)
    for ax in axes[:3]:
        ax.legend()
    for name, exp in exps.items():
        dev = [(r["step"], 100 * r["dev/dev_wer"]) for r in curve(exp, "dev/", ("dev/dev_wer",)) if "dev/dev_wer" in r]
        if dev:
            axes[3].plot(*zip(*dev, strict=True), marker="o", label=name)
    axes[3].set(xlabel="stage-3 step", ylabel="dev WER (%)", title="stage 3: dev WER (greedy CTC)")
    axes[3].grid(alpha=0.3)
    axes[3].legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def main() -> None:
    args = parse_args()
    RESULTS = result_path(__file__, args.results or None)
    exp = REPO / args.exp
    logs = exp / "logs"
    results: dict = run_header(settings=vars(args), phases={}, stage1={}, stage2={}, runs={})
    if RESULTS.is_file():  # a study continued (see run()): keep what the earlier call measured of its phases
        earlier = json.loads(RESULTS.read_text())
        if earlier.get("settings") == json.loads(json.dumps(results["settings"])):
            results["earlier_calls"] = [*earlier.get("earlier_calls", []), earlier.get("phases")]

    def save() -> None:
        write_result(RESULTS, results)

    start = time.perf_counter()
    results["phases"] |= prepare_data(args)
    save()

    common = [f"model={args.model}", f"data.manifest_dir={args.corpus}", f"data.max_duration={args.max_duration}",
              f"data.num_workers={args.num_workers}", f"optim.lr={args.lr}", f"optim.warmup_steps={args.warmup}",
              f"trainer.device={args.device}", *args.extra]  # fmt: skip
    if args.model_overrides:
        common.append(f"model.overrides={args.model_overrides}")
    if args.tokenizer != "corpus":
        path = REPO / args.corpus / "tokenizer_char" / "tokenizer.model" if args.tokenizer == "char" else args.tokenizer
        common.append(f"tokenizer={path}")
    s1_min, s2_min, s3_min = (f"trainer.max_minutes={m}" for m in args.minutes)
    control_min = f"trainer.max_minutes={args.minutes[1] + args.minutes[2]}"
    stage3 = [f"task.inter_ctc_weight={args.inter_ctc}"]
    bestrq = [f"task.bestrq.num_codebooks={args.num_codebooks}", f"task.bestrq.codebook_size={args.codebook_size}"]

    def steps(n: int) -> list[str]:
        every = min(args.eval_every, n) if args.eval_every else 0
        return [f"trainer.max_steps={n}", f"trainer.eval_every={every}", f"trainer.save_every={every or n}"]

    stage1 = exp / "stage1"
    t = time.perf_counter()
    run(train_cmd("recipe=stage1", *common, *bestrq, f"trainer.max_steps={args.stage1_steps}", "trainer.eval_every=0",
                  f"trainer.save_every={args.stage1_steps}", s1_min, f"trainer.exp_dir={stage1}"), logs / "stage1.log")  # fmt: skip
    results["phases"]["stage1_minutes"] = round((time.perf_counter() - t) / 60, 2)
    rows = curve(stage1, "train/", ("train/loss", "train/acc_mean", "train/pred_perplexity_mean"))
    results["stage1"] = {
        "steps": args.stage1_steps,
        "steps_done": last_step(stage1),
        "final": rows[-1] if rows else None,
    }
    save()

    jobs: dict[str, list[tuple[list[str], Path]]] = {
        "ctc": [(train_cmd("recipe=stage3_ctc", *common, *stage3, *steps(args.stage3_steps), s3_min, f"init_from={stage1}",
                           f"trainer.exp_dir={exp / 'ctc'}"), logs / "ctc.log")],
    }  # fmt: skip
    stage2_dirs: dict[str, Path] = {}  # job name -> its stage-2 run
    stage2_overrides: dict[str, str] = {}  # job name -> its variant's stage-2 overrides
    # A job that needs another's model starts once that job's command ``releases[other]`` has run: (a)'s
    # training for a stage 2 aligned with it, a variant's stage 2 and its eval for its --also-joint twin.
    waits_for: dict[str, str] = {}  # job -> the job it waits for
    releases: dict[str, int] = {}  # waited-for job -> index of the command after which its waiters start
    twins: set[str] = set()  # --also-joint jobs (their stage 2 is their sibling job's)
    for variant in args.most_variants:
        vname, _, overrides = variant.partition("=")
        joint = vname in args.joint
        suffix = "joint" if joint else "ctc"
        stage2, name = (
            (exp / "stage2", f"most_{suffix}") if vname == "most" else (exp / f"stage2_{vname}", f"{vname}_{suffix}")
        )
        stage2_dirs[name] = stage2
        align_warmup = args.align_warmup
        if vname in args.align_from_ctc:
            waits_for[name], releases["ctc"] = "ctc", 0
            overrides = f"task.most.align_from={exp / 'ctc'} {overrides}".strip()
            align_warmup = 0
        stage2_overrides[name] = overrides
        most = [f"task.most.text_layer={args.text_layer}", *args.stage2_extra, *overrides.split()]

        def finetune(joint: bool, name: str, stage2: Path = stage2, most: list[str] = most) -> list[str]:
            if joint:  # the stage-2 objective without BEST-RQ, its text encoder and CTC head carried over
                return train_cmd("recipe=stage3_joint", *common, *most, *steps(args.stage3_steps), s3_min,
                                 f"init_from={stage2}", f"trainer.exp_dir={exp / name}")  # fmt: skip
            return train_cmd("recipe=stage3_ctc", *common, *stage3, *steps(args.stage3_steps), s3_min, f"init_from={stage2}",
                             f"trainer.exp_dir={exp / name}")  # fmt: skip

        jobs[name] = [
            (train_cmd("recipe=stage2", *common, *bestrq, *steps(args.stage2_steps), s2_min, f"init_from={stage1}",
                       f"task.most.text_warmup_steps={args.text_warmup}", f"task.most.align_warmup_steps={align_warmup}",
                       *most, f"trainer.exp_dir={stage2}"), logs / f"{stage2.name}.log"),
            (eval_cmd(stage2, stage2 / "eval.json", args.device), logs / f"{stage2.name}_eval.log"),
            (finetune(joint, name), logs / f"{name}.log"),
        ]  # fmt: skip
        if vname in args.also_joint and not joint:  # the same stage 2 fine-tuned jointly too, once it is trained
            twin = name.removesuffix("_ctc") + "_joint"
            stage2_dirs[twin], stage2_overrides[twin] = stage2, overrides
            jobs[twin] = [(finetune(True, twin), logs / f"{twin}.log")]
            waits_for[twin], releases[name] = name, 1
            twins.add(twin)
    if not args.no_control:
        long = args.stage2_steps + args.stage3_steps
        jobs["ctc_long"] = [(train_cmd("recipe=stage3_ctc", *common, *stage3, *steps(long), control_min, f"init_from={stage1}",
                                       f"trainer.exp_dir={exp / 'ctc_long'}"), logs / "ctc_long.log")]  # fmt: skip
    for name in jobs:
        jobs[name].append((eval_cmd(exp / name, exp / name / "eval.json", args.device), logs / f"{name}_eval.log"))

    released = {name: threading.Event() for name in releases}

    def one(name: str) -> None:
        t0 = time.perf_counter()
        if name in waits_for:
            released[waits_for[name]].wait()
        try:
            for i, (cmd, log) in enumerate(jobs[name]):
                run(cmd, log)
                if i == releases.get(name):
                    released[name].set()
        finally:  # waiters also start when this job failed (and then fail themselves)
            if name in released:
                released[name].set()
        results["runs"][name] = {
            "minutes": round((time.perf_counter() - t0) / 60, 2),
            "stage3_steps": args.stage3_steps if name != "ctc_long" else args.stage2_steps + args.stage3_steps,
            "init_from": stage2_dirs[name].name if name in stage2_dirs else "stage1",
            "stage3_steps_done": last_step(exp / name),
            "commands": [shlex.join(cmd[2:]) for cmd, _ in jobs[name]],
            "sets": read_eval(exp / name / "eval.json"),
        }
        results["runs"][name]["sets"]["test_textonly"] |= heldout_recall(exp / name, REPO / args.corpus, args.device)
        if name in stage2_dirs and name not in twins:
            stage2 = stage2_dirs[name]
            results["stage2"][stage2.name] = {
                "steps": args.stage2_steps,
                "steps_done": last_step(stage2),
                "command": shlex.join(jobs[name][0][0][2:]),
                "sets": read_eval(stage2 / "eval.json"),  # the stage-2 model itself, through its CTC head
                "curve": curve(stage2, "train/", STAGE2_KEYS),
            }
            results["stage2"][stage2.name]["sets"]["test_textonly"] |= heldout_recall(
                stage2, REPO / args.corpus, args.device
            )
        save()

    t = time.perf_counter()
    if args.sequential:
        for name in jobs:
            one(name)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(jobs)) as pool:  # threads only wait on their subprocesses
            for future in [pool.submit(one, name) for name in jobs]:
                future.result()
    results["phases"]["parallel_minutes"] = round((time.perf_counter() - t) / 60, 2)
    results["phases"]["total_minutes"] = round((time.perf_counter() - start) / 60, 2)
    results["budgets"] = {
        "ctc": f"stage 1 {args.stage1_steps} + stage 3 {args.stage3_steps} steps",
        **{
            name: f"stage 1 {args.stage1_steps} + stage 2 {args.stage2_steps} ({stage2_overrides[name] or 'as configured'}) "
            f"+ stage 3 {args.stage3_steps} steps" + (" (paired + text)" if name.endswith("_joint") else "")
            for name in stage2_dirs
        },
    }
    if not args.no_control:
        results["budgets"]["ctc_long"] = (
            f"stage 1 {args.stage1_steps} + stage 3 {args.stage2_steps + args.stage3_steps} steps"
        )
    png = plot(results, {n: exp / n for n in jobs}, RESULTS.with_name(f"{RESULTS.stem}_curves.png"))
    results["figure"] = png.name
    save()

    print(f"\nwrote {RESULTS} and {png}")
    print(
        f"\n{'model':22s} " + " ".join(f"{s + ' WER %':>18s} {'CER %':>7s}" for s in TEST_SETS) + "  held-out words %"
    )
    table = {f"{v} alone": r["sets"] for v, r in results["stage2"].items()}
    table |= {name: r["sets"] for name, r in results["runs"].items()}
    for name, sets in table.items():
        cells = " ".join(f"{100 * sets[s]['wer']:18.2f} {100 * sets[s]['cer']:7.2f}" for s in TEST_SETS if s in sets)
        recall = sets.get("test_textonly", {}).get("heldout_word_recall")
        print(f"{name:22s} {cells}" + (f"  {100 * recall:16.1f}" if recall is not None else ""))


if __name__ == "__main__":
    main()
