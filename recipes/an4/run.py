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

Each step that succeeds leaves a record (its command) in ``OUT/steps/``. A rerun skips the steps recorded
with the same command and resumes a training run stopped part way, so a stage reruns alone and an
interrupted stage goes on where it stopped; a step recorded with another command is refused (remove its
record and its outputs to redo it). Logs: ``OUT/logs/<step>.log``.

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

import argparse
import json
import shlex
import shutil
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from steps import Execute, StageFailed, Step, now, parse_overrides, run_steps, subprocess_runner  # recipes/an4/steps.py

from usmkit.checkpointing.atomic import replaced_atomically, replaced_dir_atomically

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("prepare", "train", "decode", "report")
VARIANTS = ("scratch", "cb1", "cb16", "las", "most")
CODEBOOKS = {"cb1": 1, "cb16": 16}  # the BEST-RQ encoders
POOLS = ("an4", "kathleen", "synth")  # synth: the embedded synthesizer's English speech (espeak-ng voices)
NARROWBAND = "test_8k"  # the test split resampled to 8 kHz and back (``python -m usmkit.cli.prepare bandlimit``)


@dataclass(frozen=True)
class Settings:
    """Every choice of the recipe (the command line's options, typed)."""

    out: Path = Path("exp/an4_recipe")
    an4: str = ""  # corpus folders; empty: $USMKIT_CORPORA/<name>
    kathleen: str = ""
    pool: tuple[str, ...] = ("an4", "kathleen")  # the corpora whose unlabeled audio BEST-RQ learns from (POOLS)
    synth_size: str = "english"  # the synthetic corpus of a pool with synth (``prepare synth size=``)
    dev_utterances: int = 100
    narrowband_test: bool = True  # also score every model on test_8k: the test set through an 8 kHz channel
    variants: tuple[str, ...] = VARIANTS
    labels: int = 100  # percent of AN4 train's labels the fine-tuning runs see (speakers of lists/train_<labels>.txt)
    seeds: tuple[int, ...] = (0, 1, 2)
    pretrain_seeds: tuple[int, ...] = (0, 1)
    stage1: Mapping[str, str] = field(default_factory=dict)  # BEST-RQ encoders given instead of pre-trained here
    las_from: str = "cb16"
    las_ctc_weight: float = 0.7  # CTC's share of the joint CTC/LAS runs' loss (chosen on dev: docs/recipes.md)
    most_from: str = "cb16"
    model: str = "tiny"
    model_overrides: Mapping[str, Any] | None = field(default_factory=lambda: {"subsampling_channels": 32})
    vocab_size: int = 290  # the specials, byte fallback and the letters
    device: str = "auto"
    workers: int = 2
    max_duration: float = 50.0
    speed_perturb: bool = False
    # Fine-tune on the labeled split plus a stored copy of it through an 8 kHz channel (narrowband training
    # data whose features are stored like the wideband ones; the waveform augmentation needs them on the fly).
    narrowband_copies: bool = False
    finetune_steps: int = 2000
    finetune_lr: float = 2.5e-3
    finetune_warmup: int = 300
    # Runs from a pre-trained encoder (not scratch): the encoder held still for this many steps while the new
    # head settles, then at this share of the learning rate (with few labels: docs/recipes.md).
    freeze_encoder_steps: int = 0
    encoder_lr_scale: float = 1.0
    pretrain_steps: int = 1000
    pretrain_lr: float = 2e-3
    pretrain_warmup: int = 500
    pretrain_max_duration: float = 100.0
    stage2_steps: int = 400
    text_count: int = 20000
    minutes: tuple[float, float, float] = (0.0, 0.0, 0.0)  # trainer.max_minutes: pre-training, stage 2, fine-tuning
    extra: Mapping[str, Any] = field(default_factory=dict)  # more overrides of every fine-tuning run
    pretrain_extra: Mapping[str, Any] = field(default_factory=dict)  # and of every BEST-RQ run
    lm_orders: tuple[int, ...] = (1, 2)
    lm_weights: tuple[float, ...] = (0.5, 1.0)
    word_scores: tuple[float, ...] = (0.0, 1.0)
    ensembles: tuple[str, ...] = VARIANTS  # variants whose runs are also decoded as one ensemble
    runs: Path | None = None  # the fine-tuned runs to decode; None: OUT/runs
    export: Path | None = None
    save_encoder: str = "cb16"
    jobs: int = 4
    report: Path = ROOT / "bench" / "results" / "an4.json"

    @property
    def runs_dir(self) -> Path:
        return self.runs or self.out / "runs"


