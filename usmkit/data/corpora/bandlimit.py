"""A band-limited copy of a corpus split, e.g. the telephone-band test set: every cut's audio resampled to
``rate`` and back to its own rate, so nothing is left above ``rate / 2``.

CLI::

    python -m usmkit.cli.prepare bandlimit src=data/an4 split=test            # -> split test_8k in data/an4
    python -m usmkit.cli.evaluate checkpoint=exp/an4 'test_sets=[test,test_8k]'

The new split (``name``, default ``{split}_{rate in kHz}k``, e.g. ``test_8k``) is written as
``{out}/{corpus}_{recordings,supervisions,cuts}_{name}.jsonl.gz`` with its audio as 24-bit FLAC under
``{out}/{name}/``: the same transcripts, speakers and durations (sample for sample), and cut, recording and
supervision ids suffixed with ``_{rate in kHz}k``. ``out`` defaults to ``src``, so the new split sits beside
the original one, where a model trained on that corpus finds it by name.

``channel=telephone`` puts the split through a telephone line instead (``usmkit.data.waveform_augment.narrowband``:
the band cut at 3.4 kHz, down to 8 kHz, the G.711 mu-law codec, back up; lhotse's resampler), e.g. ``test_tel``: a
narrowband channel other than ``rate``'s, for checking that what a model learned from one channel carries to
another.

Resampling: torchaudio's Kaiser-windowed sinc with librosa's "kaiser_best" settings (64 zero crossings,
roll-off 0.9476, beta 14.77): the band above ``rate / 2`` ends more than 60 dB down. lhotse's resampler
(torchaudio's default filter, 6 zero crossings) would leave energy 20-30 dB down in the first 500 Hz above
it, and a band-limited test set must not have any.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torchaudio.functional as AF
from lhotse import CutSet, MonoCut, Recording
from lhotse.cut import Cut
from lhotse.utils import fastcopy

from usmkit.data.audio_files import write_audio
from usmkit.data.corpora import print_split_table, split_rows
from usmkit.data.corpora.common import RecipeDrops, RecipeError, drops_footer, write_split
from usmkit.data.corpora.derived import derived_split_out, source_corpus
from usmkit.data.manifests import load_cuts
from usmkit.data.waveform_augment import TELEPHONE_TOP_HZ, narrowband

# torchaudio's equivalent of librosa's "kaiser_best" (torchaudio's resampling tutorial)
KAISER_BEST = dict(
    lowpass_filter_width=64, rolloff=0.9475937167399596, resampling_method="sinc_interp_kaiser", beta=14.769656459379492
)

USAGE = """\
usage: python -m usmkit.cli.prepare bandlimit src=DIR [key=value ...]

  src=DIR            a usmkit corpus folder (its lhotse manifests, e.g. data/an4)
  split=NAME         the split to copy (default test)
  rate=HZ            resample to this rate and back (default 8000: nothing above 4 kHz, the telephone band)
  channel=NAME       resample (default: rate= and back) or telephone (3.4 kHz band and mu-law codec; rate unused)
  out=DIR            where the new split goes (default: src, beside the original split)
  corpus=NAME        the manifests' name prefix (default: the only one in src)
  name=NAME          the new split's name (default {split}_{rate in kHz}k, e.g. test_8k; telephone: {split}_tel)
  on_error=fail|skip stop at the first cut whose audio cannot be read (default), or leave it out, counted
"""


@dataclass(frozen=True)
class BandlimitArgs:
    src: str = ""
    split: str = "test"
    rate: int = 8000
    out: str = ""  # default: src
    corpus: str = ""  # default: the only corpus in src
    name: str = ""  # default: {split}_{rate in kHz}k, or {split}_tel
    channel: str = "resample"  # resample | telephone
    on_error: str = "fail"  # fail | skip


CHANNELS = ("resample", "telephone")
TELEPHONE_SUFFIX = "_tel"


def suffix(rate: int) -> str:
    """``_8k`` for 8000 Hz, ``_11.025k`` for 11025 Hz."""
    return f"_{rate / 1000:g}k"


def id_suffix(args: BandlimitArgs) -> str:
    """What the new split's ids (and its default name) end with: ``_8k`` (``rate=8000``) or ``_tel``."""
    return TELEPHONE_SUFFIX if args.channel == "telephone" else suffix(args.rate)


def output_corpus(args: BandlimitArgs) -> str:
    """The corpus the new split is written under (``usmkit.cli.prepare`` checks ``out=`` against it)."""
    return source_corpus(args, "bandlimit")


