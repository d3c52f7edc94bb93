"""Pool several corpora's splits into one split: audio only (a BEST-RQ / MOST unlabeled pool) or labeled.

CLI::

    python -m usmkit.cli.prepare pool out=data/an4 corpus=an4 split=pool \\
        inputs=[data/an4:an4:unlabeled,data/kathleen:kathleen:unlabeled]

Each input is ``manifest_dir:corpus:split``; its cuts are read (paths resolved), their transcripts
dropped (``usmkit.data.corpora.common.unlabeled_cuts``: speaker and language kept in ``cut.custom``), cut ids prefixed with the corpus name so two
corpora cannot collide, and the union is written as ``{out}/{corpus}_{recordings,cuts}_{split}.jsonl.gz``
(paths under ``out`` relative to it, others absolute). Train with ``data.train_split=pool``.

``labeled=true`` keeps the transcripts (every input cut must have one) and also writes the
supervisions manifest: one training set from several labeled corpora, e.g. a general English model::

    python -m usmkit.cli.prepare pool out=data/english corpus=english split=train labeled=true \
        inputs=[data/an4:an4:train,data/kathleen:kathleen:train]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from lhotse import CutSet

from usmkit.data.corpora import print_split_table, split_rows
from usmkit.data.corpora.common import unlabeled_cuts, write_split, write_unlabeled_split
from usmkit.data.manifests import load_cuts
from usmkit.errors import UsageError

USAGE = __doc__


@dataclass
class PoolArgs:
    out: str = "data/pool"
    corpus: str = "pool"
    split: str = "unlabeled"
    inputs: list[str] = field(default_factory=list)  # manifest_dir:corpus:split
    language: str = "en"  # for cuts whose supervisions name none
    labeled: bool = False  # keep the transcripts (and write the supervisions manifest)


def _parse_input(spec: str) -> tuple[str, str, str]:
    parts = spec.rsplit(":", 2)
    if len(parts) != 3 or not all(parts):
        raise UsageError(f"pool input {spec!r} must look like manifest_dir:corpus:split (e.g. data/an4:an4:unlabeled)")
    return parts[0], parts[1], parts[2]


def _inputs(inputs: Sequence[str]) -> Iterator[tuple[str, str, CutSet]]:
    """(spec, corpus, cuts) of every ``manifest_dir:corpus:split`` input."""
    if not inputs:
        raise UsageError("pool needs inputs=[manifest_dir:corpus:split,...]")
    for spec in inputs:
        manifest_dir, corpus, split = _parse_input(spec)
        yield spec, corpus, load_cuts(manifest_dir, split, corpus=corpus)


def pooled_cuts(inputs: Sequence[str], language: str = "en") -> CutSet:
    """The cuts of every ``manifest_dir:corpus:split`` input as audio-only cuts with corpus-prefixed ids."""
    pools = [unlabeled_cuts(cuts, language, id_prefix=f"{corpus}-") for _, corpus, cuts in _inputs(inputs)]
    return CutSet.from_cuts(c for cuts in pools for c in cuts)


def pooled_labeled_cuts(inputs: Sequence[str]) -> CutSet:
    """The cuts of every input with their transcripts, ids prefixed with the corpus name."""
    out = []
    for spec, corpus, cuts in _inputs(inputs):
        for cut in cuts:
            if not cut.supervisions or not all(s.text for s in cut.supervisions):
                raise UsageError(
                    f"pool labeled=true: cut {cut.id} of {spec} has no transcript; pool labeled splits "
                    "(train, dev, test), or leave labeled=false for an audio-only pool"
                )
            out.append(cut.with_id(f"{corpus}-{cut.id}"))
    return CutSet.from_cuts(out)


def run(args: PoolArgs) -> None:
    """``python -m usmkit.cli.prepare pool key=value ...`` (``USAGE``)."""
    if args.labeled:
        cuts = pooled_labeled_cuts(args.inputs)
        write_split(args.out, args.corpus, args.split, cuts)
    else:
        cuts = pooled_cuts(args.inputs, args.language)
        write_unlabeled_split(args.out, args.corpus, args.split, cuts)
    print_split_table(f"{args.corpus} pool in {args.out}", split_rows({args.split: cuts}))


ARGS = PoolArgs