# ---------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Run:
    """One fine-tuning run: a variant, its fine-tuning seed and (rows from BEST-RQ) its pre-training seed."""

    variant: str
    seed: int
    pretrain_seed: int | None = None  # None: from scratch, or from an encoder given with --stage1

    @property
    def name(self) -> str:
        pre = "" if self.pretrain_seed is None else f"_p{self.pretrain_seed}"
        return f"{self.variant}{pre}_s{self.seed}"


def encoder_of(s: Settings, variant: str) -> str | None:
    """The BEST-RQ encoder (cb1 / cb16) a variant starts from; None for scratch."""
    return {"scratch": None, "las": s.las_from, "most": s.most_from}.get(variant, variant)


def pretrain_seeds_of(s: Settings, encoder: str | None) -> tuple[int | None, ...]:
    return (None,) if encoder is None or encoder in s.stage1 else s.pretrain_seeds


def runs_of(s: Settings) -> list[Run]:
    return [Run(v, seed, p) for v in s.variants for p in pretrain_seeds_of(s, encoder_of(s, v)) for seed in s.seeds]


def encoder_dir(s: Settings, encoder: str, pretrain_seed: int | None) -> Path:
    return Path(s.stage1[encoder]) if encoder in s.stage1 else s.out / "runs" / f"bestrq_{encoder}_p{pretrain_seed}"


def stage2_name(encoder: str, pretrain_seed: int | None) -> str:
    return f"most_{encoder}" + ("" if pretrain_seed is None else f"_p{pretrain_seed}")


def labels_split(s: Settings) -> str:
    """The labeled split: ``train``, or ``train_<labels>`` (the speakers of its list)."""
    return "train" if s.labels == 100 else f"train_{s.labels}"


def finetune_split(s: Settings) -> str:
    """The fine-tuning runs' training split: the labeled split, or (``--narrowband-copies``) ``<labeled>_nb``,
    the labeled split and its 8 kHz-channel copy ``<labeled>_8k`` pooled."""
    return f"{labels_split(s)}_nb" if s.narrowband_copies else labels_split(s)


def labels_list(labels: int) -> Path:
    return Path(__file__).resolve().parent / "lists" / f"train_{labels}.txt"


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


def pretrained_here(s: Settings) -> set[str]:
    """The BEST-RQ encoders this recipe pre-trains (those the variants need and --stage1 does not give)."""
    return {e for v in s.variants if (e := encoder_of(s, v)) is not None and e not in s.stage1}


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
RESCORE_WEIGHTS = (0.3, 0.5, 0.7, 0.9)
RESCORE_NBEST = 10


def decodes_of(variant: str) -> tuple[str, ...]:
    if variant == "las":
        return ("ctc_greedy", "ctc_lexicon", "rescore", "lexicon_rescore")
    return ("ctc_greedy", "ctc_lexicon")


def ensembles_of(s: Settings) -> dict[str, list[Run]]:
    """``ensemble_<variant>``: each variant of ``s.ensembles`` with at least two runs, all of them."""
    by_variant = {v: [r for r in runs_of(s) if r.variant == v] for v in s.variants if v in s.ensembles}
    return {f"ensemble_{v}": runs for v, runs in by_variant.items() if len(runs) > 1}


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


def chosen_rescore(out: Path) -> tuple[float, float]:
    """The rescoring weight with the lowest dev WER (the first of equals) and that WER, from the dev files in ``out``."""
    dev = {
        w: json.loads((out / f"lexicon_rescore_dev_w{w}.json").read_text())["sets"]["dev"]["wer"]
        for w in RESCORE_WEIGHTS
    }
    best = min(RESCORE_WEIGHTS, key=dev.__getitem__)
    return best, dev[best]


def chosen_lexicon(tuning_json: Path) -> dict[str, Any]:
    best = json.loads(tuning_json.read_text())["best"]
    return {f"lexicon.{k}": best[k] for k in ("order", "lm_weight", "word_score")}


