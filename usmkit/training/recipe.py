"""A training run as a recipe object: check the config, set up data, model and trainer, train, clean up.

    recipe = TrainingRecipe(cfg, config_yaml)  # checks every setting against the others, reads no data
    summary = recipe.run()                     # setup_data, setup_model, setup_trainer, train, cleanup

``python -m usmkit.cli.train`` builds ``cfg`` from Hydra's composed config and runs it; tests and
benchmarks call ``run(cfg, config_yaml)``. Several processes (torchrun): rank 0 prepares what is cached
on disk (tokenizer, stored features, statistics) first, and the others reuse it.
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from lhotse import CutSet

from usmkit.checkpointing.atomic import WriteError, disk_full_reason, replaced_atomically
from usmkit.checkpointing.checkpoint import (
    CONFIG_FILE,
    MODEL_FILE,
    latest_checkpoint,
    load_tensors,
    load_weights,
    resolve_checkpoint,
    run_dir,
)
from usmkit.checkpointing.output_dir import check_experiment_dir
from usmkit.config import ConfigError, TrainConfig, tokenizer_path
from usmkit.data.config import DataConfig
from usmkit.data.loader import make_loader, prepare_cuts, speaker_norms_for
from usmkit.data.manifests import load_cuts
from usmkit.data.normalize import STATS_FILE, FeatureStats, load_or_compute_stats
from usmkit.data.shar import shar_cuts, split_shards
from usmkit.data.tokenizer import MODEL_FILE as TOKENIZER_FILE
from usmkit.data.tokenizer import Tokenizer
from usmkit.device import resolve_device
from usmkit.errors import UsageError
from usmkit.models.config import ConformerConfig
from usmkit.runs import check_aligner, load_aligner, read_tokenizer
from usmkit.tasks import TrainInputs, task_for
from usmkit.training.distributed import launched_distributed, rank0_first, setup_distributed, shutdown_distributed
from usmkit.training.exp_lock import ExpDirLock
from usmkit.training.frame_budget import check_frame_budget, frame_budget
from usmkit.training.imported_init import check_imported_fit
from usmkit.training.memory_check import check_memory
from usmkit.training.resume_config import check_resume_config
from usmkit.training.run_lexicon import write_run_lexicon
from usmkit.training.task_spec import train_spec
from usmkit.training.trainer import Trainer, check_options

log = logging.getLogger(__name__)

SLOW_SHUTDOWN_S = 5.0  # a rank that takes longer to shut down warns, naming the part that took the time


def run(cfg: TrainConfig, config_yaml: str) -> dict:
    """Train ``cfg`` (its YAML is saved with every checkpoint); returns a small summary."""
    return TrainingRecipe(cfg, config_yaml).run()


class TrainingRecipe:
    """One training run of ``cfg``. The constructor checks the settings (model, task, trainer options,
    ``init_from``) before any data is read; ``run`` does the rest."""

    def __init__(self, cfg: TrainConfig, config_yaml: str) -> None:
        self.cfg = cfg
        self.config_yaml = config_yaml
        self.encoder_cfg = check_config(cfg)
        self.task = task_for(cfg.task)  # what the run's task kind means: its loader, module, dev evaluation
        self.exp_dir = Path(cfg.trainer.exp_dir)
        self.rank, self.world, self.device = 0, 1, resolve_device(cfg.trainer.device)
        self.tokenizer: Tokenizer | None = None
        self.trainer: Trainer | None = None
        self.lock: ExpDirLock | None = None  # rank 0's, from setup_data to cleanup
        self.loader = None
        self.finished = False  # trained to the end on this rank (cleanup then ends the run behind a barrier)
        self.cleaned = False

    def run(self) -> dict:
        try:
            self.setup_distributed()
            self.setup_data()
            self.setup_model()
            self.setup_trainer()
            return self.train()
        finally:
            self.cleanup()  # also after an error: the loader's workers, compile workers and process groups end

    # ---------------------------------------------------------------- setup
    def setup_distributed(self) -> None:
        cfg = self.cfg
        if cfg.trainer.compile:
            raise_recompile_limit(cfg)
        self.rank, self.world, self.device = setup_distributed(
            cfg.trainer.device,
            cfg.trainer.strategy,
            dist_timeout_s=cfg.trainer.dist_timeout_s,
            rank0_timeout_s=cfg.trainer.rank0_timeout_s,
        )
        torch.manual_seed(cfg.trainer.seed + self.rank)
        if not cfg.resume and latest_checkpoint(self.exp_dir / "checkpoints") is not None:
            raise UsageError(
                f"{self.exp_dir} already holds checkpoints: pass resume=true to continue that run, "
                f"or choose another trainer.exp_dir"
            )

    def setup_data(self) -> None:
        """Tokenizer, validated cuts, the CTC frame budget, feature statistics, the training loader and
        the dev evaluation; the tokenizer, statistics and config are copied into the experiment directory,
        which rank 0 locks first (``usmkit.training.exp_lock``: one run per directory)."""
        cfg, data, rank, task = self.cfg, self.cfg.data, self.rank, self.task
        if rank == 0:
            self.lock = ExpDirLock(self.exp_dir)
            self.lock.acquire()
        self.tokenizer = tokenizer = (
            rank0_first(rank, functools.partial(load_tokenizer, cfg, rank), "the tokenizer") if task.text else None
        )
        prepare = functools.partial(self._prepare, require_text=task.text)
        # With data.shar_dir the training cuts stream from shards (checked when they were written): here only
        # their manifests, for the frame budget and the duration buckets; the statistics read their audio.
        train_cuts = shar_train_cuts(data, audio=False) if data.shar_dir else prepare(data.train_split)
        if task.ctc:  # what CTC cannot align it ignores: counted now rather than found in the results.
            budget = frame_budget(
                train_cuts,
                tokenizer,
                self.encoder_cfg.subsampling_factor,
                data.features.frame_shift_ms,
                self.encoder_cfg.front_end,
            )
            check_frame_budget(budget, data.train_split, warn=rank == 0)
        stats_cuts = shar_train_cuts(data, audio=True) if data.shar_dir else train_cuts
        stats = rank0_first(rank, lambda: load_stats(cfg, stats_cuts), "the feature statistics")
        if rank == 0:
            self._write_run_files(stats, tokenizer)
            write_run_lexicon(train_cuts, tokenizer, self.exp_dir)  # what --lexicon decodes with, wherever the run goes
        pin = self.device.type == "cuda"  # the trainer's host runs a step ahead: batch copies must not wait
        if task.align_from:
            check_aligner(task.align_from, tokenizer)
        self.loader = task.train_loader(
            TrainInputs(
                train_cuts,
                data,
                tokenizer,
                stats,
                prepare=functools.partial(self._prepare, require_text=False),
                seed=cfg.trainer.seed,
                accum_steps=cfg.optim.accum_steps,
                rank=rank,
                world_size=self.world,
                pin_memory=pin,
                pack_align=self.encoder_cfg.subsampling_factor,
            )
        )
        self.dev_eval = None
        if cfg.trainer.eval_every and data.dev_split:
            dev_cuts = prepare(data.dev_split)
            dev_norms = speaker_norms_for(dev_cuts, data, stats)

            def dev_batches():  # a fresh loader per dev evaluation; the speaker means are computed once
                return make_loader(
                    dev_cuts, data, tokenizer=tokenizer, stats=stats, train=False, speaker_norms=dev_norms
                )

            self.dev_eval = task.dev_eval(dev_batches, tokenizer, max_batches=cfg.trainer.dev_max_batches)

    def _write_run_files(self, stats, tokenizer: Tokenizer | None) -> None:
        """The copies that travel with the checkpoints: feature statistics, the tokenizer the run loaded (the
        corpus's may be retrained), the config. Each replaces its file atomically (a link is replaced, not
        written through); a failure (a full disk) is one ``WriteError`` line and leaves the earlier copies."""
        path = self.exp_dir / STATS_FILE
        try:
            stats.save(path, self.cfg.data.features)
            files = {CONFIG_FILE: self.config_yaml.encode()}
            if tokenizer is not None:
                files[TOKENIZER_FILE] = tokenizer.model_proto
            for name, data in files.items():
                path = self.exp_dir / name
                with replaced_atomically(path) as tmp:
                    tmp.write_bytes(data)
        except Exception as e:  # OSError, or safetensors' own error type for the same full disk
            raise WriteError(
                f"could not write {path} ({disk_full_reason(e, self.exp_dir)}); nothing was lost: what "
                f"{self.exp_dir} held is as it was. Free disk space or choose another trainer.exp_dir, then run "
                "the same command again"
            ) from e

    def _prepare(self, split: str, require_text: bool):
        data = self.cfg.data
        cuts, report = rank0_first(
            self.rank,
            lambda: prepare_cuts(
                load_cuts(data.manifest_dir, split, corpus=data.corpus, allow_urls=data.allow_urls),
                data,
                split=split,
                require_text=require_text,
            ),
            f"the {split} split's validation and features",
        )
        if self.rank == 0 and report.num_skipped:
            log.warning("%s: %s", split, report.summary())
        return cuts

    def setup_model(self) -> None:
        """The task's module, initialized from ``init_from`` (encoder, and the heads that fit), and MOST's
        frozen aligner."""
        cfg, rank, task = self.cfg, self.rank, self.task
        vocab = self.tokenizer.vocab_size if self.tokenizer else 0
        self.module = module = task.build(self.encoder_cfg, vocab)
        if task.align_from:
            module.set_aligner(load_aligner(task.align_from, self.device))
        if cfg.init_from and not (cfg.resume and latest_checkpoint(self.exp_dir / "checkpoints")):
            src = resolve_checkpoint(cfg.init_from)
            loaded = load_weights(module, src, prefix="encoder.")
            if rank == 0:
                log.info("initialized %d encoder tensors from %s", len(loaded), src)
            if task.init_heads is not None:  # e.g. stage 1's BEST-RQ heads for MOST, where they fit
                heads = task.init_heads(module, load_tensors(src / MODEL_FILE))
                if rank == 0:
                    log.info("initialized %d head tensors from %s: %s", len(heads), src, ", ".join(heads) or "none fit")
            if cfg.init_heads and self.tokenizer is not None:
                heads = init_ctc_head(module, src, self.tokenizer)
                if rank == 0 and heads:
                    log.info("initialized the CTC head from %s (trained with this run's tokenizer)", src)
        if rank == 0:
            n = sum(p.numel() for p in module.parameters())
            log.info(
                "task %s, encoder %s: %.2fM parameters, device %s, world %d",
                task.kind,
                cfg.model.preset,
                n / 1e6,
                self.device,
                self.world,
            )

    def setup_trainer(self) -> None:
        cfg = self.cfg
        trainer_cfg = cfg.trainer
        if str(self.device) != trainer_cfg.device:
            trainer_cfg = replace(trainer_cfg, device=str(self.device))
        spec = train_spec(self.module, cfg.optim)
        self.trainer = Trainer(
            trainer_cfg, cfg.optim, self.module, self.loader, self.config_yaml, dev_eval=self.dev_eval, spec=spec
        )
        if cfg.resume and not self.trainer.resume():
            log.warning("resume=true but %s has no checkpoint yet: starting from step 0", self.exp_dir)

    # ---------------------------------------------------------------- train
    def train(self) -> dict:
        result = self.trainer.fit()
        self.finished = True
        summary = {
            "step": result.step,
            "last_loss": result.last_loss,
            "best": result.best,
            "bad_steps": result.bad_steps,
        }
        if self.rank == 0:
            log.info("done: %s", summary)
        return summary

    def cleanup(self) -> None:
        """End what the run started, on every rank, after a finished run and after an error alike (``run``
        calls it in ``finally``; a second call does nothing): the training loader's worker processes,
        inductor's compile workers, the trainer, the process groups (``shutdown_distributed``: behind a
        final barrier when every rank finished) and rank 0's lock of the experiment directory. The TensorBoard writer is closed by ``Trainer.fit`` itself.
        Each part is timed; a slow one is named in a warning."""
        if self.cleaned:
            return
        self.cleaned = True
        timings: dict[str, float] = {}

        def timed(name: str, fn) -> None:
            start = time.perf_counter()
            try:
                fn()
            except Exception as e:  # the remaining parts still end; the run's own error (if any) comes first
                log.warning("rank %d: ending %s failed: %s", self.rank, name, e)
            timings[name] = time.perf_counter() - start

        loader, self.loader = self.loader, None
        if loader is not None and hasattr(loader, "close"):
            timed("the loader workers", loader.close)
        timed("the compile workers", shutdown_compile_workers)
        # DDP's reducer goes first, while the process group it holds is still registered: were the reducer
        # the group's last owner, its destructor would join gloo's threads holding the GIL, and a thread
        # releasing a finished collective's tensor waits for that GIL (a hang at exit). The group itself
        # is destroyed with the GIL released.
        self.trainer = None
        timed("the trainer", gc.collect)
        timed("the process groups", functools.partial(shutdown_distributed, self.finished))
        lock, self.lock = self.lock, None
        if lock is not None:
            timed("the experiment directory's lock", lock.release)
        total = sum(timings.values())
        parts = ", ".join(f"{name} {t:.1f} s" for name, t in timings.items())
        if total > SLOW_SHUTDOWN_S:
            log.warning("rank %d: shutting down took %.1f s (%s)", self.rank, total, parts)
        elif self.rank == 0:
            log.info("shut down in %.1f s (%s)", total, parts)


def shutdown_compile_workers() -> None:
    """End inductor's pool of compile worker processes, if this process started one (``torch.compile``)."""
    async_compile = sys.modules.get("torch._inductor.async_compile")
    if async_compile is not None:
        async_compile.shutdown_compile_workers()


