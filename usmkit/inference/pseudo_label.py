"""Pseudo-labels: a teacher's transcripts of unlabeled audio, kept above a confidence, as a corpus to train on.

``python -m usmkit.cli.pseudo_label checkpoint=TEACHER inputs=AUDIO out=DIR threshold=0.9``:

1. the teacher transcribes ``inputs`` (``usmkit.inference.batch_transcribe``: any folder, file list or
   cuts manifest; resumable) into ``DIR/{corpus}_transcripts_{split}.jsonl``, with a confidence per
   utterance (``usmkit.inference.word_alignment``);
2. utterances with ``confidence >= threshold`` and at least ``min_words`` words are kept; their text
   is normalized as every corpus recipe normalizes transcripts (``usmkit.metrics.normalize_text``);
3. they are written as a usmkit corpus in ``DIR`` (``{corpus}_{recordings,supervisions,cuts}_{split}
   .jsonl.gz``, ``usmkit.data.corpora.common.write_split``), each supervision keeping its confidence
   in ``custom``; what was kept in ``{corpus}_kept_{split}.json``; the teacher's tokenizer is copied to ``DIR/tokenizer/tokenizer.model`` (where the
   trainer looks for a corpus's own), so ``python -m usmkit.cli.train data.manifest_dir=DIR
   data.corpus={corpus}`` trains on it with the teacher's pieces.

Calibration (``calibrate=true``) picks the threshold: on a labeled cuts manifest whose transcripts the
teacher does not see, the pseudo-labels' WER against the threshold, with the share of utterances and
hours each threshold keeps, as JSON and a plot (``DIR/{corpus}_calibration_{split}.json`` / ``.png``).
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from lhotse import CutSet, MonoCut, Recording, RecordingSet, SupervisionSegment, SupervisionSet

from usmkit.checkpointing.atomic import replaced_atomically
from usmkit.checkpointing.output_dir import check_output_dir, corpus_names
from usmkit.config import ConfigError
from usmkit.data.corpora.common import write_split
from usmkit.data.dataset import cut_text
from usmkit.data.manifests import manifest_path
from usmkit.data.sampling import cut_language, cut_speaker
from usmkit.data.tokenizer import MODEL_FILE
from usmkit.decoding.ctc_lexicon import LexiconConfig
from usmkit.errors import UsageError
from usmkit.inference.batch_inputs import AudioItem, find_inputs
from usmkit.inference.batch_transcribe import BatchConfig, BatchSummary, transcribe_batch
from usmkit.inference.transcript_journal import read_records
from usmkit.metrics import normalize_text, score
from usmkit.runs import load_trained

log = logging.getLogger(__name__)

DEFAULT_THRESHOLDS = tuple(round(0.05 * i, 2) for i in range(20)) + (0.96, 0.97, 0.98, 0.99)


@dataclass(frozen=True)
class PseudoLabelConfig:
    """``python -m usmkit.cli.pseudo_label`` keys. The transcription keys (``decode`` ... ``progress``) are
    those of ``usmkit.inference.batch_transcribe.BatchConfig``."""

    checkpoint: str = ""  # the teacher
    inputs: str = ""  # audio to label: a folder, a file list or a cuts manifest (calibrate: a labeled manifest)
    out: str = ""  # the corpus folder to write
    threshold: float = 0.9  # keep utterances whose confidence is at least this
    corpus: str = "pseudo"  # manifests' corpus name: {corpus}_cuts_{split}.jsonl.gz
    split: str = "train"
    language: str = "en"  # for inputs whose manifest names none
    min_words: int = 1  # keep utterances with at least this many words
    calibrate: bool = False  # instead: WER of the pseudo-labels against the threshold on a labeled manifest
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS  # the calibration's grid
    decode: str = "ctc_greedy"
    lexicon: LexiconConfig = field(default_factory=LexiconConfig)
    lexicon_workers: int = 2
    device: str = "auto"
    precision: str = "auto"
    compile: bool = False
    batch_seconds: float = 600.0
    num_workers: int = 2
    progress: bool = True

    def check(self) -> None:
        for key in ("checkpoint", "inputs", "out"):
            if not getattr(self, key):
                raise ConfigError(f"{key}= is required (python -m usmkit.cli.pseudo_label --help)")
        if not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"threshold={self.threshold} must lie in [0, 1] (a confidence)")
        if not self.thresholds or any(not 0.0 <= t <= 1.0 for t in self.thresholds):
            raise ConfigError(f"thresholds={list(self.thresholds)} must be confidences in [0, 1]")
        try:
            manifest_path(self.out, self.corpus, "cuts", self.split)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def transcripts(self) -> Path:
        """The teacher's JSONL: ``{corpus}_transcripts_{split}.jsonl`` (calibration: ``_calibration_``)."""
        kind = "calibration" if self.calibrate else "transcripts"
        return Path(self.out) / f"{self.corpus}_{kind}_{self.split}.jsonl"

    def batch_config(self) -> BatchConfig:
        """The transcription of ``inputs`` into ``transcripts()``."""
        return BatchConfig(
            checkpoint=self.checkpoint,
            inputs=self.inputs,
            out=str(self.transcripts()),
            decode=self.decode,
            lexicon=self.lexicon,
            lexicon_workers=self.lexicon_workers,
            device=self.device,
            precision=self.precision,
            compile=self.compile,
            batch_seconds=self.batch_seconds,
            num_workers=self.num_workers,
            progress=self.progress,
        )


