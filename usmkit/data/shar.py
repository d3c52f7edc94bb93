"""lhotse Shar shards of a usmkit corpus: the converter, and the shards training streams.

At scale a corpus is too many small files to read at random from shared storage. Shar (``lhotse.shar``)
keeps the cuts in numbered shards, each one JSONL manifest and one tar of audio, read sequentially::

    python -m usmkit.cli.prepare shar src=data/an4 out=data/an4_shar [shard_size=1000]

    data/an4_shar/shar.json                  what was written: source, settings, shards and hours per split
    data/an4_shar/<split>/cuts.000000.jsonl.gz
    data/an4_shar/<split>/recording.000000.tar   the cuts' audio, FLAC (lossless), in the manifest's order
    ...

Each split is validated first (``usmkit.data.validate``: what cannot be read stops the conversion, or is
left out and counted with ``on_bad_input=skip``), resampled to ``sample_rate``, shuffled (``seed``: shards
then mix speakers and lengths, as training reads them), and written by lhotse's ``CutSet.to_shar`` into a
folder that replaces the split's atomically. Training reads a split with ``data.shar_dir=<out>``
(``usmkit.data.loader.make_loader``: every process and loader worker streams its own shards).
"""

from __future__ import annotations

import gzip
import json
import random
import re
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lhotse import CutSet
from lhotse.cut import Cut

from usmkit.checkpointing.atomic import replaced_atomically, replaced_dir_atomically
from usmkit.checkpointing.output_dir import check_output_dir
from usmkit.data.manifests import available_splits, load_cuts
from usmkit.data.validate import validate_cuts
from usmkit.errors import UsageError

INDEX = "shar.json"
AUDIO_FIELD = "recording"  # lhotse's name for a cut's audio in Shar
_SHARD = re.compile(r"^[a-z_]+\.\d+\.(?:jsonl\.gz|tar)$")  # lhotse's shard names: cuts.000000.jsonl.gz, ...


class SharError(UsageError):
    """A Shar folder that cannot be read as one this module wrote; the message names it."""


@dataclass(frozen=True)
class SharArgs:
    src: str = ""
    out: str = ""
    corpus: str = ""  # the manifests' name prefix; default: the only one in src
    splits: tuple[str, ...] = ()  # default: every split with a cuts manifest
    shard_size: int = 1000
    sample_rate: int = 16000
    seed: int = 0
    num_jobs: int = 1
    on_bad_input: str = "error"  # error | skip


USAGE = """\
usage: python -m usmkit.cli.prepare shar src=DIR out=DIR [key=value ...]

  src=DIR                 a usmkit corpus folder (its lhotse manifests, e.g. data/an4)
  out=DIR                 where the shards go: DIR/<split>/cuts.NNNNNN.jsonl.gz + recording.NNNNNN.tar; a new
                          or empty folder or an earlier conversion, apart from src= (each split's folder is replaced)
  corpus=NAME             the manifests' name prefix (default: the only one in src)
  splits=[a,b]            which splits (default: every split with a cuts manifest)
  shard_size=N            cuts per shard (default 1000); training needs at least
                          processes x loader workers shards of its training split
  sample_rate=HZ          resample to this rate first (default 16000, the feature rate)
  seed=S                  the order the cuts are shuffled into before they are sharded (default 0)
  num_jobs=N              shards written in parallel (default 1)
  on_bad_input=error|skip stop at the first cut whose audio cannot be read (default), or leave it out, counted
"""


def run(args: SharArgs) -> None:
    """``python -m usmkit.cli.prepare shar key=value ...`` (``USAGE``)."""
    if not args.src or not args.out:
        raise SharError("pass src=DIR (a usmkit corpus folder) and out=DIR (where the shards go)")
    if args.shard_size < 1 or args.num_jobs < 1:
        raise SharError(f"shard_size and num_jobs must be >= 1, got {args.shard_size} and {args.num_jobs}")
    if args.on_bad_input not in ("error", "skip"):
        raise SharError(f"on_bad_input must be error or skip, got {args.on_bad_input!r}")
    check_out(args)
    corpus = args.corpus or _only_corpus(Path(args.src))
    splits = list(args.splits) or available_splits(args.src, corpus)
    if not splits:
        raise SharError(f"{args.src} holds no cuts manifest of corpus {corpus!r} ({corpus}_cuts_<split>.jsonl.gz)")
    index = {"source": str(Path(args.src).resolve()), "corpus": corpus, "shard_size": args.shard_size,
             "sample_rate": args.sample_rate, "seed": args.seed, "splits": {}}  # fmt: skip
    for split in splits:
        entry = write_split(
            load_cuts(args.src, split, corpus=corpus), Path(args.out) / split, shard_size=args.shard_size,
            sample_rate=args.sample_rate, seed=args.seed, num_jobs=args.num_jobs, on_bad_input=args.on_bad_input,
        )  # fmt: skip
        index["splits"][split] = entry
        print(f"{split}: {entry['cuts']} cuts ({entry['hours']:.3f} h) in {entry['shards']} shards; {entry['skipped']}")
    with replaced_atomically(Path(args.out) / INDEX) as tmp:
        tmp.write_text(json.dumps(index, indent=1))


