"""The streaming decoder on hand-made CTC log-probs: partials, endpoints, segments, word timings, rescoring."""

from __future__ import annotations

import pytest
import torch

from usmkit.decoding import PrefixBeamState, ctc_greedy_hypotheses
from usmkit.models.las import LASConfig, LASDecoder
from usmkit.streaming.decoder import DecoderConfig, EndpointConfig, Segment, StreamingDecoder, Word

NEVER = EndpointConfig(trailing_blank_s=1e3, trailing_silence_s=1e3, max_segment_s=1e3)


class Pieces:
    """A tokenizer over a fixed piece table, with sentencepiece's conventions (▁ starts a word)."""

    table = ["<blank>", "<unk>", "<s>", "</s>", "▁the", "▁cat", "▁sat", "s", "▁on", "▁a", "▁mat"]

    def id_to_piece(self, i: int) -> str:
        return self.table[i]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.table[i] for i in ids if i > 3).replace("\u2581", " ").strip()


V = len(Pieces.table)


def peaky(ids: list[int]) -> torch.Tensor:
    """Log-probs (T, V) whose argmax per frame is ``ids``."""
    return (10.0 * torch.nn.functional.one_hot(torch.tensor(ids), V).float()).log_softmax(-1)


def feed(decoder: StreamingDecoder, log_probs: torch.Tensor, chunk: int, silent=None, enc=None) -> list[Segment]:
    segments = []
    for i in range(0, log_probs.shape[0], chunk):
        s = None if silent is None else silent[i : i + chunk]
        e = None if enc is None else enc[i : i + chunk]
        segments += decoder.accept(log_probs[i : i + chunk], e, s)
    return segments + decoder.finish()


@pytest.mark.parametrize("chunk", [1, 4, 7, 100])
def test_greedy_stream_equals_offline_greedy(chunk):
    log_probs = torch.randn(60, V, generator=torch.Generator().manual_seed(chunk)).log_softmax(-1)
    (seg,) = feed(StreamingDecoder(Pieces(), DecoderConfig(endpoint=NEVER)), log_probs, chunk)
    (ref,) = ctc_greedy_hypotheses(log_probs[None], torch.tensor([60]))
    assert seg.tokens == ref.tokens
    assert seg.start == pytest.approx(ref.timestamps[0] * 0.04)
    assert seg.end == pytest.approx((ref.timestamps[-1] + 1) * 0.04)
    assert seg.score == pytest.approx(ref.score, rel=1e-5)


def _two_utterances() -> list[int]:
    # "the cat", 20 blank frames (0.8 s), "sats", 5 blanks
    return [4, 4, 0, 5] + [0] * 20 + [6, 7] + [0] * 5


@pytest.mark.parametrize("mode", ["ctc_greedy", "ctc_beam"])
@pytest.mark.parametrize("chunk", [1, 3, 8, 100])
def test_trailing_blanks_end_a_segment_at_the_exact_frame(mode, chunk):
    decoder = StreamingDecoder(Pieces(), DecoderConfig(mode=mode, beam_size=4))
    segments = feed(decoder, peaky(_two_utterances()), chunk)
    assert [s.text for s in segments] == ["the cat", "sats"]
    first, second = segments
    assert (first.start, first.end) == pytest.approx((0.0, 0.16))
    assert first.words == (Word("the", 0.0, pytest.approx(0.04)), Word("cat", pytest.approx(0.12), pytest.approx(0.16)))
    assert (second.start, second.end) == pytest.approx((0.96, 1.04))  # frames 24-25: absolute stream times
    assert [w.text for w in second.words] == ["sats"]


def test_partial_grows_then_resets_after_an_endpoint():
    decoder = StreamingDecoder(Pieces(), DecoderConfig())
    frames = peaky(_two_utterances())
    assert decoder.accept(frames[:1]) == [] and decoder.partial == "the"
    assert decoder.accept(frames[1:4]) == [] and decoder.partial == "the cat"
    (seg,) = decoder.accept(frames[4:25])  # the endpoint is at frame 23; frame 24 starts the next segment
    assert seg.text == "the cat" and decoder.partial == "sat"
    assert decoder.frames == 25


def test_silence_ends_a_segment_and_all_silent_segments_are_dropped():
    cfg = DecoderConfig(endpoint=EndpointConfig(trailing_silence_s=0.48))  # 12 frames
    # "the" keeps being the argmax (no blanks at all), but the audio goes silent from frame 5 on.
    ids = [4] * 30
    silent = torch.tensor([False] * 5 + [True] * 25)
    segments = feed(StreamingDecoder(Pieces(), cfg), peaky(ids), 4, silent=silent)
    # The first segment ends after 12 silent frames; what the head says over the silence after is dropped.
    assert [s.text for s in segments] == ["the"]
    all_silent = feed(
        StreamingDecoder(Pieces(), cfg), peaky([4, 0, 5, 0] * 5), 4, silent=torch.ones(20, dtype=torch.bool)
    )
    assert all_silent == []


