"""CTC posterior averaging over several trained models (e.g. the same recipe with different seeds).

Shapes: B batch, T feature frames, F mel bins, T' encoder frames, V vocabulary.

Each member encodes the same features; the ensemble's frame posteriors are the members' averaged
in probability, ``log p(v | t) = log mean_i p_i(v | t)``, and are decoded exactly as one model's
would be (greedy, prefix beam, or the lexicon decoder through ``encode`` + ``ctc``). Averaging
probabilities rather than picking by vote keeps each member's confidence: a seed that is sure of
a word outweighs two that hesitate. Members must share the tokenizer, the features and the
encoder's subsampling, so that frame t' and token v mean the same in each; ``check_compatible``
says which of these differ.
"""

from __future__ import annotations

import math

import torch

from usmkit.decoding.ctc_greedy import ctc_greedy_hypotheses
from usmkit.decoding.ctc_prefix_beam import ctc_prefix_beam_search_batch
from usmkit.decoding.hypothesis import Hypothesis

ENSEMBLE_DECODE_MODES = ("ctc_greedy", "ctc_beam")


class CtcEnsemble(torch.nn.Module):
    """``encode`` / ``ctc`` / ``decode`` of an ``AsrModel``, over ``members`` (each with a CTC head)."""

    def __init__(self, members: list[torch.nn.Module]) -> None:
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"an ensemble needs at least 2 models, got {len(members)}")
        missing = [i for i, m in enumerate(members) if getattr(m, "ctc", None) is None]
        if missing:
            raise ValueError(f"ensemble members {missing} have no CTC head; posterior averaging needs CTC models")
        self.members = torch.nn.ModuleList(members)

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """features (B, T, F), lengths (B,) -> every member's enc (B, T', D_i), and enc_lens (B,)."""
        encoded = [member.encode(features, lengths) for member in self.members]
        enc_lens = encoded[0][1]
        for i, (_, lens) in enumerate(encoded[1:], start=1):
            if not torch.equal(lens, enc_lens):
                raise ValueError(f"ensemble member {i} subsamples differently from member 0; members must match")
        return [enc for enc, _ in encoded], enc_lens

    def ctc(self, encoded: list[torch.Tensor]) -> torch.Tensor:
        """Every member's enc -> the averaged CTC log-probabilities (B, T', V)."""
        log_probs = torch.stack([member.ctc(enc) for member, enc in zip(self.members, encoded, strict=True)])
        return torch.logsumexp(log_probs, dim=0) - math.log(len(self.members))  # log of the mean probability

    @torch.no_grad()
    def decode_hypotheses(
        self, features: torch.Tensor, lengths: torch.Tensor, mode: str = "ctc_greedy", beam_size: int = 10
    ) -> list[Hypothesis]:
        if mode not in ENSEMBLE_DECODE_MODES:
            raise ValueError(f"an ensemble decodes with {ENSEMBLE_DECODE_MODES} or ctc_lexicon, not {mode!r}")
        encoded, enc_lens = self.encode(features, lengths)
        log_probs = self.ctc(encoded)
        if mode == "ctc_greedy":
            return ctc_greedy_hypotheses(log_probs, enc_lens)
        return [nbest[0] for nbest in ctc_prefix_beam_search_batch(log_probs, enc_lens, beam_size)]

    def decode(
        self, features: torch.Tensor, lengths: torch.Tensor, mode: str = "ctc_greedy", beam_size: int = 10
    ) -> list[list[int]]:
        """Token ids of the best hypothesis per utterance, like ``AsrModel.decode``."""
        return [list(h.tokens) for h in self.decode_hypotheses(features, lengths, mode, beam_size)]
