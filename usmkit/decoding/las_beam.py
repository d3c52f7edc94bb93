"""Batched beam search with the LAS attention decoder.

Shapes: B utterances, K beam, N = B * K decoder rows, T encoder frames, E encoder dim, V vocabulary.

All beams of all utterances advance together, one ``decoder.step`` per token (KV cache). A beam that
has emitted </s> stays in the beam with its score frozen (it may only "emit" </s> again at log-prob
0), so finished and unfinished hypotheses compete for the K slots on the same score, as in WeNet's
attention beam search. Every hypothesis ends with </s>: at its utterance's ``max_len`` only </s> is
allowed.

Score = sum of log p(token | prefix, audio) including </s> + ``length_penalty`` x number of tokens
(ESPnet's additive length bonus: > 0 counters the attention decoder's bias towards short outputs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from usmkit.decoding.hypothesis import Hypothesis

if TYPE_CHECKING:
    from usmkit.models.las import LASDecoder

NEG_INF = float("-inf")


@torch.no_grad()
def las_beam_search(
    decoder: LASDecoder,
    enc: torch.Tensor,
    enc_lens: torch.Tensor,
    beam_size: int = 4,
    max_len: int | None = None,
    length_penalty: float = 0.0,
) -> list[list[Hypothesis]]:
    """Beam search for every utterance of enc (B, T, E), enc_lens (B,).

    Returns per utterance its n-best (up to ``beam_size`` hypotheses, best first; ``att_score`` is the
    pure log-prob, ``score`` adds the length penalty). ``max_len``: most tokens per hypothesis
    (without </s>); ``None`` = the utterance's number of encoder frames. Call ``decoder.eval()`` first.
    """
    if enc.dim() != 3 or enc_lens.shape != enc.shape[:1]:
        raise ValueError(f"enc must be (B, T, E) and enc_lens (B,), got {tuple(enc.shape)} and {tuple(enc_lens.shape)}")
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if bool((enc_lens < 1).any()):
        raise ValueError(f"every utterance needs at least one encoder frame, got enc_lens={enc_lens.tolist()}")
    B, K, V = enc.shape[0], beam_size, decoder.vocab_size
    device = enc.device
    eos = decoder.eos_id
    max_lens = enc_lens.to(device).long() if max_len is None else torch.full((B,), max_len, device=device)  # (B,)
    steps = int(max_lens.max()) + 1  # tokens plus the final </s>

    state = decoder.init_state(enc.repeat_interleave(K, dim=0), enc_lens.repeat_interleave(K), steps)  # N rows
    tokens = torch.full((B * K,), decoder.bos_id, dtype=torch.long, device=device)  # (N,)
    scores = torch.full((B, K), NEG_INF, device=device)  # (B, K): ranking score
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    att = torch.zeros(B, K, device=device)  # (B, K): pure log-prob sum
    finished = torch.zeros(B, K, dtype=torch.bool, device=device)
    not_eos = torch.ones(V, device=device)
    not_eos[eos] = 0.0
    bonus = length_penalty * not_eos  # (V,)
    frozen = torch.full((V,), NEG_INF, device=device)  # (V,): what a finished beam may emit
    frozen[eos] = 0.0
    base = (torch.arange(B, device=device) * K)[:, None]  # (B, 1): first row of each utterance
    history: list[tuple[torch.Tensor, torch.Tensor]] = []  # per step: (tokens (B, K), parent beam (B, K))

    for t in range(steps):
        log_probs, state = decoder.step(tokens, state)
        log_probs = log_probs.view(B, K, V)
        # A finished beam continues only with </s> at no cost; at max_len every beam must end.
        log_probs = torch.where(finished[..., None], frozen, log_probs)
        must_end = (t >= max_lens)[:, None, None] & (not_eos == 1)  # (B, 1, V)
        log_probs = log_probs.masked_fill(must_end, NEG_INF)
        cand = scores[..., None] + log_probs + torch.where(finished[..., None], 0.0, bonus)  # (B, K, V)
        scores, flat = cand.view(B, K * V).topk(K, dim=1)  # (B, K) each
        parent, token = flat // V, flat % V  # (B, K) each
        att = att.gather(1, parent) + log_probs.view(B, K * V).gather(1, flat)
        finished = finished.gather(1, parent) | (token == eos) | torch.isinf(scores)
        history.append((token, parent))
        if bool(finished.all()):
            break
        state = state.reorder((base + parent).view(-1), memory_too=False)  # beams share their utterance's memory
        tokens = token.view(-1)

    return _backtrack(history, scores, att, eos)


def _backtrack(
    history: list[tuple[torch.Tensor, torch.Tensor]], scores: torch.Tensor, att: torch.Tensor, eos: int
) -> list[list[Hypothesis]]:
    """Follow parent pointers from the last step; cut each sequence at its first </s>."""
    tokens = torch.stack([tok for tok, _ in history], dim=2).cpu().tolist()  # (B, K, L)
    parents = torch.stack([par for _, par in history], dim=2).cpu().tolist()  # (B, K, L)
    scores_l, att_l = scores.cpu().tolist(), att.cpu().tolist()
    out = []
    for b in range(len(scores_l)):
        hyps = []
        for k in range(len(scores_l[b])):
            if scores_l[b][k] == NEG_INF:
                continue
            seq, beam = [], k
            for step in range(len(history) - 1, -1, -1):
                seq.append(tokens[b][beam][step])
                beam = parents[b][beam][step]
            seq.reverse()
            seq = seq[: seq.index(eos)] if eos in seq else seq
            hyps.append(Hypothesis(tuple(seq), score=scores_l[b][k], att_score=att_l[b][k]))
        out.append(sorted(hyps, key=lambda h: h.score, reverse=True))
    return out