@dataclass(frozen=True)
class PseudoLabels:
    """What ``pseudo_label`` wrote: how many utterances (and hours) it kept of how many."""

    transcription: BatchSummary
    total: int
    kept: int
    kept_hours: float
    total_hours: float
    cuts: Path


def select(records: list[dict], threshold: float, min_words: int = 1) -> list[dict]:
    """The records with ``confidence >= threshold`` and at least ``min_words`` words (and some text)."""
    return [
        r
        for r in records
        if r["confidence"] >= threshold and len(r["words"]) >= min_words and normalize_text(r["text"])
    ]


def check_out(cfg: PseudoLabelConfig) -> None:
    """Refuse, before any work, an ``out=`` that is, contains or lies inside ``inputs=`` or the teacher, lies
    inside other usmkit work, or holds other work than this command's own (``is_pseudo_corpus``; with
    ``calibrate=true``, any folder of corpus ``cfg.corpus``): a labelled corpus whose name is passed as
    ``corpus=`` is refused, not overwritten (``usmkit.checkpointing.output_dir``)."""
    corpus, split = cfg.corpus, cfg.split
    if cfg.calibrate:
        own, words = (lambda p: corpus_names(p) == {corpus}), f"the corpus folder of {corpus}"
    else:
        own, words = (lambda p: is_pseudo_corpus(p, corpus, split)), f"the pseudo-labels of corpus {corpus}"
    check_output_dir(
        Path(cfg.out), option="out=", own_kind="corpus", own_words=words, own=own, replaces=False,
        inputs=[(f"inputs={cfg.inputs}", Path(cfg.inputs)), (f"checkpoint={cfg.checkpoint}", Path(cfg.checkpoint))],
    )  # fmt: skip


def is_pseudo_corpus(folder: Path, corpus: str, split: str) -> bool:
    """Whether ``folder`` holds the manifests of ``corpus`` alone and those of ``split``, where it has them,
    are pseudo-labels of this module (the teacher's transcripts or ``{corpus}_kept_{split}.json`` beside
    them), not a labelled corpus that the pseudo-labels would replace."""
    if corpus_names(folder) != {corpus}:
        return False
    if not any(manifest_path(folder, corpus, kind, split).exists() for kind in ("cuts", "recordings", "supervisions")):
        return True
    return (folder / f"{corpus}_kept_{split}.json").is_file() or (
        folder / f"{corpus}_transcripts_{split}.jsonl"
    ).is_file()