# ---------------------------------------------------------------- checks before any data is read
def check_config(cfg: TrainConfig) -> ConformerConfig:
    """The encoder's config, after checking the model's, the task's and the trainer's settings against
    each other and the machine, that ``init_from`` exists and that ``trainer.exp_dir`` is not other work
    (``check_experiment_dir``) and, on resume, keeps the model and task it was trained with
    (``check_resume_config``); ``ConfigError`` names what does not fit."""
    if os.environ.get("RANK", "0") == "0":  # rank 0 checks before it writes there; the others would see its files
        check_experiment_dir(Path(cfg.trainer.exp_dir))
    check_resume_config(cfg)
    try:
        encoder_cfg = cfg.model.build_config(input_dim=cfg.data.features.num_mel_bins)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"model: {e}") from e
    try:
        device = resolve_device(cfg.trainer.device)
    except UsageError as e:
        raise ConfigError(f"trainer.{e}") from None
    try:
        task_for(cfg.task).check(cfg, encoder_cfg)
        check_options(cfg.trainer, cfg.optim, device, launched_distributed(cfg.trainer.strategy))
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from e
    if cfg.data.pack_to_frames and encoder_cfg.front_end == "dw_striding":
        raise ConfigError(
            f"data.pack_to_frames={cfg.data.pack_to_frames}: the encoder's dw_striding front end (NEST) reads across "
            "the utterances of a packed row; set data.pack_to_frames=0"
        )
    if cfg.trainer.compile:
        compiled_lengths(cfg)  # refuses unpadded batches
        fixed = cfg.data.fixed_batch_shapes or cfg.data.pack_to_frames > 0
        if cfg.trainer.compile_mode == "reduce-overhead" and not fixed:
            log.warning(
                "trainer.compile_mode=reduce-overhead records a CUDA graph for every batch shape, and bucketed "
                "batches vary in size: set data.fixed_batch_shapes=true for a few shapes, or data.pack_to_frames "
                "for one"
            )
    if cfg.init_from:
        resolve_checkpoint(cfg.init_from)  # a missing init_from is named now, not after data preparation
        check_imported_fit(cfg.init_from, encoder_cfg)  # an imported encoder needs its own model section
    check_memory(cfg, encoder_cfg, device)  # a model too large for the machine: refused now, not after the data
    return encoder_cfg


