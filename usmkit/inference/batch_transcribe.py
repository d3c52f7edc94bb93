"""Batch transcription of archives: files of any length to JSONL (``python -m usmkit.cli.transcribe_batch``).

::

    inputs (folder | file list | cuts manifest)          usmkit.inference.batch_inputs
      -> sorted by duration, this rank's share, batches   (plan_units)
      -> DataLoader workers: audio decoding, features     usmkit.inference.batch_audio
      -> device: encoder (bf16, compiled), CTC            usmkit.inference.batch_runner
         greedy on the device | lexicon beam search in CPU processes (usmkit.inference.lexicon_pool)
      -> words, times, confidences                        usmkit.inference.word_alignment
      -> OUT.jsonl, appended line by line                 usmkit.inference.transcript_journal
         (+ one SRT per input, one CTM at the end)        usmkit.inference.subtitles

Each line of ``OUT`` is one input::

    {"id": "talks/day1.flac", "path": "/data/talks/day1.flac", "duration": 3605.12,
     "text": "good morning ...", "confidence": 0.9312,
     "words": [{"word": "good", "start": 0.48, "end": 0.72, "confidence": 0.9871}, ...]}

Times are seconds from the start of the input (or of the cut, for a manifest), ``confidence`` is
defined in ``usmkit.inference.word_alignment``. A rerun with the same ``out`` transcribes only the
inputs whose id is not in it yet; inputs that cannot be read are reported, counted and left out (a
rerun tries them again). Under ``torchrun`` each process takes every ``world``-th input of the
duration-sorted list and writes its own part; rank 0 merges them into ``OUT`` at the end.

Files longer than ``long_seconds`` are encoded alone, in windows of whole chunks with their context
(``usmkit.streaming.windowed``: the full forward's frames in flat memory). That needs chunk-wise
attention with bounded history (``chunk_size`` set, ``left_chunks >= 0``); a full-attention model
encodes each file at once, and files longer than its attention can hold are left out with a pointer.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from usmkit.checkpointing.atomic import replaced_atomically
from usmkit.checkpointing.output_dir import check_apart, check_output
from usmkit.config import ConfigError
from usmkit.data.validate import Problem, ValidationReport
from usmkit.decoding.ctc_lexicon import LexiconConfig
from usmkit.errors import UsageError
from usmkit.inference.batch_audio import AudioBatch, BatchAudioDataset, FailedItem, FbankFrontEnd, LongPiece
from usmkit.inference.batch_inputs import AudioItem, BatchUnit, LongUnit, find_inputs, output_name, plan_units
from usmkit.inference.batch_runner import DeviceRunner, compile_encoder
from usmkit.inference.lexicon_pool import LexiconPool
from usmkit.inference.ranks import Ranks
from usmkit.inference.subtitles import ctm_lines, srt
from usmkit.inference.transcript_journal import (
    JournalWriter,
    check_journal,
    done_ids,
    merge,
    part_path,
    read_records,
)
from usmkit.inference.word_alignment import Transcript
from usmkit.metrics import TextNormConfig
from usmkit.runs import lexicon_texts
from usmkit.streaming.pipeline import FULL_ATTENTION_BYTES, LoadedModel, ModelError, load_model

log = logging.getLogger(__name__)

DECODES = ("ctc_greedy", "ctc_lexicon")
FEATURES = ("auto", "workers", "device")
PRECISIONS = ("auto", "bf16", "fp32")


@dataclass(frozen=True)
class BatchConfig:
    """What ``transcribe_batch`` reads, writes and how (``python -m usmkit.cli.transcribe_batch`` keys).

    - ``batch_seconds``: audio per batch, padding included (rows x the longest row's seconds).
    - ``features``: where log-mel features are computed: ``workers`` (the DataLoader processes),
      ``device`` (the main process, on the GPU: the workers only decode audio), ``auto`` (device on
      CUDA, else workers).
    - ``precision``: ``auto`` = bf16 autocast on CUDA, fp32 on the CPU.
    - ``long_seconds``: longer files are encoded alone, window by window (chunk-wise models).
    - ``chunk_size`` / ``left_chunks``: ``default`` = the checkpoint's mask; another one (``null`` = full
      attention) decodes the same weights under it (an approximation).
    - ``pin_memory``: on CUDA, the loader page-locks each batch so that its copy to the device does not wait.
    - ``lexicon_workers``: CPU processes for ``decode=ctc_lexicon`` (0: in the main process).
    - ``bias_phrases``: with ``decode=ctc_lexicon``, a file of phrases to favour, ``phrase[<TAB>boost]`` a
      line (contextual biasing, ``usmkit.decoding.biasing``).
    - ``wait_timeout_s``: several processes: how long rank 0 waits for the slowest rank at the end.
    """

    checkpoint: str = ""
    inputs: str = ""
    out: str = ""
    srt_dir: str | None = None
    ctm: str | None = None
    decode: str = "ctc_greedy"
    lexicon: LexiconConfig = field(default_factory=LexiconConfig)
    bias_phrases: str | None = None
    lexicon_workers: int = 2
    device: str = "auto"
    precision: str = "auto"
    compile: bool = False
    batch_seconds: float = 600.0
    max_batch_size: int = 128
    num_workers: int = 2
    pin_memory: bool = True
    features: str = "auto"
    long_seconds: float = 60.0
    window_chunks: int | None = None
    chunk_size: int | str | None = "default"
    left_chunks: int | str = "default"
    progress: bool = True
    wait_timeout_s: float = 86400.0

    def check(self) -> None:
        """``ConfigError`` naming the first key that cannot be used."""
        for key, hint in (("checkpoint", "a checkpoint or experiment dir"), ("inputs", "a folder, file list or "
                          "manifest"), ("out", "the JSONL file to write")):  # fmt: skip
            if not getattr(self, key):
                raise ConfigError(f"{key}= is required: pass {hint} (python -m usmkit.cli.transcribe_batch --help)")
        for key, allowed in (("decode", DECODES), ("features", FEATURES), ("precision", PRECISIONS)):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"{key}={getattr(self, key)}: choose one of {', '.join(allowed)}")
        for key in ("batch_seconds", "long_seconds", "wait_timeout_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key}={getattr(self, key)} must be > 0 seconds")
        for key in ("max_batch_size",):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}={getattr(self, key)} must be >= 1")
        for key in ("num_workers", "lexicon_workers"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key}={getattr(self, key)} must be >= 0")
        if isinstance(self.chunk_size, str) and self.chunk_size != "default":
            raise ConfigError(f"chunk_size={self.chunk_size}: an int, null (full attention) or default")
        if isinstance(self.left_chunks, str) and self.left_chunks != "default":
            raise ConfigError(f"left_chunks={self.left_chunks}: an int (-1 = all history) or default")
        if self.bias_phrases and self.decode != "ctc_lexicon":
            raise ConfigError(
                f"bias_phrases={self.bias_phrases} boosts phrases in the lexicon search: add decode=ctc_lexicon"
            )
        if Path(self.out).is_dir():
            raise ConfigError(
                f"out={self.out} is a folder; pass the JSONL file to write, e.g. out={self.out}/out.jsonl"
            )


def check_outputs(cfg: BatchConfig, home: tuple[Path, ...] = ()) -> None:
    """Refuse, before any work, an ``out=``, ``ctm=`` or ``srt_dir=`` that would replace what is not this
    command's own (``usmkit.checkpointing.output_dir.check_output``): a path that is, contains or lies inside
    ``inputs=``, the checkpoint or another output, or lies inside other usmkit work (``home``: a folder the
    caller owns, e.g. pseudo-labelling's corpus); an existing ``out`` that is not a transcript of ours, a
    ``ctm`` that is not a CTM file, an ``srt_dir`` holding other files than SubRip ones."""
    inputs = [(f"{k}={getattr(cfg, k)}", Path(getattr(cfg, k))) for k in ("inputs", "checkpoint", "bias_phrases")
              if getattr(cfg, k)]  # fmt: skip
    check_journal(Path(cfg.out))  # a rerun appends to it: only to a transcript file of ours
    check_output(Path(cfg.out), option="out=", own_words="a transcript", own=lambda p: True, folder=False,
                 inputs=inputs, home=home)  # fmt: skip
    taken = [(f"out={cfg.out}", Path(cfg.out))]
    if cfg.ctm:
        check_output(Path(cfg.ctm), option="ctm=", own_words="a CTM file of ours", own=is_ctm, folder=False,
                     inputs=inputs + taken, home=home)  # fmt: skip
        taken.append((f"ctm={cfg.ctm}", Path(cfg.ctm)))
    if cfg.srt_dir:
        check_output(Path(cfg.srt_dir), option="srt_dir=", own_words="a folder of SubRip files", own=is_srt_dir,
                     folder=True, inputs=inputs + taken, home=home)  # fmt: skip


def is_ctm(path: Path) -> bool:
    """Whether ``path`` begins as a CTM file (``usmkit.inference.subtitles.ctm_lines``): its first line is
    ``<id> 1 <start> <duration> <word> <confidence>``."""
    try:
        with path.open("rb") as f:
            fields = f.readline(4096).decode("utf-8").split()
        return len(fields) == 6 and fields[1] == "1" and all(float(fields[k]) >= 0 for k in (2, 3, 5))
    except (OSError, UnicodeDecodeError, ValueError):
        return False


def is_srt_dir(folder: Path) -> bool:
    """Whether every file under ``folder`` is a SubRip file (or a temporary file of one being written)."""
    return all(p.suffix == ".srt" or p.name.startswith(".tmp-") for p in folder.rglob("*") if not p.is_dir())


@dataclass
class BatchSummary:
    """What a run did (all ranks' totals on rank 0; this rank's elsewhere)."""

    out: Path
    transcribed: int  # inputs transcribed by this run
    already_done: int  # inputs skipped because ``out`` had them
    report: ValidationReport  # inputs left out, with why
    audio_seconds: float  # of the inputs transcribed by this run
    wall_seconds: float  # from the first batch to the last line written (the slowest rank's)
    records: int = 0  # lines of ``out`` after the run (rank 0)
    setup_seconds: float = 0.0  # loading the checkpoint and compiling the encoder, before the first batch
    loader_wait_seconds: float = 0.0  # of wall_seconds, waiting for the loader's workers (the slowest rank's)

    @property
    def rtfx(self) -> float:
        """Audio seconds transcribed per wall-clock second."""
        return self.audio_seconds / self.wall_seconds if self.wall_seconds > 0 else float("nan")


def transcribe_batch(cfg: BatchConfig, *, home: tuple[Path, ...] = ()) -> BatchSummary:
    """Transcribe every input of ``cfg.inputs`` not yet in ``cfg.out`` (see the module docstring). ``home``:
    folders of the caller's own that the outputs may lie in (``check_outputs``)."""
    cfg.check()
    check_outputs(cfg, home)
    ranks = Ranks.from_env(cfg.wait_timeout_s)
    try:
        return _run(cfg, ranks)
    finally:
        ranks.close()


def load_checkpoint(cfg: BatchConfig, device: torch.device) -> tuple[LoadedModel, int | None, int]:
    """The checkpoint ready to transcribe, and the mask (chunk_size, left_chunks) it runs under."""
    try:
        loaded = load_model(cfg.checkpoint, device)
    except ModelError as e:
        raise UsageError(str(e)) from e
    enc_cfg = loaded.model.encoder.cfg
    C = enc_cfg.chunk_size if cfg.chunk_size == "default" else cfg.chunk_size
    K = enc_cfg.left_chunks if cfg.left_chunks == "default" else cfg.left_chunks
    if (C, K) != (enc_cfg.chunk_size, enc_cfg.left_chunks):
        log.warning(
            "decoding under chunk_size=%s, left_chunks=%s; the model was trained with chunk_size=%s, left_chunks=%s: "
            "an approximation, expect more errors",
            C, K, enc_cfg.chunk_size, enc_cfg.left_chunks,
        )  # fmt: skip
    return loaded, C, K


def max_full_attention_seconds(num_heads: int, frame_s: float) -> float:
    """The longest input a full-attention encoder takes at once (``usmkit.streaming.pipeline.FULL_ATTENTION_BYTES``)."""
    return math.isqrt(FULL_ATTENTION_BYTES // (8 * num_heads + 1)) * frame_s


@dataclass(frozen=True)
class _Plan:
    items: list[AudioItem]  # not yet in out
    report: ValidationReport
    already_done: int


def _plan(cfg: BatchConfig, max_seconds: float | None) -> _Plan:
    """The inputs not yet in ``cfg.out``; with ``max_seconds`` (full attention), longer ones are left out."""
    items, report = find_inputs(cfg.inputs)
    check_outputs_apart(cfg, items)
    done = done_ids(Path(cfg.out))
    pending = [i for i in items if i.id not in done]
    already_done = len(items) - len(pending)
    if max_seconds is not None:
        fits = []
        for item in pending:
            if item.duration <= max_seconds:
                fits.append(item)
                continue
            report.problems.append(
                Problem(
                    "too long for full attention",
                    item.path,
                    f"{item.duration:.0f} s, but this full-attention model encodes at most {max_seconds:.0f} s at "
                    "once; pass chunk_size=N left_chunks=K to encode it in windows (an approximation for this "
                    "model) or split the file",
                )
            )
        pending = fits
    return _Plan(pending, report, already_done)


def check_outputs_apart(cfg: BatchConfig, items: list[AudioItem]) -> None:
    """``UsageError`` where ``srt_dir=`` is, contains or lies inside the folder of an input file (a manifest's
    cuts may name files anywhere; ``ctm=`` over an input file is refused by ``check_outputs``: not a CTM file)."""
    if cfg.srt_dir:
        folders = {Path(i.path).parent for i in items}
        check_apart(
            Path(cfg.srt_dir),
            f"srt_dir={cfg.srt_dir}",
            [(f"the folder of input files {f}", f) for f in folders],
            folder=True,
        )


def _run(cfg: BatchConfig, ranks: Ranks) -> BatchSummary:
    setup_start = time.perf_counter()  # loading, planning, compiling: before the first batch
    bias = _bias_phrases(cfg)
    device = ranks.device(cfg.device)
    loaded, C, K = load_checkpoint(cfg, device)
    model, tokenizer = loaded.model, loaded.tokenizer
    features = loaded.cfg.data.features
    frame_s = model.encoder.subsampling_factor * features.frame_shift_ms / 1000.0
    windowed = C is not None and C > 0 and K >= 0
    max_seconds = None if windowed else max_full_attention_seconds(model.encoder.cfg.num_heads, frame_s)
    plan = ranks.share(lambda: _plan(cfg, max_seconds))
    for p in plan.report.problems:
        if ranks.rank == 0:
            log.warning("skipped %s: %s (%s)", p.name, p.kind, p.detail)
    units = plan_units(
        plan.items,
        rank=ranks.rank,
        world=ranks.world,
        batch_seconds=cfg.batch_seconds,
        max_batch_size=cfg.max_batch_size,
        long_seconds=cfg.long_seconds if windowed else None,
    )
    if cfg.compile:
        compile_encoder(model.encoder)
    on_device = cfg.features == "device" or (cfg.features == "auto" and device.type == "cuda")
    out = Path(cfg.out)
    writer = JournalWriter(out if ranks.world == 1 else part_path(out, ranks.rank))
    sink = _Sink(writer, cfg.srt_dir, sum(_seconds(u) for u in units), cfg.progress and ranks.rank == 0)
    pool = None
    try:
        pool = _lexicon_pool(cfg, loaded, frame_s, bias) if cfg.decode == "ctc_lexicon" else None
        runner = DeviceRunner(
            model,
            tokenizer,
            chunk_size=C,
            left_chunks=K,
            device=device,
            precision=cfg.precision,
            frame_s=frame_s,
            emit=sink.emit,
            front_end=FbankFrontEnd(features, loaded.stats).to(device) if on_device else None,
            pool=pool,
            window_chunks=cfg.window_chunks,
        )
        if cfg.compile and units:
            rows, seconds = largest_batch(units, cfg.long_seconds)
            frames = round(seconds * 1000 / features.frame_shift_ms)
            runner.warm_up(rows, max(frames, 100), features.num_mel_bins)
        workers = min(cfg.num_workers, len(units))
        loader = torch.utils.data.DataLoader(
            BatchAudioDataset(
                units, features, loaded.stats, None if on_device else FbankFrontEnd(features, loaded.stats)
            ),
            batch_size=None,
            num_workers=workers,
            pin_memory=cfg.pin_memory and device.type == "cuda",
            prefetch_factor=4 if workers else None,
        )
        start = sink.start = time.perf_counter()  # RTFx counts from the first batch on
        failures, loader_wait = _transcribe(loader, runner, sink, writer)
    finally:
        writer.close()
        sink.close()
        if pool is not None:
            pool.close()
    setup = start - setup_start
    wall = time.perf_counter() - start
    mine = BatchSummary(
        out, sink.count, plan.already_done, ValidationReport(problems=failures), sink.seconds, wall, setup_seconds=setup,
        loader_wait_seconds=loader_wait,
    )  # fmt: skip
    everyone = ranks.gather(mine)
    if ranks.rank != 0:
        return mine
    report = plan.report
    for s in everyone:
        report.problems += s.report.problems
    summary = BatchSummary(
        out,
        sum(s.transcribed for s in everyone),
        plan.already_done,
        report,
        sum(s.audio_seconds for s in everyone),
        max(s.wall_seconds for s in everyone),
        setup_seconds=max(s.setup_seconds for s in everyone),
        loader_wait_seconds=max(s.loader_wait_seconds for s in everyone),
    )
    summary.records = merge(out)
    if cfg.ctm:
        with replaced_atomically(cfg.ctm) as tmp, tmp.open("w", encoding="utf-8") as f:
            f.writelines(ctm_lines(read_records(out)))
    return summary


def _transcribe(loader, runner: DeviceRunner, sink: _Sink, writer: JournalWriter) -> tuple[list[Problem], float]:
    """Everything the loader yields through the runner into the sink; returns the inputs that failed and the
    seconds spent waiting for the loader."""
    failures: list[Problem] = []
    finish_previous = None
    waited = 0.0
    batches = iter(loader)
    while True:
        asked = time.perf_counter()
        x = next(batches, None)
        waited += time.perf_counter() - asked
        if x is None:
            break
        if isinstance(x, AudioBatch):
            failures += [sink.fail(f) for f in x.failed]
            finish = runner.batch(x)  # launched on the device; the previous batch is finished meanwhile
            if finish_previous is not None:
                finish_previous()
            finish_previous = finish
        elif isinstance(x, LongPiece):
            runner.long_piece(x)
        else:
            runner.drop(x.item.id)
            failures.append(sink.fail(x))
        runner.poll()
        writer.flush()
    if finish_previous is not None:
        finish_previous()
    runner.poll(wait=True)
    writer.flush()
    return failures, waited


def largest_batch(units: list[BatchUnit | LongUnit], long_seconds: float) -> tuple[int, float]:
    """Rows and padded seconds (the longest row's) of the batch with the most padded audio; a long file's
    pieces count as one row of at most ``long_seconds``."""

    def shape(unit: BatchUnit | LongUnit) -> tuple[int, float]:
        if isinstance(unit, LongUnit):
            return 1, min(unit.item.duration, long_seconds)
        return len(unit.items), max(i.duration for i in unit.items)

    return max((shape(u) for u in units), key=lambda s: s[0] * s[1])


def _seconds(unit: BatchUnit | LongUnit) -> float:
    return unit.item.duration if isinstance(unit, LongUnit) else sum(i.duration for i in unit.items)


def _lexicon_pool(cfg: BatchConfig, loaded: LoadedModel, frame_s: float, bias=()) -> LexiconPool:
    """The lexicon and word LM of the checkpoint's training transcripts, as ``usmkit.cli.evaluate decode=ctc_lexicon``
    builds them, decoded by ``cfg.lexicon_workers`` processes."""
    try:
        texts = lexicon_texts(loaded.cfg, TextNormConfig())
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(
            f"decode=ctc_lexicon builds its words from the training transcripts of {loaded.checkpoint}, which could "
            f"not be read: {e}"
        ) from e
    return LexiconPool(loaded.tokenizer, texts, cfg.lexicon, frame_s, cfg.lexicon_workers, bias)


def _bias_phrases(cfg: BatchConfig) -> tuple:
    """The phrases of ``cfg.bias_phrases`` (read before anything else, so a bad file stops the run at once)."""
    if not cfg.bias_phrases:
        return ()
    from usmkit.decoding.biasing import read_bias_phrases

    if cfg.lexicon.lm_weight <= 0:
        raise ConfigError("bias_phrases adds to the word LM's score: use lexicon.lm_weight > 0")
    return read_bias_phrases(cfg.bias_phrases)


class _Sink:
    """Where finished inputs go: a JSONL line, an SRT file, the progress bar (audio seconds, RTFx, ETA)."""

    def __init__(self, writer: JournalWriter, srt_dir: str | None, total_seconds: float, progress: bool) -> None:
        from tqdm import tqdm

        self.writer = writer
        self.srt_dir = Path(srt_dir) if srt_dir else None
        self.count, self.seconds = 0, 0.0
        self.passed = 0.0  # audio seconds transcribed or failed
        self.start = time.perf_counter()
        self.bar = tqdm(  # counts milliseconds (integers: float sums overshoot the total), shows seconds
            total=round(total_seconds * 1000),
            unit_scale=1e-3,
            bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} audio s [{elapsed}<{remaining}{postfix}]",
            disable=not progress,
            file=sys.stderr,
            dynamic_ncols=True,
        )

    def emit(self, item: AudioItem, transcript: Transcript) -> None:
        record = {
            "id": item.id,
            "path": item.path,
            "duration": round(item.duration, 3),
            "text": transcript.text,
            "confidence": round(transcript.confidence, 4),
            "words": [w.as_dict() for w in transcript.words],
        }
        self.writer.write(record)
        if self.srt_dir is not None:
            with replaced_atomically(self.srt_dir / output_name(item.id, ".srt")) as tmp:
                tmp.write_text(srt(record), encoding="utf-8")
        self.count += 1
        self.seconds += item.duration
        self._advance(item.duration)

    def fail(self, failed: FailedItem) -> Problem:
        log.warning("skipped %s: %s", failed.item.path, failed.message)
        self._advance(failed.item.duration)
        return Problem("unreadable audio", failed.item.path, failed.message)

    def _advance(self, seconds: float) -> None:
        self.passed += seconds
        elapsed = time.perf_counter() - self.start
        if elapsed > 0:
            self.bar.set_postfix_str(f"RTFx {self.seconds / elapsed:.0f}", refresh=False)
        self.bar.update(round(self.passed * 1000) - self.bar.n)

    def close(self) -> None:
        self.bar.close()
