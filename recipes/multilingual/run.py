"""One CTC model on the seven languages of Debian's speech packages against one model per language, at equal
steps, every step a usmkit command (printed as it runs).

    python recipes/multilingual/run.py --debs DEBS [data] [train] [decode] [report] [--out exp/multilingual]
        [--languages en,es,fr,it,ru,cs,nl] [--seeds 0,1,2] [--steps 2000] [--temperature 3] [--jobs 1] ...

No stage named: all four, in order.

- data: ``prepare asterisk`` (en, es, fr, it, ru) and ``prepare fillets`` (cs, nl) from the packages in ``--debs``
  (``apt-get download ...``: docs/recipes.md), then one corpus ``multilingual`` (``prepare pool labeled=true``) with
  ``train`` and ``dev`` of every chosen language and each language's ``train_LANG``, ``dev_LANG``, ``test_LANG``;
  with ``--english DIR:CORPUS ...`` (prepared English corpora, e.g. ``data/an4:an4 data/kathleen:kathleen``)
  their ``train`` and ``dev`` join the multilingual model's, and it is scored on their ``test`` too; then one
  tokenizer (sentencepiece over every script, byte fallback; ``--vocab-size``) on ``train``, shared by every run,
  so the models differ in their training data only.
- train: per seed, the multilingual model (``train``, languages drawn with probability proportional to
  n_l^(1/T), ``--temperature``: ``data.language_temperature``) and one model per language (``train_LANG``), each
  ``--steps`` steps from scratch, the ``--model`` encoder.
- decode: CTC greedy on every language's dev and test split (the multilingual model), on its own language's
  (the others).
- report: per language, test WER and CER of the multilingual and the single-language models, mean +- sd over
  the seeds, with the dev scores; every row to ``--report``.

The asterisk audio is 8 kHz, loaded at 16 kHz (its band above 4 kHz empty), as the narrowband test sets of the
AN4 recipe are. Steps are recorded in ``OUT/steps/`` and skipped when rerun with the same command
(``usmkit.recipes.steps``); logs in ``OUT/logs/``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from usmkit.recipes.steps import Execute, StageFailed, Step, now, run_steps, subprocess_runner

STAGES = ("data", "train", "decode", "report")
CORPORA = {"asterisk": ("en", "es", "fr", "it", "ru"), "fillets": ("cs", "nl")}
LANGUAGES = tuple(lang for langs in CORPORA.values() for lang in langs)
CORPUS = "multilingual"


@dataclass(frozen=True)
class Settings:
    debs: Path = Path("../debs")
    out: Path = Path("exp/multilingual")
    languages: tuple[str, ...] = LANGUAGES
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 2000
    temperature: float = 3.0  # chosen on dev against 1 (experiments/multilingual/README.md)
    recipe: str = "stage3_ctc"
    model: str = "tiny"
    model_overrides: dict[str, Any] | None = field(default_factory=lambda: {"subsampling_channels": 32})
    vocab_size: int | None = 512  # None: characters only (the smallest vocabulary the transcripts fit)
    max_duration: float = 200.0
    device: str = "auto"
    workers: int = 1
    jobs: int = 1
    extra: dict[str, Any] = field(default_factory=dict)
    report: Path | None = None
    # Which checkpoint of each run is scored: "best" (its best on dev by trainer.best_metric, dev WER) or "last"
    # (its final step: short runs whose dev WER is still 100% or more, where the best by WER is an early one).
    checkpoint: str = "best"
    models: tuple[str, ...] = ("multilingual", "single")  # which of the two kinds of model to train and score
    english: tuple[tuple[Path, str], ...] = ()  # prepared English corpora (folder, corpus name): AN4, Kathleen

    @property
    def data(self) -> Path:
        return self.out / "data" / CORPUS

    @property
    def tokenizer(self) -> Path:
        return self.data / "tokenizer" / "tokenizer.model"

    def scored(self) -> list[str]:
        """What the multilingual model is scored on: each language's test split, and each English corpus's."""
        return [*self.languages, *(corpus for _, corpus in self.english)]

    def corpora(self) -> dict[str, tuple[str, ...]]:
        """The source corpora with the chosen languages of each."""
        chosen = {c: tuple(lang for lang in langs if lang in self.languages) for c, langs in CORPORA.items()}
        return {c: langs for c, langs in chosen.items() if langs}


def run_names(s: Settings) -> dict[str, tuple[str, int, str | None]]:
    """``{run name: (training split, seed, language or None for the multilingual model)}``."""
    runs: dict[str, tuple[str, int, str | None]] = {}
    for seed in s.seeds:
        if "multilingual" in s.models:
            runs[f"multi_s{seed}"] = ("train", seed, None)
        if "single" in s.models:
            for lang in s.languages:
                runs[f"{lang}_s{seed}"] = (f"train_{lang}", seed, lang)
    return runs


def data_steps(s: Settings) -> list[Step]:
    steps, sources = [], []
    for corpus, langs in s.corpora().items():
        folder = s.out / "data" / corpus
        prep = {"out": folder, "debs": s.debs, "languages": list(langs)}
        steps.append(Step(f"prepare_{corpus}", "usmkit.cli.prepare", prep, positional=(corpus,)))
        sources.append((corpus, folder, langs))
    deps = tuple(f"prepare_{corpus}" for corpus, _, _ in sources)
    pools = {split: [f"{folder}:{corpus}:{split}" for corpus, folder, _ in sources] for split in ("train", "dev")}
    for corpus, folder, langs in sources:
        for lang in langs:
            for split in ("train", "dev", "test"):
                pools[f"{split}_{lang}"] = [f"{folder}:{corpus}:{split}_{lang}"]
    for folder, corpus in s.english:  # their train and dev join the multilingual model's; scored apart
        for split in ("train", "dev"):
            pools[split].append(f"{folder}:{corpus}:{split}")
        for split in ("dev", "test"):
            pools[f"{split}_{corpus}"] = [f"{folder}:{corpus}:{split}"]
    for split, inputs in pools.items():
        pool = {"out": s.data, "corpus": CORPUS, "split": split, "labeled": True, "inputs": inputs}
        steps.append(Step(f"pool_{split}", "usmkit.cli.prepare", pool, deps, positional=("pool",)))
    return steps


def train_overrides(s: Settings, split: str, seed: int, lang: str | None) -> dict[str, Any]:
    every = max(1, s.steps // 5)
    return {
        "recipe": s.recipe,
        "data": "kathleen",  # a real-speech data preset; the corpus and splits below
        "data.manifest_dir": s.data,
        "data.corpus": CORPUS,
        "data.train_split": split,
        "data.dev_split": f"dev_{lang}" if lang else "dev",
        "data.language_temperature": 1.0 if lang else s.temperature,
        "data.speed_perturb": [],
        "data.max_duration": s.max_duration,
        "data.num_workers": s.workers,
        "tokenizer": s.tokenizer,
        "model": s.model,
        "model.overrides": s.model_overrides or None,
        "trainer.max_steps": s.steps,
        "trainer.seed": seed,
        "trainer.eval_every": every,
        "trainer.save_every": every,
        "trainer.keep_last": 1,
        "trainer.dev_max_batches": 0,  # the whole dev split: the multilingual one holds every language
        "trainer.device": s.device,
        "trainer.progress": False,
        "trainer.exp_dir": s.out / "runs" / run_name(lang, seed),
        **s.extra,
    }


def run_name(lang: str | None, seed: int) -> str:
    return f"{lang or 'multi'}_s{seed}"


def train_steps(s: Settings) -> list[Step]:
    return [
        Step(name, "usmkit.cli.train", train_overrides(s, split, seed, lang))
        for name, (split, seed, lang) in run_names(s).items()
    ]


def decode_steps(s: Settings) -> list[Step]:
    steps = []
    for name, (_, _, lang) in run_names(s).items():
        langs = [lang] if lang else s.scored()
        sets = [f"{split}_{x}" for x in langs for split in ("dev", "test")]
        overrides = {
            "checkpoint": scored_checkpoint(s.out / "runs" / name, s.checkpoint, s.steps),
            "test_sets": sets,
            "decode": "ctc_greedy",
            "device": s.device,
            "output": s.out / "decode" / f"{name}.json",
        }
        steps.append(Step(f"decode_{name}", "usmkit.cli.evaluate", overrides, (name,)))
    return steps


def scored_checkpoint(run: Path, which: str, steps: int) -> Path:
    """The run (its best checkpoint) or its last step's checkpoint."""
    return run if which == "best" else run / "checkpoints" / f"step-{steps:06d}"