def compiled_lengths(cfg: TrainConfig) -> int:
    """With ``trainer.compile``: how many padded time lengths the training batches can take.

    The compiled step is static in time, so each length compiles a graph of its own, and
    ``torch._dynamo`` runs uncompiled whatever comes after its recompile limit (8 graphs per function).
    Unpadded batches (``data.pad_to_frames=0``) would take every length: refused. Packed rows
    (``data.pack_to_frames``) have one length.
    """
    data = cfg.data
    if data.pack_to_frames:
        return 1
    if data.pad_to_frames == 0:
        raise UsageError(
            "trainer.compile=true needs data.pad_to_frames (e.g. data.pad_to_frames=256) or data.pack_to_frames: unpadded batches "
            "compile a new graph for every length, and past torch's recompile limit they run uncompiled"
        )
    slowest = min((1.0, *data.speed_perturb))  # a factor below 1 lengthens the audio
    max_frames = math.ceil(data.max_cut_duration / slowest * 1000 / data.features.frame_shift_ms)
    return math.ceil(max_frames / data.pad_to_frames)


def raise_recompile_limit(cfg: TrainConfig) -> None:
    """Let torch compile a graph per padded length (and one more for a batch of one row: torch specializes
    sizes 0 and 1), times the task's graphs per length (MOST's text lengths)."""
    needed = 2 * compiled_lengths(cfg) * task_for(cfg.task).graphs_per_length
    limit = torch._dynamo.config.recompile_limit
    if needed > limit:
        torch._dynamo.config.recompile_limit = needed
        log.info("compiled step: up to %d graphs per function, torch's recompile limit %d -> %d", needed, limit, needed)


