"""Batch decoding of a trained module over a data loader, and the trainer's dev evaluation.

Shapes: B batch, T' encoder frames, V vocabulary.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from usmkit.decoding.rescoring import rescore_lexicon_nbest
from usmkit.metrics import TextNormConfig, normalize_text, score
from usmkit.models.ensemble import CtcEnsemble


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
    rescore_ctc_weight: float = 0.3,
) -> tuple[list[dict], float]:
    """Decode every batch; returns per-utterance records and the decoding wall time in seconds.

    ``word_decoder`` (e.g. ``usmkit.decoding.ctc_lexicon.LexiconDecoder``) maps CTC log-probs
    (B, T', V) and lengths to transcripts; when given, it replaces ``mode``, except ``mode="lexicon_rescore"``:
    its scored n-best is rescored with the model's attention decoder (``rescore_lexicon_nbest``).
    ``rescore_ctc_weight``: the first pass's share of the score in ``rescore`` and ``lexicon_rescore``.
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
            elif mode == "lexicon_rescore":
                enc, enc_lens = module.encode(batch.features, batch.feature_lens)
                nbests = word_decoder.scored_nbest(module.ctc(enc), enc_lens)
                texts = rescore_lexicon_nbest(module.las, tokenizer, enc, enc_lens, nbests, rescore_ctc_weight)
            elif word_decoder is not None:
                enc, enc_lens = module.encode(batch.features, batch.feature_lens)
                texts = word_decoder(module.ctc(enc), enc_lens)
            else:
                hyps = module.decode(
                    batch.features,
                    batch.feature_lens,
                    mode=mode,
                    beam_size=beam_size,
                    rescore_ctc_weight=rescore_ctc_weight,
                )
                texts = [tokenizer.decode(hyp_ids) for hyp_ids in hyps]
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
        if task_kind in ("ctc", "las", "most"):
            records, _ = transcribe_batches(module, dev_batches_factory(), tokenizer, max_batches=max_batches)
            stats = score([r["ref"] for r in records], [r["hyp"] for r in records])
            results |= {"dev_wer": stats.wer, "dev_cer": stats.cer}
        return results

    return dev_eval
