"""Baseline WER on this CPU: tiny CTC models trained on the embedded corpus and on FSDD.

    python bench/baseline_wer.py synth   # needs data/synth (python -m usmkit.data.synth out=data/synth)
    python bench/baseline_wer.py fsdd    # builds data/fsdd from ../shared/data/fsdd (theo held out);
                                         # fine-tunes the synth run's encoder, so run synth first
    python bench/baseline_wer.py plot    # training curves of both runs -> bench/results/baseline_curves.png
    python bench/baseline_wer.py synth --eval-only   # re-score an existing run (minutes from its train.log)

Each run trains with the command recorded in the JSON, times it, evaluates the held-out voices /
speaker with every decode mode in ``decodes`` (the first is the headline number), and merges its
entry into bench/results/baseline_wer.json.

The synth settings come from the GPU sweeps in ``bench/results/synth_ctc_sweep.json``: 50-s
batches, lr 2.5e-3, a 320-piece (about character) tokenizer, light SpecAugment (2 time masks, freq
width 15), dropout 0.1 and intermediate CTC at weight 0.3 (GPU round 8, at 2800 steps: test-en
lexicon WER 23.8 / 24.0 / 22.4% over three seeds, against 25.1-29.4% over six seeds without it).
On this CPU these settings run at about 2 steps/s, so the 20-minute budget holds 2200 steps with one
dev evaluation at the end.
"""

from __future__ import annotations

import json
import platform
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "baseline_wer.json"

RUNS = {
    "synth": {
        "key": "synth_test",
        "exp": "exp/synth_v5",
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
    "fsdd": {
        "key": "fsdd_heldout_speaker",
        "exp": "exp/fsdd_v5",
        "prepare": [sys.executable, "-m", "usmkit.data.recipes.fsdd", "out=data/fsdd", "test_speakers=theo"],
        # Fine-tuned from the synth run's encoder (58 espeak voices; run() adds its init_from): from
        # scratch, four training speakers gave theo 22.4% (400 steps) to 28.4% (1200 steps, GPU sweep
        # round 4); fine-tuned, 7-15% over five seeds (bench/results/synth_ctc_sweep.json, rounds 5-8).
        "pretrained": "synth",
        "train": [
            "recipe=stage3_ctc",
            "model=tiny",
            "model.overrides={subsampling_channels: 32}",
            "data=fsdd",
            "data.manifest_dir=data/fsdd",
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


def run(name: str, eval_only: bool = False) -> None:
    spec = RUNS[name]
    init = [f"init_from={RUNS[spec['pretrained']]['exp']}"] if "pretrained" in spec else []
    train = [sys.executable, "-m", "usmkit.train", *spec["train"], *init, f"trainer.exp_dir={spec['exp']}"]
    if init and not (REPO / RUNS[spec["pretrained"]]["exp"] / "checkpoints").is_dir():
        raise SystemExit(f"{name} fine-tunes the {spec['pretrained']} run's encoder: run that one first")
    if eval_only:
        minutes = log_minutes(REPO / spec["exp"])
    else:
        if "prepare" in spec:
            sh(spec["prepare"])
        start = time.perf_counter()
        sh(train)
        minutes = (time.perf_counter() - start) / 60
    sets = f"test_sets=[{','.join(spec['test_sets'])}]"
    decoded = {}
    for decode in spec["decodes"]:
        out_json = REPO / spec["exp"] / f"eval_baseline_{decode}.json"
        sh([sys.executable, "-m", "usmkit.evaluate", f"checkpoint={spec['exp']}", sets, f"decode={decode}",
            f"output={out_json}"])  # fmt: skip
        ev = json.loads(out_json.read_text())
        main = ev["sets"][spec["main_set"]]
        d = {
            "wer": main["wer"],
            "cer": main["cer"],
            "eval_command": f"python -m usmkit.evaluate checkpoint={spec['exp']} {sets} decode={decode}",
            "sets": {k: {m: v[m] for m in ("wer", "cer", "utterances", "rtf")} for k, v in ev["sets"].items()},
        }
        if spec["main_language"]:
            per_lang = main.get("per_language", {})
            d["per_language"] = {
                k: {"wer": v["wer"], "cer": v["cer"], "utterances": v["utterances"]} for k, v in per_lang.items()
            }
            d["wer_" + spec["main_language"]] = per_lang[spec["main_language"]]["wer"]
        decoded[decode] = d
    headline = decoded[spec["decodes"][0]]
    entry = {
        "wer": headline["wer"],
        "cer": headline["cer"],
        **({f"wer_{spec['main_language']}": headline[f"wer_{spec['main_language']}"]} if spec["main_language"] else {}),
        "decode": spec["decodes"][0],
        "model": "tiny",
        "train_minutes": round(minutes, 1),
        **(
            {
                "pretrained_from": RUNS[spec["pretrained"]]["exp"],
                "pretrain_minutes": round(log_minutes(REPO / RUNS[spec["pretrained"]]["exp"]), 1),
            }
            if "pretrained" in spec
            else {}
        ),
        "command": "python -m usmkit.train " + shlex.join(train[3:]),
        "eval_command": headline["eval_command"],
        "decodes": decoded,
    }
    entry["machine"] = f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores, CPU only"
    entry["date"] = datetime.now(UTC).isoformat(timespec="seconds")
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    results[spec["key"]] = entry
    RESULTS.write_text(json.dumps(results, indent=2))
    print(json.dumps({spec["key"]: {k: entry[k] for k in entry if k != "sets"}}, indent=2))


def plot() -> None:
    sys.path.insert(0, str(REPO))
    from usmkit.plots import plot_training_curves

    runs = {
        n: REPO / s["exp"] / "metrics.jsonl" for n, s in RUNS.items() if (REPO / s["exp"] / "metrics.jsonl").is_file()
    }
    print(plot_training_curves(runs, REPO / "bench" / "results" / "baseline_curves.png", "tiny CTC baselines (CPU)"))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--eval-only"]
    for w in args or ["synth", "fsdd", "plot"]:
        plot() if w == "plot" else run(w, eval_only="--eval-only" in sys.argv)
