"""``make demo``: the pipeline end to end on the embedded corpus, printing each command it runs.

``python -m usmkit.demo data=data/synth exp=exp/demo_ctc [steps=300]``: trains a tiny streaming CTC
model (640 ms chunks, 4 chunks of left context, causal convolution) on the synthesized corpus (built
before by ``python -m usmkit.data.synth``), evaluates it on the held-out-voice test sets, transcribes
one held-out test recording chunk by chunk with ``usmkit-transcribe``, and prints what it did.
Every step is a user-facing command; copy any of them to run it alone.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path


def _args(argv: list[str]) -> dict[str, str]:
    out = {"data": "data/synth", "exp": "exp/demo_ctc", "steps": "300"}
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
        f"data.manifest_dir={data}", "data.max_duration=100", f"trainer.exp_dir={exp}",
        f"trainer.max_steps={a['steps']}", "optim.lr=2e-3", "optim.warmup_steps=60",
        "trainer.eval_every=100", "trainer.save_every=100", "trainer.dev_max_batches=4",
    ]  # fmt: skip
    if (exp / "checkpoints").is_dir():
        train.append("resume=true")
    _run(train, log)
    out_json = exp / "eval_test.json"
    _run(
        [
            py, "-m", "usmkit.evaluate", f"checkpoint={exp}", "test_sets=[test,test_other]",
            "decode=ctc_greedy", f"output={out_json}",
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
    results = json.loads(out_json.read_text())
    print("\nDemo summary")
    for step in log:
        print(f"  {step['seconds']:>7.1f} s  {step['command']}")
    for name, s in results["sets"].items():
        print(f"  {name:<12} WER {100 * s['wer']:.1f}%  CER {100 * s['cer']:.1f}%  ({s['utterances']} utterances)")


if __name__ == "__main__":
    main()
