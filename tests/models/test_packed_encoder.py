"""Packed batches in the model: the same utterances packed into shared rows or one per row give the same
encoder outputs, the same CTC / LAS / BEST-RQ losses and the same gradients (fp32), for every attention
path that takes packed rows on the CPU, chunk-wise masks with and without left context, causal convolution
and both subsampling factors."""

import pytest
import torch

from usmkit.data.packing import RowPacker
from usmkit.kernels.masks import Segments
from usmkit.models.asr import AsrHeadConfig, AsrModel
from usmkit.models.config import ConformerConfig
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.convolution import ConvolutionModule
from usmkit.models.las import LASConfig
from usmkit.models.packing import encoder_segments, feature_segments, unpack
from usmkit.ssl.bestrq import BestRQConfig, BestRQModel

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]

F_BINS = 16
LENGTHS = [37, 50, 23, 61, 9, 44, 30, 3]  # feature frames; 3 is shorter than the front end's receptive field


def _encoder(**overrides) -> ConformerEncoder:
    args = dict(input_dim=F_BINS, d_model=32, num_layers=2, num_heads=2, subsampling_channels=8, dropout=0.0)
    args |= dict(zero_init_residual=False, chunk_size=4, left_chunks=0)
    torch.manual_seed(0)
    return ConformerEncoder(ConformerConfig(**{**args, **overrides}))


def _utterances(lengths=LENGTHS, rows=4, frames=96, align=4, seed=1):
    """The same utterances both ways: packed (R, N, F) with their packing, and one per row (U, T, F), in the
    packing's order."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lengths)
    feats = torch.randn(len(lengths), max(lengths), F_BINS, generator=g)
    feats = feats * (torch.arange(max(lengths))[None, :] < lens[:, None])[:, :, None]  # zero padding
    order, packed, packed_lens, packing = RowPacker(rows, frames, align).pack(feats, lens, lengths)
    assert torch.equal(packed_lens, lens[order])
    return packed, packed_lens, packing, feats[order], lens[order]


def _valid(x, lens):
    """x (B, T, ...) -> only the first lens[b] frames of each row (a list)."""
    return [x[b, : int(n)] for b, n in enumerate(lens)]


def test_packing_places_whole_utterances_at_aligned_offsets():
    packed, lens, packing, feats, _ = _utterances()
    assert packed.shape == (4, 96, F_BINS)
    assert packing.segment_ids.shape == (4, 96)
    assert (packing.offsets % 4 == 0).all()
    ids = packing.segment_ids
    assert (ids[ids >= 0].diff() >= 0).all(), "utterances are numbered row by row, left to right"
    for u, n in enumerate(lens.tolist()):
        r, o = int(packing.rows[u]), int(packing.offsets[u])
        torch.testing.assert_close(packed[r, o : o + n], feats[u, :n], rtol=0, atol=0)
        assert (ids[r, o : o + n] == u).all() and int((ids == u).sum()) == n
    seg = feature_segments(packing)
    assert (seg.positions[ids >= 0] < lens[ids[ids >= 0]]).all()


@pytest.mark.parametrize("factor", [4, 8])
def test_encoder_segments_hold_exactly_each_utterances_valid_frames(factor):
    packed, lens, packing, _, _ = _utterances(align=factor)
    enc = _encoder(subsampling_factor=factor)
    T = enc.subsampling(packed, lens)[0].shape[1]
    seg = encoder_segments(packing, lens, factor, T)
    enc_lens = enc.output_lengths(lens)
    for u in range(len(lens)):
        frames = (seg.ids == u).nonzero()
        assert len(frames) == int(enc_lens[u])
        if len(frames):
            assert (frames[:, 0] == packing.rows[u]).all()
            assert frames[:, 1].tolist() == list(
                range(int(packing.offsets[u]) // factor, len(frames) + int(packing.offsets[u]) // factor)
            )
            assert seg.positions[seg.ids == u].tolist() == list(range(len(frames)))


MASKS = [(None, 0), (4, 0), (3, 1), (2, -1)]


@pytest.mark.parametrize("impl", ["reference", "sdpa", "flex"])
@pytest.mark.parametrize(("chunk_size", "left_chunks"), MASKS)
def test_packed_encoder_output_equals_one_utterance_per_row(impl, chunk_size, left_chunks):
    packed, lens, packing, feats, _ = _utterances()
    enc = _encoder(attention_impl=impl, chunk_size=chunk_size, left_chunks=left_chunks).eval()
    with torch.no_grad():
        got, got_lens, _ = enc.forward_packed(packed, lens, packing)
        want, want_lens = enc(feats, lens)
    assert torch.equal(got_lens, want_lens)
    for a, b in zip(_valid(got, got_lens), _valid(want, want_lens), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert (got[torch.arange(got.shape[1])[None, :] >= got_lens[:, None]] == 0).all(), "zeros after each utterance"


@pytest.mark.parametrize("factor", [4, 8])
@pytest.mark.parametrize("kernel", [5, 15])
def test_packed_encoder_with_causal_convolution_and_either_factor(factor, kernel):
    """A streaming-style encoder (causal convolution, one chunk of history) and 8x subsampling; a kernel of 15
    reaches across several utterances' edges."""
    packed, lens, packing, feats, _ = _utterances(align=factor, frames=128, rows=3)
    enc = _encoder(causal_conv=True, conv_kernel=kernel, chunk_size=3, left_chunks=1, subsampling_factor=factor)
    enc = enc.eval()
    with torch.no_grad():
        got, got_lens, _ = enc.forward_packed(packed, lens, packing)
        want, want_lens = enc(feats, lens)
    for a, b in zip(_valid(got, got_lens), _valid(want, want_lens), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["reference", "sdpa", "flex"])