ARGS = SharArgs


def check_out(args: SharArgs) -> None:
    """Refuse an ``out=`` that is, contains or lies inside ``src=`` or other usmkit work, or that exists and
    is not empty nor an earlier conversion (``is_shar_folder``): each split's folder in it is replaced
    whole (``usmkit.checkpointing.output_dir``)."""
    check_output_dir(
        Path(args.out), option="out=", own_kind="shar", own_words="an earlier Shar conversion", own=is_shar_folder,
        inputs=[(f"src={args.src}", Path(args.src))],
    )  # fmt: skip


def is_shar_folder(folder: Path) -> bool:
    """Whether ``folder`` holds only what ``run`` writes: ``shar.json`` and split folders of shards (and the
    temporary folder of a conversion that was killed)."""
    for p in folder.iterdir():
        if p.name == INDEX or (p.name.startswith(".tmp-") and p.is_dir()):
            continue
        if not p.is_dir() or any(not _SHARD.match(f.name) for f in p.iterdir()):
            return False
    return True


def write_split(
    cuts: CutSet, out: Path, *, shard_size: int, sample_rate: int = 16000, seed: int = 0, num_jobs: int = 1,
    on_bad_input: str = "error",
) -> dict:  # fmt: skip
    """Validate, resample and shuffle ``cuts``, and write them as Shar shards into ``out`` (replaced
    atomically); returns the split's entry of ``shar.json``."""
    cuts, report = validate_cuts(cuts, require_text=False, on_bad=on_bad_input, expected_sample_rate=sample_rate)
    if len(cuts) == 0:
        raise SharError(f"no usable cut left for {out} ({report.summary()})")
    cuts = CutSet.from_cuts(c if c.sampling_rate == sample_rate else c.resample(sample_rate) for c in cuts)
    cuts = cuts.shuffle(rng=random.Random(seed))
    with replaced_dir_atomically(out) as tmp:
        written = cuts.to_shar(tmp, fields={AUDIO_FIELD: "flac"}, shard_size=shard_size, num_jobs=num_jobs)
    return {
        "shards": len(written["cuts"]),
        "cuts": len(cuts),
        "hours": round(sum(c.duration for c in cuts) / 3600, 4),
        "skipped": report.summary(),
    }


def _only_corpus(src: Path) -> str:
    names = sorted({p.name.split("_cuts_")[0] for p in src.glob("*_cuts_*.jsonl.gz")})
    if len(names) != 1:
        raise SharError(f"{src} holds the manifests of corpora {names or 'none'}: pass corpus=NAME")
    return names[0]


def _rewrite_hint(shar_dir: str | Path) -> str:
    return f"write the split's shards again (`python -m usmkit.cli.prepare shar src=<corpus dir> out={shar_dir}`)"


def split_shards(shar_dir: str | Path, split: str) -> list[dict[str, str]]:
    """The shards of ``split`` in ``shar_dir``, in order: ``{"cuts": path, "recording": path}`` each."""
    folder = Path(shar_dir) / split
    cuts = sorted(folder.glob("cuts.*.jsonl.gz"))
    audio = sorted(folder.glob(f"{AUDIO_FIELD}.*.tar"))
    if not cuts:
        raise SharError(
            f"{folder} holds no Shar shards (cuts.NNNNNN.jsonl.gz): write them with `python -m usmkit.cli.prepare "
            f"shar src=<corpus dir> out={shar_dir}`, or leave data.shar_dir unset to read the manifests"
        )
    by_number = {p.name.split(".")[1]: p for p in cuts}
    audio_by_number = {p.name.split(".")[1]: p for p in audio}
    if by_number.keys() != audio_by_number.keys():
        missing = [folder / f"{AUDIO_FIELD}.{n}.tar" for n in sorted(by_number.keys() - audio_by_number.keys())]
        missing += [folder / f"cuts.{n}.jsonl.gz" for n in sorted(audio_by_number.keys() - by_number.keys())]
        shown = ", ".join(str(p) for p in missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise SharError(
            f"Shar shards of {folder} are missing: {shown} (every cuts.N.jsonl.gz needs its {AUDIO_FIELD}.N.tar); "
            f"copy the missing files again, or {_rewrite_hint(shar_dir)}"
        )
    return [{"cuts": str(c), AUDIO_FIELD: str(audio_by_number[n])} for n, c in by_number.items()]


def shar_cuts(shards: list[dict[str, str]], *, audio: bool) -> CutSet:
    """The cuts of ``shards`` (``split_shards``), lazily in shard order: with their audio (read from the
    tars as they stream by) or, ``audio=False``, only what the manifests say (durations, transcripts).
    A shard that cannot be read raises ``SharError`` naming its files (``_ShardByShard``)."""
    return CutSet(_ShardByShard(shards, audio))


class _ShardByShard:
    """The cuts of Shar shards, each shard read by ``CutSet.from_shar`` in turn (the same cuts in the same order as
    one ``from_shar`` over them all), so that a shard lhotse cannot read is named: a tar cut short
    (``tarfile.ReadError``, or fewer audio entries than cuts), one shard's manifest beside another's audio
    (lhotse's ``AssertionError: Mismatched IDs``), an unreadable manifest."""

    def __init__(self, shards: list[dict[str, str]], audio: bool) -> None:
        self.shards, self.audio = shards, audio

    def __iter__(self) -> Iterator[Cut]:
        for shard in self.shards:
            fields = {"cuts": [shard["cuts"]]}
            if self.audio:
                fields[AUDIO_FIELD] = [shard[AUDIO_FIELD]]
            read = 0
            try:
                for cut in CutSet.from_shar(fields=fields):
                    read += 1
                    yield cut
                expected = _lines(shard["cuts"]) if self.audio else read  # a tar cut short at an entry's edge
                short = read < expected
            except (tarfile.TarError, AssertionError, OSError, EOFError, ValueError, zlib.error) as e:
                raise SharError(_unreadable(shard, e, self.audio)) from None
            if short:
                raise SharError(
                    f"Shar shard {shard[AUDIO_FIELD]} holds the audio of {read} of the {expected} cuts of "
                    f"{shard['cuts']}: it was cut short; copy it again, or {_rewrite_hint(_shar_dir(shard))}"
                )


def _lines(path: str) -> int:
    with gzip.open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _shar_dir(shard: dict[str, str]) -> Path:
    return Path(shard["cuts"]).parent.parent


def _unreadable(shard: dict[str, str], e: Exception, audio: bool) -> str:
    """The one line for a shard ``CutSet.from_shar`` failed on with ``e``."""
    detail = " ".join(str(e).split()) or type(e).__name__
    hint = _rewrite_hint(_shar_dir(shard))
    if isinstance(e, AssertionError) and "Mismatched IDs" in detail:
        return (
            f"Shar shards {shard['cuts']} and {shard[AUDIO_FIELD]} do not belong together ({detail}): were shard "
            f"files swapped or renamed? Put the original files back, or {hint}"
        )
    what = f"{shard[AUDIO_FIELD]} (the audio of {shard['cuts']})" if audio else shard["cuts"]
    return (
        f"Shar shard {what} cannot be read ({type(e).__name__}: {detail}): it is damaged or cut short; copy it "
        f"again, or {hint}"
    )


def stream_shards(
    shards: list, *, epoch: int, seed: int, rank: int, world_size: int, stream: int, streams: int
) -> list:
    """The shards one loader stream reads in ``epoch``: all shards shuffled by ``seed + epoch``, then every
    ``world_size``-th from ``rank``, then every ``streams``-th of those from ``stream`` (lhotse's rule for
    ``CutSet.from_shar(shuffle_shards=True, split_for_dataloading=True)``: shuffle, split by node, split
    by worker). Over the streams of every rank, each shard is read once per epoch."""
    order = list(shards)
    random.Random(seed + epoch).shuffle(order)
    return order[rank::world_size][stream::streams]
