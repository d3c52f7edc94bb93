"""Cross-lingual pre-training at small scale (issue 60, item 3): BEST-RQ on the pooled audio of every source,
then CTC fine-tuning on 10% of one language's labels, against scratch and against BEST-RQ on that language's
own audio only, at equal pre-training and fine-tuning steps; every step a usmkit command.

    python recipes/multilingual/run.py data --debs DEBS --out exp/ml --vocab-size chars \\
        --english data/an4:an4 data/kathleen:kathleen                   # the corpora and the shared tokenizer
    PYTHONPATH=. python experiments/multilingual/crosslingual.py --ml exp/ml --out exp/xl \\
        --english data/an4:an4 data/kathleen:kathleen --clips ../shared/data/librispeech_clips

Pools (audio only, in the multilingual corpus's folder, so every run shares its tokenizer and feature
statistics): ``pool_all``, every source's audio but the scored languages' dev and test (asterisk's five
languages, all splits; fillets' train; the English corpora's train, dev and test; ``--clips``, a folder of
unlabeled audio read by ``prepare audio_folder``); ``pool_LANG``, the language's own training audio. Each pool
pre-trains one encoder (``--pretrain-steps``, seed 0, 1 codebook: the AN4 study's dev-chosen BEST-RQ). Then per
scored language and seed: fine-tuning on ``--labels`` of ``train_LANG`` (``data.labeled_fraction``: the subset
depends on the seed, the same for every start) from scratch, from ``pool_all`` and from ``pool_LANG``; each
decoded (CTC greedy) on ``dev_LANG`` and ``test_LANG``. The report: per language and start, test CER and WER
mean +- sd over the seeds, the relative CER gain over scratch, whether the target (>= 20% lower) is met;
``--plot`` draws each start's test CER and the fine-tuning dev CER curves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.results import run_header  # noqa: E402
from usmkit.recipes.steps import StageFailed, Step, run_steps, subprocess_runner  # noqa: E402
from usmkit.training.curves import metric_series, read_metrics  # noqa: E402

STAGES = ("data", "pretrain", "finetune", "decode", "report")
CORPUS = "multilingual"
STARTS = ("scratch", "pool_all", "pool_own")
TARGET_GAIN = 0.20
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Settings:
    ml: Path  # the multilingual recipe's --out (its data stage done)
    out: Path
    english: tuple[tuple[Path, str], ...] = ()
    clips: Path | None = None
    languages: tuple[str, ...] = ("cs", "nl")
    seeds: tuple[int, ...] = (0, 1, 2)
    labels: float = 0.1
    pretrain_steps: int = 800
    pretrain_lr: float = 2e-3
    pretrain_warmup: int = 200
    finetune_steps: int = 600
    starts: tuple[str, ...] = STARTS
    # Fine-tuning a pre-trained encoder: frozen for the first quarter of the steps, then at half the head's lr
    # (the AN4 study's setting at 10% of the labels: 500 of 2000 steps, lr / 2); else like scratch.
    frozen: bool = False
    checkpoint: str = "last"  # scored: each run's final step ("best": its best by dev WER)
    device: str = "auto"
    jobs: int = 1

    @property
    def data(self) -> Path:
        return self.ml / "data" / CORPUS

    @property
    def tokenizer(self) -> Path:
        return self.data / "tokenizer" / "tokenizer.model"


def pool_inputs(s: Settings) -> dict[str, list[str]]:
    """``{pool split: [manifest_dir:corpus:split, ...]}``: every source's audio but the scored languages' dev
    and test, and each scored language's own training audio."""
    asterisk, fillets = s.ml / "data" / "asterisk", s.ml / "data" / "fillets"
    every = [f"{asterisk}:asterisk:{split}" for split in ("train", "dev", "test")] + [f"{fillets}:fillets:train"]
    every += [f"{folder}:{corpus}:{split}" for folder, corpus in s.english for split in ("train", "dev", "test")]
    if s.clips:
        every.append(f"{s.out / 'data' / 'clips'}:clips:unlabeled")
    return {"pool_all": every, **{f"pool_{lang}": [f"{fillets}:fillets:train_{lang}"] for lang in s.languages}}


def data_steps(s: Settings) -> list[Step]:
    steps, deps = [], ()
    if s.clips:
        clips = {"corpus_dir": s.clips, "out": s.out / "data" / "clips", "corpus": "clips"}
        steps.append(Step("prepare_clips", "usmkit.cli.prepare", clips, positional=("audio_folder",)))
        deps = ("prepare_clips",)
    for split, inputs in pool_inputs(s).items():
        pool = {"out": s.data, "corpus": CORPUS, "split": split, "inputs": inputs}
        steps.append(Step(f"prepare_{split}", "usmkit.cli.prepare", pool, deps, positional=("pool",)))
    return steps


