"""Loading a trained run: the module, its config and tokenizer, rebuilt from a checkpoint directory;
and a trained CTC run as MOST's frozen aligner."""

from __future__ import annotations

from dataclasses import replace

import torch
import yaml

from usmkit.checkpointing.checkpoint import CONFIG_FILE, load_weights, resolve_checkpoint, run_dir
from usmkit.config import TrainConfig, from_dict, tokenizer_path
from usmkit.data.tokenizer import MODEL_FILE as TOKENIZER_FILE
from usmkit.data.tokenizer import Tokenizer
from usmkit.errors import UsageError
from usmkit.tasks import build_task


def load_trained(checkpoint: str, device: torch.device | str = "cpu", **model_changes):
    """Rebuild a trained module from a checkpoint dir (or experiment dir) and its saved config.

    ``model_changes`` replace fields of the model section that do not change the weights, e.g.
    ``chunk_size=None`` to decode with full attention a model trained with chunk-wise attention.

    Returns ``(module in eval mode, TrainConfig, Tokenizer | None, checkpoint path)``.
    """
    ckpt = resolve_checkpoint(checkpoint)
    cfg = from_dict(TrainConfig, yaml.safe_load((ckpt / CONFIG_FILE).read_text()))
    if model_changes:
        cfg = replace(cfg, model=replace(cfg.model, **model_changes))
    tokenizer = None
    vocab = 0
    if cfg.task.kind != "bestrq":
        # The training run's copy (<exp_dir>/tokenizer.model, beside the feature stats), else its config's.
        candidates = [run_dir(ckpt) / TOKENIZER_FILE, tokenizer_path(cfg)]
        tok_path = next((p for p in candidates if p.is_file()), None)
        if tok_path is None:
            raise FileNotFoundError(
                f"the tokenizer this checkpoint was trained with is missing: looked for {candidates[0]} and "
                f"{candidates[1]} (copy the training run's {TOKENIZER_FILE} into the experiment directory, "
                f"rebuild the corpus, or run from the directory the model was trained in)"
            )
        tokenizer = Tokenizer.load(tok_path)
        vocab = tokenizer.vocab_size
    module = build_task(cfg.task, cfg.model.build_config(input_dim=cfg.data.features.num_mel_bins), vocab)
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
    if Tokenizer.load(own).model_proto != tokenizer.model_proto:
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
