"""``make demo``: the pipeline end to end on the embedded demo corpus, printing each command it runs.

``python -m usmkit.cli.demo data=data/demo exp=exp/demo_ctc [steps=1500]``: trains a tiny streaming CTC
model (640 ms chunks, 4 chunks of left context, causal convolution) on the English demo corpus
(built before by ``python -m usmkit.cli.prepare synth out=data/demo size=demo``: 40 synthetic voices reading
sequences of the 400 most frequent English words and digit strings), scores it on the six voices it
never heard (greedy and lexicon decoding), transcribes one of their recordings chunk by chunk with
``usmkit-transcribe``, and says where to go next.

The settings are chosen for a 2-core CPU and a few minutes: a character-level tokenizer (290 pieces:
the specials, byte fallback and the letters), which gets out of CTC's all-blank phase sooner than
word pieces; intermediate CTC on the middle block; no dropout, light SpecAugment (two time masks,
narrow frequency masks: the voices it is tested on are not the 40 it hears); 50-s batches. Every step is a user-facing command; copy any of them to run it alone.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from usmkit.cli.compose import compose_dataclass
from usmkit.errors import UsageError, strip_debug_flag, user_errors

DIGITS = frozenset("zero one two three four five six seven eight nine".split())
# Lexicon decoding: unigram LM of the training transcripts; weight and word score chosen on the dev set.
LEXICON = ("lexicon.order=1", "lexicon.lm_weight=0.5", "lexicon.word_score=0.0")

NEXT_STEPS = """
Where to go next (docs/ has each in full):
  the three USM stages on this corpus     python -m usmkit.cli.train recipe=stage1 | stage2 | stage3_joint | stage3_ctc | stage3_las
  real human speech (CMU AN4, Kathleen)   python -m usmkit.cli.prepare an4 out=data/an4      (docs/recipes.md)
  stream from a file or the microphone    usmkit-transcribe FILE --checkpoint {exp} --lexicon
  evaluate other test sets                python -m usmkit.cli.evaluate checkpoint={exp} test_sets=[test,test_other]
  train longer (resumes this run)         python -m usmkit.cli.demo steps=3000
"""


@dataclass(frozen=True)
class DemoArgs:
    data: str = "data/demo"
    exp: str = "exp/demo_ctc"
    steps: int = 1500


def _run(cmd: list[str], log: list[dict]) -> None:
    print(f"\n$ {shlex.join(cmd)}", flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    log.append({"command": shlex.join(cmd), "seconds": round(time.perf_counter() - start, 1)})


def train_command(py: str, data: Path, exp: Path, steps: int) -> list[str]:
    """The demo's training run (``python -m usmkit.cli.train ...``): ``recipe=stage3_ctc_cpu``'s model and
    optimizer (usmkit/conf/recipe/stage3_ctc_cpu.yaml), a streaming encoder, light SpecAugment against
    overfitting the training voices over the longer run, its own tokenizer and steps."""
    every = max(1, steps // 3)
    return [
        py, "-m", "usmkit.cli.train", "recipe=stage3_ctc_cpu", "model=tiny",
        "model.chunk_size=16", "model.left_chunks=4", "model.causal_conv=true",
        "data.spec_augment.enabled=true", "data.spec_augment.time_masks=2", "data.spec_augment.freq_width=15",
        f"data.manifest_dir={data}", "vocab_size=290", f"tokenizer={exp}/tokenizer/tokenizer.model",
        f"trainer.exp_dir={exp}", f"trainer.max_steps={steps}", f"trainer.eval_every={every}",
        f"trainer.save_every={every}",
    ]  # fmt: skip


def demo_recording(data: Path):
    """The first digit string of the held-out-voice test set (else its first recording): a short,
    checkable example of what the model hears."""
    from usmkit.data.manifests import load_cuts

    cuts = list(load_cuts(data, "test"))
    digits = [c for c in cuts if set(c.supervisions[0].text.split()) <= DIGITS]
    return (digits or cuts)[0]


def main(argv: list[str] | None = None) -> int:
    argv = strip_debug_flag(sys.argv[1:] if argv is None else argv)
    with user_errors():
        a = compose_dataclass(DemoArgs, argv, command="usmkit.cli.demo", usage=__doc__)
        data, exp = Path(a.data), Path(a.exp)
        if not (data / "corpus.json").is_file():
            raise UsageError(
                f"no corpus at {data}: run `python -m usmkit.cli.prepare synth out={data} size=demo` first"
            )
        try:
            demo(data, exp, a.steps)
        except subprocess.CalledProcessError as e:
            raise UsageError(
                f"the demo stopped: `{shlex.join(map(str, e.cmd))}` exited with status {e.returncode}"
            ) from None
    return 0


def demo(data: Path, exp: Path, steps: int) -> None:
    py = sys.executable
    log: list[dict] = []
    train = train_command(py, data, exp, steps)
    if (exp / "checkpoints").is_dir():
        train.append("resume=true")
    _run(train, log)
    evals = {}
    for decode, extra in (("ctc_greedy", ()), ("ctc_lexicon", LEXICON)):
        evals[decode] = exp / f"eval_test_{decode}.json"
        _run(
            [
                py, "-m", "usmkit.cli.evaluate", f"checkpoint={exp}", "test_sets=[test]",
                f"decode={decode}", *extra, f"output={evals[decode]}",
            ],
            log,
        )  # fmt: skip
    cut = demo_recording(data)
    audio = cut.recording.sources[0].source
    print(f"\nreference: {cut.supervisions[0].text}  ({cut.supervisions[0].speaker}, a voice not heard in training)")
    script = Path(py).parent / "usmkit-transcribe"  # the console script, where usmkit is pip-installed
    transcribe = [str(script)] if script.is_file() else [py, "-m", "usmkit.cli.transcribe"]
    _run([*transcribe, audio, "--checkpoint", str(exp), "--lexicon"], log)
    print("\nDemo summary")
    for step in log:
        print(f"  {step['seconds']:>7.1f} s  {step['command']}")
    for decode, path in evals.items():
        for name, s in json.loads(path.read_text())["sets"].items():
            print(
                f"  {decode:<12} {name:<6} WER {100 * s['wer']:.1f}%  CER {100 * s['cer']:.1f}%  "
                f"({s['utterances']} utterances, voices not heard in training)"
            )
    print(NEXT_STEPS.format(exp=exp))


if __name__ == "__main__":
    sys.exit(main())
