"""The encoder's stream step: chunk-by-chunk output equals the full forward under the same chunk mask."""

import pytest
import torch

from usmkit.models.config import ConformerConfig
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.presets import tiny
from usmkit.models.subsampling import feature_context, output_lengths
from usmkit.streaming.encoder import StreamingEncoder
from usmkit.streaming.graphed_step import GraphedStreamStep
from usmkit.streaming.step import (
    EncoderStreamState,
    NotStreamableError,
    check_streamable,
    init_state,
    split_state,
    stack_states,
    stream_step,
)
from usmkit.streaming.traced_step import TracedStreamStep

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: chunks of a few frames run best on one

F_BINS = 16
FEATURE_CONTEXT = feature_context(4)  # the default encoder's: 3 feature frames read by two chunks


def _encoder(**overrides) -> ConformerEncoder:
    args = dict(
        input_dim=F_BINS,
        d_model=32,
        num_layers=2,
        num_heads=2,
        subsampling_channels=8,
        dropout=0.0,
        causal_conv=True,
        chunk_size=4,
        left_chunks=2,
        zero_init_residual=False,  # random residual branches: every path contributes
    )
    torch.manual_seed(0)
    return ConformerEncoder(ConformerConfig(**{**args, **overrides})).eval()


def _features(B, T, F=F_BINS, seed=1):
    return torch.randn(B, T, F, generator=torch.Generator().manual_seed(seed))


def _stream(streamer: StreamingEncoder, feats: torch.Tensor, seed: int) -> torch.Tensor:
    """Feed feats (B, T, F) in random pieces of 1..12 frames, then flush; returns (B, T', D)."""
    g = torch.Generator().manual_seed(seed)
    outs, i = [], 0
    while i < feats.shape[1]:
        n = int(torch.randint(1, 13, (1,), generator=g))
        outs.append(streamer.accept(feats[:, i : i + n]))
        i += n
    outs.append(streamer.flush())
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize(
    "chunk_size,left_chunks,conv_kernel",
    [(1, 3, 5), (2, 1, 5), (3, 0, 3), (4, 2, 5), (5, 4, 4), (8, 1, 5)],
)
@pytest.mark.parametrize("extra", [0, 26, 94])  # T = receptive field + extra: 7, 33, 101 at 4x; 15, 41, 109 at 8x
@pytest.mark.parametrize("factor", [4, 8])
def test_chunk_by_chunk_equals_full_forward(chunk_size, left_chunks, conv_kernel, extra, factor):
    enc = _encoder(chunk_size=chunk_size, left_chunks=left_chunks, conv_kernel=conv_kernel, subsampling_factor=factor)
    T = enc.subsampling.receptive_field + extra  # 101, 109: not s - 1 + a multiple of s x chunk for any chunk here
    feats = _features(2, T)
    full, lens = enc(feats, torch.tensor([T, T]))
    streamed = _stream(StreamingEncoder(enc), feats, seed=T)
    assert streamed.shape == full.shape == (2, int(output_lengths(torch.tensor(T), factor)), 32)
    torch.testing.assert_close(streamed, full, atol=1e-5, rtol=1e-5)


def test_eight_x_stream_geometry():
    """At 8x a step consumes 8 C feature frames and carries 7 (the 15-frame receptive field less the stride)."""
    enc = _encoder(chunk_size=3, left_chunks=2, subsampling_factor=8)
    feats = _features(2, 7 + 24 * 4)
    state = init_state(enc, feats[:, :7])
    assert (state.chunk_input_frames, state.feature_context, state.feat_ctx.shape) == (24, 7, (2, 7, F_BINS))
    outs = []
    for i in range(4):
        out, out_lens, state = stream_step(enc, feats[:, 7 + 24 * i : 7 + 24 * (i + 1)], state)
        assert out_lens.tolist() == [3, 3]
        outs.append(out)
    full, _ = enc(feats, torch.tensor([103, 103]))
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"first \(B, 7, 16\)"):
        init_state(enc, feats[:, :3])
    with pytest.raises(ValueError, match="8 x chunk_size = 24"):
        stream_step(enc, feats[:, :12], init_state(enc, feats[:, :7]))
    with pytest.raises(ValueError, match="state is of a 4x stream, the encoder subsamples 8x"):
        stream_step(enc, feats[:, :12], init_state(_encoder(chunk_size=3, left_chunks=2), feats[:, :3]))


