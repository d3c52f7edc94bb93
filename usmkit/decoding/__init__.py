"""Decoding: pure searches on tensors (CTC greedy, CTC prefix beam, lexicon + word LM, LAS beam, rescoring),
ensembles of CTC models, and the one table of decode modes that runs them on a model's encoder output and
heads (``usmkit.decoding.modes``). Decoding sits above the models: they never import it."""

from usmkit.decoding.ctc_greedy import ctc_greedy, ctc_greedy_hypotheses
from usmkit.decoding.ctc_prefix_beam import PrefixBeamState, ctc_prefix_beam_search, ctc_prefix_beam_search_batch
from usmkit.decoding.hypothesis import Hypothesis
from usmkit.decoding.las_beam import las_beam_search
from usmkit.decoding.rescoring import attention_rescore, attention_rescore_batch

__all__ = [
    "Hypothesis",
    "PrefixBeamState",
    "attention_rescore",
    "attention_rescore_batch",
    "ctc_greedy",
    "ctc_greedy_hypotheses",
    "ctc_prefix_beam_search",
    "ctc_prefix_beam_search_batch",
    "las_beam_search",
]