def common(s: Settings, seed: int) -> dict[str, Any]:
    return {
        "data": "kathleen",  # a real-speech data preset; the corpus and splits are named here
        "data.manifest_dir": s.data,
        "data.corpus": CORPUS,
        "data.speed_perturb": [],
        "data.num_workers": 1,
        "trainer.seed": seed,
        "trainer.keep_last": 1,
        "trainer.dev_max_batches": 0,
        "trainer.device": s.device,
        "trainer.progress": False,
    }


def pretrained_pool(start: str, lang: str) -> str | None:
    """The pool split a start pre-trained on (None: scratch)."""
    return {"scratch": None, "pool_all": "pool_all", "pool_own": f"pool_{lang}"}[start]


def pretrain_steps(s: Settings) -> list[Step]:
    steps = []
    for pool in pool_inputs(s):
        overrides = {
            "recipe": "stage1_cpu",
            **common(s, 0),
            "data.train_split": pool,
            "data.dev_split": "dev",
            "task.bestrq.num_codebooks": 1,
            "optim.lr": s.pretrain_lr,
            "optim.warmup_steps": s.pretrain_warmup,
            "trainer.max_steps": s.pretrain_steps,
            "trainer.eval_every": s.pretrain_steps,
            "trainer.save_every": s.pretrain_steps,
            "trainer.exp_dir": s.out / "runs" / f"bestrq_{pool}",
        }
        steps.append(Step(f"bestrq_{pool}", "usmkit.cli.train", overrides))
    return steps


def finetune_runs(s: Settings) -> dict[str, tuple[str, str, int]]:
    """``{run name: (language, start, seed)}``; a pre-trained start fine-tuned ``frozen`` is named ``START_frozen``."""
    runs = {}
    for lang in s.languages:
        for seed in s.seeds:
            for start in s.starts:
                name = start + ("_frozen" if s.frozen and start != "scratch" else "")
                runs[f"{lang}_{name}_s{seed}"] = (lang, name, seed)
    return runs


