"""Batch decoding of a trained module (or an ensemble) over a data loader, in any decode mode.

Shapes: B batch, T' encoder frames, V vocabulary.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from usmkit.decoding.modes import DecodeOptions, decode_texts
from usmkit.metrics import TextNormConfig, normalize_text


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

    ``mode``: one of ``usmkit.decoding.modes.DECODE_MODES``. ``word_decoder`` (e.g.
    ``usmkit.decoding.ctc_lexicon.LexiconDecoder``) maps CTC log-probs (B, T', V) and lengths to transcripts;
    when given, it replaces a mode without one (``ctc_lexicon``); ``lexicon_rescore`` rescores its scored
    n-best with the model's attention decoder. ``rescore_ctc_weight``: the first pass's share of the score in
    ``rescore`` and ``lexicon_rescore``.
    """
    norm = norm or TextNormConfig()
    opts = DecodeOptions(beam_size=beam_size, rescore_ctc_weight=rescore_ctc_weight, word_decoder=word_decoder)
    device = device or next(module.parameters()).device
    records: list[dict] = []
    seconds = 0.0
    for i, batch in enumerate(batches):
        if max_batches and i >= max_batches:
            break
        batch = batch.to(device)
        start = time.perf_counter()
        texts = decode_texts(module, batch.features, batch.feature_lens, tokenizer, mode, opts)
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