@pytest.mark.parametrize(("chunk_size", "left_chunks"), [(None, 0), (3, 1)])
def test_packed_imported_layout_equals_one_utterance_per_row(impl, chunk_size, left_chunks):
    """w2v-BERT 2.0's options (2 stacked frames, relative_key bias clipped at 3 / 2, causal kernel 5): the bias
    counts distances inside each utterance, so packed rows give each utterance its own output."""
    packed, lens, packing, feats, _ = _utterances(align=2)
    enc = _encoder(
        attention_impl=impl, chunk_size=chunk_size, left_chunks=left_chunks, front_end="stack", subsampling_factor=2,
        position="relative_key", relative_left=3, relative_right=2, causal_conv=True,
    ).eval()  # fmt: skip
    with torch.no_grad():
        got, got_lens, _ = enc.forward_packed(packed, lens, packing)
        want, want_lens = enc(feats, lens)
    assert torch.equal(got_lens, want_lens) and torch.equal(want_lens, lens // 2)
    for a, b in zip(_valid(got, got_lens), _valid(want, want_lens), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_the_packed_depthwise_taps_stop_at_each_utterance():
    """A convolution over two utterances side by side, with segment ids, equals each one convolved alone."""
    torch.manual_seed(0)
    conv = ConvolutionModule(8, kernel_size=7, causal=False, dropout=0.0)
    a, b = torch.randn(1, 5, 8), torch.randn(1, 9, 8)
    ids = torch.tensor([[0] * 5 + [1] * 9])
    together = conv.depthwise(torch.cat([a, b], dim=1), segment_ids=ids)
    torch.testing.assert_close(together[:, :5], conv.depthwise(a), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(together[:, 5:], conv.depthwise(b), atol=1e-6, rtol=1e-6)
    mixed = conv.depthwise(torch.cat([a, b], dim=1))
    assert not torch.allclose(mixed[:, 3:5], together[:, 3:5]), "without ids the taps would cross"


def _tokens(U, S=4, seed=2):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, S + 1, (U,), generator=g)
    tokens = torch.randint(4, 20, (U, S), generator=g)
    return tokens.masked_fill(torch.arange(S)[None, :] >= lens[:, None], -1), lens


def _grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _check_same_losses_and_grads(model, packed_args, unpacked_args):
    model.zero_grad()
    packed = model.losses(*packed_args)
    packed["loss"].backward()
    packed_grads = _grads(model)
    model.zero_grad()
    unpacked = model.losses(*unpacked_args)
    unpacked["loss"].backward()
    unpacked_grads = _grads(model)
    assert set(packed) == set(unpacked)
    for key in packed:
        torch.testing.assert_close(packed[key], unpacked[key], atol=1e-5, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
    assert set(packed_grads) == set(unpacked_grads) and len(packed_grads) > 10
    for name, g in packed_grads.items():
        torch.testing.assert_close(g, unpacked_grads[name], atol=2e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("impl", ["reference", "sdpa"])
@pytest.mark.parametrize(("chunk_size", "left_chunks"), [(None, 0), (4, 0), (3, 1)])
def test_packed_ctc_losses_and_gradients_equal_one_utterance_per_row(impl, chunk_size, left_chunks):
    packed, lens, packing, feats, _ = _utterances()
    tokens, token_lens = _tokens(len(lens))
    model = AsrModel(_encoder(attention_impl=impl, chunk_size=chunk_size, left_chunks=left_chunks), 24, AsrHeadConfig())
    _check_same_losses_and_grads(model, (packed, lens, tokens, token_lens, packing), (feats, lens, tokens, token_lens))


def test_packed_joint_ctc_las_with_intermediate_ctc_equals_one_utterance_per_row():
    packed, lens, packing, feats, _ = _utterances()
    tokens, token_lens = _tokens(len(lens))
    las = LASConfig(num_layers=1, num_heads=2, dropout=0.0)
    head = AsrHeadConfig(ctc_weight=0.3, las=las, inter_ctc_weight=0.3, inter_ctc_layer=1)
    model = AsrModel(_encoder(), 24, head)
    _check_same_losses_and_grads(model, (packed, lens, tokens, token_lens, packing), (feats, lens, tokens, token_lens))


def _unpack_features(x, packing, lens):
    """Packed feature rows (R, N, ...) -> (U, max len, ...) one utterance per row (feature frames: factor 1)."""
    return unpack(x, packing, lens, 1)[:, : int(lens.max())]


def test_packed_bestrq_loss_and_gradients_equal_one_utterance_per_row():
    """Targets, masks and the loss per utterance: a mask drawn on the packed rows, given to both layouts."""
    packed, lens, packing, feats, _ = _utterances()
    cfg = BestRQConfig(num_codebooks=2, codebook_size=16, code_dim=4, mask_prob=0.05, mask_span_ms=60.0)
    model = BestRQModel(_encoder(), cfg, input_dim=F_BINS)
    masked, mask = model.mask_features(packed, lens, torch.Generator().manual_seed(3), packing)
    assert mask.any() and not mask[packing.segment_ids < 0].any()

    def encode_rows(features, lengths):
        x, segments, _ = model.encoder.encode_packed(features, lengths, packing)
        return x, segments

    def run(*args):
        model.zero_grad()
        out = model.predict_masked(*args)
        out.loss.backward()
        return out, _grads(model)

    got, got_grads = run(packed, masked, mask, lens, encode_rows, packing)
    per_row = (_unpack_features(t, packing, lens) for t in (packed, masked, mask))
    want, want_grads = run(*per_row, lens, model.encoder)
    torch.testing.assert_close(got.loss, want.loss, atol=1e-5, rtol=1e-5)
    for key in ("acc_mean", "perplexity_mean", "mask_frac"):
        torch.testing.assert_close(got.metrics[key], want.metrics[key], atol=1e-6, rtol=1e-6)
    assert set(got_grads) == set(want_grads)
    for name, g in got_grads.items():
        torch.testing.assert_close(g, want_grads[name], atol=2e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_packed_batches_need_utterances_aligned_to_the_subsampling():
    packed, lens, packing, _, _ = _utterances(align=4)
    with pytest.raises(ValueError, match="pack_align=8"):
        _encoder(subsampling_factor=8).forward_packed(packed, lens, packing)


def test_segments_of_one_utterance_per_row_run_like_lengths():
    """run_blocks with ``Segments.from_lengths`` (positions from 0 in every row) equals run_blocks with lengths."""
    enc = _encoder().eval()
    x = torch.randn(3, 20, 32)
    lengths = torch.tensor([20, 13, 4])
    with torch.no_grad():
        a, _ = enc.run_blocks(x, lengths, 0, 2)
        b, _ = enc.run_blocks(x, Segments.from_lengths(lengths, 20), 0, 2)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_the_packed_front_end_sees_one_shape_whatever_the_number_of_utterances():
    """The compiled front end (a compile unit) gets (R,) row lengths, not (U,): U varies from batch to batch, and
    under CUDA graphs each new input shape records a new graph."""
    enc = _encoder()
    seen = []
    forward = enc.subsampling.forward
    enc.subsampling.forward = lambda feats, lengths: seen.append(tuple(lengths.shape)) or forward(feats, lengths)
    for lengths in (LENGTHS, LENGTHS[:5]):
        packed, lens, packing, _, _ = _utterances(lengths=lengths)
        enc.forward_packed(packed, lens, packing)
    assert seen == [(4,), (4,)]


@pytest.mark.parametrize("compiled", [False, True])
def test_unpack_and_its_gradient_equal_plain_indexing(compiled):
    """``unpack``'s gather (and its gradient, a gather through the inverse map) against autograd's own indexing."""
    _, lens, packing, _, _ = _utterances()
    factor = 4
    enc_lens = torch.div(lens, factor, rounding_mode="floor")  # any lengths that fit each utterance's slot
    R, T, D = 4, 96 // factor, 3
    x = torch.randn(R, T, D, requires_grad=True)
    weights = torch.randn(len(LENGTHS), T, D)

    def reference(x):
        t = torch.arange(T)
        start = packing.rows * T + torch.div(packing.offsets, factor, rounding_mode="floor")
        valid = t[None, :] < enc_lens[:, None]
        index = torch.where(valid, start[:, None] + t[None, :], 0)
        return x.reshape(R * T, D)[index].masked_fill(~valid[:, :, None], 0)

    fn = torch.compile(unpack, backend="aot_eager", fullgraph=True) if compiled else unpack
    got = fn(x, packing, enc_lens, factor)
    (grad,) = torch.autograd.grad((got * weights).sum(), x)
    want = reference(x)
    (want_grad,) = torch.autograd.grad((want * weights).sum(), x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=0)
    assert (grad.abs().sum(-1) > 0).sum() == int(enc_lens.sum()), "each valid frame gets its gradient, once"
