"""``python -m usmkit.data.synth out=data/synth size=default seed=0 [force=true] [workers=N] [vocab_size=512]``."""

from __future__ import annotations

import usmkit.entrypoint  # noqa: F401  (first: sets the OpenMP wait policy before torch loads)

# isort: split
import sys
from collections.abc import Sequence

from usmkit.data.recipes import parse_key_value_args
from usmkit.data.synth.build import SynthConfig, build_corpus, print_summary
from usmkit.errors import strip_debug_flag, user_errors

USAGE = """\
usage: python -m usmkit.data.synth [key=value ...]

Synthesize the embedded multi-voice corpus (espeak-ng; no download) and train its tokenizer.

  out=PATH            output directory (default data/synth)
  size=NAME           default|demo|english|tiny. default: ~3 h train in five languages + dev/test/test_other/
                      test_textonly + 1 h unlabeled + 20k texts; demo: English, 400 words, 1.8 h (make demo);
                      english: English, 1000 words, 5.2 h + 2.6 h unlabeled (the MOST study); tiny: tests
  seed=INT            corpus seed (default 0): same seed, same texts, voices and audio bytes
  force=true          rebuild even if out/corpus.json shows this seed and size already built
  workers=INT         synthesis processes (default 0 = all cores)
  vocab_size=INT      tokenizer pieces incl. 4 specials and 256 byte pieces (default 512)
  external_engines=false   do not add flite/festival voices even if installed
"""


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_key_value_args(SynthConfig, strip_debug_flag(sys.argv[1:] if argv is None else argv), USAGE)
    with user_errors():  # a bad file or value: one line, exit code 2 (--debug: the traceback)
        result = build_corpus(cfg)
        if result.skipped:
            print(
                f"{cfg.out}/corpus.json: the corpus with seed={cfg.seed} size={cfg.size} is already built; "
                "nothing to do (force=true rebuilds it)"
            )
        print_summary(result.summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