def train_tokenizer(s: Settings) -> None:
    """The shared tokenizer on the multilingual ``train`` split's transcripts, once (``s.tokenizer``)."""
    from usmkit.data.manifests import load_cuts
    from usmkit.data.tokenizer import Tokenizer, minimum_vocab_size

    if s.tokenizer.is_file():
        return
    texts = [sup.text for cut in load_cuts(s.data, "train", corpus=CORPUS) for sup in cut.supervisions if sup.text]
    size = s.vocab_size or minimum_vocab_size(texts)
    Tokenizer.train(texts, s.tokenizer.parent, vocab_size=size)
    print(f"tokenizer: {s.tokenizer} ({size} pieces, {len(texts)} transcripts)", flush=True)


def mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def build_report(s: Settings, command: str = "") -> dict[str, Any]:
    """Per run and language: dev and test WER and CER; per model kind and language: mean and sd over seeds."""
    rows, missing = [], []
    for name, (_, seed, lang) in run_names(s).items():
        path = s.out / "decode" / f"{name}.json"
        if not path.is_file():
            missing.append(name)
            continue
        sets = json.loads(path.read_text())["sets"]
        for x in [lang] if lang else s.scored():
            rows.append(
                {
                    "run": name,
                    "model": "single" if lang else "multilingual",
                    "language": x,
                    "seed": seed,
                    **{f"{split}_{m}": sets[f"{split}_{x}"][m] for split in ("dev", "test") for m in ("wer", "cer")},
                }
            )
    summary = []
    for lang in s.scored():
        for model in ("single", "multilingual"):
            group = [r for r in rows if (r["language"], r["model"]) == (lang, model)]
            if not group:
                continue
            entry: dict[str, Any] = {"language": lang, "model": model, "runs": len(group)}
            for key in ("dev_wer", "test_wer", "test_cer"):
                entry[f"{key}_mean"], entry[f"{key}_sd"] = mean_sd([r[key] for r in group])
            summary.append(entry)
    settings = {
        "recipe": s.recipe,
        "steps": s.steps,
        "temperature": s.temperature,
        "model": s.model,
        "vocab_size": s.vocab_size or "chars",
        "checkpoint": s.checkpoint,
        "seeds": list(s.seeds),
        "extra": {k: str(v) for k, v in s.extra.items()},
    }
    return {
        "recipe": "recipes/multilingual/run.py",
        "command": command,
        "date": now(),
        "settings": settings,
        "train_hours": train_hours(s),
        "rows": rows,
        "summary": summary,
        "missing": missing,
    }


