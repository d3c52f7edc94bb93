"""Typed configuration for training and evaluation.

Hydra composes YAML from ``usmkit/conf``; the entry points convert the composed config to these
frozen dataclasses once (``from_dict``) and library code only ever sees the dataclasses.
Each section's dataclass lives next to the code it configures; this module composes them.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from usmkit.data.config import DataConfig
from usmkit.errors import UsageError
from usmkit.models.config import ConformerConfig
from usmkit.models.las import LASConfig
from usmkit.ssl.bestrq_config import BestRQConfig
from usmkit.ssl.most_config import MostConfig


class ConfigError(UsageError, ValueError):
    """A config key or value that does not fit the schema."""


@dataclass(frozen=True)
class ModelSection:
    """Which encoder to build: a named size preset plus the knobs recipes change.

    ``chunk_size`` is in encoder frames (40 ms each at ``subsampling_factor=4``, 80 ms at 8); ``None`` =
    full attention. USM's chunk-wise attention uses 8 s chunks (200 frames) with ``left_chunks=0``.
    """

    preset: str = "tiny"  # size preset: tiny, small, base, large, usm600m, usm2b (usmkit/models/presets.py)
    chunk_size: int | None = 200  # attention chunk in encoder frames; None = full attention
    left_chunks: int = 0  # chunks of history each chunk attends to: 0 USM's disjoint chunks, -1 all, k > 0 streaming
    causal_conv: bool = False  # depthwise convolution padded on the left only (streaming)
    attention_impl: str = "sdpa"  # sdpa, reference, flex or triton: one mask definition, four implementations
    dropout: float = 0.1
    subsampling_factor: int = 4  # feature frames per encoder frame: 4 or 8 (one more stride-2 conv stage)
    overrides: dict[str, Any] | None = None  # any other ConformerConfig field, e.g. {d_model: 192}

    def build_config(self, input_dim: int) -> ConformerConfig:
        from usmkit.models.presets import preset

        return preset(
            self.preset,
            input_dim=input_dim,
            chunk_size=self.chunk_size,
            left_chunks=self.left_chunks,
            causal_conv=self.causal_conv,
            attention_impl=self.attention_impl,
            dropout=self.dropout,
            subsampling_factor=self.subsampling_factor,
            **(self.overrides or {}),
        )


@dataclass(frozen=True)
class TaskConfig:
    """What is trained. ``kind``: ``ctc``, ``las`` (joint CTC + attention decoder), ``bestrq`` or ``most``."""

    kind: Literal["ctc", "las", "bestrq", "most"] = "ctc"
    ctc_weight: float = 1.0  # for ``las``: weight of the CTC loss in the joint loss (0.3 is usual)
    inter_ctc_weight: float = 0.0  # intermediate CTC's share of the CTC loss (0.3 is usual); 0 = off
    inter_ctc_layer: int = 0  # encoder block that gets it; 0 = the middle one
    las: LASConfig = field(default_factory=LASConfig)  # the attention decoder, for kind=las
    bestrq: BestRQConfig = field(default_factory=BestRQConfig)  # stage 1's objective, and MOST's on unlabeled audio
    most: MostConfig = field(default_factory=MostConfig)  # stage 2 (text injection), for kind=most; BEST-RQ from bestrq


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-3  # peak learning rate (AdamW), reached after warmup_steps
    weight_decay: float = 1e-2
    betas: tuple[float, float] = (0.9, 0.98)
    warmup_steps: int = 500  # linear warm-up from 0
    schedule: Literal["cosine", "constant", "noam"] = "cosine"  # after the warm-up
    min_lr_ratio: float = 0.05  # cosine decays to lr * min_lr_ratio at max_steps
    grad_clip: float = 5.0  # max global grad norm; 0 disables
    accum_steps: int = 1  # micro-batches per optimizer step
    # Fine-tuning a pre-trained encoder under a new head (``init_from``): the encoder's parameters
    # (names starting ``encoder.``) learn at ``lr * encoder_lr_scale``, and not at all during the first
    # ``freeze_encoder_steps`` steps, so the randomly initialized head settles before its gradients
    # reach the encoder (fairseq's ``freeze_finetune_updates`` for wav2vec 2.0).
    encoder_lr_scale: float = 1.0  # fine-tuning from init_from: the encoder's share of lr
    freeze_encoder_steps: int = 0  # fine-tuning: steps in which only the new head learns

    def __post_init__(self) -> None:
        if not (self.lr > 0 and self.lr < float("inf")):
            raise ValueError(f"optim.lr must be a positive number, got {self.lr}")
        if not (self.weight_decay >= 0):
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optim.betas must both be in [0, 1), got {self.betas}")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not (0 <= self.min_lr_ratio <= 1):
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not (self.grad_clip >= 0):
            raise ValueError(f"optim.grad_clip must be >= 0 (0 disables clipping), got {self.grad_clip}")
        if self.accum_steps < 1:
            raise ValueError(f"optim.accum_steps must be >= 1, got {self.accum_steps}")
        if self.encoder_lr_scale < 0:
            raise ValueError(f"optim.encoder_lr_scale must be >= 0, got {self.encoder_lr_scale}")
        if self.freeze_encoder_steps < 0:
            raise ValueError(f"optim.freeze_encoder_steps must be >= 0, got {self.freeze_encoder_steps}")

    @property
    def splits_encoder(self) -> bool:
        """Whether the encoder gets its own learning rate (own optimizer parameter groups)."""
        return self.encoder_lr_scale != 1.0 or self.freeze_encoder_steps > 0


@dataclass(frozen=True)
class TrainerConfig:
    exp_dir: str = "exp/run"  # each recipe writes to exp/<recipe>; checkpoints, metrics.jsonl, TensorBoard, the tokenizer and the config that ran
    max_steps: int = 2000  # optimizer steps; the learning-rate schedule counts to it
    # A wall-clock budget on top of max_steps (0 = none): once this many minutes of training have passed,
    # the run evaluates, saves and stops early, as after its last step (a job's time limit, a shared GPU).
    max_minutes: float = 0.0
    log_every: int = 10  # steps per logged window (metrics.jsonl, TensorBoard)
    eval_every: int = 500  # dev loss + dev WER; 0 disables
    save_every: int = 500  # steps between checkpoints; 0 = only the last
    keep_last: int = 3  # checkpoints kept besides the best
    # Write checkpoints in the background (usmkit/checkpointing/async_save.py): the loop waits only while the
    # weights and train state are copied into host memory (one more copy of both, held until written), then
    # trains on. A failed write stops the run soon after (at the next step; with several processes at the next
    # log step or save), the earlier checkpoints intact. Sharded runs (strategy=fsdp) save in the loop anyway.
    async_save: bool = True
    dev_max_batches: int = 0  # 0 = the whole dev set
    precision: Literal["auto", "bf16", "fp32"] = "auto"  # auto = bf16 autocast on CUDA, fp32 on CPU
    compile: bool = False  # torch.compile the training step (needs data.pad_to_frames; pays on a GPU)
    # With compile on a GPU: "reduce-overhead" replays the compiled forward and backward as CUDA
    # graphs, so the GPU no longer waits on the host between kernels. One graph is recorded per batch
    # shape, so it pays only where shapes repeat: with the bucketing sampler's varying batch sizes the
    # recordings cost more than they save (bench/trainer_compile.py). Needs CUDA, one process and accum_steps=1.
    compile_mode: Literal["default", "reduce-overhead"] = "default"
    # What compile covers: "blocks" (each Conformer block and the front end, the rest eager;
    # usmkit/training/compile_blocks.py) or "whole" (the model's training step, one graph per padded length).
    # "blocks" is the default: one graph serves every identical block, so it compiles several times
    # sooner than the unrolled whole model (experiments/compile_scope).
    compile_scope: Literal["whole", "blocks"] = "blocks"
    # Several processes (torchrun): "ddp" keeps a whole copy of the model, its gradients and optimizer
    # state in each; "fsdp" shards all three over them (FSDP2, usmkit/training/fsdp.py; needs torchrun, also for
    # one process) with sharded checkpoints. See docs/performance.md for which to use for which preset.
    strategy: Literal["ddp", "fsdp"] = "ddp"
    # Recompute each block's activations in the backward instead of keeping them (usmkit/training/activation_checkpoint.py):
    # about a third more compute per step for a fraction of the activation memory.
    activation_checkpointing: bool = False
    device: str = "auto"  # auto = cuda if available, else cpu
    seed: int = 0  # model initialization, data order and augmentation
    max_bad_steps: int = 10  # consecutive non-finite losses before training stops
    progress: bool = True  # a progress bar on the terminal
    best_metric: str = "dev_wer"  # or dev_loss; lower is better
    # Several processes: a collective of training (gradient all-reduce, FSDP's gathers, the trainer's
    # agreements) that does not complete within this many seconds fails, naming the rank and the operation
    # (usmkit/training/distributed.py); the last checkpoint stays intact.
    dist_timeout_s: float = 600.0
    # How long the other processes wait while rank 0 works alone: preparing the data (tokenizer, stored
    # features and statistics of the whole corpus), evaluating on the dev set, writing a checkpoint.
    rank0_timeout_s: float = 86400.0

    def __post_init__(self) -> None:
        for name in ("dist_timeout_s", "rank0_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"trainer.{name} must be > 0 seconds, got {getattr(self, name)}")
        for name in ("log_every", "max_bad_steps", "keep_last"):  # keep_last=0 would delete every checkpoint
            if getattr(self, name) < 1:
                raise ValueError(f"trainer.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_steps", "eval_every", "save_every", "dev_max_batches"):
            if getattr(self, name) < 0:
                raise ValueError(f"trainer.{name} must be >= 0 (0 = off / all), got {getattr(self, name)}")
        if not self.max_minutes >= 0:
            raise ValueError(f"trainer.max_minutes must be >= 0 (0 = no time budget), got {self.max_minutes}")


@dataclass(frozen=True)
class TrainConfig:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelSection = field(default_factory=ModelSection)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    tokenizer: str | None = None  # sentencepiece model; null = <data.manifest_dir>/tokenizer[_bpe]/tokenizer.model
    vocab_size: int = 512  # used when the tokenizer is trained here because none exists
    # The model type of a tokenizer trained here: ``unigram`` or ``bpe``. For a corpus of a few words
    # (FSDD's ten digits) BPE makes each word one piece, whatever the sentencepiece version; unigram's
    # pieces for such texts depend on it (0.2.2: nine of the ten digits whole, 0.2.3: characters).
    tokenizer_type: Literal["unigram", "bpe"] = "unigram"
    resume: bool = False  # continue the run in trainer.exp_dir from its last checkpoint
    init_from: str | None = None  # checkpoint dir whose encoder weights start this run
    # With init_from: also its CTC head, where it has one trained with this run's tokenizer (stage 3 from a
    # stage-2 or CTC run keeps what the head learned); false: a new head, as from a BEST-RQ encoder.
    init_heads: bool = True


def tokenizer_path(cfg: TrainConfig) -> Path:
    """The run's sentencepiece model: ``cfg.tokenizer``, else the corpus's own for the tokenizer type:
    ``<manifest_dir>/tokenizer/tokenizer.model`` (unigram) or ``<manifest_dir>/tokenizer_bpe/...``."""
    if cfg.tokenizer:
        return Path(cfg.tokenizer)
    folder = "tokenizer" if cfg.tokenizer_type == "unigram" else f"tokenizer_{cfg.tokenizer_type}"
    return Path(cfg.data.manifest_dir) / folder / "tokenizer.model"


def from_dict(cls: type, data: Any, path: str = "") -> Any:
    """Build dataclass ``cls`` from nested plain dicts, checking every key and scalar type.

    Unknown keys raise ``ConfigError`` listing the valid ones, so a typo in an override is caught at
    start-up instead of silently ignored.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls} is not a dataclass")
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ConfigError(f"{path or cls.__name__}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in {path or cls.__name__}; valid keys: {sorted(fields)}")
    kwargs = {name: _convert(hints[name], value, f"{path}.{name}" if path else name) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:  # a value the dataclass itself refuses (its message names it)
        raise ConfigError(str(e)) from e


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, path)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{path}: {value!r} fits none of {tp}: {errors}")
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{path}: {value!r} is not one of {typing.get_args(tp)}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"{path}: expected {len(args)} values, got {list(value)}")
        return tuple(_convert(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin is list:
        (arg,) = typing.get_args(tp)
        return [_convert(arg, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, float) and not math.isfinite(value):
        # NaN passes every range check (all comparisons are false), inf most upper bounds.
        raise ConfigError(f"{path} must be a finite number, got {value}")
    if tp in (int, float, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ConfigError(f"{path}: expected {tp.__name__}, got {value!r}")
        return value
    return value


def to_dict(cfg: Any) -> Any:
    """Dataclass -> plain nested dict (tuples become lists), for saving next to checkpoints."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg
