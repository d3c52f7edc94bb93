"""The training/eval loader: cuts + DataConfig -> an iterable of ``Batch`` that resumes exactly.

Usage (the trainer's side)::

    cuts, report = prepare_cuts(load_cuts(cfg.manifest_dir, "train"), cfg, split="train", require_text=True)
    stats = load_or_compute_stats(cuts, cfg)
    loader = make_loader(cuts, cfg, tokenizer=tok, stats=stats, train=True, rank=rank, world_size=world)
    loader.load_state_dict(ckpt["loader"])      # on resume
    for batch in loader: ...; ckpt["loader"] = loader.state_dict()
"""

from __future__ import annotations

import copy
import functools
import logging
import signal
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np
import torch
from lhotse import CutSet
from lhotse.cut import Cut
from lhotse.dataset import DynamicBucketingSampler
from lhotse.dataset.sampling.dynamic_bucketing import estimate_duration_buckets

from usmkit.data.batch import Batch
from usmkit.data.config import DataConfig
from usmkit.data.dataset import AsrDataset, TextEncoder, cut_text
from usmkit.data.features import feature_storage_dir, precompute_features
from usmkit.data.manifests import load_cuts
from usmkit.data.normalize import FeatureStats, SpeakerNorm, speaker_norms
from usmkit.data.packing import RowPacker, cut_frames, packed_rows
from usmkit.data.sampling import NUM_CUTS_FOR_BINS, labeled_subset, language_balanced, make_sampler
from usmkit.data.shar import SharError, shar_cuts, split_shards, stream_shards
from usmkit.data.validate import ValidationReport, validate_cuts
from usmkit.data.waveform_augment import WaveformAugment, load_noise_cuts, waveform_augmentation

log = logging.getLogger(__name__)


def prepare_cuts(
    cuts: CutSet, cfg: DataConfig, *, split: str, require_text: bool, num_jobs: int = 1
) -> tuple[CutSet, ValidationReport]:
    """Once per run, before any loader: validate (``cfg.on_bad_input``; cuts shorter than one feature
    frame are bad input), resample to the feature rate, and attach stored features when
    ``cfg.features.precomputed`` (cached in ``feats_{split}``)."""
    cuts, report = validate_cuts(
        cuts,
        require_text=require_text,
        on_bad=cfg.on_bad_input,
        expected_sample_rate=cfg.features.sample_rate,
        allow_urls=cfg.allow_urls,
        split=split,
        min_duration=cfg.features.frame_length_ms / 1000.0,
    )
    if cfg.features.precomputed:
        cuts = precompute_features(
            cuts,
            cfg.features,
            feature_storage_dir(cfg.manifest_dir, split, cfg.features.sample_rate),
            num_jobs=num_jobs,
            on_bad=cfg.on_bad_input,
            report=report,
        )
    return cuts, report


BATCH_INDEX_KEY = "usmkit_batch_index"  # ours, kept beside lhotse's keys in the loader state


