"""Training-time augmentation of the waveform (lhotse): room reverberation, recorded background noise and
a band-limited channel (telephone narrowband or a random low-pass), drawn per cut from one seeded stream.

Per cut, in the order sound takes:

1. reverberation (the room), with probability ``reverb_prob``: lhotse ``reverb_rir`` with an impulse
   response from lhotse's synthetic generator (FRA-RIR: a random room, T60 0.1-0.8 s, and source distance);
2. background noise (at the microphone), with probability ``noise_prob``, from the recordings of a noise
   manifest (e.g. MUSAN's noise part): lhotse ``CutSet.mix`` at an SNR uniform in ``noise_snr_db``, the noise
   cut's window drawn at random and repeated to cover the whole cut;
3. the channel, one of: narrowband with probability ``narrowband_prob`` (a telephone line: the band cut at
   3.4 kHz, then lhotse ``Narrowband``: down to 8 kHz, the G.711 mu-law codec, back to the cut's rate), a
   low-pass with probability ``lowpass_prob`` (lhotse's resampling low-pass: down to twice a cut-off drawn
   log-uniformly in ``lowpass_hz``, and back), else unchanged. The channel comes last, so it band-limits the
   noise too, as a telephone line would.

Lengths, ids and transcripts are kept, so batches still name the manifest's cuts and their shapes do not
change (``fixed_batch_shapes`` holds). Everything is lazy (lhotse applies it when the audio is loaded for the
on-the-fly features), so it needs ``features.precomputed=false``.

Every option is off by default (``DataConfig``): the default features are stored ones, which waveform
augmentation cannot change, and what each costs wideband accuracy is for a training run to measure.

Every random draw comes from ``random.Random`` seeded per batch (``reseed``, which the loader calls with the
batch's seed) and from torch's RNG, which the loader seeds per batch too: a resumed loader draws the same
augmentation as an uninterrupted one.

Every resampling here is lhotse's (a copy of torchaudio's default sinc filter, roll-off 0.99 of the lower
Nyquist), whose transition band keeps energy 20-30 dB down for the first ~500 Hz above a cut-off, as usmkit's
own loading of an 8 kHz recording does (``usmkit.data.features.to_sample_rate``). Narrowband cuts the band at
3.4 kHz before going down to 8 kHz, so it leaves nothing above 4 kHz (the sharply band-limited audio of
``usmkit.data.corpora.bandlimit``'s test sets); low-pass cut-offs near 4 kHz give the leaky kind.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Iterator
from pathlib import Path

import torch
from lhotse import CutSet
from lhotse.cut import Cut, MixedCut
from lhotse.utils import fastcopy

from usmkit.data.features import to_sample_rate
from usmkit.data.manifests import read_cuts
from usmkit.data.validate import BadInputError

NARROWBAND_CODEC = "mulaw"  # G.711, the telephone codec; lhotse's other one (lpc10) needs the SpanDSP library
TELEPHONE_TOP_HZ = 3400  # the telephone band's upper edge (ITU-T G.712: 300-3400 Hz)
LOWPASS_GRID_HZ = 100  # low-pass cut-offs are drawn on this grid (see ``WaveformAugment.lowpass_cutoff``)


def load_noise_cuts(path: str | Path, sample_rate: int, allow_urls: bool = False) -> CutSet:
    """The noise recordings of the lhotse cuts manifest ``path``, without supervisions (a noise recording's
    transcript must not join the speech's), at ``sample_rate``, in memory. ``BadInputError`` naming the file
    when it is missing or holds no cut."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(
            "missing noise manifest",
            str(path),
            "data.noise_cuts names no file",
            hint="pass a lhotse cuts manifest of noise recordings (e.g. `lhotse cut simple -r "
            "musan_recordings_noise.jsonl.gz noise_cuts.jsonl.gz`), or leave data.noise_cuts unset",
        )
    cuts = [to_sample_rate(c.drop_supervisions(), sample_rate) for c in read_cuts(path, allow_urls=allow_urls)]
    if not cuts:
        raise BadInputError(
            "empty noise manifest", str(path), "it holds no cut", hint="pass a manifest with noise recordings"
        )
    return CutSet.from_cuts(cuts)


