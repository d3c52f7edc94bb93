"""The training loop: step, evaluate, checkpoint, resume. It knows nothing of model internals.

The task module maps a ``Batch`` to a ``StepOutput`` (loss + metrics); what else the loop must know
of the model (parameter groups, the blocks to compile, checkpoint or shard, the batch axes that vary)
comes with it as a ``TrainSpec`` (``usmkit.training.task_spec``). The loop does the rest: the optimizer
and schedule (``usmkit.training.optim``), gradient accumulation and clipping, bf16 autocast on CUDA,
skipping of non-finite steps, metrics (``usmkit.training.metric_log``), a progress bar, periodic dev
evaluation, atomic checkpoints (keep last N and the best; written in the background by default,
``usmkit.checkpointing.async_save``), exact resume, and several processes: DDP, or FSDP2
(``trainer.strategy=fsdp``, ``usmkit.training.fsdp``) with sharded checkpoints (``usmkit.checkpointing.sharded``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from usmkit.checkpointing.async_save import CheckpointWriter
from usmkit.checkpointing.checkpoint import (
    BEST_FILE,
    STATE_FILE,
    STATE_TENSORS_FILE,
    CheckpointDamaged,
    CheckpointError,
    CheckpointWriteError,
    checkpoint_content,
    list_checkpoints,
    load_train_state,
    load_weights,
    prune_checkpoints,
    read_best,
    rng_state,
    save_checkpoint,
    set_rng_state,
    write_best,
)
from usmkit.checkpointing.sharded import checkpoint_strategy, load_sharded_checkpoint, save_sharded_checkpoint
from usmkit.config import OptimConfig, TrainerConfig
from usmkit.data.batch import Batch
from usmkit.device import autocast_context, resolve_device
from usmkit.errors import UsageError
from usmkit.models.output import StepOutput
from usmkit.training.activation_checkpoint import checkpoint_blocks
from usmkit.training.compile_blocks import compile_blocks
from usmkit.training.distributed import agree, collective, from_rank0, gather, wait_for_rank0
from usmkit.training.fsdp import clip_grad_norm, gathered, shard_model
from usmkit.training.grad_norms import clip_with_norms
from usmkit.training.metric_log import MetricLog
from usmkit.training.optim import keep_fused, make_optimizer, make_scheduler, param_groups
from usmkit.training.spec import DevEval, ResumableLoader, TrainResult, TrainSpec
from usmkit.training.step_record import StepRecord
from usmkit.training.stop_signals import StopSignals, TrainingInterrupted

log = logging.getLogger(__name__)


class TrainingDiverged(UsageError):
    """Too many consecutive steps with a non-finite loss or gradient."""

    exit_code = 1


def is_main_process() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def check_options(cfg: TrainerConfig, optim_cfg: OptimConfig, device: torch.device, distributed: bool) -> None:
    """ValueError naming every combination of trainer options this run cannot serve (the entry point
    calls it before any data is read; ``Trainer`` again)."""
    problems = []
    if device.type == "cuda" and not torch.cuda.is_available():
        problems.append(f"trainer.device={cfg.device} but this machine has no CUDA device; use trainer.device=cpu")
    if cfg.strategy == "fsdp" and not distributed:
        problems.append(
            "trainer.strategy=fsdp needs torch.distributed: launch with torchrun "
            "(torchrun --nproc-per-node N -m usmkit.cli.train ..., N=1 for one GPU)"
        )
    if cfg.compile_mode == "reduce-overhead":
        cg = "trainer.compile_mode=reduce-overhead (CUDA graphs)"
        if not cfg.compile:
            problems.append(f"{cg} needs trainer.compile=true")
        if device.type != "cuda":
            problems.append(f"{cg} needs a CUDA device (this run uses {device})")
        if optim_cfg.accum_steps != 1:
            # Untested: whether the next micro-batch's replay leaves the gradients accumulated so far intact.
            problems.append(f"{cg} needs optim.accum_steps=1 (got {optim_cfg.accum_steps})")
        if cfg.strategy == "fsdp":
            # FSDP gathers and frees each unit's weights in hooks around the compiled blocks, outside any graph.
            problems.append(f"{cg} does not work with trainer.strategy=fsdp; use compile_mode=default")
        elif distributed:
            # Untested in the trainer (bench/ddp_scaling.py --cuda-graphs measured it with its own DDP options).
            problems.append(f"{cg} is not supported with several processes (DDP); use compile_mode=default")
    if problems:
        raise ValueError("; ".join(problems))


class Trainer:
    """Runs ``max_steps`` optimizer steps of ``module`` over ``train_loader``.

    ``module(batch) -> StepOutput``. ``dev_eval(module)`` (rank 0 only) returns dev metrics such as
    ``{"dev_loss": ..., "dev_wer": ...}``. ``config_yaml`` is saved with every checkpoint. ``spec``: what
    the loop needs to know of the model (``TrainSpec``; default: one parameter group, nothing to compile
    block by block, static batch axes).
    """

    def __init__(
        self,
        cfg: TrainerConfig,
        optim_cfg: OptimConfig,
        module: torch.nn.Module,
        train_loader: ResumableLoader,
        config_yaml: str,
        dev_eval: DevEval | None = None,
        spec: TrainSpec | None = None,
    ) -> None:
        spec = spec or TrainSpec()
        if optim_cfg.splits_encoder and not spec.param_groups:
            raise ValueError(
                "optim.encoder_lr_scale / optim.freeze_encoder_steps need the task's parameter groups "
                "(TrainSpec.param_groups, built by usmkit.tasks.train_spec); leave them at 1.0 / 0 otherwise"
            )
        self.cfg = cfg
        self.spec = spec
        self.optim_cfg = optim_cfg
        self.device = resolve_device(cfg.device)
        self.module = module.to(self.device)
        self.train_loader = train_loader
        self.dev_eval = dev_eval
        self.config_yaml = config_yaml
        self.exp_dir = Path(cfg.exp_dir)
        self.ckpt_root = self.exp_dir / "checkpoints"
        self.distributed = dist.is_available() and dist.is_initialized()
        check_options(cfg, optim_cfg, self.device, self.distributed)
        self.sharded = cfg.strategy == "fsdp"
        groups = param_groups(self.module, spec.param_groups)
        # Compile per block, checkpoint around each compiled block (why that order: usmkit.training.activation_checkpoint),
        # then shard (FSDP's gather and free run in hooks around each block). The whole-step compile (below)
        # traces the checkpointed blocks.
        compile_mode = "reduce-overhead" if cfg.compile_mode == "reduce-overhead" else None
        self.cuda_graphs = compile_mode == "reduce-overhead"  # each step then marks a new graph replay
        if cfg.compile and cfg.compile_scope == "blocks":
            # Static shapes step faster than fully dynamic ones (bench/train_throughput.py); the time
            # axis comes in a few padded lengths (data.pad_to_frames), and only the axes the task names
            # dynamic (those the sampler varies) are left dynamic (see _forward_backward).
            n = compile_blocks(spec.compile_units, compile_mode)
            log.info("compiling %d blocks of the model one by one (trainer.compile_scope=blocks)", n)
        if cfg.activation_checkpointing:
            n = checkpoint_blocks(spec.checkpoint_units)
            log.info("recomputing the activations of %d blocks in the backward (trainer.activation_checkpointing)", n)
        self.step_module: torch.nn.Module = self.module
        if self.sharded:
            names = {id(p): name for name, p in self.module.named_parameters()}
            with collective("FSDP's sharding of the model"):
                n = shard_model(self.module, spec.shard_units, self.device, cfg.precision)
            log.info("sharding %d units and the rest of the model over %d processes (FSDP2)", n, dist.get_world_size())
            now = dict(self.module.named_parameters())  # the shards: new parameters under the same names
            groups = tuple(replace(g, params=tuple(now[names[id(p)]] for p in g.params)) for g in groups)
        elif self.distributed:
            ids = [self.device.index] if self.device.type == "cuda" else None
            # No BatchNorm anywhere: buffers (e.g. BEST-RQ's frozen codebooks) need no per-step broadcast.
            with collective("DDP's check of the parameter shapes and broadcast of rank 0's weights"):
                self.step_module = DistributedDataParallel(self.module, device_ids=ids, broadcast_buffers=False)
        if cfg.compile and cfg.compile_scope == "whole":  # (the config's Literal type is checked where it is read)
            self.step_module = torch.compile(self.step_module, dynamic=False, mode=compile_mode)
        self.optimizer = make_optimizer(groups, optim_cfg)
        self.scheduler = make_scheduler(self.optimizer, groups, optim_cfg, cfg.max_steps)
        self.step = 0
        self.epoch = 0
        self.best: dict | None = None
        self.bad_steps_total = 0
        self.health_warned = False  # a module's health_check warns once per run
        self.damaged: set[Path] = set()  # checkpoints resume found damaged: a save at their step rewrites them
        self.bad_steps_in_row = 0
        self.named_parameters = list(self.module.named_parameters())  # clipping names each gradient's norm
        # The step of the last checkpoint written or resumed from, and its path: the same on every rank (a
        # look at the disk could differ between processes on a shared file system, and with FSDP each takes
        # part in a save or none does).
        self.saved: tuple[int, Path | None] | None = None
        self.checkpoint_s = 0.0  # how long the last save blocked the loop
        # Rank 0's background writer (trainer.async_save); the other ranks learn of its failures from rank 0.
        self.writer = CheckpointWriter() if cfg.async_save and not self.sharded else None

    # ---------------------------------------------------------------- state
    def train_state(self) -> dict[str, Any]:
        """What resume restores besides the weights (a sharded run saves its optimizer state apart).

        Every rank calls it: with several processes, ``ranks`` holds each rank's own random state and loader
        position (its dropout and its share of the data), gathered for rank 0 to write.
        """
        own = {"loader": self.train_loader.state_dict(), "rng": rng_state()}
        state = {
            "step": self.step,
            "epoch": self.epoch,
            "scheduler": self.scheduler.state_dict(),
            **own,
            "best": self.best,
            "bad_steps_total": self.bad_steps_total,
            "strategy": self.cfg.strategy,
            "world_size": dist.get_world_size() if self.distributed else 1,
        }
        if self.distributed:
            state["ranks"] = gather(own, f"every rank's random state and data position for step {self.step}")
        if not self.sharded:
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def resume(self) -> bool:
        """Continue from the newest complete checkpoint in ``exp_dir``; False if there is none.

        A damaged newest checkpoint (a file missing, truncated or altered) is passed over with a warning
        for the one before it; ``CheckpointError`` when none is usable. (``fit`` then removes the
        entries of ``metrics.jsonl`` after the step it starts from.)
        """
        # Rank 0's view of the folder, on every rank: each process resumes from the same checkpoint.
        candidates, incomplete = from_rank0(self._checkpoints_on_disk(), "list of checkpoints")
        for p in incomplete:
            log.warning("%s is incomplete (no %s or weights); it is not resumed from", p, STATE_FILE)
        if not candidates:
            if incomplete:  # e.g. only checkpoints of the older pickled format: never start over silently
                raise CheckpointError(
                    f"resume=true but none of the {len(incomplete)} checkpoints in {self.ckpt_root} is complete "
                    f"(each needs model.safetensors, {STATE_FILE} and {STATE_TENSORS_FILE}); to reuse the weights, "
                    f"start a new run with init_from={incomplete[-1]} and another trainer.exp_dir"
                )
            return False
        for ckpt in reversed(candidates):
            problem = None
            try:
                state = self._load_checkpoint(ckpt.path)
            except CheckpointDamaged as e:
                problem = e
            failed = agree(problem is None, f"checking checkpoint {ckpt.path.name}") if self.distributed else []
            if not failed and problem is None:
                break
            log.warning(
                "%s; falling back to the previous checkpoint", problem or f"{ckpt.path} is damaged on rank(s) {failed}"
            )
            self.damaged.add(ckpt.path)  # a save at its step rewrites it
        else:
            raise CheckpointError(
                f"none of the {len(candidates)} checkpoints in {self.ckpt_root} can be read (see the warnings "
                "above); start a new run (resume=false) with another trainer.exp_dir"
            )
        last = ckpt
        self.scheduler.load_state_dict(state["scheduler"])
        world = dist.get_world_size() if self.distributed else 1
        rank = dist.get_rank() if self.distributed else 0
        # This rank's own random state and data position; a rank the writing run did not have takes rank 0's.
        ranks = state.get("ranks") or []
        own = ranks[rank] if rank < len(ranks) else {"loader": state["loader"], "rng": state["rng"]}
        if state.get("world_size", world) == world:
            self.train_loader.load_state_dict(own["loader"])
        else:  # the sampler's position is per process: it cannot carry over to another number of them
            log.warning(
                "%s was written by %d processes, this run has %d: the data order cannot continue where it "
                "stopped, so epoch %d starts over",
                last.path,
                state["world_size"],
                world,
                state["epoch"],
            )
            self.train_loader.set_epoch(state["epoch"])
        set_rng_state(own["rng"])
        self.step, self.epoch = state["step"], state["epoch"]
        self.best = state.get("best") or read_best(self.ckpt_root)
        self.bad_steps_total = state.get("bad_steps_total", 0)
        self.saved = (self.step, last.path)
        log.info("resumed from %s at step %d (epoch %d)", last.path, self.step, self.epoch)
        return True

    def _checkpoints_on_disk(self) -> tuple[list, list[Path]]:
        """The complete checkpoints in ``ckpt_root`` (oldest first) and the incomplete ones."""
        candidates = list_checkpoints(self.ckpt_root)
        complete = {c.path for c in candidates}
        return candidates, [p for p in sorted(self.ckpt_root.glob("step-*")) if p not in complete]

    def _load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Load the weights (and a sharded run's optimizer) of checkpoint ``path``; returns its train state."""
        saved = checkpoint_strategy(path)  # None: unreadable, which loading reports as damage
        if saved is not None and saved != self.cfg.strategy:
            raise CheckpointError(
                f"{path} was written with trainer.strategy={saved}, this run has trainer.strategy={self.cfg.strategy}: "
                f"resume with trainer.strategy={saved}, or start a new run from its weights with init_from={path}"
            )
        if self.sharded:  # every process: checks, weights and optimizer state at this run's sharding
            state = load_sharded_checkpoint(path, self.module, self.optimizer)
        else:
            state = load_train_state(path)  # checks the files' sizes and SHA-256 first
            load_weights(self.module, path, verify=False)
            self.optimizer.load_state_dict(state["optimizer"])
        keep_fused(self.optimizer)
        return state

    def save(self) -> Path | None:
        """Write a checkpoint of this step (rank 0; with FSDP every process writes its part); its path, or
        None on the processes that write nothing. Every rank calls it. ``checkpoint_s``: how long it kept
        the loop waiting. Written in the loop (sharded, or ``trainer.async_save=false``), that is the write
        (with DDP the other ranks wait for rank 0's on the host group); with ``async_save`` rank 0 waits for
        the checkpoint before this one, copies this one into host memory and hands it to the background
        writer: the loop waits for those only."""
        if self.saved is not None and self.saved[0] == self.step:  # e.g. the best was just saved at this step
            return self.saved[1]
        start = time.perf_counter()
        if self.writer is not None:  # (every rank: they agree on whether rank 0's last write succeeded)
            self._await_write(f"before the checkpoint of step {self.step}")
        path = None
        target = self.ckpt_root / f"step-{self.step:06d}"
        if is_main_process() and target.exists():  # one resume fell back from, or one cut short by a crash
            why = "damaged" if target in self.damaged else "incomplete"
            log.warning("%s is %s: replacing it with this run's checkpoint of step %d", target, why, self.step)
        state = self.train_state()  # (every rank: it gathers each rank's part)
        keep = {self.ckpt_root / self.best["path"]} if self.best else set()
        prune = functools.partial(prune_checkpoints, self.ckpt_root, self.cfg.keep_last, keep)
        # A failed write (CheckpointWriteError, e.g. a full disk) stops the run: training on without
        # saving would lose every step after the last checkpoint, which stays intact.
        if self.sharded:
            with collective(f"the sharded checkpoint of step {self.step}"):
                path = save_sharded_checkpoint(
                    self.ckpt_root, self.step, self.module, self.optimizer, state, self.config_yaml
                )
        elif is_main_process() and self.writer is not None:
            # A copy of its own: the next optimizer step changes the live weights and moments in place.
            content = checkpoint_content(self.module, state, self.config_yaml, copy=True)
            path = self.writer.write(self.ckpt_root, self.step, content, then=lambda _: prune())
        elif is_main_process():
            path = save_checkpoint(self.ckpt_root, self.step, self.module, state, self.config_yaml)
        if is_main_process() and self.writer is None:
            prune()
        if self.distributed and not self.sharded and self.writer is None:
            wait_for_rank0(f"checkpoint of step {self.step}")
        self.saved = (self.step, path)
        self.damaged.discard(target)
        self.checkpoint_s = time.perf_counter() - start
        if is_main_process():
            how = "handed to the background writer" if self.writer is not None else "written"
            log.info("step %d: checkpoint %s %s in %.1f s", self.step, path.name, how, self.checkpoint_s)
        return path

    def _await_write(self, when: str) -> None:
        """Wait for rank 0's checkpoint write in flight; if it failed, raise its error on every rank (the
        others get rank 0's message on the host group). ``when`` names the moment in a collective's error."""
        failure = self.writer.finish() if is_main_process() else None
        if self.distributed:
            message = None if failure is None else (str(failure) or repr(failure))
            message = from_rank0(message, f"checkpoint write's outcome {when}")
            if failure is None and message is not None:
                failure = CheckpointWriteError(message)
        if failure is not None:
            raise failure

    def _drain_write(self) -> None:
        """After an error: let the checkpoint in flight complete (or fail) before the run ends; its failure
        is logged, not raised over the error that ends the run."""
        failure = self.writer.finish() if self.writer is not None else None
        if failure is not None:
            log.error("%s", failure)

    # ---------------------------------------------------------------- loop
    def _batches(self) -> Iterator[Batch]:
        """The training batches, epoch after epoch. A loader that crosses epochs itself (an endless one)
        never ends a pass and reports its own ``epoch``; another gets ``set_epoch`` after each pass."""
        empty_passes = 0  # in a row: one is a run resumed after the last batch of an epoch, two an empty split
        while True:
            got_any = False
            for batch in self.train_loader:
                got_any = True
                self.epoch = getattr(self.train_loader, "epoch", self.epoch)
                yield batch
            empty_passes = 0 if got_any else empty_passes + 1
            if empty_passes == 2:
                raise RuntimeError("the training loader yielded no batch: is the training split empty?")
            self.epoch += 1
            self.train_loader.set_epoch(self.epoch)

    def _forward_backward(self, batch: Batch, sync: bool) -> tuple[StepOutput, int]:
        frames = batch.num_frames  # counted on the host copy: no device sync
        batch = batch.to(self.device)
        if self.cfg.compile and self.cfg.compile_scope == "whole" and self.spec.dynamic_axes is not None:
            for t, dim in self.spec.dynamic_axes(batch):  # (compiled blocks mark their own inputs)
                torch._dynamo.maybe_mark_dynamic(t, dim)
        no_sync = (
            self.step_module.no_sync
            if (self.distributed and not sync and hasattr(self.step_module, "no_sync"))
            else contextlib.nullcontext
        )
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the last step's graph outputs are no longer read
        with no_sync(), collective(self._step_collectives()):
            with autocast_context(self.device, self.cfg.precision):
                out: StepOutput = self.step_module(batch)
            (out.loss / self.optim_cfg.accum_steps).backward()
        return out, frames

    def _step_collectives(self) -> str:
        """What the processes exchange in the forward and backward of the next step, for error messages."""
        if self.sharded:
            return f"step {self.step + 1}'s forward and backward (FSDP's weight gathers and gradient reduce-scatters)"
        return f"step {self.step + 1}'s forward and backward (DDP's gradient all-reduce)"

    def _past(self, deadline: float) -> bool:
        """Whether the wall clock passed ``deadline``; every process stops at the same step (rank 0's clock).
        With several processes, asked only every ``log_every`` steps: agreeing on it is a device sync."""
        past = time.perf_counter() >= deadline
        if not self.distributed:
            return past
        if self.step % self.cfg.log_every:
            return False
        flag = torch.tensor(float(past), device=self.device)
        with collective(f"step {self.step}'s broadcast of rank 0's clock (trainer.max_minutes)"):
            dist.broadcast(flag, src=0)
            return bool(flag.item())

    def _finite(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        """1.0 where the loss and the gradient norm are finite on every process, else 0.0; on the device."""
        ok = torch.isfinite(loss.detach()).float() * torch.isfinite(grad_norm).float()
        if self.distributed:
            with collective(f"step {self.step + 1}'s all-reduce of the finite flag"):
                dist.all_reduce(ok, op=dist.ReduceOp.MIN)  # one bad rank skips the step everywhere
        return ok

    def _settle(
        self, pending: list[StepRecord], losses: list[tuple[int, float]], keep: int = 0
    ) -> list[tuple[StepRecord, int]]:
        """Read the records of finished steps, all but the last ``keep``: losses of the applied steps, and
        the count of skipped ones (non-finite), which stops the run after ``max_bad_steps`` in a row.
        Returns the records read, each with the count of skipped steps up to it."""
        read: list[tuple[StepRecord, int]] = []
        while len(pending) > keep:
            record = pending.pop(0)
            loss, applied = record.read()
            if applied:
                self.bad_steps_in_row = 0
                losses.append((record.step, loss))
                read.append((record, self.bad_steps_total))
                continue
            self.bad_steps_total += 1
            self.bad_steps_in_row += 1
            read.append((record, self.bad_steps_total))
            culprits = record.non_finite_gradients()
            log.warning(
                "step %d: non-finite loss or gradient (loss=%s%s); its update was skipped (%d in a row, %d in all)",
                record.step,
                loss,
                f"; non-finite gradients: {culprits}" if culprits else "",
                self.bad_steps_in_row,
                self.bad_steps_total,
            )
            if self.bad_steps_in_row >= self.cfg.max_bad_steps:
                raise TrainingDiverged(
                    f"{self.bad_steps_in_row} consecutive steps had a non-finite loss or gradient "
                    f"(last at step {record.step}); stopping. Lower optim.lr, raise optim.warmup_steps, "
                    f"check the data, or resume from the last checkpoint in {self.ckpt_root}."
                )
        return read

    def fit(self) -> TrainResult:
        cfg = self.cfg
        main = is_main_process()
        metric_log = MetricLog(self.exp_dir, self.step) if main else None
        progress = _progress(cfg, self.step) if (main and cfg.progress) else None
        batches = self._batches()
        losses: list[tuple[int, float]] = []
        window_frames, window_start, window_wait = 0, time.perf_counter(), 0.0
        pending: list[StepRecord] = []  # steps whose loss and finiteness the host has not read yet
        lines: dict[int, dict[str, float]] = {}  # log lines waiting for their step's device values, by step
        deadline = time.perf_counter() + 60.0 * cfg.max_minutes if cfg.max_minutes else None
        self.module.train()
        start_step = self.step
        stop = StopSignals()  # a SIGINT or SIGTERM ends the run after the step it comes in
        signum = None
        try:
            stop.install()
            while self.step < cfg.max_steps:
                if deadline is not None and self._past(deadline):
                    log.info("trainer.max_minutes=%g reached at step %d of %d: stopping", cfg.max_minutes,
                             self.step, cfg.max_steps)  # fmt: skip
                    break
                signum = self._stop_signal(stop)
                if signum is not None:
                    break
                self.optimizer.zero_grad(set_to_none=True)
                loss_sum = torch.zeros((), device=self.device)
                metric_sums: dict[str, torch.Tensor] = {}
                for micro in range(self.optim_cfg.accum_steps):
                    # The host runs up to a step ahead of the device, so the device works while it waits here.
                    wait_start = time.perf_counter()
                    batch = next(batches)
                    window_wait += time.perf_counter() - wait_start
                    out, frames = self._forward_backward(batch, sync=micro == self.optim_cfg.accum_steps - 1)
                    loss_sum += out.loss.detach().float()
                    window_frames += frames
                    for k, v in out.metrics.items():
                        metric_sums[k] = metric_sums.get(k, 0) + v.detach().float()
                loss = loss_sum / self.optim_cfg.accum_steps
                clip = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else float("inf")
                grad_norms, names = None, ()
                if self.sharded:  # the norm over every process's gradient shards
                    with collective(f"step {self.step + 1}'s all-reduce of the gradient norm"):
                        grad_norm = clip_grad_norm(self.module.parameters(), clip)
                else:  # each gradient's norm kept too, to name the parameters of a non-finite step
                    grad_norm, grad_norms, names = clip_with_norms(self.named_parameters, clip)
                # A non-finite step is skipped by the optimizer on the device (its ``found_inf``): the host
                # learns of it a step later, so it never waits here for the gradient norm.
                applied = self._finite(loss, grad_norm)
                self.optimizer.found_inf = 1.0 - applied
                self.optimizer.step()
                self.scheduler.step()
                self.step += 1
                logging_now = self.step % cfg.log_every == 0 or self.step == cfg.max_steps
                eval_now = bool(cfg.eval_every) and self.step % cfg.eval_every == 0
                save_now = bool(cfg.save_every) and self.step % cfg.save_every == 0
                logged = None
                if main and logging_now:  # the host's part of the log line now, the device's when the step is read
                    elapsed = time.perf_counter() - window_start
                    fps, wait = window_frames / max(elapsed, 1e-9), window_wait / max(elapsed, 1e-9)
                    lines[self.step] = self._host_scalars(fps, wait)
                    window_frames, window_start, window_wait = 0, time.perf_counter(), 0.0
                    logged = {"train/grad_norm": grad_norm}
                    logged |= {f"train/{k}": v / self.optim_cfg.accum_steps for k, v in metric_sums.items()}
                pending.append(StepRecord.of(self.step, loss, applied, grad_norms, names, logged))
                # Read the step before this one (queued behind it, the device keeps working); all of them
                # before a checkpoint or an evaluation, which record the counts.
                settled = self._settle(pending, losses, keep=0 if (eval_now or save_now) else 1)
                self._write_lines(settled, lines, losses, metric_log, progress)
                if progress:
                    progress.update(1)

                if eval_now:
                    self._evaluate(metric_log)
                if save_now:
                    self._save_and_log(metric_log)
            self._write_lines(self._settle(pending, losses), lines, losses, metric_log, progress)
            if signum is not None:
                raise self._interrupted(signum, start_step, metric_log)
            if cfg.eval_every and self.step % cfg.eval_every != 0:
                self._evaluate(metric_log)
            if not cfg.save_every or self.step % cfg.save_every != 0:
                self._save_and_log(metric_log)
            if self.writer is not None:  # a finished run has its last checkpoint on disk
                self._await_write("at the end of training")
        except BaseException:
            self._drain_write()
            raise
        finally:
            stop.restore()
            if progress:
                progress.close()
            if metric_log:
                metric_log.close()
        return TrainResult(self.step, _last_loss(losses), self.best, self.bad_steps_total, losses)

    def _stop_signal(self, stop: StopSignals) -> int | None:
        """The signal that asks the run to stop before the next step, if any. With several processes every
        one stops at the same step: they agree on it (the largest signal number any got) every ``log_every``
        steps, as that is a device sync. A failed background checkpoint write is raised here too, on every
        rank: every step with one process; with several, rank 0's failure rides on that agreement."""
        failed = self.writer is not None and self.writer.failed
        if not self.distributed:
            if failed:
                self._await_write(f"after step {self.step}")
            return stop.signum
        if self.step % self.cfg.log_every:
            return None
        flags = torch.tensor([float(stop.signum or 0), float(failed)], device=self.device)
        with collective(f"step {self.step}'s all-reduce of the stop signal (SIGINT/SIGTERM)"):
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            signum, failed_anywhere = flags.tolist()
        if failed_anywhere:
            self._await_write(f"after step {self.step}")
        return int(signum) or None

    def _interrupted(self, signum: int, start_step: int, metric_log: MetricLog | None) -> TrainingInterrupted:
        """Save the step the signal came in (none when no step was taken) and say how to go on."""
        name = signal.Signals(signum).name
        if self.step == start_step and self.saved is None:
            where = f"before its first step ({start_step}): nothing to save; run the same command again"
        else:
            self._save_and_log(metric_log)
            if self.writer is not None:  # the message says it is saved
                self._await_write(f"on {name}")
            where = (
                f"after step {self.step} of {self.cfg.max_steps}, checkpoint saved in "
                f"{self.ckpt_root / f'step-{self.step:06d}'}; to continue, run the same command with resume=true"
            )
        return TrainingInterrupted(f"training stopped by {name} {where}", signum)

    def _save_and_log(self, metric_log: MetricLog | None) -> Path | None:
        """``save``, and log how long the loop waited for it (``train/checkpoint_s``, a line of its own)."""
        saved = self.saved
        path = self.save()
        if metric_log is not None and self.saved != saved:
            metric_log.write({"train/checkpoint_s": self.checkpoint_s}, self.step)
        return path

    def _host_scalars(self, frames_per_s: float, loader_wait: float) -> dict[str, float]:
        """The log line's values known to the host when its step is queued."""
        scalars = {
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/frames_per_s": frames_per_s,
            "train/loader_wait": loader_wait,  # share of the window's wall time spent waiting for batches
        }
        if self.device.type == "cuda":  # the allocator's counters: no device sync
            stats = torch.cuda.memory_stats(self.device)
            scalars["train/max_mem_gib"] = stats.get("allocated_bytes.all.peak", 0) / 2**30
            # times the allocator freed its cache to retry an allocation (each waits for the device)
            scalars["train/alloc_retries"] = float(stats.get("num_alloc_retries", 0))
        return scalars

    def _write_lines(
        self,
        settled: list[tuple[StepRecord, int]],
        lines: dict[int, dict[str, float]],
        losses: list[tuple[int, float]],
        metric_log: MetricLog,
        progress,
    ) -> None:
        """Complete and write the log lines of the steps just read (main process)."""
        for record, bad_steps in settled:
            host = lines.pop(record.step, None)
            if host is None:
                continue
            logged = record.logged_values()
            scalars = {
                "train/loss": _last_loss(losses, record.step),
                "train/lr": host.pop("train/lr"),
                "train/grad_norm": logged.pop("train/grad_norm"),
                **host,
                "train/bad_steps": float(bad_steps),
                **logged,
            }
            metric_log.write(scalars, record.step)
            self._health_check(scalars, record.step)
            if progress:
                progress.set_postfix(
                    loss=f"{scalars['train/loss']:.3f}",
                    lr=f"{scalars['train/lr']:.2e}",
                    fps=f"{scalars['train/frames_per_s']:.0f}",
                )

    def _health_check(self, scalars: dict[str, float], step: int) -> None:
        """Warn once if the task says its training went wrong (a module's optional ``health_check``)."""
        check = getattr(self.module, "health_check", None)
        if check is None or self.health_warned:
            return
        message = check(scalars, step, self.optim_cfg.warmup_steps)
        if message:
            log.warning(message)
            self.health_warned = True

    def _evaluate(self, metric_log: MetricLog | None) -> None:
        if self.dev_eval is None:
            return
        best = None
        # Rank 0 evaluates alone; a sharded model is first gathered whole on every process for it.
        with gathered(self.module) if self.sharded else contextlib.nullcontext():
            if is_main_process():
                log.info("step %d: evaluating on the dev set", self.step)
                self.module.eval()
                with torch.no_grad(), autocast_context(self.device, self.cfg.precision):
                    results = self.dev_eval(self.module)
                self.module.train()
                metric_log.write({f"dev/{k}": v for k, v in results.items()}, self.step)
                log.info("step %d dev: %s", self.step, ", ".join(f"{k}={v:.4g}" for k, v in results.items()))
                value = results.get(self.cfg.best_metric)
                if value is not None and (self.best is None or value < self.best["value"]):
                    best = {
                        "path": f"step-{self.step:06d}",
                        "metric": self.cfg.best_metric,
                        "value": value,
                        "step": self.step,
                    }
        # The others wait here, on the host group, while rank 0 evaluates; then every rank knows the best.
        best = from_rank0(best, f"dev evaluation of step {self.step}")
        if best is not None:
            # Set first, so the checkpoint's train state records itself as the best.
            previous, self.best = self.best, best
            path = self._save_and_log(metric_log)
            if path is None:  # (a rank that writes nothing keeps no best of its own)
                self.best = previous
            elif is_main_process():
                record = functools.partial(
                    write_best, self.ckpt_root, path, best["metric"], best["value"], best["step"]
                )
                if self.writer is not None:  # once the checkpoint it names is in place
                    self.writer.then(f"recording step {self.step}'s checkpoint as the best ({BEST_FILE})", record)
                else:
                    record()


def _last_loss(losses: list[tuple[int, float]], step: int | None = None) -> float:
    """The loss of the last applied step (up to ``step``; NaN before any)."""
    for s, loss in reversed(losses):  # (steps increase; the step asked for is among the last)
        if step is None or s <= step:
            return loss
    return float("nan")


def _progress(cfg: TrainerConfig, start: int):
    from tqdm.auto import tqdm

    return tqdm(total=cfg.max_steps, initial=start, desc="train", unit="step", dynamic_ncols=True)
