"""Choosing lexicon decoding's settings on a dev set: a grid over LM order, LM weight and word score.

    tuning = tune_lexicon(EvalConfig(checkpoint="exp/an4"), LexiconGrid(orders=(1, 2)), split="dev")
    tuning.overrides()  # ["lexicon.order=2", "lexicon.lm_weight=1.0", "lexicon.word_score=0.0"]

Shapes: B batch, T' encoder frames, V vocabulary.

The split is read and run through the encoder once; only the lexicon beam search runs per grid point.
Each point decodes exactly as ``usmkit.inference.evaluate`` does with those settings (the same word
decoder, normalization and scoring), so the best point's WER is what ``python -m usmkit.cli.evaluate
... decode=ctc_lexicon`` reports on that split. What is held in memory between points is the split's
CTC log-probs (B, T', V) per batch, or, for an ensemble (whose members' candidates are rescored by all
members), its feature batches: tune on a dev set, not a training corpus. ``python -m
usmkit.cli.tune_lexicon`` runs it from the command line.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from usmkit.data.loader import split_loader
from usmkit.decoding.ctc_lexicon import LexiconConfig, LexiconDecoder
from usmkit.decoding.ensemble import CtcEnsemble
from usmkit.errors import UsageError
from usmkit.inference.batches import transcribe_batches
from usmkit.inference.evaluate import EvalConfig, LoadedModel, build_word_decoder, load_for_eval
from usmkit.metrics import normalize_text, score
from usmkit.runs import lexicon_texts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LexiconGrid:
    """The settings tried: every combination of ``orders`` x ``lm_weights`` x ``word_scores``."""

    orders: tuple[int, ...] = (1, 2)
    lm_weights: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0, 3.0)
    word_scores: tuple[float, ...] = (-2.0, 0.0, 2.0, 4.0)

    def __post_init__(self) -> None:
        for name in ("orders", "lm_weights", "word_scores"):
            if not getattr(self, name):
                raise ValueError(f"the lexicon grid's {name} is empty: give at least one value")
        bad = [o for o in self.orders if o not in (0, 1, 2)]
        if bad:
            raise ValueError(f"lexicon LM orders must be 0 (no LM), 1 or 2, got {bad}")
        for name in ("lm_weights", "word_scores"):
            bad = [v for v in getattr(self, name) if not math.isfinite(v)]
            if bad:
                raise ValueError(
                    f"{name}={list(getattr(self, name))} holds {bad[0]}: every value must be a finite number"
                )

    def points(self) -> list[tuple[int, float, float]]:
        """(order, lm_weight, word_score) in grid order: orders outermost, word scores innermost."""
        return list(itertools.product(self.orders, self.lm_weights, self.word_scores))


@dataclass(frozen=True)
class GridPoint:
    order: int
    lm_weight: float
    word_score: float
    wer: float
    cer: float


@dataclass(frozen=True)
class LexiconTuning:
    """The grid's scores on ``split`` and the chosen settings (``best``: lowest WER, then lowest CER,
    then the first in grid order)."""

    checkpoint: str
    ensemble: tuple[str, ...]  # every member, the checkpoint first; () for one model
    split: str
    utterances: int
    points: tuple[GridPoint, ...]
    best: LexiconConfig  # the base settings with the best point's order, LM weight and word score

    @property
    def best_point(self) -> GridPoint:
        return next(
            p
            for p in self.points
            if (p.order, p.lm_weight, p.word_score) == (self.best.order, self.best.lm_weight, self.best.word_score)
        )

    def overrides(self) -> list[str]:
        """The chosen settings as ``usmkit.cli.evaluate`` overrides."""
        b = self.best
        return [f"lexicon.order={b.order}", f"lexicon.lm_weight={b.lm_weight}", f"lexicon.word_score={b.word_score}"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            **({"ensemble": list(self.ensemble)} if self.ensemble else {}),
            "set": self.split,
            "utterances": self.utterances,
            "grid": [asdict(p) for p in self.points],
            "best": asdict(self.best_point),
            "lexicon": asdict(self.best),
            "overrides": self.overrides(),
        }


def is_test_split(split: str) -> bool:
    """Whether ``split`` names a test set (``test``, ``test_other``, ``test_8k``, ...)."""
    return split.lower().startswith("test")


def check_tuning_split(split: str, allow_test: bool = False) -> None:
    """``UsageError`` for a test set unless ``allow_test`` (then a warning): settings chosen on a set make
    its WER optimistic, so they are chosen on a dev set and the test set's WER is measured once, with them."""
    if not is_test_split(split):
        return
    if not allow_test:
        raise UsageError(
            f"set={split} is a test set: tune on a dev set (set=dev) and score the test set once with the chosen "
            "settings; to tune on it anyway (its WER is then no unbiased estimate), add allow_test=true"
        )
    log.warning("tuning on the test set %s (allow_test=true): its WER with these settings is optimistic", split)