def test_tiny_preset_streaming_config_matches_full_forward():
    torch.manual_seed(0)
    enc = ConformerEncoder(
        tiny(causal_conv=True, chunk_size=4, left_chunks=2, dropout=0.0, zero_init_residual=False)
    ).eval()
    feats = _features(1, 150, F=80)
    full, _ = enc(feats, torch.tensor([150]))
    torch.testing.assert_close(_stream(StreamingEncoder(enc), feats, seed=0), full, atol=1e-5, rtol=1e-5)


def test_state_has_fixed_shapes_and_rolls_the_cache():
    enc = _encoder(chunk_size=3, left_chunks=2, conv_kernel=5)
    feats = _features(2, 3 + 12 * 5)
    state = init_state(enc, feats[:, :FEATURE_CONTEXT])
    L, H, Dh, D = 2, 2, 16, 32
    shapes = (state.kv.shape, state.conv_tail.shape, state.feat_ctx.shape)
    assert shapes == ((L, 2, 2, H, 2 * 3, Dh), (L, 2, 4, D), (2, FEATURE_CONTEXT, F_BINS))
    for i in range(5):
        chunk = feats[:, FEATURE_CONTEXT + 12 * i : FEATURE_CONTEXT + 12 * (i + 1)]
        prev = state
        out, out_lens, state = stream_step(enc, chunk, state)
        assert out.shape == (2, 3, D) and out_lens.tolist() == [3, 3]
        assert (state.kv.shape, state.conv_tail.shape, state.feat_ctx.shape) == shapes
        assert int(state.offset) == 3 * (i + 1) and int(state.cached) == min(3 * (i + 1), 6)
        # Rolling: the newer half of the old cache is now the older half.
        torch.testing.assert_close(state.kv[..., :3, :], prev.kv[..., 3:, :])


def test_rows_ending_in_different_chunks_match_the_padded_batch():
    """The low-level API with per-row lengths: each row's last chunk is partial, then the row is padding."""
    enc = _encoder(chunk_size=2, left_chunks=1)
    lengths = torch.tensor([45, 30])
    feats = _features(2, 45)
    feats[1, 30:] = 0.0
    full, full_lens = enc(feats, lengths)
    state = init_state(enc, feats[:, :FEATURE_CONTEXT])
    outs, i = [], FEATURE_CONTEXT
    while i < 45:
        chunk = torch.nn.functional.pad(feats[:, i : i + 8], (0, 0, 0, 8 - feats[:, i : i + 8].shape[1]))
        out, _, state = stream_step(enc, chunk, state, (lengths - i).clamp(0, 8))
        outs.append(out)
        i += 8
    streamed = torch.cat(outs, dim=1)
    for b, n in enumerate(full_lens.tolist()):
        torch.testing.assert_close(streamed[b, :n], full[b, :n], atol=1e-5, rtol=1e-5)


def _run_batched(enc, feats: list[torch.Tensor], joins: list[int], step) -> tuple[list[torch.Tensor], list[int]]:
    """Streams of feats[i] (T_i, F) as a server runs them: stream i joins at round joins[i]; each round,
    every joined stream that is not done gives one chunk (its last one padded) to one batched step over
    their stacked states. Returns each stream's output (T_i', D) and the batch size of each round."""
    streams = [StreamingEncoder(enc, step=None) for _ in feats]
    for s, f in zip(streams, feats, strict=True):
        s.queue(f[None])
    outs: list[list[torch.Tensor]] = [[] for _ in feats]
    done, sizes, r = [False] * len(feats), [], 0
    while not all(done):
        rows = []
        for i, s in enumerate(streams):
            if done[i] or r < joins[i]:
                continue
            taken = s.next_chunk() if s.chunks_ready else s.last_chunk()
            done[i] = taken is None or bool(taken[1][0] < s.state.chunk_input_frames)
            if taken is not None:
                rows.append((i, *taken))
        if rows:
            state = stack_states([streams[i].state for i, _, _ in rows])
            chunk = torch.cat([c for _, c, _ in rows])  # (B, 4C, F)
            out, out_lens, new = step(enc, chunk, state, torch.cat([n for _, _, n in rows]))
            for (i, _, _), o, n, st in zip(rows, out, out_lens.tolist(), split_state(new), strict=True):
                outs[i].append(streams[i].advance(o[None], st, n))
            sizes.append(len(rows))
        r += 1
    return [torch.cat(o, dim=1)[0] for o in outs], sizes


