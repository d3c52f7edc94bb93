"""The traced streaming step (``step="jit"``) gives the eager step's output, chunk for chunk."""

import pytest
import torch

from usmkit.models.config import ConformerConfig
from usmkit.models.conformer import ConformerEncoder
from usmkit.streaming.encoder import StreamingEncoder
from usmkit.streaming.quantize import quantize_linear_int8
from usmkit.streaming.step import init_state, stream_step
from usmkit.streaming.traced_step import TracedStreamStep

F_BINS = 16


def _encoder(**overrides) -> ConformerEncoder:
    args = dict(input_dim=F_BINS, d_model=32, num_layers=2, num_heads=2, subsampling_channels=8, dropout=0.0)
    args |= dict(causal_conv=True, chunk_size=4, left_chunks=2, zero_init_residual=False)
    torch.manual_seed(0)
    return ConformerEncoder(ConformerConfig(**{**args, **overrides})).eval()


def _stream(streamer: StreamingEncoder, feats: torch.Tensor, piece: int = 7) -> torch.Tensor:
    outs = [streamer.accept(feats[:, i : i + piece]) for i in range(0, feats.shape[1], piece)]
    outs.append(streamer.flush())
    return torch.cat(outs, dim=1)  # (B, T', D)


@pytest.mark.parametrize("chunk_size,left_chunks", [(2, 1), (4, 0), (3, 4)])
@pytest.mark.parametrize("T", [9, 61, 150])  # more chunks than the cache holds; a short last chunk
def test_traced_stream_equals_eager_stream(chunk_size, left_chunks, T):
    enc = _encoder(chunk_size=chunk_size, left_chunks=left_chunks)
    feats = torch.randn(2, T, F_BINS, generator=torch.Generator().manual_seed(T))
    eager = _stream(StreamingEncoder(enc, step="eager"), feats)
    traced = StreamingEncoder(enc, step="jit")
    torch.testing.assert_close(_stream(traced, feats), eager, atol=1e-5, rtol=1e-5)
    # The graph traced for the first stream serves the next one (reset, other lengths, other data).
    traced.reset()
    other = torch.randn(2, T + 5, F_BINS)
    torch.testing.assert_close(
        _stream(traced, other, piece=5), _stream(StreamingEncoder(enc, step="eager"), other), atol=1e-5, rtol=1e-5
    )
    assert len(traced._step._graphs) == 1


def test_traced_eight_x_stream_equals_eager_stream():
    enc = _encoder(chunk_size=2, left_chunks=2, subsampling_factor=8)
    feats = torch.randn(2, 97, F_BINS, generator=torch.Generator().manual_seed(0))
    eager = _stream(StreamingEncoder(enc, step="eager"), feats)
    assert eager.shape[1] == 11  # 97 frames at 8x, the last chunk short
    torch.testing.assert_close(_stream(StreamingEncoder(enc, step="jit"), feats), eager, atol=1e-5, rtol=1e-5)


def test_traced_step_state_and_short_chunk_match_stream_step():
    enc = _encoder()
    step = TracedStreamStep(enc)
    first = torch.randn(1, 3, F_BINS)
    s_eager, s_traced = init_state(enc, first), init_state(enc, first)
    for i, valid in enumerate([16, 16, 16, 9]):  # the last chunk has 9 valid feature frames of 16
        chunk = torch.randn(1, 16, F_BINS, generator=torch.Generator().manual_seed(i))
        lengths = torch.tensor([valid])
        out_e, lens_e, s_eager = stream_step(enc, chunk, s_eager, lengths)
        out_t, lens_t, s_traced = step(enc, chunk, s_traced, lengths)
        torch.testing.assert_close(out_t, out_e, atol=1e-5, rtol=1e-5)
        assert torch.equal(lens_t, lens_e)
        for name in ("kv", "cached", "conv_tail", "feat_ctx", "offset"):
            torch.testing.assert_close(getattr(s_traced, name), getattr(s_eager, name), atol=1e-5, rtol=1e-5)


def test_traced_int8_encoder_matches_its_eager_run():
    enc = quantize_linear_int8(_encoder())
    feats = torch.randn(1, 80, F_BINS)
    torch.testing.assert_close(
        _stream(StreamingEncoder(enc, step="jit"), feats), _stream(StreamingEncoder(enc), feats), atol=1e-5, rtol=1e-5
    )


def test_traced_step_refuses_training_mode_and_another_encoder():
    with pytest.raises(ValueError, match="eval mode"):
        TracedStreamStep(_encoder().train())
    enc, other = _encoder(), _encoder()
    state = init_state(other, torch.zeros(1, 3, F_BINS))
    with pytest.raises(ValueError, match="another encoder"):
        TracedStreamStep(enc)(other, torch.zeros(1, 16, F_BINS), state)


def test_warm_up_traces_before_the_first_chunk():
    streamer = StreamingEncoder(_encoder(), step="jit")
    streamer.warm_up()
    assert len(streamer._step._graphs) == 1 and streamer.chunks == 0 and streamer.state is None


def test_unknown_step_is_refused():
    with pytest.raises(ValueError, match="step must be"):
        StreamingEncoder(_encoder(), step="fast")
