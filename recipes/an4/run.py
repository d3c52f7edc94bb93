"""The USM recipe on CMU AN4 in four stages, every step a usmkit command (printed as it runs).

    python recipes/an4/run.py [prepare] [train] [decode] [report] [--out exp/an4_recipe] [--variants ...]
        [--seeds 0,1,2] [--pretrain-seeds 0,1] [--jobs 4] [--device auto] ...

No stage named: all four, in order.

- prepare: the AN4 manifests (``python -m usmkit.cli.prepare an4``; the corpus from ``--an4`` or
  ``$USMKIT_CORPORA/an4``); for rows with pre-training, the unlabeled pool (``--pool``: AN4 train audio and
  Kathleen's train and dev prompts' audio, never test audio; ``synth`` adds the embedded synthesizer's English
  corpus, ``--synth-size``); for the ``most`` row, AN4-style text.
- train: every variant with each fine-tuning seed (``--seeds``), and for rows from a BEST-RQ encoder with
  each pre-training seed too (``--pretrain-seeds``; it seeds the BEST-RQ run and its quantizer):
  ``scratch`` (CTC from scratch), ``cb1`` / ``cb16`` (BEST-RQ with 1 / 16 codebooks on the pool, then CTC
  fine-tuning from its encoder), ``las`` (joint CTC/LAS from the ``--las-from`` encoder, CTC's share of the
  loss ``--las-ctc-weight``), ``most`` (MOST, stage 2, from the ``--most-from`` encoder, then CTC). Equal
  fine-tuning budgets, on AN4 ``train`` labels only, up to ``--jobs`` runs side by side (one GPU serves
  several runs of a model this small). ``--narrowband-copies``: the fine-tuning runs train on the labels and their
  copy through an 8 kHz channel (``prepare bandlimit``, pooled with them: ``train_nb``), features stored as usual.
- decode: per fine-tuned run, CTC greedy on dev and test; the lexicon settings (LM order, weight, word
  score, over ``--lm-orders`` x ``--lm-weights`` x ``--word-scores``) chosen on dev
  (``python -m usmkit.cli.tune_lexicon``), then test once with them; for ``las`` also attention rescoring of
  the CTC prefix beam's n-best, and of the lexicon's n-best (the weight of the two passes chosen on dev). Each
  variant's runs together as one ensemble (``--ensembles``) the same way. Every test score is also taken
  on ``test_8k``, the test set resampled to 8 kHz and back (telephone band; ``--no-narrowband-test``: not).
- report: mean +- standard deviation over the seeds per variant and decoding, ensembles apart, and how
  many configurations were scored on test; every row to ``--report`` (bench/results/an4.json).

Each step that succeeds leaves a record (its command) in ``OUT/steps/`` (``usmkit/recipes/steps.py``). A rerun
skips the steps recorded with the same command and resumes a training run stopped part way, so a stage reruns
alone and an interrupted stage goes on where it stopped; a step recorded with another command is refused
(remove its record and its outputs to redo it). Logs: ``OUT/logs/<step>.log``.

Train on a GPU machine, decode on another (run both from the same folder with the same ``--out``: runs
find their manifests by the relative path they were trained with):

    python recipes/an4/run.py --train-only --export exp/an4_export   # prepare, train, then copy each run's best
    python recipes/an4/run.py --decode-only --runs exp/an4_export --device cpu   # prepare (AN4), decode, report

Settings (the defaults): the ``tiny`` encoder with 32 subsampling channels, a character-level tokenizer
(AN4 spells letters), intermediate CTC, 50-s batches, stored features, light SpecAugment, 1000 BEST-RQ
and 2000 fine-tuning steps. The 16-codebook encoder of the first pre-training seed is also saved as
``OUT/bestrq_encoder/`` (encoder weights only; ``--stage1 cb16=DIR`` starts from such an encoder instead
of pre-training one).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from report import RESCORE_WEIGHTS, build_report, chosen_lexicon, chosen_rescore, print_report  # recipes/an4/
from settings import (  # recipes/an4/settings.py
    CODEBOOKS,
    NARROWBAND,
    Settings,
    decodes_of,
    encoder_dir,
    encoder_of,
    ensembles_of,
    finetune_split,
    labels_list,
    labels_split,
    parse_args,
    pretrain_seeds_of,
    pretrained_here,
    runs_of,
    stage2_name,
)

from usmkit.checkpointing.atomic import replaced_atomically
from usmkit.recipes.handoff import export_run, save_encoder
from usmkit.recipes.steps import Execute, StageFailed, Step, run_steps, subprocess_runner


# ---------------------------------------------------------------- the plan
def corpus_steps(s: Settings) -> tuple[str, ...]:
    """The prepare steps every training and decoding run reads: AN4, the labeled subset when there is one, and
    the narrowband copies when they are trained on."""
    subset = ("prepare_subset",) if s.labels != 100 else ()
    copies = ("prepare_train_8k", "prepare_train_nb") if s.narrowband_copies else ()
    return ("prepare_an4", *subset, *copies)


def _prepare(name: str, overrides: dict, deps: tuple[str, ...] = ()) -> Step:
    return Step(f"prepare_{name}", "usmkit.cli.prepare", overrides, deps, positional=(name,))


def data_steps(s: Settings, for_training: bool) -> list[Step]:
    """The corpus steps: AN4; for training, the pool (when something is pre-trained here) and MOST's text."""
    an4, data = s.out / "data" / "an4", s.out / "data"
    steps = [_prepare("an4", {"out": an4, "dev_utterances": s.dev_utterances, **_corpus_dir(s.an4)})]
    if s.labels != 100:  # the labeled subset (decoding needs it too: the lexicon's LM reads the training text)
        subset = {"src": an4, "split": "train", "speakers": labels_list(s.labels), "name": labels_split(s)}
        steps.append(_prepare("subset", subset, ("prepare_an4",)))
    if s.narrowband_copies:  # decoding needs them too (the training text of the lexicon's LM)
        steps += narrowband_copy_steps(s, an4, tuple(step.name for step in steps))
    if not for_training and s.narrowband_test:  # resampled to 8 kHz and back, beside test (split test_8k)
        steps.append(_prepare("bandlimit", {"src": an4, "split": "test", "rate": 8000}, ("prepare_an4",)))
    if for_training and pretrained_here(s):
        inputs = [f"{an4}:an4:unlabeled"]
        if "kathleen" in s.pool:
            steps.append(_prepare("kathleen", {"out": data / "kathleen", **_corpus_dir(s.kathleen)}))
            inputs.append(f"{data / 'kathleen'}:kathleen:unlabeled")
        if "synth" in s.pool:  # its train and unlabeled audio, transcripts dropped
            steps.append(_prepare("synth", {"out": data / "synth", "size": s.synth_size}))
            inputs += [f"{data / 'synth'}:synth:{split}" for split in ("train", "unlabeled")]
        deps = tuple(step.name for step in steps)
        steps.append(_prepare("pool", {"out": an4, "corpus": "an4", "split": "pool", "inputs": inputs}, deps))
    if for_training and "most" in s.variants:
        steps.append(_prepare("an4_text", {"out": an4, "count": s.text_count}, ("prepare_an4",)))
    return steps


