"""The AN4 recipe's settings (``recipes/an4/run.py``'s command line, typed) and the runs they make: each
variant's fine-tuning runs with their seeds, the encoders they start from, and how each is decoded."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from usmkit.recipes.steps import parse_overrides

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


# ---------------------------------------------------------------- the runs
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


def pretrained_here(s: Settings) -> set[str]:
    """The BEST-RQ encoders this recipe pre-trains (those the variants need and --stage1 does not give)."""
    return {e for v in s.variants if (e := encoder_of(s, v)) is not None and e not in s.stage1}


def decodes_of(variant: str) -> tuple[str, ...]:
    if variant == "las":
        return ("ctc_greedy", "ctc_lexicon", "rescore", "lexicon_rescore")
    return ("ctc_greedy", "ctc_lexicon")


def ensembles_of(s: Settings) -> dict[str, list[Run]]:
    """``ensemble_<variant>``: each variant of ``s.ensembles`` with at least two runs, all of them."""
    by_variant = {v: [r for r in runs_of(s) if r.variant == v] for v in s.variants if v in s.ensembles}
    return {f"ensemble_{v}": runs for v, runs in by_variant.items() if len(runs) > 1}


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
