"""Builds the module a recipe trains (``Batch -> StepOutput``) and its dev evaluation.

This is where configuration meets model classes: one explicit branch per task kind.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from usmkit.config import TaskConfig
from usmkit.metrics import TextNormConfig, normalize_text, score
from usmkit.models.config import ConformerConfig
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.ensemble import CtcEnsemble


def build_task(task: TaskConfig, encoder_cfg: ConformerConfig, vocab_size: int) -> torch.nn.Module:
    encoder = ConformerEncoder(encoder_cfg)
    if task.kind in ("ctc", "las"):
        from usmkit.models.asr import AsrHeadConfig, AsrModel

        las = task.las if task.kind == "las" else None
        ctc_weight = task.ctc_weight if task.kind == "las" else 1.0
        head = AsrHeadConfig(
            ctc_weight=ctc_weight, las=las, inter_ctc_weight=task.inter_ctc_weight, inter_ctc_layer=task.inter_ctc_layer
        )
        return AsrModel(encoder, vocab_size, head)
    if task.kind == "bestrq":
        from usmkit.ssl.bestrq import BestRQConfig, BestRQModel

        return BestRQModel(encoder, BestRQConfig(**task.bestrq), input_dim=encoder_cfg.input_dim)
    raise ValueError(f"unknown task.kind {task.kind!r}; choose ctc, las or bestrq")


def transcribe_batches(
    module: torch.nn.Module,
    batches,
    tokenizer,
    mode: str = "ctc_greedy",
    beam_size: int = 10,
    device: torch.device | None = None,
    max_batches: int = 0,
    norm: TextNormConfig | None = None,
    word_decoder: Callable[[torch.Tensor, torch.Tensor], list[str]] | None = None,
) -> tuple[list[dict], float]:
    """Decode every batch; returns per-utterance records and the decoding wall time in seconds.

    ``word_decoder`` (e.g. ``usmkit.decoding.ctc_lexicon.LexiconDecoder``) maps CTC log-probs
    (B, T', V) and lengths to transcripts; when given, it replaces ``mode``.
    """
    norm = norm or TextNormConfig()
    device = device or next(module.parameters()).device
    records: list[dict] = []
    seconds = 0.0
    for i, batch in enumerate(batches):
        if max_batches and i >= max_batches:
            break
        batch = batch.to(device)
        start = time.perf_counter()
        with torch.no_grad():
            if isinstance(module, CtcEnsemble):
                texts = module.transcribe(
                    batch.features, batch.feature_lens, tokenizer, mode, beam_size, word_decoder=word_decoder
                )
            elif word_decoder is not None:
                enc, enc_lens = module.encode(batch.features, batch.feature_lens)
                texts = word_decoder(module.ctc(enc), enc_lens)
            else:
                texts = [
                    tokenizer.decode(hyp_ids)
                    for hyp_ids in module.decode(batch.features, batch.feature_lens, mode=mode, beam_size=beam_size)
                ]
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - start
        for j, text in enumerate(texts):
            records.append(
                {
                    "id": batch.cut_ids[j] if batch.cut_ids else str(len(records)),
                    "language": batch.languages[j] if batch.languages else "",
                    "ref": normalize_text(batch.texts[j], norm),
                    "hyp": normalize_text(text, norm),
                    "frames": int(batch.feature_lens[j]),
                }
            )
    return records, seconds


def make_dev_eval(dev_batches_factory: Callable, tokenizer, task_kind: str, max_batches: int = 0):
    """Dev loss (every task) and greedy-CTC dev WER (ASR tasks), computed on rank 0."""

    def dev_eval(module: torch.nn.Module) -> dict[str, float]:
        device = next(module.parameters()).device
        total, n = 0.0, 0
        for i, batch in enumerate(dev_batches_factory()):
            if max_batches and i >= max_batches:
                break
            out = module(batch.to(device))
            total += float(out.loss) * batch.size
            n += batch.size
        results = {"dev_loss": total / max(n, 1)}
        if task_kind in ("ctc", "las"):
            records, _ = transcribe_batches(module, dev_batches_factory(), tokenizer, max_batches=max_batches)
            stats = score([r["ref"] for r in records], [r["hyp"] for r in records])
            results |= {"dev_wer": stats.wer, "dev_cer": stats.cer}
        return results

    return dev_eval


def load_trained(checkpoint: str, device: torch.device | str = "cpu", **model_changes):
    """Rebuild a trained module from a checkpoint dir (or experiment dir) and its saved config.

    ``model_changes`` replace fields of the model section that do not change the weights, e.g.
    ``chunk_size=None`` to decode with full attention a model trained with chunk-wise attention.

    Returns ``(module in eval mode, TrainConfig, Tokenizer | None, checkpoint path)``.
    """
    import yaml

    from usmkit.checkpoint import CONFIG_FILE, load_weights, resolve_checkpoint, run_dir
    from usmkit.config import TrainConfig, from_dict, tokenizer_path
    from usmkit.data.tokenizer import MODEL_FILE as TOKENIZER_FILE
    from usmkit.data.tokenizer import Tokenizer

    ckpt = resolve_checkpoint(checkpoint)
    cfg = from_dict(TrainConfig, yaml.safe_load((ckpt / CONFIG_FILE).read_text()))
    if model_changes:
        from dataclasses import replace

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
