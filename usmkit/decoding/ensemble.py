"""Ensembles of CTC models (e.g. one recipe trained with different seeds), combined per hypothesis.

Shapes: B batch, T feature frames, F mel bins, T' encoder frames, V vocabulary, P (utterance,
candidate) pairs, N members.

Averaging the members' frame posteriors does not work for CTC: each model puts its spikes on its own
frames, so on every frame most members say blank and the average decodes to nothing. The ensemble
therefore works on whole hypotheses. Every member decodes on its own (greedy, prefix beam, or the
lexicon decoder: the decode mode's ``candidates`` in ``usmkit.decoding.modes``), which proposes candidate
transcripts; each candidate is scored by every member's CTC likelihood, summed over all alignments, so it
does not matter where a member spikes:

    score(y) = log mean_i p_i(y | x)

and the best-scoring candidate wins: a seed that is sure of a word outweighs two that hesitate.
Scores are acoustic only (the lexicon decoder's word LM shapes the candidates, not the choice).
Members must share the tokenizer and the features (``usmkit.cli.evaluate`` checks both).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

Candidates = list[list[tuple[int, ...]]]  # per utterance, its candidate token id sequences
Propose = Callable[[torch.Tensor, torch.Tensor], Candidates]  # one member's log-probs (B, T', V), lengths (B,)


class CtcEnsemble(torch.nn.Module):
    """Several trained CTC models (``AsrModel`` with a CTC head) that transcribe as one."""

    def __init__(self, members: list[torch.nn.Module]) -> None:
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"an ensemble needs at least 2 models, got {len(members)}")
        missing = [i for i, m in enumerate(members) if getattr(m, "ctc", None) is None]
        if missing:
            raise ValueError(f"ensemble members {missing} have no CTC head; this ensemble combines CTC models")
        self.members = torch.nn.ModuleList(members)

    @torch.no_grad()
    def log_probs(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """features (B, T, F), lengths (B,) -> every member's CTC log-probs (B, T', V), and enc_lens (B,)."""
        outputs = []
        enc_lens = None
        for i, member in enumerate(self.members):
            enc, lens = member.encode(features, lengths)
            if enc_lens is not None and not torch.equal(lens, enc_lens):
                raise ValueError(f"ensemble member {i} subsamples differently from member 0; members must match")
            enc_lens = lens
            outputs.append(member.ctc(enc).float())
        return outputs, enc_lens

    @torch.no_grad()
    def transcribe(self, features: torch.Tensor, lengths: torch.Tensor, tokenizer, propose: Propose) -> list[str]:
        """One transcript per utterance: the members' candidates, the one of highest mean likelihood.

        ``propose`` maps one member's log-probs (B, T', V) and lengths (B,) to its candidate token
        sequences per utterance (a decode mode's, ``usmkit.decoding.modes``: greedy's best path, the whole
        n-best list of a prefix beam search or of the lexicon decoder).
        """
        log_probs, enc_lens = self.log_probs(features, lengths)
        candidates: list[dict[tuple[int, ...], None]] = [{} for _ in range(features.shape[0])]  # ordered sets
        for member_log_probs in log_probs:
            for row, token_lists in enumerate(propose(member_log_probs, enc_lens)):
                candidates[row].update(dict.fromkeys(token_lists))
        best = choose_by_mean_likelihood(log_probs, enc_lens, [list(c) for c in candidates])
        return [tokenizer.decode(list(ids)) for ids in best]


def choose_by_mean_likelihood(
    log_probs: list[torch.Tensor], enc_lens: torch.Tensor, candidates: list[list[tuple[int, ...]]]
) -> list[tuple[int, ...]]:
    """Per utterance, the candidate token sequence maximizing ``log mean_i p_i(y | x)``.

    log_probs: N tensors (B, T', V); enc_lens (B,); candidates[b]: token id tuples (at least one).
    One batched CTC forward per member over the P (utterance, candidate) pairs of the utterances
    with more than one candidate; where every member proposed the same, that is the answer.
    """
    best = [cands[0] for cands in candidates]
    contested = [b for b, cands in enumerate(candidates) if len(cands) > 1]
    if not contested:
        return best
    rows = [b for b in contested for _ in candidates[b]]
    flat = [ids for b in contested for ids in candidates[b]]
    index = torch.tensor(rows, device=enc_lens.device)  # (P,)
    targets = torch.tensor([t for ids in flat for t in ids], dtype=torch.long, device=enc_lens.device)
    target_lens = torch.tensor([len(ids) for ids in flat], dtype=torch.long, device=enc_lens.device)
    per_member = []
    for member_log_probs in log_probs:
        pairs = member_log_probs[index].transpose(0, 1)  # (T', P, V): each pair's utterance
        nll = F.ctc_loss(pairs, targets, enc_lens[index], target_lens, reduction="none", zero_infinity=False)
        per_member.append(-nll)  # (P,) log p_i(y | x)
    scores = torch.logsumexp(torch.stack(per_member), dim=0) - math.log(len(log_probs))  # (P,)
    start = 0
    for b in contested:
        count = len(candidates[b])
        best[b] = candidates[b][int(scores[start : start + count].argmax())]
        start += count
    return best