def train_hours(s: Settings) -> dict[str, float]:
    """Hours of training audio of each scored language (``train_LANG``) and English corpus (its ``train``)."""
    from usmkit.data.manifests import load_cuts

    splits = [(s.data, CORPUS, f"train_{lang}", lang) for lang in s.languages]
    splits += [(folder, corpus, "train", corpus) for folder, corpus in s.english]
    hours = {}
    for folder, corpus, split, name in splits:
        try:
            hours[name] = round(sum(c.duration for c in load_cuts(folder, split, corpus=corpus)) / 3600, 3)
        except FileNotFoundError:  # not prepared (yet): the report says so by leaving it out
            continue
    return hours


def print_report(report: dict[str, Any]) -> None:
    def pct(mean: float, sd: float | None) -> str:
        return f"{100 * mean:.2f}" + ("" if sd is None else f" +- {100 * sd:.2f}")

    print("language  model          runs  dev WER          test WER         test CER")
    for e in report["summary"]:
        print(
            f"{e['language']:<9} {e['model']:<14} {e['runs']:>4}  {pct(e['dev_wer_mean'], e['dev_wer_sd']):<16} "
            f"{pct(e['test_wer_mean'], e['test_wer_sd']):<16} {pct(e['test_cer_mean'], e['test_cer_sd'])}"
        )
    if report["missing"]:
        print(f"not decoded yet: {', '.join(report['missing'])}")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse_args(argv: Sequence[str] | None = None) -> tuple[tuple[str, ...], Settings]:
    d = Settings()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="*", metavar="STAGE", help=f"of {', '.join(STAGES)} (default: all)")
    ap.add_argument("--debs", type=Path, default=d.debs, help="the folder `apt-get download ...` wrote the packages to")
    ap.add_argument("--out", type=Path, default=d.out)
    ap.add_argument("--languages", default=",".join(d.languages), help=f"of {', '.join(LANGUAGES)}")
    ap.add_argument("--seeds", default=",".join(map(str, d.seeds)))
    ap.add_argument("--steps", type=int, default=d.steps, help="training steps of every model")
    ap.add_argument("--temperature", type=float, default=d.temperature, help="T of p_l ~ n_l^(1/T), multilingual model")
    ap.add_argument("--recipe", default=d.recipe, help="the training recipe (stage3_ctc_cpu: settings for a CPU)")
    ap.add_argument("--model", default=d.model)
    ap.add_argument("--model-overrides", default="{subsampling_channels: 32}", help="model.overrides ('' for none)")
    ap.add_argument("--vocab-size", default=str(d.vocab_size), help="tokenizer pieces, or 'chars': characters only")
    ap.add_argument("--max-duration", type=float, default=d.max_duration, help="seconds of audio per batch")
    ap.add_argument("--device", default=d.device)
    ap.add_argument("--workers", type=int, default=d.workers, help="loader workers per training run")
    ap.add_argument("--jobs", type=int, default=d.jobs, help="steps side by side")
    ap.add_argument("--extra", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides of every training run")
    ap.add_argument(
        "--english",
        nargs="*",
        default=[],
        metavar="DIR:CORPUS",
        help="prepared English corpora whose train and dev join the multilingual model's (e.g. data/an4:an4)",
    )
    ap.add_argument("--report", type=Path, default=None, help="write the report's JSON here (default OUT/report.json)")
    ap.add_argument("--checkpoint", choices=("best", "last"), default=d.checkpoint, help="which checkpoint is scored")
    ap.add_argument("--models", default=",".join(d.models), help="multilingual, single or both (the default)")
    a = ap.parse_args(argv)
    bad = [x for x in a.stages if x not in STAGES]
    languages = tuple(x.strip() for x in a.languages.split(",") if x.strip())
    unknown = [x for x in languages if x not in LANGUAGES]
    models = tuple(x.strip() for x in a.models.split(",") if x.strip())
    if bad or unknown or not languages or not models or set(models) - {"multilingual", "single"}:
        ap.error(
            f"stages must be of {', '.join(STAGES)}; languages of {', '.join(LANGUAGES)}; models of multilingual, single"
        )
    from usmkit.recipes.steps import parse_overrides

    settings = Settings(
        debs=a.debs,
        out=a.out,
        languages=languages,
        seeds=_ints(a.seeds),
        steps=a.steps,
        temperature=a.temperature,
        recipe=a.recipe,
        model=a.model,
        model_overrides=yaml.safe_load(a.model_overrides) if a.model_overrides else None,
        vocab_size=None if a.vocab_size == "chars" else int(a.vocab_size),
        max_duration=a.max_duration,
        device=a.device,
        workers=a.workers,
        jobs=a.jobs,
        extra=parse_overrides(a.extra),
        report=a.report,
        checkpoint=a.checkpoint,
        models=models,
        english=tuple((Path(folder), corpus) for folder, _, corpus in (x.rpartition(":") for x in a.english)),
    )
    return tuple(a.stages) or STAGES, settings


def main(argv: Sequence[str] | None = None, execute: Execute | None = None) -> int:
    stages, s = parse_args(argv)
    s.out.mkdir(parents=True, exist_ok=True)
    execute = execute or subprocess_runner(s.out, s.jobs)
    try:
        if "data" in stages:
            run_steps("data", data_steps(s), s.out, s.jobs, execute)
            train_tokenizer(s)
        if "train" in stages:
            if not s.tokenizer.is_file():
                raise StageFailed(f"no tokenizer at {s.tokenizer}: run the data stage first")
            run_steps("train", train_steps(s), s.out, s.jobs, execute)
        if "decode" in stages:
            run_steps("decode", decode_steps(s), s.out, s.jobs, execute)
    except StageFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if "report" in stages:
        report = build_report(
            s, shlex.join(["python", "recipes/multilingual/run.py", *(sys.argv[1:] if argv is None else argv)])
        )
        path = s.report or s.out / "report.json"
        path.write_text(json.dumps(report, indent=1) + "\n")
        print_report(report)
        print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