def batch_seed(seed: int, epoch: int, index: int) -> int:
    """The random seed of batch ``index`` of ``epoch``: augmentation depends on nothing else (not on
    which worker builds the batch, nor on how many batches that worker built before), so a resumed
    loader draws the same augmentation as an uninterrupted one."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1, dtype=np.uint64)[0] >> 1)


class _SnapshotSampler(torch.utils.data.Sampler):
    """Hands out ``(batch seed, epoch, cuts)`` and records the lhotse sampler's state right after each batch.

    The DataLoader draws batches ahead of the consumer (prefetching in workers), so the sampler's own
    state runs ahead of training. The loader pops one snapshot per batch it yields, which pins the
    state to the batch the trainer actually received. ``endless``: at the end of an epoch the next one
    starts within the same pass, so the workers keep prefetching across the boundary instead of being
    primed again by a new pass.
    """

    def __init__(self, sampler: DynamicBucketingSampler, seed: int, endless: bool = False) -> None:
        self.sampler = sampler
        self.seed = seed
        self.endless = endless
        self.resume_index = 0  # batches of the epoch already consumed, when resuming from a state
        self.snapshots: deque[dict[str, Any]] = deque()

    def __iter__(self) -> Iterator[tuple[int, int, CutSet]]:
        while True:
            index, self.resume_index = self.resume_index, 0  # lhotse, too, restarts the epoch unless restored
            first = index
            for cuts in self.sampler:
                self.snapshots.append(self.sampler.state_dict() | {BATCH_INDEX_KEY: index + 1})
                yield batch_seed(self.seed, self.sampler.epoch, index), self.sampler.epoch, cuts
                index += 1
            if not self.endless:
                return
            if index == 0 and first == 0:  # a whole epoch without a batch (not a state restored at its end)
                raise RuntimeError(
                    "the training loader yielded no batch in a whole epoch: is the training split empty?"
                )
            self.sampler.set_epoch(self.sampler.epoch + 1)


class _SeededDataset(torch.utils.data.Dataset):
    """``dataset[(seed, epoch, cuts)]``: ``dataset[cuts]`` with every random draw of augmentation (torch's RNG and
    the speed perturbation's) seeded by the batch's seed, and the waveform augmentation on from its epoch; the
    caller's torch RNG state is left as it was."""

    def __init__(self, dataset: AsrDataset) -> None:
        self.dataset = dataset

    def __getitem__(self, item: tuple[int, int, CutSet]) -> Batch:
        seed, epoch, cuts = item
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.dataset.reseed(seed, epoch)
            return self.dataset[cuts]


class AsrLoader:
    """Iterable of ``Batch``; wraps ``DataLoader(dataset, sampler=..., batch_size=None)``.

    ``state_dict()`` after k batches of an epoch, loaded into a fresh loader built the same way,
    makes it yield exactly the batches an uninterrupted loader yields after k: the same cut ids and,
    since each batch's augmentation is seeded by (seed, epoch, batch index) alone, the same features,
    with any number of workers.

    ``endless=False``: one pass is one epoch (``set_epoch`` picks the next). ``endless=True`` (training):
    one pass runs through every epoch from the current one on, and ``epoch`` says which epoch the last
    batch came from; the batches are those of passes over consecutive epochs, without the pause a new
    pass costs while the workers fill their queues again.
    """

    def __init__(
        self,
        dataset: AsrDataset,
        sampler: DynamicBucketingSampler,
        *,
        num_workers: int,
        seed: int,
        pin_memory: bool = False,
        endless: bool = False,
    ) -> None:
        self.dataset = dataset
        self.sampler = sampler
        self._tracker = _SnapshotSampler(sampler, seed, endless)
        self._state: dict[str, Any] | None = None
        self._pass_start: dict[str, Any] = {}  # (endless) the state the current pass started from
        self._live: Any = None  # the DataLoader iterator of the current pass (it owns the worker processes)
        self._loader = torch.utils.data.DataLoader(
            _SeededDataset(dataset),
            sampler=self._tracker,
            batch_size=None,
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
            pin_memory=pin_memory,
            # Its own generator: each iter() draws a worker base seed from it, never from the global RNG,
            # which the trainer restores on resume (the workers' draws are re-seeded per batch anyway).
            generator=torch.Generator().manual_seed(seed),
            worker_init_fn=StopSignalsIgnored(),
        )

    def __iter__(self) -> Iterator[Batch]:
        if self._tracker.endless:
            if self._pass_start:  # an earlier pass stopped, its sampler maybe ahead: go on after its last batch
                self.load_state_dict(self._state or self._pass_start)
            self._pass_start = self.state_dict()
        self._tracker.snapshots.clear()
        self._live = iter(self._loader)
        for batch in self._live:
            self._state = self._tracker.snapshots.popleft()
            yield batch

    def close(self) -> None:
        """End the worker processes now (they are persistent: otherwise they live until this loader is
        garbage collected, which a suspended training loop can put off to the interpreter's exit). The
        loader can be iterated again afterwards (new workers)."""
        live, self._live = self._live, None
        self._loader._iterator = None  # DataLoader's own reference to its persistent iterator
        shutdown_workers(live)

    @property
    def epoch(self) -> int:
        """The epoch of the last batch yielded (of the next one before any)."""
        return int(self._state["epoch"]) if self._state is not None else self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self._tracker.resume_index = 0
        self._state = None
        self._pass_start = {}

    def state_dict(self) -> dict[str, Any]:
        """The sampler state as of the last batch this loader yielded (lhotse's format, plus the number of
        batches of this epoch yielded so far under ``BATCH_INDEX_KEY``)."""
        if self._state is not None:
            return copy.deepcopy(self._state)
        return self.sampler.state_dict() | {BATCH_INDEX_KEY: self._tracker.resume_index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = copy.deepcopy(state)
        self._tracker.resume_index = int(state.pop(BATCH_INDEX_KEY, 0))
        self._state = state | {BATCH_INDEX_KEY: self._tracker.resume_index}
        self.sampler.load_state_dict(state)  # lhotse consumes the dict it gets


class StopSignalsIgnored:
    """A DataLoader ``worker_init_fn``: the worker process ignores SIGINT and SIGTERM, then runs ``then`` (the
    caller's own ``worker_init_fn``, if any).

    A Ctrl-C in a terminal reaches the whole foreground process group, and a scheduler's SIGTERM (``timeout``,
    SLURM, ``kill -- -PGID``, torchrun passing its own on to each worker's session) the whole group too. The
    training process owns shutdown: it finishes its step on either signal and saves it
    (``usmkit.training.stop_signals``), which may need the workers' batches; a worker killed by the signal
    instead fails the main process (``DataLoader worker ... killed by signal``) before it saves. The workers
    end when the main process shuts them down (``shutdown_workers``) or exits (they watch their parent).
    A class rather than a closure so that it pickles for spawned workers.
    """

    def __init__(self, then: Callable[[int], None] | None = None) -> None:
        self.then = then

    def __call__(self, worker_id: int) -> None:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
        if self.then is not None:
            self.then(worker_id)


def shutdown_workers(iterator: Any) -> None:
    """End the worker processes (and the pin-memory thread) of a DataLoader iterator; nothing for None or an
    iterator without workers. torch has no public call for it: a multi-process iterator ends its workers in
    ``_shutdown_workers``, which its destructor calls and which may run more than once. It asks each worker to
    stop and, for one still alive after a few seconds, sends SIGTERM, which our workers ignore
    (``StopSignalsIgnored``): such a worker is killed here. torch stops watching the workers' exits before
    that (``_remove_worker_pids``), so the main process is not failed by a worker it ended itself."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is None:
        return
    shutdown()
    for worker in getattr(iterator, "_workers", ()):
        if worker.is_alive():
            worker.kill()
            worker.join(timeout=5.0)


def speaker_norms_for(cuts: CutSet, cfg: DataConfig, stats: FeatureStats | None) -> dict[str, SpeakerNorm] | None:
    """The speakers' norms of ``cuts`` that ``cfg`` asks for (``speaker_mean_norm``, ``speaker_var_norm``);
    None when it asks for none or there are no global stats to express them in."""
    if not cfg.speaker_mean_norm or stats is None:
        return None
    return speaker_norms(cuts, cfg.features, stats, variance=cfg.speaker_var_norm)


def make_loader(
    cuts: CutSet,
    cfg: DataConfig,
    *,
    tokenizer: TextEncoder | None = None,
    stats: FeatureStats | None,
    train: bool,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
    speaker_norms: dict[str, SpeakerNorm] | None = None,
    pin_memory: bool = False,
    endless: bool = False,
    pack_align: int | None = None,
) -> AsrLoader:
    """Loader over ``cuts`` (already through ``prepare_cuts``).

    Training: ``labeled_fraction`` subset (only for labeled loaders, i.e. with a tokenizer), cuts over
    ``max_cut_duration`` left out, language temperature sampling, shuffled duration buckets, speed
    perturbation and SpecAugment. Evaluation: every cut once, in bucket order, no augmentation.
    With ``cfg.speaker_mean_norm`` the speakers' norms (means, and with ``cfg.speaker_var_norm``
    variances) come from ``speaker_norms`` when given (to build loaders over the same cuts
    repeatedly), else from ``cuts``. ``pin_memory``: batches arrive in page-locked memory (for a CUDA
    trainer, whose host runs ahead of the device: a copy from pageable memory can wait for it).
    ``endless``: one pass runs through consecutive epochs (``AsrLoader``), for a training loop counted in steps.
    ``pack_align``: with ``cfg.pack_to_frames`` (training), where packed utterances may start: a multiple of
    this many frames, the encoder's subsampling factor (``usmkit.data.packing``).

    With ``cfg.shar_dir`` the training loader streams the training split's Shar shards instead (``SharLoader``,
    endless; ``cuts`` are then only the shards' manifests, from which it takes the duration buckets).
    """
    if train and cfg.shar_dir:
        long = long_text_ids(cuts, tokenizer, cfg) if tokenizer is not None else frozenset()  # from the manifests
        dataset = _dataset(cfg, tokenizer, stats, None, train=True, seed=seed + rank)
        return SharLoader(
            dataset, split_shards(cfg.shar_dir, cfg.train_split), cfg, duration_bins=duration_bins(cuts, cfg),
            rank=rank, world_size=world_size, seed=seed, pin_memory=pin_memory, left_out=long,
        )  # fmt: skip
    if cfg.features.precomputed:
        bare = next((c.id for c in cuts if not c.has_features), None)
        if bare is not None:
            raise ValueError(
                f"features.precomputed=True but cut {bare!r} has no stored features: pass the cuts through "
                "usmkit.data.loader.prepare_cuts first, or set features.precomputed=False"
            )
    packer = _packer(cfg, pack_align) if train else None
    if speaker_norms is None:  # before language sampling, which can make the training stream endless
        speaker_norms = speaker_norms_for(cuts, cfg, stats)
    if train:
        if tokenizer is not None:
            cuts = labeled_subset(cuts, cfg.labeled_fraction, seed=seed)
        cuts = _drop_long(cuts, cfg.max_cut_duration)
        if tokenizer is not None:
            cuts = _drop_long_texts(cuts, tokenizer, cfg)
        if packer is not None:
            cuts = _drop_unpackable(cuts, packer, cfg.features.frame_shift_ms / 1000.0)
        cuts = language_balanced(cuts, cfg.language_temperature, seed=seed)
    fixed = train and cfg.fixed_batch_shapes
    sampler = make_sampler(
        cuts, cfg, train=train, rank=rank, world_size=world_size, seed=seed, fixed_shapes=fixed, packer=packer
    )
    dataset = _dataset(cfg, tokenizer, stats, speaker_norms, train=train, seed=seed + rank, packer=packer)
    return AsrLoader(
        dataset, sampler, num_workers=cfg.num_workers, seed=seed + rank, pin_memory=pin_memory, endless=endless
    )


def _dataset(
    cfg: DataConfig,
    tokenizer: TextEncoder | None,
    stats: FeatureStats | None,
    speaker_norms: dict[str, SpeakerNorm] | None,
    *,
    train: bool,
    seed: int,
    packer: RowPacker | None = None,
) -> AsrDataset:
    """Cuts -> ``Batch``: features, normalization, and in training the augmentation ``cfg`` asks for."""
    return AsrDataset(
        cfg.features,
        tokenizer=tokenizer,
        stats=stats,
        spec_augment=cfg.spec_augment if train else None,
        speed_perturb=cfg.speed_perturb if train else (),
        waveform=_waveform_augmentation(cfg, seed) if train else None,
        waveform_from_epoch=cfg.waveform_augment_from_epoch,
        gain_db=cfg.gain_db if train else 0.0,
        noise_snr_db=cfg.noise_snr_db if train else (),
        noise_prob=cfg.noise_prob,
        pad_to_frames=cfg.pad_to_frames,
        utterance_mean_norm=cfg.utterance_mean_norm,
        speaker_norms=speaker_norms,
        packer=packer,
        seed=seed,
    )


def _waveform_augmentation(cfg: DataConfig, seed: int) -> WaveformAugment | None:
    """The training cuts' waveform augmentation ``cfg`` asks for (its noise manifest read here), or None."""
    if not cfg.waveform_augmentation_on:
        return None
    noise = load_noise_cuts(cfg.noise_cuts, cfg.features.sample_rate, cfg.allow_urls) if cfg.noise_cuts else None
    if cfg.waveform_augment_from_epoch:
        log.info("waveform augmentation (%s) from epoch %d on", ", ".join(cfg.waveform_augmentation_on),
                 cfg.waveform_augment_from_epoch)  # fmt: skip
    return waveform_augmentation(
        sample_rate=cfg.features.sample_rate, reverb_prob=cfg.reverb_prob, noise=noise,
        noise_snr_db=cfg.noise_snr_db, noise_prob=cfg.noise_prob, narrowband_prob=cfg.narrowband_prob,
        lowpass_prob=cfg.lowpass_prob, lowpass_hz=cfg.lowpass_hz, seed=seed,
    )  # fmt: skip


def split_loader(
    cfg: DataConfig, split: str, *, tokenizer: TextEncoder | None, stats: FeatureStats | None
) -> tuple[AsrLoader, ValidationReport]:
    """The evaluation loader over transcribed ``split`` of ``cfg``'s corpus (every cut once, no
    augmentation), and the report of the cuts ``prepare_cuts`` left out."""
    cuts, report = prepare_cuts(
        load_cuts(cfg.manifest_dir, split, corpus=cfg.corpus, allow_urls=cfg.allow_urls),
        cfg,
        split=split,
        require_text=True,
    )
    return make_loader(cuts, cfg, tokenizer=tokenizer, stats=stats, train=False), report


def _packer(cfg: DataConfig, align: int | None) -> RowPacker | None:
    """The training batches' rows with ``cfg.pack_to_frames``, else None."""
    if not cfg.pack_to_frames:
        return None
    if not align:
        raise ValueError("data.pack_to_frames needs pack_align (the encoder's subsampling factor) to place utterances")
    rows = packed_rows(cfg.max_duration, cfg.features.frame_shift_ms / 1000.0, cfg.pack_to_frames)
    log.info("training batches: utterances packed into %d rows of %d frames", rows, cfg.pack_to_frames)
    return RowPacker(rows, cfg.pack_to_frames, align)


def _drop_unpackable(cuts: CutSet, packer: RowPacker, frame_shift: float) -> CutSet:
    """Leave out the cuts longer than a packed row (``max_cut_duration`` keeps them within a frame or two of it)."""
    long = sum(1 for c in cuts if not packer.fits(cut_frames(c, frame_shift)))
    if long == 0:
        return cuts
    log.warning("training leaves out %d cuts longer than a packed row (%d frames)", long, packer.frames)
    return CutSet.from_cuts(c for c in cuts if packer.fits(cut_frames(c, frame_shift)))


def _drop_long(cuts: CutSet, max_duration: float) -> CutSet:
    long = sum(1 for c in cuts if c.duration > max_duration)
    if long == 0:
        return cuts
    log.warning("training leaves out %d cuts longer than max_cut_duration=%gs", long, max_duration)
    return CutSet.from_cuts(c for c in cuts if c.duration <= max_duration)


def _drop_long_texts(cuts: CutSet, tokenizer: TextEncoder, cfg: DataConfig) -> CutSet:
    """``cuts`` without those of ``long_text_ids``."""
    long = long_text_ids(cuts, tokenizer, cfg)
    return CutSet.from_cuts(c for c in cuts if c.id not in long) if long else cuts


def long_text_ids(cuts: CutSet, tokenizer: TextEncoder, cfg: DataConfig) -> frozenset[str]:
    """The ids of the cuts whose transcripts have more tokens than ``cfg.max_text_tokens`` (when set) or than the
    cut has feature frames (an encoder has at most that many frames, and CTC emits at most one token a frame),
    with a warning saying how many training leaves out. Each transcript is tokenized once here (the batches
    tokenize again)."""
    shift = cfg.features.frame_shift_ms / 1000.0
    limit = cfg.max_text_tokens or None

    def too_long(cut: Cut) -> bool:
        text = cut_text(cut)
        if not text:
            return False
        tokens = len(tokenizer.encode(text))
        return tokens > cut_frames(cut, shift) or (limit is not None and tokens > limit)

    long = frozenset(c.id for c in cuts if too_long(c))
    if long:
        bound = f"max_text_tokens={limit} or " if limit else ""
        log.warning("training leaves out %d cuts whose transcripts have more tokens than %sthe cut's feature frames "
                    "(%g ms each)", len(long), bound, cfg.features.frame_shift_ms)  # fmt: skip
    return long


def _not_in(ids: frozenset[str], cut: Cut) -> bool:
    return cut.id not in ids


# ---------------------------------------------------------------- streaming from Shar shards
SHAR_BUFFER_CUTS = 1000  # cuts a shard stream's sampler buffers to bucket and shuffle; they hold their audio


def duration_bins(cuts: CutSet, cfg: DataConfig) -> list[float]:
    """The duration buckets' edges, from the first cuts of ``cuts`` (as ``make_sampler`` estimates them)."""
    head = [c for c in islice(cuts, NUM_CUTS_FOR_BINS) if c.duration <= cfg.max_cut_duration]
    if not head:
        raise ValueError("the training split has no cut of at most max_cut_duration seconds: nothing to load")
    num_buckets = min(cfg.num_buckets, len(head))
    if num_buckets > 1:
        return estimate_duration_buckets(head, num_buckets=num_buckets)
    return [max(c.duration for c in head) + 1.0]


def _at_most(seconds: float, cut: Cut) -> bool:
    return cut.duration <= seconds


def stream_seed(seed: int, rank: int, stream: int) -> int:
    """The seed of shard stream ``stream`` of process ``rank``: its sampler's shuffling and its batches'."""
    return int(np.random.SeedSequence([seed, rank, stream]).generate_state(1, dtype=np.uint64)[0] >> 1)


@dataclass(frozen=True)
class _ShardFailed:
    """What a shard stream yields instead of a batch when a shard cannot be read (``SharError``'s message)."""

    message: str


class _SharStreams(torch.utils.data.IterableDataset):
    """One process's shard streams, one per loader worker (one in the loading process without workers):
    stream ``w`` reads its shards of each epoch (``stream_shards``) with a bucketing sampler of its own, and
    yields ``((w, epoch, index), batch)``, epoch after epoch, from ``start[w] = (epoch, index)`` on.

    lhotse's ``IterableDatasetWrapper`` is not used: the loader needs each batch's stream and position to
    resume exactly. Resuming replays a stream's sampler over the batches already consumed: their cuts (and
    the audio bytes in the tars) are read again, but neither decoded nor turned into features.
    """

    def __init__(
        self, dataset: _SeededDataset, shards: list, cfg: DataConfig, bins: list[float], *, rank: int,
        world_size: int, streams: int, seed: int, start: list[tuple[int, int]], left_out: frozenset[str],
    ) -> None:  # fmt: skip
        super().__init__()
        self.dataset, self.shards, self.bins, self.left_out = dataset, shards, bins, left_out
        self.max_duration, self.max_cut_duration = cfg.max_duration, cfg.max_cut_duration
        self.rank, self.world_size, self.streams, self.seed, self.start = rank, world_size, streams, seed, start

    def __iter__(self) -> Iterator[tuple[tuple[int, int, int], Batch]]:
        info = torch.utils.data.get_worker_info()
        stream = info.id if info is not None else 0
        epoch, skip = self.start[stream]
        seed = stream_seed(self.seed, self.rank, stream)
        while True:
            index = -1
            try:
                for index, cuts in enumerate(self._sampler(stream, epoch, seed)):
                    if index >= skip:
                        yield (stream, epoch, index), self.dataset[(batch_seed(seed, epoch, index), epoch, cuts)]
            except SharError as e:  # a damaged shard: the loading process raises it (a worker's error is a traceback)
                yield (stream, epoch, index), _ShardFailed(str(e))
                return
            if index < 0:
                raise RuntimeError(f"shard stream {stream} of rank {self.rank} got no batch in epoch {epoch}")
            epoch, skip = epoch + 1, 0

    def _sampler(self, stream: int, epoch: int, seed: int) -> DynamicBucketingSampler:
        shards = stream_shards(self.shards, epoch=epoch, seed=self.seed, rank=self.rank,
                               world_size=self.world_size, stream=stream, streams=self.streams)  # fmt: skip
        cuts = shar_cuts(shards, audio=True).filter(functools.partial(_at_most, self.max_cut_duration))
        if self.left_out:
            cuts = cuts.filter(functools.partial(_not_in, self.left_out))
        sampler = DynamicBucketingSampler(
            cuts, max_duration=self.max_duration, duration_bins=self.bins, shuffle=True, drop_last=False,
            buffer_size=SHAR_BUFFER_CUTS, world_size=1, rank=0, seed=seed,
        )  # fmt: skip
        sampler.set_epoch(epoch)
        return sampler


class SharLoader:
    """Training batches streamed from Shar shards (``data.shar_dir``): every process and loader worker reads
    its own shards (``stream_shards``), so per epoch every cut is read once over all processes.

    One stream per worker (``data.num_workers``, at least one), each through its own epochs (a stream's
    epoch ends when its shards do; ``epoch`` is the last batch's). The DataLoader takes a batch from each
    worker in turn, so batch ``k`` comes from stream ``k mod streams``; the state is, per stream, the epoch
    and the number of its batches consumed, and which stream is next. Resuming from it yields exactly the
    batches an uninterrupted loader yields (see ``_SharStreams`` for what the replay costs).
    """

    def __init__(
        self, dataset: AsrDataset, shards: list, cfg: DataConfig, *, duration_bins: list[float], rank: int = 0,
        world_size: int = 1, seed: int = 0, pin_memory: bool = False, left_out: frozenset[str] = frozenset(),
    ) -> None:  # fmt: skip
        self.streams = max(1, cfg.num_workers)
        if len(shards) < world_size * self.streams:
            raise SharError(
                f"data.shar_dir={cfg.shar_dir} holds {len(shards)} shards of split {cfg.train_split}, fewer than "
                f"{world_size} processes x {self.streams} loader streams (data.num_workers): every stream needs "
                "shards of its own. Write the shards smaller (python -m usmkit.cli.prepare shar ... shard_size=N) "
                "or use fewer loader workers"
            )
        self.dataset, self.shards, self.cfg, self.bins = _SeededDataset(dataset), shards, cfg, duration_bins
        self.rank, self.world_size, self.seed, self.pin_memory = rank, world_size, seed, pin_memory
        self.left_out = left_out  # cut ids the streams skip (``long_text_ids``)
        self.positions = [(0, 0)] * self.streams  # per stream: (epoch, batches of it consumed)
        self.next_stream = 0
        self._epoch = 0
        self._live: Any = None

    def __iter__(self) -> Iterator[Batch]:
        self.close()  # an earlier pass's workers are ahead of what was consumed
        streams = _SharStreams(
            self.dataset, self.shards, self.cfg, self.bins, rank=self.rank, world_size=self.world_size,
            streams=self.streams, seed=self.seed, start=list(self.positions), left_out=self.left_out,
        )  # fmt: skip
        self._live = iter(
            torch.utils.data.DataLoader(
                streams,
                batch_size=None,
                num_workers=self.cfg.num_workers,
                pin_memory=self.pin_memory,
                generator=torch.Generator().manual_seed(self.seed),  # not the global RNG (see AsrLoader)
                worker_init_fn=StopSignalsIgnored(),
            )
        )
        # Worker w delivers stream w's batches in turn from worker 0 on; a pass that resumes with another
        # stream next keeps the batches that come before their turn (fewer than one per stream).
        held: dict[int, tuple[int, int, Batch]] = {}
        for (stream, epoch, index), batch in self._live:
            if isinstance(batch, _ShardFailed):
                self.close()
                raise SharError(batch.message)
            held[stream] = (epoch, index, batch)
            while self.next_stream in held:
                stream = self.next_stream
                epoch, index, batch = held.pop(stream)
                self.positions[stream] = (epoch, index + 1)
                self.next_stream = (stream + 1) % self.streams
                self._epoch = epoch
                yield batch

    @property
    def epoch(self) -> int:
        """The epoch of the last batch yielded (of its stream's)."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Every stream starts ``epoch`` from its beginning."""
        self.close()
        self.positions = [(epoch, 0)] * self.streams
        self.next_stream, self._epoch = 0, epoch

    def state_dict(self) -> dict[str, Any]:
        return {
            "shar_positions": [list(p) for p in self.positions],
            "next_stream": self.next_stream,
            "epoch": self._epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        positions = [tuple(int(x) for x in p) for p in state["shar_positions"]]
        if len(positions) != self.streams:
            earliest = min(e for e, _ in positions)
            log.warning(
                "the checkpoint's loader read its shards in %d streams, this run in %d (data.num_workers): the "
                "streams' shards differ, so the data order cannot continue where it stopped; every stream starts "
                "epoch %d over",
                len(positions),
                self.streams,
                earliest,
            )
            self.set_epoch(earliest)
            return
        self.close()
        self.positions, self.next_stream, self._epoch = positions, int(state["next_stream"]), int(state["epoch"])

    def close(self) -> None:
        """End the worker processes of the current pass."""
        live, self._live = self._live, None
        shutdown_workers(live)