def tune_lexicon(
    cfg: EvalConfig,
    grid: LexiconGrid,
    split: str = "dev",
    on_point: Callable[[GridPoint], None] | None = None,
    allow_test: bool = False,
) -> LexiconTuning:
    """Score every point of ``grid`` on ``split`` with lexicon decoding of ``cfg.checkpoint`` (and
    ``cfg.ensemble``); ``cfg.lexicon`` gives the settings the grid does not vary (beam size and threshold).
    ``on_point`` (optional) sees each point as it is scored. A test set is refused unless ``allow_test``
    (``check_tuning_split``)."""
    check_tuning_split(split, allow_test)
    cfg = replace(cfg, decode="ctc_lexicon", test_sets=(split,))
    loaded = load_for_eval(cfg)
    loader, report = split_loader(loaded.data, split, tokenizer=loaded.tokenizer, stats=loaded.stats)
    if report.num_skipped:
        log.warning("%s: %s", split, report.summary())
    transcribe = _cached_transcriber(loaded, loader, cfg)
    refs = transcribe(None)
    texts = lexicon_texts(loaded.train_cfg, cfg.norm)
    points = []
    for order, lm_weight, word_score in grid.points():
        lexicon = replace(cfg.lexicon, order=order, lm_weight=lm_weight, word_score=word_score)
        decoder = build_word_decoder(replace(cfg, lexicon=lexicon), loaded.train_cfg, loaded.tokenizer, texts)
        stats = score(refs, transcribe(decoder))
        points.append(GridPoint(order, lm_weight, word_score, stats.wer, stats.cer))
        if on_point is not None:
            on_point(points[-1])
    best = min(points, key=lambda p: (p.wer, p.cer))  # min keeps the first of equals: grid order breaks ties
    return LexiconTuning(
        checkpoint=str(loaded.checkpoint),
        ensemble=tuple(str(m) for m in loaded.members),
        split=split,
        utterances=len(refs),
        points=tuple(points),
        best=replace(cfg.lexicon, order=best.order, lm_weight=best.lm_weight, word_score=best.word_score),
    )


def _cached_transcriber(loaded: LoadedModel, loader, cfg: EvalConfig) -> Callable[[LexiconDecoder | None], list[str]]:
    """``transcribe(decoder)``: the split's normalized hypotheses under ``decoder`` (``None``: its
    normalized references), from what one pass over the split left in memory."""
    module, device = loaded.module, loaded.device
    if isinstance(module, CtcEnsemble):
        # Every member proposes candidates from its own log-probs and all of them score each candidate
        # (decoding/ensemble.py): the batches are kept and the ensemble decodes them at each point.
        batches = list(loader)

        def transcribe_ensemble(decoder: LexiconDecoder | None) -> list[str]:
            if decoder is None:
                return [normalize_text(t, cfg.norm) for b in batches for t in b.texts]
            records, _ = transcribe_batches(
                module, batches, loaded.tokenizer, device=device, norm=cfg.norm, word_decoder=decoder
            )
            return [r["hyp"] for r in records]

        return transcribe_ensemble

    emissions: list[tuple[torch.Tensor, torch.Tensor]] = []  # per batch: log-probs (B, T', V), lengths (B,)
    refs: list[str] = []
    with torch.no_grad():
        for batch in loader:
            batch = batch.to(device)
            enc, enc_lens = module.encode(batch.features, batch.feature_lens)
            emissions.append((module.ctc(enc).float().cpu(), enc_lens.cpu()))
            refs += [normalize_text(t, cfg.norm) for t in batch.texts]

    def transcribe_one(decoder: LexiconDecoder | None) -> list[str]:
        if decoder is None:
            return refs
        return [normalize_text(h, cfg.norm) for log_probs, lens in emissions for h in decoder(log_probs, lens)]

    return transcribe_one
