"""Pool the audio of several corpora's splits into one audio-only split (a BEST-RQ / MOST unlabeled pool).

CLI::

    python -m usmkit.data.recipes.pool out=data/an4 corpus=an4 split=pool \\
        inputs=[data/an4:an4:unlabeled,data/kathleen:kathleen:unlabeled]

Each input is ``manifest_dir:corpus:split``; its cuts are read (paths resolved), their transcripts
dropped (``usmkit.data.recipes.common.unlabeled_cuts``: speaker and language kept in ``cut.custom``), cut ids prefixed with the corpus name so two
corpora cannot collide, and the union is written as ``{out}/{corpus}_{recordings,cuts}_{split}.jsonl.gz``
(paths under ``out`` relative to it, others absolute). Train with ``data.train_split=pool``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from lhotse import CutSet

from usmkit.data.manifests import load_cuts
from usmkit.data.recipes import parse_key_value_args, print_split_table, split_rows
from usmkit.data.recipes.common import unlabeled_cuts, write_unlabeled_split
from usmkit.errors import UsageError, strip_debug_flag, user_errors

USAGE = __doc__


@dataclass
class PoolArgs:
    out: str = "data/pool"
    corpus: str = "pool"
    split: str = "unlabeled"
    inputs: list[str] = field(default_factory=list)  # manifest_dir:corpus:split
    language: str = "en"  # for cuts whose supervisions name none


def _parse_input(spec: str) -> tuple[str, str, str]:
    parts = spec.rsplit(":", 2)
    if len(parts) != 3 or not all(parts):
        raise UsageError(f"pool input {spec!r} must look like manifest_dir:corpus:split (e.g. data/an4:an4:unlabeled)")
    return parts[0], parts[1], parts[2]


def pooled_cuts(inputs: Sequence[str], language: str = "en") -> CutSet:
    """The cuts of every ``manifest_dir:corpus:split`` input as audio-only cuts with corpus-prefixed ids."""
    if not inputs:
        raise UsageError("pool needs inputs=[manifest_dir:corpus:split,...]")
    pools = []
    for spec in inputs:
        manifest_dir, corpus, split = _parse_input(spec)
        pools.append(unlabeled_cuts(load_cuts(manifest_dir, split, corpus=corpus), language, id_prefix=f"{corpus}-"))
    return CutSet.from_cuts(c for cuts in pools for c in cuts)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_key_value_args(PoolArgs, strip_debug_flag(sys.argv[1:] if argv is None else argv), USAGE)
    with user_errors():
        cuts = pooled_cuts(args.inputs, args.language)
        write_unlabeled_split(args.out, args.corpus, args.split, cuts)
        print_split_table(f"{args.corpus} pool in {args.out}", split_rows({args.split: cuts}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
