"""CTC greedy (best path) decoding.

Shapes: B batch, T encoder frames, V vocabulary (id 0 = blank).
"""

from __future__ import annotations

import torch

from usmkit.decoding.hypothesis import Hypothesis

BLANK_ID = 0


def _check(log_probs: torch.Tensor, lengths: torch.Tensor) -> None:
    if log_probs.dim() != 3:
        raise ValueError(f"log_probs must be (B, T, V), got shape {tuple(log_probs.shape)}")
    if lengths.shape != log_probs.shape[:1]:
        raise ValueError(f"lengths must be (B,) with B={log_probs.shape[0]}, got shape {tuple(lengths.shape)}")


def _best_path(log_probs: torch.Tensor, lengths: torch.Tensor, blank: int):
    """Frame-wise argmax and a (B, T) mask of the frames that emit a token."""
    best, ids = log_probs.max(dim=-1)  # (B, T) each
    B, T = ids.shape
    prev = torch.cat([ids.new_full((B, 1), -1), ids[:, :-1]], dim=1)  # (B, T): previous frame's id
    valid = torch.arange(T, device=ids.device)[None, :] < lengths[:, None].to(ids.device)  # (B, T)
    emit = (ids != blank) & (ids != prev) & valid  # a new token starts here
    return best, ids, emit, valid


def ctc_greedy(log_probs: torch.Tensor, lengths: torch.Tensor, blank: int = BLANK_ID) -> list[list[int]]:
    """Argmax per frame, collapse repeats, drop blanks: token ids per utterance.

    log_probs (B, T, V) (log-probs or logits, only the argmax matters); lengths (B,) valid frames.
    The collapse is vectorized; only the final split into Python lists loops over utterances.

    >>> frames = torch.tensor([1, 2, 2, 0, 2, 3])  # argmax id per frame, 0 = blank
    >>> lp = torch.nn.functional.one_hot(frames, 4).float()[None].log_softmax(-1)  # (1, 6, 4)
    >>> ctc_greedy(lp, torch.tensor([6]))
    [[1, 2, 2, 3]]
    """
    _check(log_probs, lengths)
    _, ids, emit, _ = _best_path(log_probs, lengths, blank)
    ids, emit = ids.cpu(), emit.cpu()
    return [ids[b][emit[b]].tolist() for b in range(ids.shape[0])]


def ctc_greedy_hypotheses(log_probs: torch.Tensor, lengths: torch.Tensor, blank: int = BLANK_ID) -> list[Hypothesis]:
    """Like ``ctc_greedy`` but as ``Hypothesis``: score = log-prob of the best path, timestamps = the
    frame where each token starts."""
    _check(log_probs, lengths)
    best, ids, emit, valid = _best_path(log_probs, lengths, blank)
    path_score = (best.float() * valid).sum(dim=1).cpu().tolist()  # (B,)
    ids, emit = ids.cpu(), emit.cpu()
    frames = torch.arange(ids.shape[1])
    out = []
    for b in range(ids.shape[0]):
        out.append(
            Hypothesis(
                tokens=tuple(ids[b][emit[b]].tolist()),
                score=path_score[b],
                ctc_score=path_score[b],
                timestamps=tuple(frames[emit[b]].tolist()),
            )
        )
    return out