# ---------------------------------------------------------------- tokenizer and heads
def load_tokenizer(cfg: TrainConfig, rank: int) -> Tokenizer:
    """The run's tokenizer: on ``resume``, the copy in the experiment directory; else ``tokenizer_path``,
    trained on the training transcripts (by rank 0, which runs this first: ``rank0_first``) when missing."""
    copy = Path(cfg.trainer.exp_dir) / TOKENIZER_FILE
    if cfg.resume and copy.is_file():
        return read_tokenizer(copy)
    path = tokenizer_path(cfg)
    if not path.is_file() and rank == 0:
        log.info(
            "no tokenizer at %s: training one (%s, vocab %d) on the training transcripts",
            path,
            cfg.tokenizer_type,
            cfg.vocab_size,
        )
        if cfg.data.shar_dir:
            cuts = shar_train_cuts(cfg.data, audio=False)
        else:
            cuts = load_cuts(
                cfg.data.manifest_dir, cfg.data.train_split, corpus=cfg.data.corpus, allow_urls=cfg.data.allow_urls
            )
        texts = [s.text for c in cuts for s in c.supervisions if s.text]
        Tokenizer.train(texts, path.parent, vocab_size=cfg.vocab_size, model_type=cfg.tokenizer_type)
        return Tokenizer.load(path)
    tokenizer = Tokenizer.load(path)
    if not cfg.tokenizer:
        check_corpus_tokenizer(tokenizer, path, cfg.vocab_size, warn=rank == 0)
    return tokenizer