def narrowband_copy_steps(s: Settings, an4: Path, deps: tuple[str, ...]) -> list[Step]:
    """The labeled split through an 8 kHz channel (``bandlimit``, the channel of ``test_8k``), then both pooled
    as one labeled split (``pool``): every utterance once wideband and once narrowband."""
    labeled, prepare = labels_split(s), "usmkit.cli.prepare"
    copy = {"src": an4, "split": labeled, "rate": 8000, "name": f"{labeled}_8k"}
    inputs = [f"{an4}:an4:{labeled}", f"{an4}:an4:{copy['name']}"]
    pooled = {"out": an4, "corpus": "an4", "split": finetune_split(s), "labeled": True, "inputs": inputs}
    return [
        Step("prepare_train_8k", prepare, copy, deps, positional=("bandlimit",)),
        Step("prepare_train_nb", prepare, pooled, ("prepare_train_8k",), positional=("pool",)),
    ]


def _corpus_dir(path: str) -> dict[str, str]:
    return {"corpus_dir": path} if path else {}


def common_overrides(s: Settings) -> dict[str, Any]:
    return {
        "data": "an4",
        "data.manifest_dir": s.out / "data" / "an4",
        "model": s.model,
        "model.overrides": s.model_overrides or None,
        "vocab_size": s.vocab_size,
        "trainer.device": s.device,
        "trainer.progress": False,
        "trainer.log_every": 50,
        "trainer.keep_last": 1,
        "data.num_workers": s.workers,
    }