def pseudo_label(cfg: PseudoLabelConfig) -> PseudoLabels | None:
    """Transcribe, filter and write the corpus (see the module docstring). Under ``torchrun`` every process
    transcribes its share and rank 0 alone writes the corpus (the others return None)."""
    cfg.check()
    check_out(cfg)
    summary = transcribe_batch(cfg.batch_config(), home=(Path(cfg.out),))
    if _rank() != 0:
        return None
    items = {i.id: i for i in find_inputs(cfg.inputs)[0]}
    records = [r for r in read_records(cfg.transcripts()) if r["id"] in items]
    kept = select(records, cfg.threshold, cfg.min_words)
    if not kept:
        raise UsageError(
            f"threshold={cfg.threshold} keeps none of the {len(records)} utterances (their confidences range from "
            f"{min((r['confidence'] for r in records), default=0):.3f} to "
            f"{max((r['confidence'] for r in records), default=0):.3f}); lower it (calibrate=true helps choose)"
        )
    cuts, recordings, supervisions = pseudo_cuts(kept, items, cfg.corpus, cfg.language, cfg.checkpoint)
    write_split(cfg.out, cfg.corpus, cfg.split, cuts, recordings=recordings, supervisions=supervisions)
    _copy_tokenizer(cfg.checkpoint, Path(cfg.out))
    result = PseudoLabels(
        summary,
        total=len(records),
        kept=len(kept),
        kept_hours=sum(c.duration for c in cuts) / 3600,
        total_hours=sum(r["duration"] for r in records) / 3600,
        cuts=manifest_path(cfg.out, cfg.corpus, "cuts", cfg.split),
    )
    with replaced_atomically(Path(cfg.out) / f"{cfg.corpus}_kept_{cfg.split}.json") as tmp:
        info = {k: v for k, v in asdict(result).items() if k != "transcription"}
        tmp.write_text(
            json.dumps({"teacher": cfg.checkpoint, "threshold": cfg.threshold, **info}, indent=2, default=str)
        )
    return result


def pseudo_cuts(
    records: list[dict], items: dict[str, AudioItem], corpus: str, language: str, teacher: str
) -> tuple[CutSet, RecordingSet, SupervisionSet]:
    """Cuts (with their supervision), recordings and supervisions of the kept ``records``: a file input
    becomes a recording of its own; a cut of a manifest keeps its recording, offset and speaker."""
    cuts, recordings, supervisions, ids = [], {}, [], {}
    for record in records:
        item = items[record["id"]]
        cut_id = f"{corpus}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', item.id)}"
        if cut_id in ids:
            raise UsageError(f"inputs {ids[cut_id]} and {item.id} both become cut {cut_id}; rename one of them")
        ids[cut_id] = item.id
        if item.cut is not None:
            recording, start, channel = item.cut.recording, item.cut.start, item.cut.channel
            speaker, lang = cut_speaker(item.cut), cut_language(item.cut) or language
        else:
            recording = Recording.from_file(item.path, recording_id=cut_id)
            start, channel, speaker, lang = 0.0, 0, None, language
        duration = item.duration if item.cut is not None else recording.duration
        sup = SupervisionSegment(
            id=cut_id,
            recording_id=recording.id,
            start=start,
            duration=duration,
            channel=channel,
            text=normalize_text(record["text"]),
            language=lang,
            speaker=speaker,
            custom={"confidence": record["confidence"], "teacher": teacher},
        )
        supervisions.append(sup)
        recordings[recording.id] = recording
        cuts.append(
            MonoCut(cut_id, start, duration, channel, recording=recording, supervisions=[replace(sup, start=0.0)])
        )
    return (
        CutSet.from_cuts(cuts),
        RecordingSet.from_recordings(recordings.values()),
        SupervisionSet.from_segments(supervisions),
    )


def _rank() -> int:
    """This process's rank under ``torchrun`` (0 without it): rank 0 alone writes what follows the transcripts."""
    return int(os.environ.get("RANK", "0"))


def _copy_tokenizer(checkpoint: str, out: Path) -> None:
    """The teacher's sentencepiece model as the corpus's own (``out/tokenizer/tokenizer.model``), unless
    the folder has one already."""
    target = out / "tokenizer" / MODEL_FILE
    if target.is_file():
        return
    _, _, tokenizer, _ = load_trained(checkpoint, "cpu")
    with replaced_atomically(target) as tmp:
        tmp.write_bytes(tokenizer.model_proto)


