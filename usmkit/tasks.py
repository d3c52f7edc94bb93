"""A task is one object: what ``task.kind`` means is decided here, once, and everything else asks the ``Task``.

    task = task_for(cfg.task)                 # the one branch on task.kind
    task.check(cfg, encoder_cfg)              # the settings that do not fit the task, before any data is read
    loader = task.train_loader(inputs)        # its training batches (``TrainInputs``)
    module = task.build(encoder_cfg, vocab)   # the module the recipe trains: Batch -> StepOutput
    dev_eval = task.dev_eval(dev_batches, tokenizer)

The training recipe (``usmkit.training.recipe``) and run loading (``usmkit.runs``) ask the task what it
reads (``text``), whether a CTC head reads the encoder (``ctc``), which checkpoint aligns its data
(``align_from``) and which of another stage's heads it takes (``init_heads``), instead of testing its kind.

Each kind's model, settings and their checks live beside the model: ``AsrModel`` (models/asr.py, ``ctc``
and ``las``), ``BestRQModel``, ``BestRQConfig`` and ``check_stack_frames`` (ssl/bestrq.py,
ssl/bestrq_config.py), ``MostModel``, ``MostConfig`` with ``check_run`` and MOST's three-stream loader
(ssl/most.py, ssl/most_config.py, ssl/most_data.py). The models do no I/O and read no data (the layer
contract in pyproject.toml), so what binds them to the config, the data loaders and the dev evaluation is
here, one small function per kind. A new task is its model (a new file), its settings in ``TaskConfig``
(config.py) and its function here, named in ``task_for``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Any

import torch
from lhotse import CutSet

from usmkit.config import TaskConfig, TrainConfig
from usmkit.data.batch import Batch
from usmkit.data.config import DataConfig
from usmkit.data.loader import make_loader
from usmkit.data.normalize import FeatureStats
from usmkit.data.tokenizer import Tokenizer
from usmkit.decoding.modes import decode_texts
from usmkit.metrics import normalize_text, score
from usmkit.models.asr import AsrHeadConfig, AsrModel
from usmkit.models.config import ConformerConfig
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.las import LASConfig
from usmkit.ssl.bestrq import BestRQModel, check_stack_frames
from usmkit.ssl.most import MostModel
from usmkit.ssl.most_data import build_most_loader

DevEval = Callable[[torch.nn.Module], dict[str, float]]  # the trainer's (usmkit.training.spec.DevEval)


@dataclass(frozen=True)
class TrainInputs:
    """What a task's training loader is built from (``Task.train_loader``)."""

    cuts: CutSet  # the training split's cuts, validated (from shards with data.shar_dir)
    data: DataConfig
    tokenizer: Tokenizer | None  # None for a task that reads no text
    stats: FeatureStats
    prepare: Callable[[str], CutSet]  # another split's validated cuts, audio only (MOST's unlabeled stream)
    seed: int
    accum_steps: int = 1  # micro-batches per optimizer step
    rank: int = 0
    world_size: int = 1
    pin_memory: bool = False
    pack_align: int = 1  # packed utterances start at multiples of the encoder's subsampling factor


def _no_check(cfg: TrainConfig, encoder_cfg: ConformerConfig) -> None:
    return None


def audio_batches(inputs: TrainInputs) -> Any:
    """One stream of training batches (``usmkit.data.loader.make_loader``): the split's audio, with its
    transcripts where the task reads text."""
    return make_loader(
        inputs.cuts,
        inputs.data,
        tokenizer=inputs.tokenizer,
        stats=inputs.stats,
        train=True,
        rank=inputs.rank,
        world_size=inputs.world_size,
        seed=inputs.seed,
        pin_memory=inputs.pin_memory,
        endless=True,  # the workers prefetch across epoch boundaries
        pack_align=inputs.pack_align,  # packed utterances start where the encoder strides
    )


@dataclass(frozen=True)
class Task:
    """One task kind with its settings bound (``task_for``): how its module is built, checked, fed and scored."""

    kind: str  # the config's task.kind, for messages
    build: Callable[[ConformerConfig, int], torch.nn.Module]  # (encoder config, vocabulary size) -> the module
    train_loader: Callable[[TrainInputs], Any] = audio_batches  # a resumable loader (usmkit.training.spec)
    # (train config, encoder config): ValueError (or UsageError) naming a setting that does not fit the task
    check: Callable[[TrainConfig, ConformerConfig], None] = _no_check
    text: bool = True  # reads transcripts: a tokenizer, text in the batches; False: audio only
    ctc: bool = True  # a CTC head reads the encoder: the CTC frame budget applies, dev WER is greedy CTC's
    align_from: str | None = None  # a trained CTC checkpoint whose alignments the task reads (frozen)
    # Loads what fits of another stage's weights into the task's heads; returns the keys loaded
    init_heads: Callable[[torch.nn.Module, dict[str, torch.Tensor]], list[str]] | None = None
    graphs_per_length: int = 1  # compiled graphs per padded audio length (2: text lengths vary too)

    def dev_eval(
        self, batches: Callable[[], Iterable[Batch]], tokenizer: Tokenizer | None, max_batches: int = 0
    ) -> DevEval:
        """The trainer's dev evaluation: the dev loss (every task) and, where a CTC head reads the encoder,
        the greedy-CTC WER and CER; over the first ``max_batches`` batches of ``batches()`` (0: all)."""
        wer = self.ctc

        def dev_eval(module: torch.nn.Module) -> dict[str, float]:
            device = next(module.parameters()).device
            total, n = 0.0, 0
            for batch in islice(batches(), max_batches or None):
                out = module(batch.to(device))
                total += float(out.loss) * batch.size
                n += batch.size
            results = {"dev_loss": total / max(n, 1)}
            if wer:
                refs, hyps = [], []
                for batch in islice(batches(), max_batches or None):
                    batch = batch.to(device)
                    hyps += decode_texts(module, batch.features, batch.feature_lens, tokenizer, "ctc_greedy")
                    refs += batch.texts
                stats = score([normalize_text(t) for t in refs], [normalize_text(t) for t in hyps])
                results |= {"dev_wer": stats.wer, "dev_cer": stats.cer}
            return results

        return dev_eval