def finetune_steps(s: Settings) -> list[Step]:
    steps = []
    every = max(1, s.finetune_steps // 5)
    for name, (lang, start, seed) in finetune_runs(s).items():
        pool = pretrained_pool(start.removesuffix("_frozen"), lang)
        frozen = {"optim.freeze_encoder_steps": s.finetune_steps // 4, "optim.encoder_lr_scale": 0.5}
        overrides = {
            "recipe": "stage3_ctc_cpu",
            **common(s, seed),
            "data.train_split": f"train_{lang}",
            "data.dev_split": f"dev_{lang}",
            "data.labeled_fraction": s.labels,
            "tokenizer": s.tokenizer,
            "trainer.max_steps": s.finetune_steps,
            "trainer.eval_every": every,
            "trainer.save_every": every,
            "trainer.exp_dir": s.out / "runs" / name,
            **({"init_from": s.out / "runs" / f"bestrq_{pool}"} if pool else {}),
            **(frozen if start.endswith("_frozen") else {}),
        }
        steps.append(Step(name, "usmkit.cli.train", overrides))
    return steps


def decode_steps(s: Settings) -> list[Step]:
    steps = []
    for name, (lang, _, _) in finetune_runs(s).items():
        run = s.out / "runs" / name
        overrides = {
            "checkpoint": run / "checkpoints" / f"step-{s.finetune_steps:06d}" if s.checkpoint == "last" else run,
            "test_sets": [f"dev_{lang}", f"test_{lang}"],
            "decode": "ctc_greedy",
            "device": s.device,
            "output": s.out / "decode" / f"{name}.json",
        }
        steps.append(Step(f"decode_{name}", "usmkit.cli.evaluate", overrides))
    return steps


def build_report(s: Settings) -> dict[str, Any]:
    rows, missing = [], []
    planned = finetune_runs(s)
    other = finetune_runs(replace(s, frozen=not s.frozen))  # the other fine-tuning rule's runs, where decoded
    for name, (lang, start, seed) in {**planned, **other}.items():
        path = s.out / "decode" / f"{name}.json"
        if not path.is_file():
            if name in planned:
                missing.append(name)
            continue
        sets = json.loads(path.read_text())["sets"]
        row = {"run": name, "language": lang, "start": start, "seed": seed}
        row |= {f"{split}_{m}": sets[f"{split}_{lang}"][m] for split in ("dev", "test") for m in ("wer", "cer")}
        row["dev_cer_curve"] = metric_series(s.out / "runs" / name / "metrics.jsonl", "dev/dev_cer")
        rows.append(row)
    summary = []
    names = [*STARTS, *(f"{x}_frozen" for x in STARTS[1:])]
    for lang in s.languages:
        base = None
        for start in names:
            group = [r for r in rows if (r["language"], r["start"]) == (lang, start)]
            if not group:
                continue
            entry: dict[str, Any] = {"language": lang, "start": start, "runs": len(group)}
            for key in ("dev_cer", "test_cer", "test_wer"):
                values = [r[key] for r in group]
                entry[f"{key}_mean"] = statistics.fmean(values)
                entry[f"{key}_sd"] = statistics.stdev(values) if len(values) > 1 else None
            if start == "scratch":
                base = entry["test_cer_mean"]
            elif base:
                entry["test_cer_gain"] = 1 - entry["test_cer_mean"] / base
                entry["target_met"] = entry["test_cer_gain"] >= TARGET_GAIN
            summary.append(entry)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(s).items() if k not in ("ml", "out")}
    settings["english"] = [f"{folder}:{corpus}" for folder, corpus in s.english]
    pools = pool_inputs(s)
    settings["pools"] = {pool: [":".join(x.rsplit(":", 2)[1:]) for x in inputs] for pool, inputs in pools.items()}
    pretraining = {pool: pretrain_curve(s.out / "runs" / f"bestrq_{pool}") for pool in pools}
    return {
        "settings": settings,
        "pool_hours": pool_hours(s),
        "pretraining": pretraining,
        "rows": rows,
        "summary": summary,
        "missing": missing,
    }


PRETRAIN_SERIES = {  # metrics.jsonl key -> the curve's name
    "train/loss": "loss",
    "train/acc_mean": "accuracy",  # of the masked frames' codes
    "train/perplexity_mean": "target_perplexity",  # how many codes the quantizer hands out
    "train/pred_perplexity_mean": "prediction_perplexity",  # how many the model tells apart
}


def pretrain_curve(run_dir: Path, every: int = 50) -> list[dict[str, float]]:
    """A BEST-RQ run's ``PRETRAIN_SERIES`` per window of ``every`` steps (the mean of the logged steps in it:
    single steps are noisy), each with its ``step`` (the window's end); [] where the run is not there."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    windows: dict[int, list[dict]] = {}
    for row in read_metrics(path):
        if "train/acc_mean" in row:
            windows.setdefault(-(-int(row["step"]) // every) * every, []).append(row)
    return [
        {
            "step": end,
            **{name: statistics.fmean(r[key] for r in rows) for key, name in PRETRAIN_SERIES.items() if key in rows[0]},
        }
        for end, rows in sorted(windows.items())
    ]


def pool_hours(s: Settings) -> dict[str, float]:
    from usmkit.data.manifests import load_cuts

    hours = {}
    for split in pool_inputs(s):
        try:
            hours[split] = round(sum(c.duration for c in load_cuts(s.data, split, corpus=CORPUS)) / 3600, 3)
        except FileNotFoundError:
            continue
    return hours


def print_report(report: dict[str, Any]) -> None:
    def pct(mean: float, sd: float | None) -> str:
        return f"{100 * mean:.1f}" + ("" if sd is None else f" +- {100 * sd:.1f}")

    print(f"pools (hours): {report['pool_hours']}")
    print("lang  start      runs  dev CER       test CER      test WER      CER gain  target")
    for e in report["summary"]:
        gain = f"{100 * e['test_cer_gain']:+.1f}%" if "test_cer_gain" in e else ""
        met = {True: "met", False: "missed"}.get(e.get("target_met"), "")
        print(
            f"{e['language']:<5} {e['start']:<10} {e['runs']:>4}  {pct(e['dev_cer_mean'], e['dev_cer_sd']):<13} "
            f"{pct(e['test_cer_mean'], e['test_cer_sd']):<13} {pct(e['test_wer_mean'], e['test_wer_sd']):<13} "
            f"{gain:<9} {met}"
        )
    if report["missing"]:
        print(f"not decoded yet: {', '.join(report['missing'])}")


def plot(report: dict[str, Any], path: Path) -> None:
    """Left: test CER per language and start (mean, sd bars); middle: the fine-tuning dev CER curves; right: the
    BEST-RQ runs' masked-prediction accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    langs = sorted({e["language"] for e in report["summary"]})
    names = [*STARTS, *(f"{x}_frozen" for x in STARTS[1:])]
    starts = [x for x in names if any(e["start"] == x for e in report["summary"])]
    fig, (bars, curves, pre) = plt.subplots(1, 3, figsize=(16, 4))
    width = 0.8 / max(1, len(starts))
    palette = ("tab:gray", "tab:blue", "tab:orange", "tab:cyan", "tab:red")
    colors = dict(zip(names, palette, strict=True))
    for i, start in enumerate(starts):
        entries = {e["language"]: e for e in report["summary"] if e["start"] == start}
        xs = [j + (i - (len(starts) - 1) / 2) * width for j, lang in enumerate(langs) if lang in entries]
        means = [100 * entries[lang]["test_cer_mean"] for lang in langs if lang in entries]
        sds = [100 * (entries[lang]["test_cer_sd"] or 0) for lang in langs if lang in entries]
        bars.bar(xs, means, width, yerr=sds, capsize=3, label=start, color=colors[start])
    bars.set_xticks(range(len(langs)), langs)
    bars.set_ylabel("test CER (%)")
    bars.set_title(f"{report['settings']['labels']:.0%} of the labels, mean +- sd over seeds")
    bars.legend()
    styles = dict(zip(sorted(langs), ("-", "--", ":", "-."), strict=False))
    for row in report["rows"]:
        steps, cers = zip(*row["dev_cer_curve"], strict=True) if row["dev_cer_curve"] else ((), ())
        curves.plot(steps, [100 * c for c in cers], styles[row["language"]], color=colors[row["start"]], alpha=0.6)
    curves.set_xlabel("fine-tuning step")
    curves.set_ylabel("dev CER (%)")
    curves.set_title("dev CER while fine-tuning (" + ", ".join(f"{s} {styles[s]}" for s in langs) + ")")
    for pool, curve in report.get("pretraining", {}).items():
        if curve:
            label = (
                f"{pool} ({report['pool_hours'].get(pool, '?')} h, codes in use ~{curve[-1]['target_perplexity']:.0f})"
            )
            pre.plot([c["step"] for c in curve], [100 * c["accuracy"] for c in curve], label=label)
    pre.set_xlabel("BEST-RQ step")
    pre.set_ylabel("masked-frame accuracy (%)")
    pre.set_title("pre-training: codes predicted (1 codebook)")
    pre.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse_args(argv: Sequence[str] | None = None) -> tuple[tuple[str, ...], Settings, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="*", metavar="STAGE", help=f"of {', '.join(STAGES)} (default: all)")
    ap.add_argument("--ml", type=Path, required=True, help="the multilingual recipe's --out, its data stage done")
    ap.add_argument("--out", type=Path, default=Path("exp/crosslingual"))
    ap.add_argument("--english", nargs="*", default=[], metavar="DIR:CORPUS", help="prepared English corpora")
    ap.add_argument("--clips", type=Path, default=None, help="a folder of unlabeled audio for the pool")
    ap.add_argument("--languages", default="cs,nl")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--labels", type=float, default=0.1, help="share of the language's training labels")
    ap.add_argument("--pretrain-steps", type=int, default=800)
    ap.add_argument("--finetune-steps", type=int, default=600)
    ap.add_argument("--starts", default=",".join(STARTS), help=f"of {', '.join(STARTS)}")
    ap.add_argument(
        "--frozen", action="store_true", help="pre-trained encoders frozen for a quarter of the steps, then lr / 2"
    )
    ap.add_argument("--checkpoint", choices=("best", "last"), default="last", help="which checkpoint is scored")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--report", type=Path, default=None, help="the report's JSON (default OUT/crosslingual.json)")
    ap.add_argument("--plot", type=Path, default=None, help="the report's plot (PNG)")
    a = ap.parse_args(argv)
    if any(x not in STAGES for x in a.stages) or any(x not in STARTS for x in a.starts.split(",") if x):
        ap.error(f"stages must be of {', '.join(STAGES)}; starts of {', '.join(STARTS)}")
    s = Settings(
        ml=a.ml,
        out=a.out,
        english=tuple((Path(f), c) for f, _, c in (x.rpartition(":") for x in a.english)),
        clips=a.clips,
        languages=tuple(x for x in a.languages.split(",") if x),
        seeds=_ints(a.seeds),
        labels=a.labels,
        pretrain_steps=a.pretrain_steps,
        finetune_steps=a.finetune_steps,
        starts=tuple(x for x in a.starts.split(",") if x),
        frozen=a.frozen,
        checkpoint=a.checkpoint,
        device=a.device,
        jobs=a.jobs,
    )
    return tuple(a.stages) or STAGES, s, a


def main(argv: Sequence[str] | None = None) -> int:
    stages, s, a = parse_args(argv)
    if not s.tokenizer.is_file():
        print(f"error: no tokenizer at {s.tokenizer}: run recipes/multilingual/run.py data first", file=sys.stderr)
        return 1
    s.out.mkdir(parents=True, exist_ok=True)
    execute = subprocess_runner(s.out, s.jobs)
    plan = {"data": data_steps, "pretrain": pretrain_steps, "finetune": finetune_steps, "decode": decode_steps}
    try:
        for stage, steps in plan.items():
            if stage in stages:
                run_steps(stage, steps(s), s.out, s.jobs, execute)
    except StageFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if "report" in stages:
        report = {**run_header(), **build_report(s)}
        path = a.report or s.out / "crosslingual.json"
        path.write_text(json.dumps(report, indent=1) + "\n")
        print_report(report)
        print(f"report: {path}")
        if a.plot:
            plot(report, a.plot)
            print(f"plot: {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