def finetune_overrides(s: Settings, las: bool = False, pretrained: bool = False) -> dict[str, Any]:
    """Every fine-tuning run's settings (stage 2 shares the data and optimizer ones); ``las``: a joint CTC/LAS
    run's; ``pretrained``: a run from a pre-trained encoder's (the encoder's freeze and learning-rate share,
    where set). ``--extra`` comes last, so it overrides any of them."""
    every = max(1, s.finetune_steps // 5)
    features = {} if s.speed_perturb else {"data.features.precomputed": True, "data.speed_perturb": []}
    task = {"recipe": "stage3_las", "task.ctc_weight": s.las_ctc_weight} if las else {"recipe": "stage3_ctc"}
    encoder = {}  # only where set, so that the commands (and step records) of runs without them stay as they were
    if pretrained and s.freeze_encoder_steps:
        encoder["optim.freeze_encoder_steps"] = s.freeze_encoder_steps
    if pretrained and s.encoder_lr_scale != 1.0:
        encoder["optim.encoder_lr_scale"] = s.encoder_lr_scale
    return {
        **task,
        **common_overrides(s),
        "data.max_duration": s.max_duration,
        **({"data.train_split": finetune_split(s)} if finetune_split(s) != "train" else {}),
        "trainer.max_steps": s.finetune_steps,
        "optim.lr": s.finetune_lr,
        "optim.warmup_steps": s.finetune_warmup,
        "task.inter_ctc_weight": 0.3,
        "trainer.eval_every": every,
        "trainer.save_every": every,
        "trainer.max_minutes": s.minutes[2],
        "data.spec_augment.time_masks": 2,
        "data.spec_augment.freq_width": 15,
        **features,
        **encoder,
        **s.extra,
    }


def pretrain_overrides(s: Settings) -> dict[str, Any]:
    return {
        "recipe": "stage1",
        **common_overrides(s),
        "data.train_split": "pool",
        "data.features.precomputed": True,
        "data.speed_perturb": [],
        "data.max_duration": s.pretrain_max_duration,
        "trainer.max_steps": s.pretrain_steps,
        "optim.lr": s.pretrain_lr,
        "optim.warmup_steps": s.pretrain_warmup,
        "trainer.eval_every": s.pretrain_steps,
        "trainer.save_every": s.pretrain_steps,
        "trainer.max_minutes": s.minutes[0],
        **s.pretrain_extra,
    }


def stage2_overrides(s: Settings, encoder: str, pretrain_seed: int | None) -> dict[str, Any]:
    """MOST from a BEST-RQ encoder: its quantizer settings, the fine-tuning data, AN4 train text + generated."""
    an4, every = s.out / "data" / "an4", max(1, s.stage2_steps // 4)
    return {
        **finetune_overrides(s),
        "recipe": "stage2",
        "task.inter_ctc_weight": 0.0,
        "task.most.unlabeled_split": "pool",
        "task.most.text_only": an4 / "an4_text_only.jsonl.gz",
        "task.bestrq.num_codebooks": CODEBOOKS[encoder],
        "task.bestrq.seed": pretrain_seed or 0,  # stage 1's quantizer: MOST loads it and its heads
        "trainer.seed": pretrain_seed or 0,
        "trainer.max_steps": s.stage2_steps,
        "trainer.eval_every": every,
        "trainer.save_every": every,
        "task.most.align_warmup_steps": s.stage2_steps // 4,
        "task.most.text_warmup_steps": s.stage2_steps // 3,
        "trainer.max_minutes": s.minutes[1],
        "init_from": encoder_dir(s, encoder, pretrain_seed),
    }


def train_steps(s: Settings) -> list[Step]:
    """Data, then one step per BEST-RQ, MOST and fine-tuning run, each after what it starts from."""
    steps = data_steps(s, for_training=True)
    pool_deps = ("prepare_pool",) if pretrained_here(s) else ()
    runs_dir = s.out / "runs"

    def train(name: str, overrides: dict, deps: tuple[str, ...]) -> Step:
        return Step(name, "usmkit.cli.train", {**overrides, "trainer.exp_dir": runs_dir / name}, deps)

    # The tokenizer and the feature statistics (of AN4 train, shared by every run) made once, before runs share them.
    steps.append(train("prep_finetune", {**finetune_overrides(s), "trainer.max_steps": 0}, corpus_steps(s)))
    if pretrained_here(s):
        prep = {**pretrain_overrides(s), "trainer.max_steps": 0}
        steps.append(train("prep_pretrain", prep, ("prep_finetune", *pool_deps)))
    for encoder in sorted(pretrained_here(s)):
        for p in s.pretrain_seeds:
            seeds = {"task.bestrq.num_codebooks": CODEBOOKS[encoder], "trainer.seed": p, "task.bestrq.seed": p}
            steps.append(train(f"bestrq_{encoder}_p{p}", {**pretrain_overrides(s), **seeds}, ("prep_pretrain",)))
    if "most" in s.variants:
        for p in pretrain_seeds_of(s, s.most_from):
            deps = ("prep_finetune", "prepare_an4_text", *_encoder_step(s, s.most_from, p))
            steps.append(train(stage2_name(s.most_from, p), stage2_overrides(s, s.most_from, p), deps))
    for run in runs_of(s):
        encoder, deps = encoder_of(s, run.variant), ("prep_finetune",)
        overrides = {
            **finetune_overrides(s, las=run.variant == "las", pretrained=encoder is not None),
            "trainer.seed": run.seed,
        }
        if run.variant == "most":  # stage 3 from the MOST model (its CTC head too: the same tokenizer)
            overrides["init_from"] = runs_dir / stage2_name(encoder, run.pretrain_seed)
            deps += (stage2_name(encoder, run.pretrain_seed),)
        elif encoder is not None:
            overrides["init_from"] = encoder_dir(s, encoder, run.pretrain_seed)
            deps += _encoder_step(s, encoder, run.pretrain_seed)
        steps.append(train(run.name, overrides, deps))
    return steps


def _encoder_step(s: Settings, encoder: str, pretrain_seed: int | None) -> tuple[str, ...]:
    return () if encoder in s.stage1 else (f"bestrq_{encoder}_p{pretrain_seed}",)


# lexicon_rescore (``las`` runs): the lexicon decoder's n-best, with the lexicon settings chosen on dev, rescored by the
# attention decoder; the lexicon score's share of the combined score is chosen on dev among these.
RESCORE_NBEST = 10


def decode_steps(s: Settings) -> list[Step]:
    """Per run and per ensemble: greedy (and LAS rescoring) on dev and test; the lexicon settings chosen on
    dev, then test once with them."""
    steps = data_steps(s, for_training=False)
    tests = ["test", NARROWBAND] if s.narrowband_test else ["test"]
    data = corpus_steps(s)
    deps = (*data, "prepare_bandlimit") if s.narrowband_test else data
    models = {run.name: ([run], decodes_of(run.variant)) for run in runs_of(s)}
    models |= {name: (runs, ("ctc_greedy", "ctc_lexicon")) for name, runs in ensembles_of(s).items()}
    for name, (runs, decodes) in models.items():
        out = s.out / "decode" / name
        model = {"checkpoint": s.runs_dir / runs[0].name, "device": s.device}
        if len(runs) > 1:
            model["ensemble"] = [s.runs_dir / r.name for r in runs[1:]]
        for decode in decodes:
            if decode in ("ctc_lexicon", "lexicon_rescore"):
                continue
            evaluate = {**model, "test_sets": ["dev", *tests], "decode": decode, "output": out / f"{decode}.json"}
            steps.append(Step(f"{decode}_{name}", "usmkit.cli.evaluate", evaluate, deps))
        grid = {"orders": s.lm_orders, "lm_weights": s.lm_weights, "word_scores": s.word_scores}
        tuned = out / "lexicon_tuning_dev.json"
        tune = {**model, "set": "dev", **grid, "output": tuned}
        steps.append(Step(f"tune_lexicon_{name}", "usmkit.cli.tune_lexicon", tune, data))
        steps.append(
            Step(
                f"ctc_lexicon_{name}",
                "usmkit.cli.evaluate",
                lambda model=model, tuned=tuned, out=out: {
                    **model,
                    "test_sets": tests,
                    "decode": "ctc_lexicon",
                    **chosen_lexicon(tuned),
                    "output": out / "ctc_lexicon.json",
                },
                (f"tune_lexicon_{name}", *deps[1:]),
            )
        )
        if "lexicon_rescore" in decodes:
            steps += lexicon_rescore_steps(name, model, tuned, out, tests, deps)
    return steps


def lexicon_rescore_steps(name: str, model: dict, tuned: Path, out: Path, tests: list[str], deps) -> list[Step]:
    """Dev with each of ``RESCORE_WEIGHTS`` (the lexicon settings chosen on dev), then the test sets once with
    the weight best on dev."""
    steps, dev_steps = [], []
    for w in RESCORE_WEIGHTS:
        dev_steps.append(f"lexicon_rescore_dev_w{w}_{name}")
        steps.append(
            Step(
                dev_steps[-1],
                "usmkit.cli.evaluate",
                lambda w=w: {
                    **model,
                    "test_sets": ["dev"],
                    "decode": "lexicon_rescore",
                    **chosen_lexicon(tuned),
                    "lexicon.nbest": RESCORE_NBEST,
                    "rescore_ctc_weight": w,
                    "output": out / f"lexicon_rescore_dev_w{w}.json",
                },
                (f"tune_lexicon_{name}", *deps[1:]),
            )
        )
    steps.append(
        Step(
            f"lexicon_rescore_{name}",
            "usmkit.cli.evaluate",
            lambda: {
                **model,
                "test_sets": tests,
                "decode": "lexicon_rescore",
                **chosen_lexicon(tuned),
                "lexicon.nbest": RESCORE_NBEST,
                "rescore_ctc_weight": chosen_rescore(out)[0],
                "output": out / "lexicon_rescore.json",
            },
            tuple(dev_steps),
        )
    )
    return steps


# ---------------------------------------------------------------- command line
def main(argv: Sequence[str] | None = None, execute: Execute | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    stages, s = parse_args(argv)
    execute = execute or subprocess_runner(s.out, s.jobs)
    try:
        if "prepare" in stages:
            for_training = "train" in stages or stages == ("prepare",)
            run_steps("prepare", data_steps(s, for_training), s.out, s.jobs, execute)
        if "train" in stages:
            run_steps("train", train_steps(s), s.out, s.jobs, execute)
            if s.save_encoder in pretrained_here(s):
                p = s.pretrain_seeds[0]
                save_encoder(encoder_dir(s, s.save_encoder, p), s.out / "bestrq_encoder")
            if s.export:
                for run in runs_of(s):
                    export_run(s.out / "runs" / run.name, s.export / run.name)
                print(f"[train] exported {len(runs_of(s))} runs to {s.export}")
        if "decode" in stages:
            run_steps("decode", decode_steps(s), s.out, s.jobs, execute)
        if "report" in stages:
            report = build_report(s, shlex.join(["python", "recipes/an4/run.py", *argv]))
            with replaced_atomically(s.report) as tmp:
                tmp.write_text(json.dumps(report, indent=2) + "\n")
            print_report(report)
            print(f"wrote {s.report}")
    except StageFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
