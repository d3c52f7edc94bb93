"""Scoring a trained model on test sets: WER/CER per set (``python -m usmkit.cli.evaluate`` runs it).

Every test set name and the decode mode are checked before anything is decoded; ``on_set`` sees the
results after each set, so a failure part way keeps the sets already scored.
"""

from __future__ import annotations

import logging
import platform
import tempfile
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from usmkit.config import ConfigError, DataConfig, TrainConfig
from usmkit.data.loader import split_loader
from usmkit.data.manifests import available_splits, manifest_path
from usmkit.data.normalize import FeatureStats
from usmkit.data.tokenizer import Tokenizer
from usmkit.decoding.ctc_lexicon import LexiconConfig, LexiconDecoder
from usmkit.decoding.ensemble import CtcEnsemble
from usmkit.decoding.modes import ATTENTION_MODES, DECODE_MODES, ENSEMBLE_MODES, LEXICON_MODES, RESCORE_MODES
from usmkit.device import resolve_device
from usmkit.errors import UsageError
from usmkit.inference.batches import transcribe_batches
from usmkit.metrics import TextNormConfig, score
from usmkit.runs import lexicon_texts, load_trained
from usmkit.streaming.features import checkpoint_feature_stats

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalConfig:
    checkpoint: str
    test_sets: tuple[str, ...] = ("test",)
    decode: str = "ctc_greedy"  # ctc_greedy | ctc_beam | las_beam | rescore | ctc_lexicon | lexicon_rescore
    beam_size: int = 10
    manifest_dir: str | None = None  # default: the manifest_dir the checkpoint was trained on
    corpus: str | None = None  # default: the checkpoint's corpus
    output: str | None = None  # JSON path; default: <checkpoint>/eval_<decode>.json
    device: str = "auto"
    max_duration: float = 200.0
    # encoder chunk (frames) for decoding: default = as trained; null = full attention
    chunk_size: int | str | None = "default"
    left_chunks: int | str = "default"
    norm: TextNormConfig = field(default_factory=TextNormConfig)
    lexicon: LexiconConfig = field(default_factory=LexiconConfig)
    ensemble: tuple[str, ...] = ()  # more checkpoints, combined with checkpoint per hypothesis (decoding/ensemble.py)
    # rescore / lexicon_rescore: the first pass's share of the combined score (the attention decoder's: 1 - it)
    rescore_ctc_weight: float = 0.3

    def __post_init__(self) -> None:
        if self.decode not in DECODE_MODES:
            raise ValueError(f"decode={self.decode!r}: choose one of {tuple(DECODE_MODES)}")
        if not 0.0 <= self.rescore_ctc_weight <= 1.0:
            raise ValueError(f"rescore_ctc_weight must be in [0, 1], got {self.rescore_ctc_weight}")
        if self.decode == "lexicon_rescore" and self.lexicon.nbest < 2:
            raise ValueError(
                "decode=lexicon_rescore rescores the lexicon decoder's n-best list: set lexicon.nbest=10 (2 or more)"
            )
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {self.beam_size}")
        if not self.max_duration > 0:
            raise ValueError(f"max_duration must be > 0 seconds of audio per batch, got {self.max_duration}")
        if self.ensemble and self.decode not in ENSEMBLE_MODES:
            raise ValueError(f"decode={self.decode!r} with an ensemble: ensembles decode with {ENSEMBLE_MODES}")


@dataclass(frozen=True)
class LoadedModel:
    """What decoding a split needs, loaded and checked once (``load_for_eval``)."""

    module: torch.nn.Module  # the model, or a CtcEnsemble of it and EvalConfig.ensemble
    train_cfg: TrainConfig  # the checkpoint's
    tokenizer: Tokenizer
    checkpoint: Path
    members: tuple[Path, ...]  # every ensemble member's checkpoint, the first included; () without one
    data: DataConfig  # the checkpoint's data settings with EvalConfig's manifest_dir, corpus and max_duration
    stats: FeatureStats  # the feature statistics the checkpoint was trained with
    device: torch.device