@pytest.mark.parametrize("kind", ["eager", "traced", "graphed"])
def test_batched_streams_at_different_positions_equal_each_stream_alone(kind):
    """Streams that started at different times (other rotary offsets and cache fills, one ending while
    the others go on) run as one step over their stacked states: each gets what it gets alone. Traced
    with ``any_batch``, one graph serves every batch size; graphed (here its eager fallback, on the CPU),
    batches of 3 run padded to 4."""
    enc = _encoder(chunk_size=3, left_chunks=2)
    feats = [_features(1, T, seed=T)[0] for T in (70, 31, 101, 50)]
    step = {"eager": stream_step, "traced": TracedStreamStep(enc, any_batch=True),
            "graphed": GraphedStreamStep(max_batch=4, capture=False)}[kind]  # fmt: skip
    batched, sizes = _run_batched(enc, feats, joins=[0, 1, 1, 2], step=step)
    assert max(sizes) == 4 and len(set(sizes)) > 2  # batches of changing size
    if kind == "graphed":
        assert 3 in sizes and sorted(step._recorded) == [1, 4]  # batches of 3 run as 4
    for f, out in zip(feats, batched, strict=True):
        alone = StreamingEncoder(enc)
        expected = torch.cat([alone.accept(f[None]), alone.flush()], dim=1)[0]  # (T', D)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    if kind == "traced":
        assert len(step._graphs) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_graphs_of_the_step_equal_the_eager_step(precision):
    """Replayed CUDA graphs (one per batch size) against the eager step, and each call's outputs its own."""
    enc = _encoder(chunk_size=3, left_chunks=2).cuda()
    feats = [_features(1, T, seed=T)[0].cuda() for T in (70, 31, 101, 50)]
    step = GraphedStreamStep(max_batch=4, capture=True, precision=precision)
    graphed, _ = _run_batched(enc, feats, joins=[0, 1, 1, 2], step=step)
    eager, _ = _run_batched(enc, feats, joins=[0, 1, 1, 2], step=stream_step)
    assert all(r.graph is not None for r in step._recorded.values())
    tol = dict(atol=1e-4, rtol=1e-4) if precision == "fp32" else dict(atol=5e-2, rtol=5e-2)
    for g, e in zip(graphed, eager, strict=True):
        torch.testing.assert_close(g, e, **tol)
    state = stack_states([init_state(enc, _features(1, FEATURE_CONTEXT, seed=i).cuda()) for i in range(3)])
    chunk = _features(3, state.chunk_input_frames).cuda()
    lengths = torch.full((3,), state.chunk_input_frames, device="cuda")
    first, _, _ = step(enc, chunk, state, lengths)
    kept = first.clone()
    step(enc, chunk + 1, state, lengths)
    assert torch.equal(first, kept), "a later replay must not overwrite an earlier call's output"


def test_graphed_step_refuses_a_batch_above_its_largest_size_and_scalar_positions():
    from dataclasses import fields

    from usmkit.streaming.graphed_step import _BATCH_DIM

    state_tensors = {f.name for f in fields(EncoderStreamState)} - {"chunk_size", "left_chunks", "subsampling_factor"}
    assert set(_BATCH_DIM) == state_tensors, "every state tensor is padded and trimmed along its row axis"
    enc = _encoder()
    step = GraphedStreamStep(max_batch=2, capture=False)
    assert step.sizes == [1, 2] and GraphedStreamStep(max_batch=24, capture=False).sizes == [1, 2, 4, 8, 16, 24]
    states = [init_state(enc, _features(1, FEATURE_CONTEXT, seed=i)) for i in range(3)]
    chunk = _features(3, states[0].chunk_input_frames)
    lengths = torch.full((3,), states[0].chunk_input_frames)
    with pytest.raises(ValueError, match="a batch of 3 streams is more than max_batch=2"):
        step(enc, chunk, stack_states(states), lengths)
    with pytest.raises(ValueError, match="per-row positions"):
        step(enc, chunk[:1], states[0], lengths[:1])


def test_stacked_state_splits_back_into_its_rows():
    enc = _encoder()
    states = [init_state(enc, _features(1, FEATURE_CONTEXT, seed=i)) for i in range(3)]
    _, _, states[1] = stream_step(enc, _features(1, 16), states[1])
    stacked = stack_states(states)
    assert stacked.batch_size == 3 and stacked.offset.tolist() == [0, 4, 0] and stacked.cached.tolist() == [0, 4, 0]
    for row, state in zip(split_state(stacked), states, strict=True):
        for name in ("kv", "conv_tail", "feat_ctx"):
            assert torch.equal(getattr(row, name), getattr(state, name))
        assert int(row.offset) == int(state.offset) and int(row.cached) == int(state.cached)
    with pytest.raises(ValueError, match="share chunk_size, left_chunks and subsampling_factor"):
        stack_states([states[0], init_state(enc, _features(1, FEATURE_CONTEXT), chunk_size=2)])