# ------------------------------------------------------------------------------------------------ calibration
@dataclass(frozen=True)
class CalibrationPoint:
    """The pseudo-labels kept at ``threshold``: how many, their share, and their WER / CER against the
    held-back references (None when none is kept)."""

    threshold: float
    kept: int
    kept_fraction: float  # of the utterances
    kept_hours_fraction: float  # of the audio
    wer: float | None
    cer: float | None


def calibration(records: list[dict], refs: dict[str, str], thresholds: tuple[float, ...]) -> list[CalibrationPoint]:
    """WER / CER of the records kept at each threshold (``confidence >= threshold``) against ``refs``
    (id -> reference text); texts normalized as scoring normalizes them. Every record is scored (an
    empty transcript counts its reference's words as deletions)."""
    total = len(records)
    hours = sum(r["duration"] for r in records)
    points = []
    for t in sorted(thresholds):
        kept = [r for r in records if r["confidence"] >= t]
        stats = (
            score([normalize_text(refs[r["id"]]) for r in kept], [normalize_text(r["text"]) for r in kept])
            if kept
            else None
        )
        points.append(
            CalibrationPoint(
                threshold=t,
                kept=len(kept),
                kept_fraction=len(kept) / total if total else 0.0,
                kept_hours_fraction=sum(r["duration"] for r in kept) / hours if hours else 0.0,
                wer=stats.wer if stats else None,
                cer=stats.cer if stats else None,
            )
        )
    return points


def calibrate(cfg: PseudoLabelConfig) -> tuple[list[CalibrationPoint], Path, Path] | None:
    """Transcribe the labeled manifest ``cfg.inputs`` (its transcripts unseen by the teacher) and score the
    pseudo-labels per threshold; returns the points and the JSON and PNG written beside the transcripts
    (None on the other ranks under ``torchrun``)."""
    cfg.check()
    check_out(cfg)
    items, _ = find_inputs(cfg.inputs)
    refs = {i.id: cut_text(i.cut) for i in items if i.cut is not None}
    if len(refs) != len(items) or not any(refs.values()):
        raise UsageError(
            f"calibrate=true needs inputs= a labeled cuts manifest (its transcripts are the references), got {cfg.inputs}"
        )
    transcribe_batch(cfg.batch_config(), home=(Path(cfg.out),))
    if _rank() != 0:
        return None
    records = [r for r in read_records(cfg.transcripts()) if r["id"] in refs]
    points = calibration(records, refs, cfg.thresholds)
    json_path, png_path = cfg.transcripts().with_suffix(".json"), cfg.transcripts().with_suffix(".png")
    with replaced_atomically(json_path) as tmp:
        tmp.write_text(
            json.dumps(
                {
                    "teacher": cfg.checkpoint,
                    "inputs": cfg.inputs,
                    "utterances": len(records),
                    "points": [asdict(p) for p in points],
                },
                indent=2,
            )  # fmt: skip
        )
    plot_calibration(points, png_path, title=f"pseudo-labels of {Path(cfg.checkpoint).name} on {Path(cfg.inputs).name}")
    return points, json_path, png_path


def plot_calibration(points: list[CalibrationPoint], path: Path, title: str = "") -> Path:
    """WER of the kept pseudo-labels (left axis) and the share kept (right axis) against the threshold, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    scored = [p for p in points if p.wer is not None]
    ax.plot([p.threshold for p in scored], [100 * p.wer for p in scored], "o-", color="tab:red", label="WER of kept")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("confidence threshold")
    ax.set_ylabel("WER of the kept pseudo-labels (%)", color="tab:red")
    share = ax.twinx()
    share.plot([p.threshold for p in points], [100 * p.kept_fraction for p in points], "s--", color="tab:blue",
               label="utterances kept")  # fmt: skip
    share.plot([p.threshold for p in points], [100 * p.kept_hours_fraction for p in points], ":", color="tab:blue",
               label="audio kept")  # fmt: skip
    share.set_ylabel("kept (%)", color="tab:blue")
    share.set_ylim(0, 105)
    lines = ax.get_lines() + share.get_lines()
    ax.legend(lines, [line.get_label() for line in lines], loc="lower left", fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    with replaced_atomically(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path