def load_for_eval(cfg: EvalConfig) -> LoadedModel:
    """Load ``cfg.checkpoint`` (and its ensemble) for decoding ``cfg.test_sets`` with ``cfg.decode``; every
    set name, the decode mode and the members are checked here, before anything is decoded."""
    device = resolve_device(cfg.device)
    changes = {}
    if cfg.chunk_size != "default":
        changes["chunk_size"] = cfg.chunk_size
    if cfg.left_chunks != "default":
        changes["left_chunks"] = cfg.left_chunks
    module, train_cfg, tokenizer, ckpt = load_trained(cfg.checkpoint, device, **changes)
    if tokenizer is None:
        raise UsageError(f"{ckpt} is a {train_cfg.task.kind} checkpoint with no ASR head: fine-tune it first")
    if cfg.decode in ATTENTION_MODES and getattr(module, "las", None) is None:
        raise UsageError(
            f"decode={cfg.decode} needs an attention (LAS) decoder, but {ckpt} is a {train_cfg.task.kind} model "
            "without one; use decode=ctc_greedy, ctc_beam or ctc_lexicon"
        )
    data = replace(
        train_cfg.data,
        manifest_dir=cfg.manifest_dir or train_cfg.data.manifest_dir,
        corpus=cfg.corpus or train_cfg.data.corpus,
        max_duration=cfg.max_duration,
    )
    check_test_sets(cfg.test_sets, data.manifest_dir, data.corpus)
    stats = checkpoint_feature_stats(ckpt, train_cfg.data)
    members: tuple[Path, ...] = ()
    if cfg.ensemble:
        loaded = [load_trained(path, device, **changes) for path in cfg.ensemble]
        for _, member_cfg, member_tok, member_ckpt in loaded:
            check_ensemble_member(train_cfg, tokenizer, stats, member_cfg, member_tok, member_ckpt, ckpt)
        module = CtcEnsemble([module, *(m[0] for m in loaded)])
        members = (ckpt, *(m[3] for m in loaded))
    return LoadedModel(module, train_cfg, tokenizer, ckpt, members, data, stats, device)


def evaluate(cfg: EvalConfig, on_set=None) -> dict[str, Any]:
    """Decode each test set with the checkpoint; returns the results dict that is also written as JSON.

    ``on_set(results)`` (optional) is called after each set is scored, with the results so far."""
    loaded = load_for_eval(cfg)
    module, tokenizer, data, stats, device = loaded.module, loaded.tokenizer, loaded.data, loaded.stats, loaded.device
    word_decoder = build_word_decoder(cfg, loaded.train_cfg, tokenizer) if cfg.decode in LEXICON_MODES else None
    results: dict[str, Any] = {
        "checkpoint": str(loaded.checkpoint),
        **({"ensemble": [str(m) for m in loaded.members]} if loaded.members else {}),
        "decode": cfg.decode,
        "beam_size": cfg.beam_size,
        **({"lexicon": asdict(cfg.lexicon)} if cfg.decode in LEXICON_MODES else {}),
        **({"rescore_ctc_weight": cfg.rescore_ctc_weight} if cfg.decode in RESCORE_MODES else {}),
        "chunk_size": first_encoder_chunk(module),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "sets": {},
    }
    for name in cfg.test_sets:
        loader, report = split_loader(data, name, tokenizer=tokenizer, stats=stats)
        if report.num_skipped:
            log.warning("%s: %s", name, report.summary())
        records, seconds = transcribe_batches(
            module,
            loader,
            tokenizer,
            mode=cfg.decode,
            beam_size=cfg.beam_size,
            device=device,
            norm=cfg.norm,
            word_decoder=word_decoder,
            rescore_ctc_weight=cfg.rescore_ctc_weight,
        )
        audio_s = sum(r["frames"] for r in records) * data.features.frame_shift_ms / 1000
        entry = score([r["ref"] for r in records], [r["hyp"] for r in records]).as_dict()
        entry |= {"audio_seconds": audio_s, "decode_seconds": seconds, "rtf": seconds / max(audio_s, 1e-9)}
        languages = sorted({r["language"] for r in records if r["language"]})
        if len(languages) > 1:
            entry["per_language"] = {
                lang: score(
                    [r["ref"] for r in records if r["language"] == lang],
                    [r["hyp"] for r in records if r["language"] == lang],
                ).as_dict()
                for lang in languages
            }
        entry["examples"] = records[:5]
        results["sets"][name] = entry
        if on_set is not None:
            on_set(results)
    return results


