"""``python -m usmkit.cli.tune_lexicon checkpoint=EXP [set=dev] [orders=[1,2]] [lm_weights=[...]] [word_scores=[...]]``.

Lexicon decoding's LM order, LM weight and word score chosen on a dev set (``usmkit.inference.lexicon_tuning``):
prints the grid's WER and the chosen settings, and writes both as JSON.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from usmkit.checkpointing.atomic import write_result_file
from usmkit.checkpointing.output_dir import check_output_file
from usmkit.cli.compose import compose_dataclass
from usmkit.cli.logs import setup_logging
from usmkit.decoding.ctc_lexicon import LexiconConfig
from usmkit.errors import UsageError, strip_debug_flag, user_errors

COMMAND = "usmkit.cli.tune_lexicon"
OWN_KEYS = ("checkpoint", "set", "grid")  # what every tuning this command writes holds

USAGE = """\
usage: python -m usmkit.cli.tune_lexicon checkpoint=EXP [set=dev] [orders=[1,2]] [lm_weights=[0.5,1,1.5,2,3]]
           [word_scores=[-2,0,2,4]] [ensemble=[EXP,...]] [output=PATH] [--debug]

  checkpoint=PATH       a CTC checkpoint dir, or an experiment dir (its best/latest checkpoint)
  set=NAME              the split to tune on: dev; a test set (test, test_*) is refused
  allow_test=true       tune on a test set anyway, with a warning (its WER is then optimistic)
  orders=[..]           word n-gram orders to try (0 = lexicon without LM, 1, 2)
  lm_weights=[..]       LM weights to try
  word_scores=[..]      word insertion scores to try
  beam_size=N           lexicon beam (default 200), beam_threshold=X (default 50): fixed over the grid
  ensemble=[..]         more checkpoints decoded with it as one ensemble (as usmkit.cli.evaluate's ensemble=)
  manifest_dir=DIR      corpus=NAME  device=auto|cpu|cuda  max_duration=SECONDS  (as usmkit.cli.evaluate's)
  output=PATH           JSON of the grid and the chosen settings (default <checkpoint>/lexicon_tuning_<set>.json)

Then: python -m usmkit.cli.evaluate checkpoint=EXP decode=ctc_lexicon <the printed lexicon.* overrides>.
"""


@dataclass(frozen=True)
class TuneLexiconArgs:
    checkpoint: str = ""
    set: str = "dev"
    orders: tuple[int, ...] = (1, 2)
    lm_weights: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0, 3.0)
    word_scores: tuple[float, ...] = (-2.0, 0.0, 2.0, 4.0)
    beam_size: int = LexiconConfig.beam_size
    beam_threshold: float = LexiconConfig.beam_threshold
    ensemble: tuple[str, ...] = ()
    manifest_dir: str | None = None
    corpus: str | None = None
    device: str = "auto"
    max_duration: float = 200.0
    output: str | None = None
    allow_test: bool = False


def main(argv: Sequence[str] | None = None) -> int:
    argv = strip_debug_flag(sys.argv[1:] if argv is None else argv)
    with user_errors():  # a bad value or file: one line and exit code 2 (--debug: the traceback)
        args = compose_dataclass(TuneLexiconArgs, argv, command=COMMAND, usage=USAGE)
        if not args.checkpoint:
            raise UsageError(f"pass checkpoint=EXP (python -m {COMMAND} --help)")
        from usmkit.inference.evaluate import EvalConfig
        from usmkit.inference.lexicon_tuning import LexiconGrid, tune_lexicon

        setup_logging()
        if args.output:  # before decoding: never over a file that is not an earlier tuning's
            check_output_file(
                Path(args.output), option="output=", own_words="a lexicon tuning", own_keys=OWN_KEYS,
                home=[Path(c) for c in (args.checkpoint, *args.ensemble) if c],
            )  # fmt: skip
        try:
            grid = LexiconGrid(tuple(args.orders), tuple(args.lm_weights), tuple(args.word_scores))
            lexicon = LexiconConfig(beam_size=args.beam_size, beam_threshold=args.beam_threshold)
        except ValueError as e:
            raise UsageError(f"{e} ({COMMAND})") from None
        cfg = EvalConfig(
            checkpoint=args.checkpoint,
            decode="ctc_lexicon",
            manifest_dir=args.manifest_dir,
            corpus=args.corpus,
            device=args.device,
            max_duration=args.max_duration,
            lexicon=lexicon,
            ensemble=tuple(args.ensemble),
        )
        print(f"{'order':>5} {'lm_w':>6} {'word':>6} {'WER %':>7} {'CER %':>7}", flush=True)
        tuning = tune_lexicon(
            cfg,
            grid,
            split=args.set,
            allow_test=args.allow_test,
            on_point=lambda p: print(
                f"{p.order:5d} {p.lm_weight:6.2f} {p.word_score:6.2f} {100 * p.wer:7.2f} {100 * p.cer:7.2f}", flush=True
            ),
        )
        out = Path(args.output) if args.output else Path(tuning.checkpoint) / f"lexicon_tuning_{args.set}.json"
        write_result_file(out, json.dumps(tuning.as_dict(), indent=2) + "\n", what="the lexicon tuning")
        best = tuning.best_point
        print(
            f"best on {args.set} ({tuning.utterances} utterances): WER {100 * best.wer:.2f}%: {' '.join(tuning.overrides())}"
        )
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
