"""``python -m usmkit.cli.prepare CORPUS [key=value ...]``: build a corpus's lhotse manifests.

    python -m usmkit.cli.prepare synth out=data/demo size=demo      # the embedded corpus (espeak-ng)
    python -m usmkit.cli.prepare an4 out=data/an4 corpus_dir=PATH   # CMU AN4 from a local copy
    python -m usmkit.cli.prepare an4 --help                         # a corpus's keys

The corpora and their modules: synth (``usmkit.data.synth``), an4, an4_text, kathleen, fsdd,
librispeech, pool (several corpora as one unlabeled split) and pack (a compressed copy of a corpus
folder), under ``usmkit.data.corpora``; shar writes a corpus's splits as lhotse Shar shards
(``usmkit.data.shar``). Each module defines ``ARGS`` (its dataclass of keys),
``USAGE`` and ``run(args)``; the keys are read like every ``python -m usmkit.cli.*`` command's.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from usmkit.cli.compose import compose_dataclass
from usmkit.errors import UsageError, strip_debug_flag, user_errors

CORPORA = {  # name -> module holding ARGS, USAGE and run
    "synth": "usmkit.data.synth.build",
    "an4": "usmkit.data.corpora.an4",
    "an4_text": "usmkit.data.corpora.an4_text",
    "kathleen": "usmkit.data.corpora.kathleen",
    "fsdd": "usmkit.data.corpora.fsdd",
    "librispeech": "usmkit.data.corpora.librispeech",
    "pool": "usmkit.data.corpora.pool",
    "pack": "usmkit.data.corpora.pack",
    "shar": "usmkit.data.shar",  # not a corpus: a corpus's splits as lhotse Shar shards
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = strip_debug_flag(sys.argv[1:] if argv is None else argv)
    with user_errors():
        if not argv or argv[0] in ("-h", "--help", "help"):
            print(__doc__)
            return 0
        name, overrides = argv[0], argv[1:]
        if name not in CORPORA:
            raise UsageError(
                f"no corpus {name!r}: choose one of {', '.join(CORPORA)} (python -m usmkit.cli.prepare --help)"
            )
        module = importlib.import_module(CORPORA[name])
        args = compose_dataclass(module.ARGS, overrides, command=f"usmkit.cli.prepare {name}", usage=module.USAGE)
        module.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