def test_long_segments_are_cut_at_max_segment():
    cfg = DecoderConfig(endpoint=EndpointConfig(max_segment_s=0.4))  # 10 frames
    segments = feed(StreamingDecoder(Pieces(), cfg), peaky([4, 0, 5, 0, 6] * 6), 7)
    assert len(segments) == 3
    assert [s.start for s in segments] == pytest.approx([0.0, 0.4, 0.8])


def test_rescoring_ranks_the_nbest_with_the_attention_decoder():
    torch.manual_seed(0)
    las = LASDecoder(16, V, LASConfig(num_layers=1, num_heads=2, dropout=0.0)).eval()
    enc = torch.randn(31, 16)
    # Two near-tied readings per frame, so the beam holds several hypotheses.
    lp = torch.full((31, V), -8.0)
    ids = _two_utterances()
    lp[torch.arange(31), torch.tensor(ids)] = -0.7
    lp[torch.arange(31), torch.tensor([8 if i else 0 for i in ids])] = -0.8
    lp = lp.log_softmax(-1)
    cfg = DecoderConfig(mode="ctc_beam", beam_size=4, rescore=True, rescore_ctc_weight=0.0)
    segments = feed(StreamingDecoder(Pieces(), cfg, las=las), lp, 5, enc=enc)
    assert segments and all(s.rescored for s in segments)
    # With ctc_weight=0 the decoder alone ranks: the first segment (frames 0-23) is its favourite of the n-best.
    end = 24
    nbest = PrefixBeamState(beam_size=4).advance(lp[:end]).nbest()
    assert len(nbest) > 1
    att = las.score(
        enc[None, :end].expand(len(nbest), -1, -1), torch.full((len(nbest),), end), [h.tokens for h in nbest]
    )
    assert segments[0].tokens == nbest[int(att.argmax())].tokens
    plain = feed(StreamingDecoder(Pieces(), DecoderConfig(mode="ctc_beam", beam_size=4)), lp, 5)
    assert len(plain) == len(segments) and not any(s.rescored for s in plain)
    with pytest.raises(ValueError, match="encoder frames"):
        StreamingDecoder(Pieces(), cfg, las=las).accept(lp[:3])


def test_beam_segments_carry_the_other_hypotheses_and_partials_the_nbest():
    """With ``ctc_beam`` a segment keeps the beam's other readings (each with its own words and times),
    and the open segment's n-best texts are there for partial results; greedy has only the best."""
    lp = torch.full((31, V), -8.0)
    ids = _two_utterances()
    lp[torch.arange(31), torch.tensor(ids)] = -0.7
    lp[torch.arange(31), torch.tensor([8 if i else 0 for i in ids])] = -0.8  # "on" nearly as likely as each word
    lp = lp.log_softmax(-1)
    decoder = StreamingDecoder(Pieces(), DecoderConfig(mode="ctc_beam", beam_size=4))
    decoder.accept(lp[:4])
    partials = decoder.partial_nbest(3)
    assert len(partials) == 3 and partials[0] == decoder.partial and len(set(partials)) == 3
    first = (decoder.accept(lp[4:]) + decoder.finish())[0]
    expected = PrefixBeamState(beam_size=4).advance(lp[:24]).nbest()
    assert [first.tokens] + [a.tokens for a in first.alternatives] == [h.tokens for h in expected if h.tokens]
    for alt in first.alternatives:
        assert alt.words and first.start <= alt.start < alt.end <= 24 * 0.04 and not alt.alternatives
    greedy = StreamingDecoder(Pieces(), DecoderConfig())
    assert greedy.accept(lp) and greedy.partial_nbest(5) == [greedy.partial]
    assert all(s.alternatives == () for s in feed(StreamingDecoder(Pieces(), DecoderConfig()), lp, 5))


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="ctc_beam"):
        DecoderConfig(mode="ctc_greedy", rescore=True)
    with pytest.raises(ValueError, match="LAS"):
        StreamingDecoder(Pieces(), DecoderConfig(mode="ctc_beam", rescore=True))
    with pytest.raises(ValueError, match="trailing_blank_s"):
        EndpointConfig(trailing_blank_s=0)
    with pytest.raises(ValueError, match="silent"):
        StreamingDecoder(Pieces()).accept(peaky([4, 0]), silent=torch.zeros(3, dtype=torch.bool))