def check_test_sets(names: tuple[str, ...], manifest_dir: str, corpus: str) -> None:
    """Refuse, before any decoding, test set names without a cuts manifest (naming all of them)."""
    if not names:
        raise UsageError("test_sets is empty: name at least one, e.g. test_sets=[test]")
    missing = [n for n in names if not manifest_path(manifest_dir, corpus, "cuts", n).is_file()]
    if missing:
        raise UsageError(
            f"test set(s) {missing} have no manifest in {manifest_dir} (corpus {corpus!r}); "
            f"the sets there are {available_splits(manifest_dir, corpus) or 'none'}: fix test_sets=[...]"
        )


def first_encoder_chunk(module: torch.nn.Module) -> int | None:
    """The encoder's chunk size (of the first member, for an ensemble), or None without an encoder."""
    module = module.members[0] if isinstance(module, CtcEnsemble) else module
    return module.encoder.cfg.chunk_size if hasattr(module, "encoder") else None


def check_ensemble_member(train_cfg, tokenizer, stats, member_cfg, member_tok, member_ckpt, ckpt) -> None:
    """Refuse a member whose tokens, features or normalization differ from the first checkpoint's
    (``ConfigError``, naming the member)."""
    if member_tok is None or member_tok.model_proto != tokenizer.model_proto:
        raise ConfigError(f"ensemble member {member_ckpt} has another tokenizer than {ckpt}; members must share it")
    for field_name in ("features", "utterance_mean_norm", "speaker_mean_norm", "speaker_var_norm"):
        if getattr(member_cfg.data, field_name) != getattr(train_cfg.data, field_name):
            raise ConfigError(
                f"ensemble member {member_ckpt} was trained with other data.{field_name} than {ckpt}: "
                f"{getattr(member_cfg.data, field_name)} vs {getattr(train_cfg.data, field_name)}"
            )
    member_stats = checkpoint_feature_stats(member_ckpt, member_cfg.data)
    if not (torch.allclose(member_stats.mean, stats.mean) and torch.allclose(member_stats.std, stats.std)):
        raise ConfigError(
            f"ensemble member {member_ckpt} normalizes features with other statistics than {ckpt} "
            "(trained on another training set?); members must share them"
        )


def build_word_decoder(
    cfg: EvalConfig, train_cfg, tokenizer, texts: list[str] | None = None, bias=()
) -> LexiconDecoder:
    """Lexicon and word LM from the transcripts of the split the checkpoint was trained on (``texts``:
    those transcripts, ``lexicon_texts``, when already loaded); ``bias``: phrases to boost
    (``usmkit.decoding.biasing``)."""
    texts = lexicon_texts(train_cfg, cfg.norm) if texts is None else texts
    with tempfile.TemporaryDirectory(prefix="usmkit-lexicon-") as tmp:  # flashlight reads the files once
        decoder = LexiconDecoder.build(texts, tokenizer, tmp, cfg.lexicon, bias)
    log.info(
        "lexicon decoding: %d words from %d %s transcripts, LM order %d",
        len({w for t in texts for w in t.split()}),
        len(texts),
        train_cfg.data.train_split,
        cfg.lexicon.order,
    )
    return decoder
