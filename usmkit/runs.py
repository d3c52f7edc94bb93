"""Loading a trained run: the module, its config and tokenizer, rebuilt from a checkpoint directory;
and a trained CTC run as MOST's frozen aligner.

What a checkpoint holds is data, never code: its ``config.yaml`` is read with ``yaml.safe_load`` (a
Python tag is refused) and may not name a Hydra ``_target_``; every file is checked against the sizes
and SHA-256 recorded with it. A file that cannot be used raises ``CheckpointError`` naming it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import yaml
from lhotse.cut import Cut

from usmkit.checkpointing.checkpoint import (
    CONFIG_FILE,
    CheckpointDamaged,
    CheckpointError,
    load_weights,
    resolve_checkpoint,
    run_dir,
    verify_checkpoint,
)
from usmkit.config import ConfigError, TrainConfig, from_dict, tokenizer_path
from usmkit.data.manifests import load_cuts
from usmkit.data.tokenizer import MODEL_FILE as TOKENIZER_FILE
from usmkit.data.tokenizer import Tokenizer
from usmkit.errors import UsageError
from usmkit.metrics import TextNormConfig, normalize_text
from usmkit.tasks import task_for


def _target_keys(tree: Any, path: str = "") -> list[str]:
    """The dotted paths of ``_target_`` keys anywhere in ``tree`` (Hydra's name for code to instantiate)."""
    found = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            key = f"{path}.{k}" if path else str(k)
            found += [key] if k == "_target_" else _target_keys(v, key)
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            found += _target_keys(v, f"{path}[{i}]")
    return found


def read_run_config(ckpt: Path) -> TrainConfig:
    """The ``TrainConfig`` in checkpoint ``ckpt``'s ``config.yaml``, checked against its recorded SHA-256,
    read as data only, and checked to build a model. ``CheckpointError`` naming the file otherwise."""
    path = Path(ckpt) / CONFIG_FILE
    verify_checkpoint(Path(ckpt), (CONFIG_FILE,))
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointDamaged(f"{path} is missing (the config the checkpoint was trained with)") from None
    except yaml.YAMLError as e:  # e.g. a !!python/object tag: safe_load builds data only and refuses it
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        what = getattr(e, "problem", None) or type(e).__name__
        raise CheckpointDamaged(f"{path} is not a usmkit config ({what}{at}); use the config the run saved") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointDamaged(f"{path} cannot be read ({type(e).__name__}: {e})") from None
    targets = _target_keys(data)
    if targets:
        raise CheckpointError(
            f"{path} names code to instantiate ({', '.join(targets)}): a checkpoint's config is data only; "
            "remove the _target_ keys or use the config the run saved"
        )
    try:
        cfg = from_dict(TrainConfig, data)
        cfg.model.build_config(input_dim=cfg.data.features.num_mel_bins)
    except (ConfigError, ValueError, TypeError) as e:
        raise CheckpointError(f"{path} does not describe a model usmkit can build: {e}") from None
    return cfg


def read_tokenizer(path: Path) -> Tokenizer:
    """The sentencepiece model at ``path`` (a trained run's copy); ``CheckpointError`` naming the file
    where it is not one (garbage, truncated)."""
    try:
        return Tokenizer.load(path)
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 - sentencepiece raises RuntimeError/OSError with its own wording
        raise CheckpointDamaged(
            f"{path} is not a sentencepiece model ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            "copy the training run's tokenizer.model there again"
        ) from None


def load_trained(checkpoint: str, device: torch.device | str = "cpu", **model_changes):
    """Rebuild a trained module from a checkpoint dir (or experiment dir) and its saved config.

    ``model_changes`` replace fields of the model section that do not change the weights, e.g.
    ``chunk_size=None`` to decode with full attention a model trained with chunk-wise attention.

    Returns ``(module in eval mode, TrainConfig, Tokenizer | None, checkpoint path)``.
    """
    ckpt = resolve_checkpoint(checkpoint)
    cfg = read_run_config(ckpt)
    if model_changes:
        cfg = replace(cfg, model=replace(cfg.model, **model_changes))
    task = task_for(cfg.task)
    tokenizer = None
    vocab = 0
    if task.text:
        # The training run's copy (<exp_dir>/tokenizer.model, beside the feature stats), else its config's.
        candidates = [run_dir(ckpt) / TOKENIZER_FILE, tokenizer_path(cfg)]
        tok_path = next((p for p in candidates if p.is_file()), None)
        if tok_path is None:
            raise FileNotFoundError(
                f"the tokenizer this checkpoint was trained with is missing: looked for {candidates[0]} and "
                f"{candidates[1]} (copy the training run's {TOKENIZER_FILE} into the experiment directory, "
                f"rebuild the corpus, or run from the directory the model was trained in)"
            )
        tokenizer = read_tokenizer(tok_path)
        vocab = tokenizer.vocab_size
    module = task.build(cfg.model.build_config(input_dim=cfg.data.features.num_mel_bins), vocab)
    load_weights(module, ckpt)
    return module.to(device).eval(), cfg, tokenizer, ckpt


def check_aligner(align_from: str, tokenizer: Tokenizer) -> None:
    """Refuse an aligner checkpoint that is missing or was trained with another tokenizer (its token ids
    would mean other pieces); a user error naming the file."""
    try:
        ckpt = resolve_checkpoint(align_from)
    except FileNotFoundError as e:
        raise UsageError(f"task.most.align_from: {e}") from None
    own = run_dir(ckpt) / TOKENIZER_FILE
    if not own.is_file():
        raise UsageError(
            f"task.most.align_from={align_from}: {own} is missing (the tokenizer the aligner was trained with); "
            "align with a CTC run of usmkit.cli.train, or set task.most.align_from=null to align with the model itself"
        )
    if read_tokenizer(own).model_proto != tokenizer.model_proto:
        raise UsageError(
            f"task.most.align_from={align_from} was trained with another tokenizer ({own}) than this run's; "
            "train the aligner with the same tokenizer, or set task.most.align_from=null"
        )


def load_aligner(align_from: str, device: torch.device) -> torch.nn.Module:
    """The frozen CTC model of ``align_from`` in eval mode on ``device`` (it must have a CTC head)."""
    module, cfg, _, ckpt = load_trained(align_from, device)
    if getattr(module, "ctc", None) is None:
        raise UsageError(f"task.most.align_from={align_from}: {ckpt} is a {cfg.task.kind} model without a CTC head")
    for p in module.parameters():
        p.requires_grad_(False)
    return module


def lexicon_texts(train_cfg: TrainConfig, norm: TextNormConfig | None = None) -> list[str]:
    """The normalized transcripts of the split the run was trained on: the words of its lexicon and the text
    of its word LM (``usmkit.decoding.ctc_lexicon``). ``FileNotFoundError`` where the split's manifest is gone."""
    cuts = load_cuts(train_cfg.data.manifest_dir, train_cfg.data.train_split, corpus=train_cfg.data.corpus)
    return transcripts_of(cuts, norm)


def transcripts_of(cuts: Iterable[Cut], norm: TextNormConfig | None = None) -> list[str]:
    """The normalized transcripts of ``cuts`` (``lexicon_texts``'s, of cuts already loaded)."""
    norm = norm or TextNormConfig()
    return [normalize_text(s.text, norm) for c in cuts for s in c.supervisions if s.text]
