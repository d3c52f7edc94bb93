"""``python -m usmkit.cli.prepare CORPUS [key=value ...]``: build a corpus's lhotse manifests.

    python -m usmkit.cli.prepare synth out=data/demo size=demo      # the embedded corpus (espeak-ng)
    python -m usmkit.cli.prepare an4 out=data/an4 corpus_dir=PATH   # CMU AN4 from a local copy
    python -m usmkit.cli.prepare an4 --help                         # a corpus's keys

The corpora and their modules: synth (``usmkit.data.synth``), an4, an4_text, kathleen, fsdd,
librispeech, asterisk and fillets (from Debian packages: ``debs=DIR``), audio_folder (audio without
transcripts), pool (several corpora as one unlabeled split), pack (a compressed copy of a corpus
folder), bandlimit (a band-limited copy of a split, e.g. the telephone-band ``test_8k``) and subset (a
split restricted to some speakers, e.g. 10% of the labels), under
``usmkit.data.corpora``; shar writes a corpus's splits as lhotse Shar shards
(``usmkit.data.shar``). Each module defines ``ARGS`` (its dataclass of keys),
``USAGE`` and ``run(args)``; the keys are read like every ``python -m usmkit.cli.*`` command's.

``out=`` may be a new folder or one holding this corpus already (its manifests are rebuilt, other splits
kept); an experiment directory, a checkpoint, an export or another corpus's folder is refused, and so is a
folder inside one (``usmkit.checkpointing.output_dir``). A module with its own rule for ``out=`` defines
``check_out(args)`` (shar: a new or empty folder or an earlier conversion, apart from ``src=``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from usmkit.checkpointing.output_dir import check_output_dir, corpus_names
from usmkit.cli.compose import compose_dataclass
from usmkit.errors import UsageError, strip_debug_flag, user_errors

CORPORA = {  # name -> module holding ARGS, USAGE and run
    "synth": "usmkit.data.synth.build",
    "an4": "usmkit.data.corpora.an4",
    "an4_text": "usmkit.data.corpora.an4_text",
    "kathleen": "usmkit.data.corpora.kathleen",
    "fsdd": "usmkit.data.corpora.fsdd",
    "librispeech": "usmkit.data.corpora.librispeech",
    "asterisk": "usmkit.data.corpora.asterisk",  # telephone prompts in en, es, fr, it, ru (Debian packages)
    "fillets": "usmkit.data.corpora.fillets",  # game dialogue in cs, nl (Debian packages)
    "audio_folder": "usmkit.data.corpora.audio_folder",  # a folder of audio without transcripts: one unlabeled split
    "pool": "usmkit.data.corpora.pool",
    "pack": "usmkit.data.corpora.pack",
    "shar": "usmkit.data.shar",  # not a corpus: a corpus's splits as lhotse Shar shards
    "bandlimit": "usmkit.data.corpora.bandlimit",  # a band-limited copy of a split (e.g. test_8k)
    "subset": "usmkit.data.corpora.subset",  # a split restricted to some speakers (e.g. 10% of the labels)
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
        check_out(name, module, args)
        module.run(args)
    return 0


def check_out(name: str, module: ModuleType, args: Any) -> None:
    """Refuse an ``out=`` folder holding other work than this recipe's own corpus: its manifests' corpus
    name (``CORPUS`` of the module, ``corpus=`` of pool) or, for pack, its ``pack.json``."""
    if not getattr(args, "out", None):
        return  # the recipe names what is missing
    if hasattr(module, "check_out"):
        module.check_out(args)
        return
    if name == "pack":
        marker = getattr(module, "MANIFEST", "pack.json")
        own, words = (lambda p: (p / marker).is_file()), f"an earlier pack (with {marker})"
    else:
        if hasattr(module, "output_corpus"):  # a recipe adding a split to a corpus it reads (bandlimit, subset)
            corpus = module.output_corpus(args)
        else:
            corpus = getattr(args, "corpus", None) if name == "pool" else getattr(module, "CORPUS", name)
        own, words = (lambda p: corpus_names(p) == {corpus}), f"the corpus folder of {corpus}"
    check_output_dir(Path(args.out), option="out=", own_kind="corpus", own_words=words, own=own, replaces=False)


if __name__ == "__main__":
    sys.exit(main())