# ---------------------------------------------------------------- what the runs hand on
def save_encoder(exp: Path, dest: Path) -> None:
    """The encoder's weights (``init_from`` reads nothing else) of ``exp``'s best (else latest) checkpoint,
    with its config."""
    from safetensors.torch import load_file, save_file

    from usmkit.checkpointing.checkpoint import MODEL_FILE, resolve_checkpoint

    src = resolve_checkpoint(exp)
    weights = {k: v for k, v in load_file(src / MODEL_FILE).items() if k.startswith("encoder.")}
    with replaced_dir_atomically(dest) as tmp:
        save_file(weights, tmp / MODEL_FILE)
        (tmp / "config.yaml").write_text((src / "config.yaml").read_text())


def export_run(exp: Path, dest: Path) -> None:
    """What decoding ``exp`` needs, nothing more: its best (else latest) checkpoint's weights and config, the
    run's tokenizer and feature statistics, and its metrics; ``dest`` then decodes as ``exp`` would."""
    from usmkit.checkpointing.checkpoint import BEST_FILE, CONFIG_FILE, MODEL_FILE, resolve_checkpoint

    src = resolve_checkpoint(exp)
    with replaced_dir_atomically(dest) as tmp:
        ckpt = tmp / "checkpoints" / src.name
        ckpt.mkdir(parents=True)
        for f in (MODEL_FILE, CONFIG_FILE):
            shutil.copy2(src / f, ckpt / f)
        best = src.parent / BEST_FILE  # how the copy is found: as its run's best checkpoint
        best_json = json.loads(best.read_text()) if best.is_file() else {}
        if best_json.get("path") != src.name:
            best_json = {"path": src.name, "metric": "latest", "value": None, "step": None}
        (ckpt.parent / BEST_FILE).write_text(json.dumps(best_json))
        for f in ("tokenizer.model", "feature_stats.safetensors", "metrics.jsonl"):
            shutil.copy2(exp / f, tmp / f)


# ---------------------------------------------------------------- report
def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def scores(s: Settings, name: str, decode: str) -> dict[str, Any] | None:
    """dev and test WER (test CER) of one model and decoding from the decode stage's files; None if missing."""
    folder = s.out / "decode" / name
    if decode == "ctc_lexicon":
        tuning, test = _read(folder / "lexicon_tuning_dev.json"), _read(folder / "ctc_lexicon.json")
        if tuning is None or test is None:
            return None
        lexicon = {k: tuning["best"][k] for k in ("order", "lm_weight", "word_score")}
        return {"dev_wer": tuning["best"]["wer"], **_test(test), "lexicon": lexicon}
    if decode == "lexicon_rescore":
        test = _read(folder / "lexicon_rescore.json")
        if test is None:
            return None
        weight, dev_wer = chosen_rescore(folder)
        return {"dev_wer": dev_wer, **_test(test), "rescore_ctc_weight": weight}
    result = _read(folder / f"{decode}.json")
    return None if result is None else {"dev_wer": result["sets"]["dev"]["wer"], **_test(result)}


def _test(result: dict) -> dict[str, float]:
    """test WER and CER, and test_8k's WER where it was scored."""
    sets = result["sets"]
    narrowband = {"test_8k_wer": sets[NARROWBAND]["wer"]} if NARROWBAND in sets else {}
    return {"test_wer": sets["test"]["wer"], "test_cer": sets["test"]["cer"], **narrowband}


def mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n - 1; None for one value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def build_report(s: Settings, command: str = "") -> dict[str, Any]:
    """Rows per run and decoding, their mean +- sd per variant and decoding, ensembles apart."""
    rows, ensembles, missing = [], [], []
    for run in runs_of(s):
        for decode in decodes_of(run.variant):
            found = scores(s, run.name, decode)
            if found is None:
                missing.append(f"{run.name} {decode}")
                continue
            rows.append(
                {"variant": run.variant, "seed": run.seed, "pretrain_seed": run.pretrain_seed, "run": run.name,
                 "decode": decode, **found, "finetune_steps": _last_step(s.runs_dir / run.name)}
            )  # fmt: skip
    for name, members in ensembles_of(s).items():
        for decode in ("ctc_greedy", "ctc_lexicon"):
            found = scores(s, name, decode)
            if found is None:
                missing.append(f"{name} {decode}")
                continue
            variant = members[0].variant
            ensembles.append({"variant": variant, "members": [r.name for r in members], "decode": decode, **found})
    summary = []
    for variant in s.variants:
        for decode in decodes_of(variant):
            group = [r for r in rows if r["variant"] == variant and r["decode"] == decode]
            if not group:
                continue
            dev, dev_sd = mean_sd([r["dev_wer"] for r in group])
            test, test_sd = mean_sd([r["test_wer"] for r in group])
            row = {"variant": variant, "decode": decode, "runs": len(group), "dev_wer_mean": dev,
                   "dev_wer_sd": dev_sd, "test_wer_mean": test, "test_wer_sd": test_sd}  # fmt: skip
            if all("test_8k_wer" in r for r in group):
                row["test_8k_wer_mean"], row["test_8k_wer_sd"] = mean_sd([r["test_8k_wer"] for r in group])
            summary.append(row)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(s).items()}
    return {
        "recipe": "recipes/an4/run.py",
        "command": command,
        "date": now(),
        "settings": settings,
        "test_configurations": len(rows) + len(ensembles),
        "summary": summary,
        "rows": rows,
        "ensembles": ensembles,
        "missing": missing,
    }


def _last_step(exp: Path) -> int | None:
    """The last step a run logged in its ``metrics.jsonl`` (below trainer.max_steps when max_minutes stopped it)."""
    metrics = exp / "metrics.jsonl"
    if not metrics.is_file():
        return None
    return max(
        (json.loads(line).get("step", 0) for line in metrics.read_text().splitlines() if line.strip()), default=0
    )


def print_report(report: dict[str, Any]) -> None:
    def pm(mean: float, sd: float | None) -> str:
        return f"{100 * mean:6.2f} +- {100 * sd:5.2f}" if sd is not None else f"{100 * mean:6.2f}         "

    print(f"\n{'variant':<8} {'decode':<12} {'runs':>4}  {'dev WER %':<15} {'test WER %':<15} {'test_8k WER %':<15}")
    for r in report["summary"]:
        dev, test = pm(r["dev_wer_mean"], r["dev_wer_sd"]), pm(r["test_wer_mean"], r["test_wer_sd"])
        narrowband = pm(r["test_8k_wer_mean"], r["test_8k_wer_sd"]) if "test_8k_wer_mean" in r else ""
        print(f"{r['variant']:<8} {r['decode']:<12} {r['runs']:>4}  {dev} {test} {narrowband}")
    if report["ensembles"]:
        print("\nensembles (all runs of a variant as one model):")
        for e in report["ensembles"]:
            print(
                f"{e['variant']:<8} {e['decode']:<12} {len(e['members']):>4}  {pm(e['dev_wer'], None)} {pm(e['test_wer'], None)}"
            )
    if report["missing"]:
        print(f"\nnot decoded yet: {', '.join(report['missing'])}")
    print(f"\n{report['test_configurations']} configurations scored on test, once each")


# ---------------------------------------------------------------- command line
def parse_args(argv: Sequence[str] | None = None) -> tuple[tuple[str, ...], Settings]:
    d = Settings()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="*", metavar="STAGE", help=f"of {', '.join(STAGES)} (default: all)")
    ap.add_argument("--out", type=Path, default=d.out)
    ap.add_argument("--an4", default="", help="the AN4 corpus folder (default $USMKIT_CORPORA/an4)")
    ap.add_argument("--kathleen", default="", help="the Kathleen corpus folder (default $USMKIT_CORPORA/kathleen)")
    ap.add_argument("--pool", default=",".join(d.pool), help=f"corpora of the unlabeled pool, of {', '.join(POOLS)}")
    ap.add_argument("--synth-size", default=d.synth_size, help="with --pool ...,synth: its size (prepare synth size=)")
    ap.add_argument("--dev-utterances", type=int, default=d.dev_utterances)
    ap.add_argument("--no-narrowband-test", action="store_true", help="do not score test_8k (test through 8 kHz)")
    ap.add_argument("--variants", default=",".join(d.variants), help=f"of {', '.join(VARIANTS)}")
    ap.add_argument(
        "--labels",
        type=int,
        default=d.labels,
        help="percent of AN4 train's labels to fine-tune on: 100, or a list's (lists/train_<N>.txt: 10, 30)",
    )
    ap.add_argument("--seeds", default=_csv(d.seeds), help="fine-tuning seeds (trainer.seed)")
    ap.add_argument("--pretrain-seeds", default=_csv(d.pretrain_seeds), help="BEST-RQ seeds (run and quantizer)")
    ap.add_argument("--stage1", nargs="*", default=[], metavar="NAME=DIR", help="start cb1/cb16 from these encoders")
    ap.add_argument("--las-from", default=d.las_from, choices=sorted(CODEBOOKS))
    ap.add_argument("--las-ctc-weight", type=float, default=d.las_ctc_weight, help="CTC's share of the las loss")
    ap.add_argument("--most-from", default=d.most_from, choices=sorted(CODEBOOKS))
    ap.add_argument("--model", default=d.model)
    ap.add_argument("--model-overrides", default="{subsampling_channels: 32}", help="model.overrides ('' for none)")
    ap.add_argument("--vocab-size", type=int, default=d.vocab_size)
    ap.add_argument("--device", default=d.device)
    ap.add_argument("--workers", type=int, default=d.workers, help="loader workers per training run")
    ap.add_argument("--max-duration", type=float, default=d.max_duration)
    ap.add_argument("--speed-perturb", action="store_true", help="0.9/1.0/1.1 speed perturbation (features on the fly)")
    ap.add_argument("--narrowband-copies", action="store_true",
                    help="fine-tune on the labels and their copy through an 8 kHz channel (stored features)")  # fmt: skip
    ap.add_argument("--finetune-steps", type=int, default=d.finetune_steps)
    ap.add_argument("--finetune-lr", type=float, default=d.finetune_lr)
    ap.add_argument("--finetune-warmup", type=int, default=d.finetune_warmup)
    ap.add_argument("--freeze-encoder-steps", type=int, default=d.freeze_encoder_steps,
                    help="runs from a pre-trained encoder: steps in which only the new head learns")  # fmt: skip
    ap.add_argument("--encoder-lr-scale", type=float, default=d.encoder_lr_scale,
                    help="runs from a pre-trained encoder: the encoder's share of the learning rate after that")  # fmt: skip
    ap.add_argument("--pretrain-steps", type=int, default=d.pretrain_steps)
    ap.add_argument("--pretrain-lr", type=float, default=d.pretrain_lr)
    ap.add_argument("--pretrain-warmup", type=int, default=d.pretrain_warmup)
    ap.add_argument("--pretrain-max-duration", type=float, default=d.pretrain_max_duration)
    ap.add_argument("--stage2-steps", type=int, default=d.stage2_steps, help="MOST steps of the 'most' variant")
    ap.add_argument("--text-count", type=int, default=d.text_count, help="generated AN4-style sentences for MOST")
    ap.add_argument("--minutes", type=float, nargs=3, default=d.minutes, metavar=("PRETRAIN", "STAGE2", "FINETUNE"),
                    help="trainer.max_minutes of each kind of run (0 = none)")  # fmt: skip
    ap.add_argument("--extra", nargs="*", default=[], metavar="KEY=VALUE", help="more fine-tuning overrides")
    ap.add_argument("--pretrain-extra", nargs="*", default=[], metavar="KEY=VALUE", help="more BEST-RQ overrides")
    ap.add_argument("--lm-orders", default=_csv(d.lm_orders))
    ap.add_argument("--lm-weights", default=_csv(d.lm_weights))
    ap.add_argument("--word-scores", default=_csv(d.word_scores))
    ap.add_argument("--ensembles", default=",".join(d.ensembles), help="variants also decoded as one ensemble ('')")
    ap.add_argument("--runs", type=Path, default=None, help="decode the fine-tuned runs here (default OUT/runs)")
    ap.add_argument("--export", type=Path, default=None, help="after training, copy each run's best checkpoint here")
    ap.add_argument("--save-encoder", default=d.save_encoder, help="save this encoder to OUT/bestrq_encoder ('')")
    ap.add_argument("--jobs", type=int, default=d.jobs, help="steps run side by side")
    ap.add_argument("--report", type=Path, default=d.report)
    ap.add_argument("--train-only", action="store_true", help="= the stages prepare train")
    ap.add_argument("--decode-only", action="store_true", help="= the stages prepare decode report")
    a = ap.parse_args(argv)
    if not set(a.stages) <= set(STAGES):
        ap.error(f"stages are {', '.join(STAGES)}, got {' '.join(a.stages)}")
    if (a.train_only or a.decode_only) and (a.stages or a.train_only == a.decode_only):
        ap.error("--train-only and --decode-only each replace the list of stages: give one of them, and no stage")
    stages = ("prepare", "train") if a.train_only else ("prepare", "decode", "report") if a.decode_only else ()
    stages = stages or tuple(st for st in STAGES if st in a.stages) or STAGES
    variants, stage1 = _names(a.variants), dict(kv.split("=", 1) for kv in a.stage1 if "=" in kv)
    if not set(variants) <= set(VARIANTS) or len(stage1) != len(a.stage1) or not set(stage1) <= set(CODEBOOKS):
        ap.error(f"--variants takes {', '.join(VARIANTS)}; --stage1 takes NAME=DIR with NAME in {sorted(CODEBOOKS)}")
    if a.labels != 100 and not labels_list(a.labels).is_file():
        lists = sorted(p.stem.removeprefix("train_") for p in labels_list(a.labels).parent.glob("train_*.txt"))
        ap.error(
            f"--labels {a.labels}: no speaker list {labels_list(a.labels)}; choose 100 or one of {', '.join(lists)} "
            "(python -m usmkit.cli.prepare subset ... fraction=F writes a new one)"
        )
    if not set(_names(a.pool)) <= set(POOLS):
        ap.error(f"--pool {a.pool}: the pool takes {', '.join(POOLS)}")
    if a.freeze_encoder_steps < 0 or a.encoder_lr_scale < 0:
        ap.error(
            f"--freeze-encoder-steps {a.freeze_encoder_steps} / --encoder-lr-scale {a.encoder_lr_scale}: "
            "both must be >= 0"
        )
    try:
        extra, pretrain_extra = parse_overrides(a.extra), parse_overrides(a.pretrain_extra)
    except ValueError as e:
        ap.error(f"--extra / --pretrain-extra: {e}")
    settings = Settings(
        out=a.out, an4=a.an4, kathleen=a.kathleen, pool=_names(a.pool), synth_size=a.synth_size,
        dev_utterances=a.dev_utterances,
        narrowband_test=not a.no_narrowband_test,
        variants=variants, labels=a.labels, seeds=_ints(a.seeds), pretrain_seeds=_ints(a.pretrain_seeds), stage1=stage1,
        las_from=a.las_from, las_ctc_weight=a.las_ctc_weight, most_from=a.most_from, model=a.model,
        model_overrides=yaml.safe_load(a.model_overrides) if a.model_overrides else None, vocab_size=a.vocab_size,
        device=a.device, workers=a.workers, max_duration=a.max_duration, speed_perturb=a.speed_perturb,
        narrowband_copies=a.narrowband_copies,
        finetune_steps=a.finetune_steps, finetune_lr=a.finetune_lr, finetune_warmup=a.finetune_warmup,
        freeze_encoder_steps=a.freeze_encoder_steps, encoder_lr_scale=a.encoder_lr_scale,
        pretrain_steps=a.pretrain_steps, pretrain_lr=a.pretrain_lr, pretrain_warmup=a.pretrain_warmup,
        pretrain_max_duration=a.pretrain_max_duration, stage2_steps=a.stage2_steps, text_count=a.text_count,
        minutes=tuple(a.minutes), extra=extra, pretrain_extra=pretrain_extra,
        lm_orders=_ints(a.lm_orders), lm_weights=_floats(a.lm_weights), word_scores=_floats(a.word_scores),
        ensembles=_names(a.ensembles), runs=a.runs, export=a.export, save_encoder=a.save_encoder, jobs=a.jobs,
        report=a.report,
    )  # fmt: skip
    return stages, settings


def _csv(values: Sequence) -> str:
    return ",".join(str(v) for v in values)


def _names(text: str) -> tuple[str, ...]:
    return tuple(x for x in text.split(",") if x)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in _names(text))


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in _names(text))


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