@contextlib.contextmanager
def one_intra_op_thread() -> Iterator[None]:
    """torch runs single-threaded inside (its previous thread count restored after).

    lhotse's synthetic RIR generator adds its reflections with an indexed assignment whose repeated indices
    race across torch's intra-op threads, so with several threads one seed gives slightly different impulse
    responses from run to run. Loader workers are single-threaded already (the DataLoader sets it); this
    makes the in-process loader (``num_workers=0``) exact too."""
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class WaveformAugment:
    """``augment(cuts) -> cuts``: reverberation, noise and channel drawn per cut (see the module docstring).

    Build it with ``waveform_augmentation`` (None when every option is off). ``reseed(seed)`` restarts its
    random stream; ``loading()`` is the context the cuts' audio must be loaded in (one torch thread when
    reverberation is on, see ``one_intra_op_thread``).
    """

    def __init__(
        self,
        *,
        sample_rate: int,
        reverb_prob: float = 0.0,
        noise: CutSet | None = None,
        noise_snr_db: tuple[float, float] = (10.0, 20.0),
        noise_prob: float = 0.0,
        narrowband_prob: float = 0.0,
        lowpass_prob: float = 0.0,
        lowpass_hz: tuple[float, float] = (3000.0, 7000.0),
        seed: int = 0,
    ) -> None:
        low, high = lowpass_hz
        if narrowband_prob + lowpass_prob > 1.0:
            raise ValueError(
                f"narrowband_prob + lowpass_prob must be <= 1 (one channel per cut), got "
                f"{narrowband_prob} + {lowpass_prob}"
            )
        if lowpass_prob > 0 and not 0 < low <= high < sample_rate / 2:
            raise ValueError(f"lowpass_hz must be 0 < low <= high < {sample_rate / 2:g} Hz, got {list(lowpass_hz)}")
        self.reverb_prob = reverb_prob
        self.noise = noise
        self.noise_snr_db = noise_snr_db
        self.noise_prob = noise_prob if noise is not None else 0.0
        self.narrowband_prob = narrowband_prob
        self.lowpass_prob = lowpass_prob
        self.lowpass_hz = (low, high)
        self.random = random.Random(stream_seed(seed))

    def reseed(self, seed: int) -> None:
        self.random = random.Random(stream_seed(seed))

    def loading(self) -> contextlib.AbstractContextManager[None]:
        return one_intra_op_thread() if self.reverb_prob > 0 else contextlib.nullcontext()

    def __call__(self, cuts: CutSet) -> CutSet:
        rng = self.random
        out = [self._reverberate(cut) for cut in cuts]
        if self.noise_prob > 0:
            out = list(
                CutSet.from_cuts(out).mix(
                    self.noise,
                    snr=self.noise_snr_db,
                    mix_prob=self.noise_prob,
                    preserve_id="left",
                    seed=rng,
                    random_mix_offset=True,
                )
            )
        return CutSet.from_cuts(self._channel(cut) for cut in out)

    def _reverberate(self, cut: Cut) -> Cut:
        if self.reverb_prob <= 0 or self.random.random() >= self.reverb_prob:
            return cut
        # lhotse's own cut transform (ReverbWithImpulseResponse) leaves the generator unseeded: seeds from our stream
        room, source = self.random.getrandbits(31), self.random.getrandbits(31)
        return cut.reverb_rir(affix_id=False, room_rng_seed=room, source_rng_seed=source)

    def _channel(self, cut: Cut) -> Cut:
        if self.narrowband_prob + self.lowpass_prob <= 0:
            return cut
        draw = self.random.random()
        if draw < self.narrowband_prob:
            return narrowband(cut)
        if draw < self.narrowband_prob + self.lowpass_prob:
            cutoff = self.lowpass_cutoff()
            return cut.resample(2 * cutoff).resample(cut.sampling_rate)
        return cut

    def lowpass_cutoff(self) -> int:
        """A cut-off (Hz) log-uniform in ``lowpass_hz``, on a ``LOWPASS_GRID_HZ`` grid.

        lhotse's ``LowpassUsingResampling`` draws it to the hertz; lhotse caches a resampler (a kernel of
        (new rate / gcd) x (old rate / gcd) taps) per pair of rates for the life of the process, so arbitrary
        rates would build large kernels and grow the cache without bound. On the grid the rates share a
        divisor of 200 Hz with 16 kHz: a few dozen small kernels."""
        low, high = self.lowpass_hz
        hz = math.exp(self.random.uniform(math.log(low), math.log(high)))
        return int(min(max(round(hz / LOWPASS_GRID_HZ) * LOWPASS_GRID_HZ, low), high))


def stream_seed(seed: int) -> str:
    """This augmentation's own stream, apart from speed perturbation's (seeded with the same batch seed)."""
    return f"waveform-augment-{seed}"


def narrowband(cut: Cut) -> Cut:
    """A telephone line, id kept: the band cut at ``TELEPHONE_TOP_HZ`` (lhotse resampling down and back), then
    lhotse ``Narrowband`` (8 kHz, mu-law, back to the cut's rate). lhotse has no ``narrowband`` for a mix
    (``MixedCut``): it is applied to each track with audio, as lhotse's ``MixedCut.resample`` does."""
    if isinstance(cut, MixedCut):
        tracks = [fastcopy(t, cut=narrowband(t.cut)) if t.cut.has_recording else t for t in cut.tracks]
        return MixedCut(id=cut.id, tracks=tracks)
    rate = cut.sampling_rate
    band = cut.resample(2 * TELEPHONE_TOP_HZ).resample(rate)
    return band.narrowband(NARROWBAND_CODEC, restore_orig_sr=True, affix_id=False)


def waveform_augmentation(
    *,
    sample_rate: int,
    reverb_prob: float = 0.0,
    noise: CutSet | None = None,
    noise_snr_db: tuple[float, ...] = (),
    noise_prob: float = 0.0,
    narrowband_prob: float = 0.0,
    lowpass_prob: float = 0.0,
    lowpass_hz: tuple[float, ...] = (3000.0, 7000.0),
    seed: int = 0,
) -> WaveformAugment | None:
    """The waveform augmentation these options ask for; None when none is on (``noise`` needs ``noise_snr_db``)."""
    mixing = noise is not None and noise_prob > 0 and len(noise_snr_db) == 2
    if reverb_prob <= 0 and not mixing and narrowband_prob <= 0 and lowpass_prob <= 0:
        return None
    return WaveformAugment(
        sample_rate=sample_rate,
        reverb_prob=reverb_prob,
        noise=noise if mixing else None,
        noise_snr_db=(noise_snr_db[0], noise_snr_db[1]) if mixing else (0.0, 0.0),
        noise_prob=noise_prob,
        narrowband_prob=narrowband_prob,
        lowpass_prob=lowpass_prob,
        lowpass_hz=(lowpass_hz[0], lowpass_hz[1]),
        seed=seed,
    )