def test_unbounded_history_is_refused_unless_capped_explicitly():
    enc = _encoder(chunk_size=3, left_chunks=-1)
    with pytest.raises(NotStreamableError, match="left_chunks=-1"):
        StreamingEncoder(enc)
    feats = _features(1, 80)
    capped, _ = enc(feats, torch.tensor([80]), chunk_size=3, left_chunks=2)  # the approximation, as a mask
    torch.testing.assert_close(
        _stream(StreamingEncoder(enc, left_chunks=2), feats, seed=3), capped, atol=1e-5, rtol=1e-5
    )


def test_non_streaming_encoders_are_refused_with_the_reason():
    with pytest.raises(NotStreamableError, match="not causal"):
        check_streamable(_encoder(causal_conv=False).cfg)
    with pytest.raises(NotStreamableError, match="full attention"):
        check_streamable(_encoder(chunk_size=None).cfg)
    assert check_streamable(_encoder().cfg) == (4, 2)
    assert check_streamable(_encoder().cfg, chunk_size=6, left_chunks=0) == (6, 0)


def test_bad_chunk_shapes_raise():
    enc = _encoder()
    state = init_state(enc, _features(1, FEATURE_CONTEXT))
    with pytest.raises(ValueError, match="4 x chunk_size = 16"):
        stream_step(enc, _features(1, 15), state)
    with pytest.raises(ValueError, match=r"first \(B, 3, 16\)"):
        init_state(enc, _features(1, 4))


def test_short_streams():
    enc = _encoder()
    s = StreamingEncoder(enc)
    assert s.accept(_features(1, 2)).shape == (1, 0, 32)
    assert s.flush().shape == (1, 0, 32)  # 2 frames: less than the subsampling's 7
    s.reset()
    feats = _features(1, 7)
    out = torch.cat([s.accept(feats), s.flush()], dim=1)
    torch.testing.assert_close(out, enc(feats, torch.tensor([7]))[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_size,left_chunks", [(1, 3), (3, 2), (4, 0), (5, 4), (8, 1)])
@pytest.mark.parametrize("T", [2, 33, 101])
def test_imported_w2vbert_layout_streams_equal_to_full_forward(chunk_size, left_chunks, T):
    """w2v-BERT 2.0's options (stacking front end, relative_key bias clipped at 3 left / 2 right, kernel 5,
    swish, eps 1e-5): the step adds the bias over the cached keys as the full forward does under the chunk mask.
    Left context beyond the clip window (chunk 8 x 1 > 3) uses the clipped distances, as the full forward."""
    enc = _encoder(
        chunk_size=chunk_size, left_chunks=left_chunks, front_end="stack", subsampling_factor=2,
        position="relative_key", relative_left=3, relative_right=2, num_heads=4,
    )  # fmt: skip
    assert enc.feature_context == 0
    feats = _features(2, T)
    full, lens = enc(feats, torch.tensor([T, T]))
    streamed = _stream(StreamingEncoder(enc), feats, seed=T)
    assert streamed.shape == full.shape == (2, T // 2, 32)
    torch.testing.assert_close(streamed, full, atol=1e-5, rtol=1e-5)
    if T > 2:  # more than one key: the bias changes the output
        with torch.no_grad():
            for block in enc.blocks:
                block.mhsa.distance_embedding.weight.zero_()
            assert not torch.allclose(enc(feats, torch.tensor([T, T]))[0], full)


@pytest.mark.parametrize("chunk_size,left_chunks", [(1, 3), (3, 2), (4, 0)])
def test_transformer_xl_positions_stream_equal_to_full_forward(chunk_size, left_chunks):
    """NEST's attention (``position="rel_pos_xl"``, random u / v biases, folded conv norm) behind a streamable
    front end: the step adds the Transformer-XL term over the cached keys as the full forward does under the
    chunk mask. (NEST's own ``dw_striding`` front end reads ahead and is refused by ``check_streamable``.)"""
    enc = _encoder(chunk_size=chunk_size, left_chunks=left_chunks, position="rel_pos_xl", num_heads=4, conv_norm="none")
    with torch.no_grad():
        for block in enc.blocks:
            block.mhsa.pos_bias_u.normal_()
            block.mhsa.pos_bias_v.normal_()
    feats = _features(2, 61)
    full, lens = enc(feats, torch.tensor([61, 61]))
    streamed = _stream(StreamingEncoder(enc), feats, seed=61)
    assert streamed.shape == full.shape
    torch.testing.assert_close(streamed, full, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # the position term contributes
        for block in enc.blocks:
            block.mhsa.linear_pos.weight.zero_()
        assert not torch.allclose(enc(feats, torch.tensor([61, 61]))[0], full)
