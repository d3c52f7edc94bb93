"""usmkit.decoding.modes: the one table of decode modes and the dispatch that runs them on encoder output and heads."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from usmkit.decoding.ctc_greedy import ctc_greedy
from usmkit.decoding.modes import (
    ATTENTION_MODES,
    DECODE_MODES,
    ENSEMBLE_MODES,
    LEXICON_MODES,
    RESCORE_MODES,
    DecodeMode,
    DecodeOptions,
    decode,
    decode_texts,
)
from usmkit.decoding.rescoring import rescore_lexicon_nbest
from usmkit.inference.evaluate import EvalConfig
from usmkit.models.asr import AsrHeadConfig, AsrModel
from usmkit.models.las import LASConfig

V, F_IN = 10, 6


class PairEncoder(nn.Module):
    """2x subsampling by stacking frame pairs, one layer (the ConformerEncoder interface at its smallest)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2 * F_IN, 16)
        self.output_dim = 16

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, F = features.shape
        return torch.tanh(self.proj(features[:, : T // 2 * 2].reshape(B, T // 2, 2 * F))), lengths // 2


class IdTokenizer:
    """Token ids as text: '3 4' <-> [3, 4]."""

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


class FakeWordDecoder:
    """A word decoder's calls (``LexiconDecoder``'s) from the greedy path: best, n-best and scored n-best."""

    def __call__(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[str]:
        return [" ".join(map(str, ids)) for ids in ctc_greedy(log_probs, lengths)]

    def scored_nbest(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[tuple[str, float]]]:
        best = self(log_probs, lengths)
        return [[(text, -1.0), (text + " 4" if text else "4", -1.5)] for text in best]


def _joint_model() -> AsrModel:
    torch.manual_seed(0)
    las = LASConfig(num_layers=1, num_heads=2, ff_mult=2, dropout=0.0)
    return AsrModel(PairEncoder(), V, AsrHeadConfig(ctc_weight=0.3, las=las)).eval()


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(3, 24, F_IN, generator=g), torch.tensor([24, 18, 12])


def test_the_table_says_which_heads_each_mode_reads():
    assert tuple(DECODE_MODES) == ("ctc_greedy", "ctc_beam", "las_beam", "rescore", "ctc_lexicon", "lexicon_rescore")
    assert LEXICON_MODES == ("ctc_lexicon", "lexicon_rescore")
    assert ATTENTION_MODES == ("las_beam", "rescore", "lexicon_rescore")
    assert RESCORE_MODES == ("rescore", "lexicon_rescore")
    assert ENSEMBLE_MODES == ("ctc_greedy", "ctc_beam", "ctc_lexicon")
    with pytest.raises(ValueError, match=r"decode='viterbi': choose one of \('ctc_greedy', 'ctc_beam', 'las_beam'"):
        EvalConfig(checkpoint="exp", decode="viterbi")
    with pytest.raises(ValueError, match="ensembles decode with"):
        EvalConfig(checkpoint="exp", decode="rescore", ensemble=("exp2",))
    with pytest.raises(ValueError, match="searches with tokens or with words"):
        DecodeMode(ctc=True, las=False)


def test_texts_in_a_token_mode_are_the_detokenized_token_ids():
    model, tok = _joint_model(), IdTokenizer()
    features, lengths = _inputs()
    for mode in ("ctc_greedy", "ctc_beam", "las_beam", "rescore"):
        ids = decode(model, features, lengths, mode, beam_size=3, max_len=4)
        opts = DecodeOptions(beam_size=3, max_len=4)
        assert decode_texts(model, features, lengths, tok, mode, opts) == [tok.decode(i) for i in ids]


def test_a_word_decoder_replaces_a_token_mode_and_the_lexicon_modes_need_one():
    model, tok, words = _joint_model(), IdTokenizer(), FakeWordDecoder()
    features, lengths = _inputs()
    with torch.no_grad():
        enc, enc_lens = model.encode(features, lengths)
        log_probs = model.ctc(enc)
    opts = DecodeOptions(word_decoder=words, rescore_ctc_weight=0.5)
    assert decode_texts(model, features, lengths, tok, "ctc_greedy", opts) == words(log_probs, enc_lens)
    assert decode_texts(model, features, lengths, tok, "ctc_lexicon", opts) == words(log_probs, enc_lens)
    expected = rescore_lexicon_nbest(model.las, tok, enc, enc_lens, words.scored_nbest(log_probs, enc_lens), 0.5)
    assert decode_texts(model, features, lengths, tok, "lexicon_rescore", opts) == expected
    for mode in LEXICON_MODES:
        with pytest.raises(ValueError, match=f"decode mode '{mode}' needs a word decoder"):
            decode_texts(model, features, lengths, tok, mode)
    with pytest.raises(ValueError, match="returns words, not token ids"):
        decode(model, features, lengths, "ctc_lexicon")


def test_a_mode_is_refused_for_a_model_without_the_heads_it_reads():
    features, lengths = _inputs()
    ctc_only = AsrModel(PairEncoder(), V, AsrHeadConfig()).eval()
    for mode in ("las_beam", "rescore", "lexicon_rescore"):
        opts = DecodeOptions(word_decoder=FakeWordDecoder() if mode in LEXICON_MODES else None)
        with pytest.raises(ValueError, match=f"decode mode '{mode}' needs a LAS decoder, but this AsrModel has none"):
            decode_texts(ctc_only, features, lengths, IdTokenizer(), mode, opts)
    las_only = AsrModel(PairEncoder(), V, AsrHeadConfig(ctc_weight=0.0, las=LASConfig(num_layers=1, num_heads=2)))
    with pytest.raises(ValueError, match="decode mode 'ctc_beam' needs a CTC head, but this AsrModel has none"):
        decode(las_only.eval(), features, lengths, "ctc_beam")
    with pytest.raises(ValueError, match="unknown decode mode 'viterbi'"):
        decode(ctc_only, features, lengths, "viterbi")
