"""A split of a corpus restricted to some speakers, e.g. 10% of the labels for a learning curve.

CLI::

    python -m usmkit.cli.prepare subset src=data/an4 split=train fraction=0.1 seed=0 name=train_10
    python -m usmkit.cli.prepare subset src=data/an4 split=train speakers=recipes/an4/lists/train_10.txt name=train_10

Whole speakers are taken, never single utterances of a speaker, so a model trained on the subset has heard
fewer voices, as a smaller corpus would give it. With ``fraction=``, speakers are drawn in a seeded random
order until their utterances reach that share of the split's; the list is written beside the manifests
(``{out}/{corpus}_{name}_speakers.txt``), so it can be committed and given back with ``speakers=FILE`` (one
speaker id a line), which reproduces the split exactly. The new split is
``{out}/{corpus}_{recordings,supervisions,cuts}_{name}.jsonl.gz``: the same cuts, audio and ids as in ``split``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from lhotse import CutSet

from usmkit.data.corpora import print_split_table, split_rows
from usmkit.data.corpora.common import RecipeError, write_split
from usmkit.data.corpora.derived import derived_split_out, source_corpus
from usmkit.data.manifests import load_cuts

USAGE = """\
usage: python -m usmkit.cli.prepare subset src=DIR name=NAME (fraction=F | speakers=FILE) [key=value ...]

  src=DIR            a usmkit corpus folder (its lhotse manifests, e.g. data/an4)
  split=NAME         the split to take speakers from (default train)
  name=NAME          the new split's name (e.g. train_10)
  fraction=F         draw speakers (seeded) until their utterances are at least this share of the split's;
                     the list is written to {out}/{corpus}_{name}_speakers.txt
  seed=N             the draw's seed (default 0)
  speakers=FILE      instead: the speakers listed in FILE (one id a line; # starts a comment)
  out=DIR            where the new split goes (default: src)
  corpus=NAME        the manifests' name prefix (default: the only one in src)
"""


@dataclass(frozen=True)
class SubsetArgs:
    src: str = ""
    split: str = "train"
    name: str = ""
    fraction: float = 0.0
    seed: int = 0
    speakers: str = ""
    out: str = ""  # default: src
    corpus: str = ""  # default: the only corpus in src


def output_corpus(args: SubsetArgs) -> str:
    """The corpus the new split is written under (``usmkit.cli.prepare`` checks ``out=`` against it)."""
    return source_corpus(args, "subset")


def speaker_of(cut) -> str:
    """The speaker of a cut (that of its first supervision); a cut without one cannot be placed."""
    speaker = cut.supervisions[0].speaker if cut.supervisions else None
    if not speaker:
        raise RecipeError(f"cut {cut.id} names no speaker: a speaker subset needs every cut's speaker")
    return speaker


def draw_speakers(cuts: CutSet, fraction: float, seed: int) -> list[str]:
    """Speakers in a seeded random order, taken until their utterances reach ``fraction`` of all; sorted."""
    counts: dict[str, int] = {}
    for cut in cuts:
        speaker = speaker_of(cut)
        counts[speaker] = counts.get(speaker, 0) + 1
    order = sorted(counts)
    random.Random(seed).shuffle(order)
    chosen, total, need = [], 0, fraction * sum(counts.values())
    for speaker in order:
        if total >= need:
            break
        chosen.append(speaker)
        total += counts[speaker]
    return sorted(chosen)


def read_speakers(path: str) -> list[str]:
    file = Path(path)
    if not file.is_file():
        raise RecipeError(f"speakers={path}: no such file (one speaker id a line)")
    lines = (line.split("#", 1)[0].strip() for line in file.read_text().splitlines())
    speakers = [line for line in lines if line]
    if not speakers:
        raise RecipeError(f"speakers={path} lists no speaker (one speaker id a line)")
    return speakers


def run(args: SubsetArgs) -> None:
    """``python -m usmkit.cli.prepare subset key=value ...`` (``USAGE``)."""
    if not args.name:
        raise RecipeError("subset needs name=NAME, the new split's name (e.g. name=train_10)")
    if bool(args.speakers) == (args.fraction > 0):
        raise RecipeError("subset needs one of fraction=F (0 < F <= 1: speakers drawn) or speakers=FILE")
    if not 0 <= args.fraction <= 1:
        raise RecipeError(f"fraction must be in (0, 1], got {args.fraction}")
    corpus = output_corpus(args)
    out = derived_split_out(args, corpus, args.name)
    source = load_cuts(args.src, args.split, corpus=corpus)
    if args.speakers:
        speakers = read_speakers(args.speakers)
        present = {speaker_of(c) for c in source}
        missing = [s for s in speakers if s not in present]
        if missing:
            raise RecipeError(
                f"speakers={args.speakers} names {len(missing)} speaker(s) not in {corpus} {args.split} "
                f"(e.g. {missing[0]}): is it the list of another corpus or split?"
            )
    else:
        speakers = draw_speakers(source, args.fraction, args.seed)
    keep = set(speakers)
    cuts = source.filter(lambda c: speaker_of(c) in keep).to_eager()
    out.mkdir(parents=True, exist_ok=True)
    write_split(out, corpus, args.name, cuts)
    if not args.speakers:
        listing = out / f"{corpus}_{args.name}_speakers.txt"
        header = f"# {len(speakers)} speakers of {corpus} {args.split}: fraction={args.fraction} seed={args.seed}\n"
        listing.write_text(header + "".join(f"{s}\n" for s in speakers))
    share = len(cuts) / max(1, len(source))
    title = f"{corpus} {args.name}: {len(speakers)} speakers of {args.split}, {len(cuts)} cuts ({share:.1%}) in {out}"
    print_split_table(title, split_rows({args.name: cuts}))


ARGS = SubsetArgs