def load_stats(cfg: TrainConfig, cuts: CutSet) -> FeatureStats:
    """The run's feature statistics: on ``resume``, the copy in the experiment directory (the model was trained
    on features normalized with it; the corpus's file may have been recomputed since); else the corpus's,
    computed from ``cuts`` when missing."""
    copy = Path(cfg.trainer.exp_dir) / STATS_FILE
    if cfg.resume and copy.is_file():
        try:
            stats = FeatureStats.load(copy)
        except Exception as e:  # safetensors' own error type for a damaged file
            raise UsageError(
                f"{copy} (the run's feature statistics) is damaged ({e}); restore it from a backup, or start a new "
                "run in another trainer.exp_dir"
            ) from e
        if stats.num_bins == cfg.data.features.num_mel_bins and stats.finite:
            return stats
        raise UsageError(
            f"{copy} (the run's feature statistics) has {stats.num_bins} bins or values that are not finite, for "
            f"data.features.num_mel_bins={cfg.data.features.num_mel_bins}; restore it from a backup, or start a "
            "new run in another trainer.exp_dir"
        )
    return load_or_compute_stats(cuts, cfg.data)


def check_corpus_tokenizer(tokenizer: Tokenizer, path: Path, vocab_size: int, *, warn: bool) -> None:
    """The corpus's shared tokenizer (``tokenizer=null``), trained by an earlier run or the corpus recipe,
    is used as it is: ``vocab_size`` only sizes one trained here. A tokenizer with more pieces than
    ``vocab_size`` was made for another setting (``ConfigError``: training on with it would ignore the
    setting and record it in the run's config as if it had applied); one with fewer may be what the texts
    allowed (sentencepiece's soft limit), so that is a warning."""
    pieces = tokenizer.vocab_size
    if pieces == vocab_size:
        return
    how = (
        f"pass vocab_size={pieces} to train with it, or tokenizer=<a new path> (e.g. "
        f"tokenizer={path.parent.with_name(f'{path.parent.name}_{vocab_size}') / path.name}) to train one with "
        f"vocab_size={vocab_size}"
    )
    if pieces > vocab_size:
        raise ConfigError(f"vocab_size={vocab_size}, but the corpus's tokenizer {path} has {pieces} pieces: {how}")
    if warn:
        log.warning(
            "the corpus's tokenizer %s has %d pieces, fewer than vocab_size=%d (the texts may allow no more); "
            "it is used as it is: %s",
            path,
            pieces,
            vocab_size,
            how,
        )


def shar_train_cuts(data: DataConfig, *, audio: bool) -> CutSet:
    """The training split's cuts in ``data.shar_dir``, lazily: with their audio, or only their manifests."""
    return shar_cuts(split_shards(data.shar_dir, data.train_split), audio=audio)


def init_ctc_head(module: torch.nn.Module, src: Path, tokenizer: Tokenizer) -> list[str]:
    """Load checkpoint ``src``'s CTC head (``ctc.*``) into ``module`` if ``src``'s run was trained with
    ``tokenizer`` (its token ids mean the same pieces) and the shapes fit; returns the keys loaded."""
    if getattr(module, "ctc", None) is None:
        return []
    stored_tokenizer = run_dir(src) / TOKENIZER_FILE
    if not stored_tokenizer.is_file() or stored_tokenizer.read_bytes() != tokenizer.model_proto:
        return []
    own = module.state_dict()
    head = {k: v for k, v in load_tensors(src / MODEL_FILE).items() if k.startswith("ctc.")}
    if not head or any(k not in own or own[k].shape != v.shape for k, v in head.items()):
        return []
    module.load_state_dict(head, strict=False)
    return sorted(head)
