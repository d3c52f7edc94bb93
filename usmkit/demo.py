"""``make demo``: the pipeline end to end on the embedded corpus, printing each command it runs.

``python -m usmkit.demo data=data/synth exp=exp/demo_ctc [steps=700]``: trains a tiny streaming CTC
model (640 ms chunks, 4 chunks of left context, causal convolution) on the synthesized corpus (built
before by ``python -m usmkit.data.synth``), evaluates it on the held-out-voice test sets (greedy and
lexicon decoding), transcribes one held-out test recording chunk by chunk with ``usmkit-transcribe``,
and prints what it did. The training settings are the fastest-learning ones of
``bench/results/baseline_wer_gpu_sweep.json`` (50-s batches, a 320-piece tokenizer, no SpecAugment/dropout).
Every step is a user-facing command; copy any of them to run it alone.
"""

from __future__ import annotations

import usmkit.entrypoint  # noqa: F401  (first: sets the OpenMP wait policy before torch loads)

# isort: split
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path


def _args(argv: list[str]) -> dict[str, str]:
    out = {"data": "data/synth", "exp": "exp/demo_ctc", "steps": "700"}
    for a in argv:
        if a in ("-h", "--help"):
            print(__doc__)
            raise SystemExit(0)
        key, sep, value = a.partition("=")
        if not sep or key not in out:
            raise SystemExit(f"usage: python -m usmkit.demo [data=DIR] [exp=DIR] [steps=N]; got {a!r}")
        out[key] = value
    return out


def _run(cmd: list[str], log: list[dict]) -> None:
    print(f"\n$ {shlex.join(cmd)}", flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    log.append({"command": shlex.join(cmd), "seconds": round(time.perf_counter() - start, 1)})


def main(argv: list[str] | None = None) -> None:
    a = _args(sys.argv[1:] if argv is None else argv)
    data, exp = Path(a["data"]), Path(a["exp"])
    if not (data / "corpus.json").is_file():
        raise SystemExit(f"no corpus at {data}: run `python -m usmkit.data.synth out={data}` first")
    py = sys.executable
    log: list[dict] = []
    train = [
        py, "-m", "usmkit.train", "recipe=stage3_ctc", "model=tiny",
        "model.chunk_size=16", "model.left_chunks=4", "model.causal_conv=true",
        "model.dropout=0.0", "model.overrides={subsampling_channels: 32}",
        f"data.manifest_dir={data}", "data.max_duration=50", "data.spec_augment.enabled=false",
        "vocab_size=320", f"tokenizer={exp}/tokenizer/tokenizer.model", f"trainer.exp_dir={exp}",
        f"trainer.max_steps={a['steps']}", "optim.lr=2.5e-3", "optim.warmup_steps=100",
        "trainer.eval_every=350", "trainer.save_every=350", "trainer.dev_max_batches=4",
    ]  # fmt: skip
    if (exp / "checkpoints").is_dir():
        train.append("resume=true")
    _run(train, log)
    evals = {}
    for decode in ("ctc_greedy", "ctc_lexicon"):
        evals[decode] = exp / f"eval_test_{decode}.json"
        _run(
            [
                py, "-m", "usmkit.evaluate", f"checkpoint={exp}", "test_sets=[test,test_other]",
                f"decode={decode}", f"output={evals[decode]}",
            ],
            log,
        )  # fmt: skip
    from usmkit.data.manifests import load_cuts

    cut = next(iter(load_cuts(data, "test")))
    audio = cut.recording.sources[0].source
    print(f"\nreference: {cut.supervisions[0].text}")
    script = Path(py).parent / "usmkit-transcribe"  # the console script, where usmkit is pip-installed
    transcribe = [str(script)] if script.is_file() else [py, "-m", "usmkit.transcribe"]
    _run([*transcribe, audio, "--checkpoint", str(exp)], log)
    print("\nDemo summary")
    for step in log:
        print(f"  {step['seconds']:>7.1f} s  {step['command']}")
    for decode, path in evals.items():
        for name, s in json.loads(path.read_text())["sets"].items():
            print(
                f"  {decode:<12} {name:<12} WER {100 * s['wer']:.1f}%  CER {100 * s['cer']:.1f}%  "
                f"({s['utterances']} utterances)"
            )


if __name__ == "__main__":
    main()
