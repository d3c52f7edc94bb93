"""Attention rescoring of CTC n-best lists (WeNet's two-pass decoding).

Shapes: B utterances, T encoder frames, E encoder dim, N hypotheses in all.

Pass 1, CTC prefix beam search, proposes an n-best list (streaming-friendly). Pass 2 scores each
hypothesis with the attention decoder under teacher forcing (one batched forward for all of them:
sum of log p(token | prefix, audio) plus </s>) and ranks by

    score = ctc_weight * ctc_score + (1 - ctc_weight) * att_score

so ``ctc_weight=1`` keeps the CTC ranking and ``ctc_weight=0`` trusts the decoder alone.

``rescore_lexicon_nbest`` does the same for the lexicon decoder's n-best (``LexiconDecoder.scored_nbest``),
whose first-pass score also holds the word LM: transcripts spelled with lexicon words, ranked with the
attention decoder's view of them (ESPnet's and WeNet's second pass, over a word-constrained first pass).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from usmkit.decoding.hypothesis import Hypothesis

if TYPE_CHECKING:
    from usmkit.data.tokenizer import Tokenizer
    from usmkit.models.las import LASDecoder


@torch.no_grad()
def attention_rescore_batch(
    decoder: LASDecoder,
    enc: torch.Tensor,
    enc_lens: torch.Tensor,
    nbests: list[list[Hypothesis]],
    ctc_weight: float = 0.3,
) -> list[Hypothesis]:
    """Best hypothesis per utterance of enc (B, T, E), enc_lens (B,) out of its CTC n-best list.

    The returned hypotheses keep their tokens, ``ctc_score`` and timestamps, and carry the decoder's
    ``att_score`` and the combined ``score``. Call ``decoder.eval()`` first.
    """
    if not 0.0 <= ctc_weight <= 1.0:
        raise ValueError(f"ctc_weight must be in [0, 1], got {ctc_weight}")
    if enc.dim() != 3 or enc_lens.shape != enc.shape[:1] or len(nbests) != enc.shape[0]:
        raise ValueError(
            f"need enc (B, T, E), enc_lens (B,) and B n-best lists; got {tuple(enc.shape)}, "
            f"{tuple(enc_lens.shape)} and {len(nbests)} lists"
        )
    for b, nbest in enumerate(nbests):
        if not nbest:
            raise ValueError(f"utterance {b}: empty n-best list; rescoring needs at least one hypothesis")
        if any(h.ctc_score is None for h in nbest):
            raise ValueError(f"utterance {b}: every hypothesis needs a ctc_score (from a CTC decoder)")
    rows = torch.tensor([b for b, nbest in enumerate(nbests) for _ in nbest], device=enc.device)  # (N,)
    flat = [h for nbest in nbests for h in nbest]
    att = decoder.score(enc.index_select(0, rows), enc_lens.index_select(0, rows), [h.tokens for h in flat])
    att = att.cpu().tolist()

    best: list[Hypothesis] = []
    i = 0
    for nbest in nbests:
        scored = [
            replace(h, att_score=a, score=ctc_weight * h.ctc_score + (1.0 - ctc_weight) * a)
            for h, a in zip(nbest, att[i : i + len(nbest)], strict=True)
        ]
        i += len(nbest)
        best.append(max(scored, key=lambda h: h.score))  # first of equals: keeps the CTC order on ties
    return best


def attention_rescore(
    decoder: LASDecoder,
    enc: torch.Tensor,
    enc_lens: torch.Tensor,
    nbest: list[Hypothesis],
    ctc_weight: float = 0.3,
) -> Hypothesis:
    """One utterance: enc (1, T, E), enc_lens (1,), its CTC n-best -> the best rescored hypothesis."""
    if enc.dim() != 3 or enc.shape[0] != 1:
        raise ValueError(
            f"attention_rescore takes one utterance, enc (1, T, E); got {tuple(enc.shape)} (use attention_rescore_batch)"
        )
    return attention_rescore_batch(decoder, enc, enc_lens, [nbest], ctc_weight)[0]


@torch.no_grad()
def rescore_lexicon_nbest(
    decoder: LASDecoder,
    tokenizer: Tokenizer,
    enc: torch.Tensor,
    enc_lens: torch.Tensor,
    nbests: list[list[tuple[str, float]]],
    ctc_weight: float = 0.3,
) -> list[str]:
    """Best transcript per utterance of enc (B, T, E), enc_lens (B,) out of its lexicon n-best [(text, score)]
    (``LexiconDecoder.scored_nbest``), by ``ctc_weight * score + (1 - ctc_weight) * att_score``; "" for an
    utterance whose list is empty (no word fits)."""
    keep = [b for b, nbest in enumerate(nbests) if nbest]
    if not keep:
        return [""] * len(nbests)
    rows = torch.tensor(keep, device=enc.device)
    lists = [[Hypothesis(tuple(tokenizer.encode(t)), s, ctc_score=s) for t, s in nbests[b]] for b in keep]
    best = attention_rescore_batch(
        decoder, enc.index_select(0, rows), enc_lens.index_select(0, rows), lists, ctc_weight
    )
    texts = [""] * len(nbests)
    for b, hyps, chosen in zip(keep, lists, best, strict=True):
        i = next(i for i, h in enumerate(hyps) if h.tokens == chosen.tokens)  # the first: ties keep the lexicon order
        texts[b] = nbests[b][i][0]
    return texts