# ---------------------------------------------------------------- one function per kind
def ctc_task(task: TaskConfig) -> Task:
    """CTC fine-tuning (stage 3): the encoder and a CTC head, with intermediate CTC where it is set."""
    return _asr_task(task, ctc_weight=1.0, las=None)


def las_task(task: TaskConfig) -> Task:
    """Joint CTC and attention (LAS) decoder, the CTC loss weighted by ``task.ctc_weight`` (0: attention only)."""
    return _asr_task(task, ctc_weight=task.ctc_weight, las=task.las)


def _asr_task(task: TaskConfig, ctc_weight: float, las: LASConfig | None) -> Task:
    head = AsrHeadConfig(
        ctc_weight=ctc_weight, las=las, inter_ctc_weight=task.inter_ctc_weight, inter_ctc_layer=task.inter_ctc_layer
    )

    def build(encoder_cfg: ConformerConfig, vocab_size: int) -> AsrModel:
        return AsrModel(ConformerEncoder(encoder_cfg), vocab_size, head)

    return Task(task.kind, build, ctc=ctc_weight > 0)


def bestrq_task(task: TaskConfig) -> Task:
    """BEST-RQ (stage 1): masked prediction of random-projection codes, on audio alone."""

    def build(encoder_cfg: ConformerConfig, vocab_size: int) -> BestRQModel:
        return BestRQModel(ConformerEncoder(encoder_cfg), task.bestrq, input_dim=encoder_cfg.input_dim)

    def check(cfg: TrainConfig, encoder_cfg: ConformerConfig) -> None:
        check_stack_frames(task.bestrq, encoder_cfg.subsampling_factor)

    return Task("bestrq", build, check=check, text=False, ctc=False)


def most_task(task: TaskConfig) -> Task:
    """MOST (stage 2): unlabeled audio, paired speech and text-only data in every step (three streams)."""
    most = task.most

    def build(encoder_cfg: ConformerConfig, vocab_size: int) -> MostModel:
        return MostModel(ConformerEncoder(encoder_cfg), vocab_size, most, task.bestrq, input_dim=encoder_cfg.input_dim)

    def train_loader(inputs: TrainInputs) -> Any:
        return build_most_loader(
            most,
            inputs.data,
            inputs.cuts,
            inputs.prepare,
            inputs.tokenizer,
            inputs.stats,
            seed=inputs.seed,
            batches_per_step=inputs.accum_steps,
            rank=inputs.rank,
            world_size=inputs.world_size,
            pin_memory=inputs.pin_memory,
        )

    def check(cfg: TrainConfig, encoder_cfg: ConformerConfig) -> None:
        most.check_run(
            encoder_cfg.num_layers,
            pack_to_frames=cfg.data.pack_to_frames,
            shar_dir=cfg.data.shar_dir,
            compiled=cfg.trainer.compile,
        )

    return Task(
        "most",
        build,
        train_loader=train_loader,
        check=check,
        align_from=most.align_from,
        init_heads=MostModel.init_heads_from,  # stage 1's BEST-RQ heads and quantizer, a MOST run's text encoder
        graphs_per_length=2,  # the text encoder's token lengths: at most as many as the frame lengths
    )


def task_for(task: TaskConfig) -> Task:
    """The ``Task`` of ``task.kind``, with ``task``'s settings bound."""
    if task.kind == "ctc":
        return ctc_task(task)
    if task.kind == "las":
        return las_task(task)
    if task.kind == "bestrq":
        return bestrq_task(task)
    if task.kind == "most":
        return most_task(task)
    raise ValueError(f"unknown task.kind {task.kind!r}; choose ctc, las, bestrq or most")


def build_task(task: TaskConfig, encoder_cfg: ConformerConfig, vocab_size: int) -> torch.nn.Module:
    """The module of ``task`` on an encoder of ``encoder_cfg`` (``task_for(task).build``)."""
    return task_for(task).build(encoder_cfg, vocab_size)