def band_limited(samples: np.ndarray, sample_rate: int, rate: int) -> np.ndarray:
    """samples (C, N) at ``sample_rate`` -> (C, N): resampled to ``rate`` and back, trimmed or zero-padded to N."""
    x = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32)).double()  # (C, N)
    y = AF.resample(AF.resample(x, sample_rate, rate, **KAISER_BEST), rate, sample_rate, **KAISER_BEST)
    n = x.shape[-1]
    y = torch.nn.functional.pad(y[..., :n], (0, max(0, n - y.shape[-1])))  # (C, N)
    return y.float().numpy()


def telephone(cut: Cut) -> np.ndarray:
    """``cut``'s audio (C, N) through a telephone line (``waveform_augment.narrowband``), trimmed or zero-padded
    to its own N."""
    samples = narrowband(cut).load_audio()  # (C, M), M within a few samples of N
    n = cut.num_samples
    return np.pad(samples[:, :n], ((0, 0), (0, max(0, n - samples.shape[1]))))


def band_limited_cut(cut: Cut, limited: np.ndarray, audio_dir: Path, tail: str) -> MonoCut:
    """``cut``'s band-limited audio ``limited`` (C, N), written to ``audio_dir/<new id>.flac``, as a new cut whose
    ids end with ``tail`` and whose supervisions (transcripts, speakers, times) are the same."""
    if limited.shape[0] != 1:
        raise RecipeError(f"cut {cut.id} has {limited.shape[0]} channels; bandlimit copies mono cuts only")
    new_id = f"{cut.id}{tail}"
    # Filter ringing can overshoot full scale by a hair on clipped recordings; FLAC stores integers in [-1, 1).
    out = np.clip(limited[0], -1.0, 1.0 - 2.0**-23)
    path = write_audio(audio_dir / f"{new_id}.flac", out, cut.sampling_rate, subtype="PCM_24")
    recording = Recording.from_file(path, recording_id=new_id)
    supervisions = [fastcopy(s, id=f"{s.id}{tail}", recording_id=new_id, channel=0) for s in cut.supervisions]
    return MonoCut(
        id=new_id, start=0.0, duration=recording.duration, channel=0, recording=recording,
        supervisions=supervisions, custom=cut.custom,
    )  # fmt: skip


def run(args: BandlimitArgs) -> None:
    """``python -m usmkit.cli.prepare bandlimit key=value ...`` (``USAGE``)."""
    if args.rate <= 0:
        raise RecipeError(f"rate must be > 0 Hz, got {args.rate}")
    if args.channel not in CHANNELS:
        raise RecipeError(f"channel must be one of {', '.join(CHANNELS)}, got {args.channel!r}")
    phone = args.channel == "telephone"
    rate = 2 * TELEPHONE_TOP_HZ if phone else args.rate  # the highest rate whose band the new split keeps
    corpus = output_corpus(args)
    name = args.name or f"{args.split}{id_suffix(args)}"
    out = derived_split_out(args, corpus, name)
    source = load_cuts(args.src, args.split, corpus=corpus)
    narrow = next((c for c in source if c.sampling_rate <= rate), None)
    if narrow is not None:
        raise RecipeError(
            f"cut {narrow.id} is at {narrow.sampling_rate} Hz, not above "
            f"{f'{rate} Hz (the telephone band)' if phone else f'rate={rate}'}: it has nothing above "
            f"{rate / 2:g} Hz to remove; pass a lower rate= or a wideband split"
        )
    drops = RecipeDrops(on_error=args.on_error, unit="cuts")
    cuts = []
    for cut in source:
        drops.seen()
        try:
            samples = telephone(cut) if phone else cut.load_audio()  # (C, N); telephone: band-limited already
        except Exception as e:  # lhotse tries every audio backend: any failure means unreadable audio
            first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            drops.drop("unreadable audio", cut.id, f"its audio cannot be read ({first_line})")
            continue
        limited = samples if phone else band_limited(samples, cut.sampling_rate, rate)
        cuts.append(band_limited_cut(cut, limited, out / name, id_suffix(args)))
    if not cuts:
        raise RecipeError(f"no cut of {corpus} {args.split} could be copied ({drops.summary()})")
    cut_set = CutSet.from_cuts(cuts)
    write_split(out, corpus, name, cut_set)
    how = "a telephone line (3.4 kHz, mu-law)" if phone else f"{args.rate / 2:g} Hz ({args.rate} Hz and back)"
    title = f"{corpus} {args.split} band-limited to {how} in {out}"
    print_split_table(title, split_rows({name: cut_set}), footer=drops_footer(drops))


ARGS = BandlimitArgs
