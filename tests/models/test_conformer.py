"""The Conformer encoder: shapes, lengths, padding, chunk isolation, causality, and its parts."""

import os

import pytest
import torch

from usmkit.kernels.masks import lengths_to_padding_mask
from usmkit.models.config import ConformerConfig
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.convolution import ConvolutionModule
from usmkit.models.rotary import apply_rotary
from usmkit.models.subsampling import Conv2dSubsampling, conv_out_size, output_lengths

F_BINS = 16


def _encoder(**overrides) -> ConformerEncoder:
    args = dict(input_dim=F_BINS, d_model=32, num_layers=2, num_heads=2, subsampling_channels=8, dropout=0.0)
    args |= dict(zero_init_residual=False)  # random residual branches: every path contributes
    torch.manual_seed(0)
    return ConformerEncoder(ConformerConfig(**{**args, **overrides})).eval()


def _features(B, T, seed=1):
    return torch.randn(B, T, F_BINS, generator=torch.Generator().manual_seed(seed))


def test_every_block_sees_the_fp32_residual_stream_under_autocast():
    """Under autocast the front end's projection returns bf16 and (on CUDA) each block's LayerNorm fp32:
    the encoder starts the residual stream in fp32, so all blocks take one dtype (one compiled graph)."""
    enc = _encoder(num_layers=3)
    seen = []
    for block in enc.blocks:
        block.register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        enc(_features(2, 64), torch.tensor([64, 40]))
    assert seen == [torch.float32] * 3


# ---- subsampling


def test_subsampling_lengths_formula_matches_the_convolutions():
    sub = Conv2dSubsampling(F_BINS, channels=4, d_model=8)
    for T in range(7, 40):
        y, lens = sub(torch.zeros(1, T, F_BINS), torch.tensor([T]))
        assert y.shape[1] == conv_out_size(T) == ((T - 1) // 2 - 1) // 2
        assert lens.tolist() == [y.shape[1]]
    assert output_lengths(torch.arange(0, 12)).tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2]


@pytest.mark.parametrize("factor", [4, 8])
def test_output_lengths_match_running_the_conv_stack_on_every_length(factor):
    """Every valid length 1..200 inside a padded batch: the formula gives the frames whose inputs are valid,
    counted by running the convolutions on that many frames alone (shorter than the receptive field: 0)."""
    sub = Conv2dSubsampling(F_BINS, channels=4, d_model=8, factor=factor).eval()
    lengths = torch.arange(1, 201)
    for T in lengths.tolist():
        frames = sub(torch.zeros(1, T, F_BINS), torch.tensor([T]))[0].shape[1] if T >= sub.receptive_field else 0
        assert int(output_lengths(torch.tensor([T]), factor)) == frames == max(0, conv_out_size(T, factor)), T
    assert torch.equal(sub.output_lengths(lengths), output_lengths(lengths, factor))
    # Padding never reaches a valid output frame: each row's valid outputs equal the row run alone.
    x = torch.randn(3, 200, F_BINS, generator=torch.Generator().manual_seed(0))
    batch_lengths = torch.tensor([200, 123, 2 * factor - 1])
    padded = x * (torch.arange(200)[None, :, None] < batch_lengths[:, None, None]) + 7.0 * (
        torch.arange(200)[None, :, None] >= batch_lengths[:, None, None]
    )  # garbage after each row's valid frames
    y, out_lens = sub(padded, batch_lengths)
    for row, T in enumerate(batch_lengths.tolist()):
        alone, _ = sub(x[row : row + 1, :T], torch.tensor([T]))
        n = int(out_lens[row])
        assert n == alone.shape[1] >= 1
        torch.testing.assert_close(y[row, :n], alone[0], rtol=1e-5, atol=1e-6)


def test_eight_x_subsampling_is_one_more_stage_of_the_same_kind():
    four, eight = (Conv2dSubsampling(80, channels=8, d_model=16, factor=f) for f in (4, 8))
    assert [n for n, _ in four.named_parameters()] == ["conv.0.weight", "conv.0.bias", "conv.2.weight", "conv.2.bias",
                                                       "proj.weight", "proj.bias"]  # fmt: skip
    assert {n for n, _ in eight.named_parameters()} - {n for n, _ in four.named_parameters()} == {
        "conv.4.weight",
        "conv.4.bias",
    }
    assert (eight.receptive_field, four.receptive_field) == (15, 7)
    assert eight.proj.in_features == 8 * 9 and four.proj.in_features == 8 * 19  # 80 bins -> 39 -> 19 -> 9
    with pytest.raises(ValueError, match=r"subsampling_factor must be one of \(4, 8\)"):
        Conv2dSubsampling(80, channels=8, d_model=16, factor=6)
    with pytest.raises(ValueError, match="at least 15 feature frames for 8x"):
        eight(torch.zeros(1, 14, 80), torch.tensor([14]))
    with pytest.raises(ValueError, match="input_dim=14 is too small for 8x subsampling.*>= 15"):
        ConformerConfig(input_dim=14, d_model=32, num_layers=1, num_heads=2, subsampling_factor=8)


def test_encoder_with_eight_x_subsampling():
    enc = _encoder(subsampling_factor=8, chunk_size=3)
    lengths = torch.tensor([57, 40, 15])
    y, out_lens = enc(_features(3, 57), lengths)
    assert enc.subsampling_factor == 8
    assert y.shape == (3, conv_out_size(57, 8), 32) == (3, 6, 32)
    assert out_lens.tolist() == enc.output_lengths(lengths).tolist() == output_lengths(lengths, 8).tolist() == [6, 4, 1]
    assert (y.masked_select(lengths_to_padding_mask(out_lens, y.shape[1])[..., None]) == 0).all()


def test_subsampling_rejects_bad_features():
    sub = Conv2dSubsampling(F_BINS, channels=4, d_model=8)
    with pytest.raises(ValueError, match="at least 7"):
        sub(torch.zeros(1, 6, F_BINS), torch.tensor([6]))
    with pytest.raises(ValueError, match="mel bins"):
        sub(torch.zeros(1, 20, F_BINS + 1), torch.tensor([20]))


# ---- encoder shapes, padding, masks


def test_output_shapes_lengths_and_zeroed_padding():
    enc = _encoder(chunk_size=4)
    lengths = torch.tensor([57, 40, 7])
    y, out_lens = enc(_features(3, 57), lengths)
    assert enc.output_dim == 32
    assert y.shape == (3, conv_out_size(57), 32)
    assert out_lens.tolist() == output_lengths(lengths).tolist() == [13, 9, 1]
    assert torch.isfinite(y).all()
    assert (y.masked_select(lengths_to_padding_mask(out_lens, y.shape[1])[..., None]) == 0).all()


@pytest.mark.parametrize(("chunk_size", "left_chunks"), [(None, 0), (3, 0), (3, 1), (4, -1)])
def test_valid_output_does_not_depend_on_padding(chunk_size, left_chunks):
    enc = _encoder(chunk_size=chunk_size, left_chunks=left_chunks)
    x = _features(1, 45)
    alone, alone_len = enc(x, torch.tensor([45]))
    padded = torch.cat([x, 5 * _features(1, 30, seed=9)], dim=1)  # garbage, not zeros, in the padding
    batch = torch.cat([padded, _features(1, 75, seed=2)])
    y, lens = enc(batch, torch.tensor([45, 75]))
    assert lens[0] == alone_len[0] == alone.shape[1]
    torch.testing.assert_close(y[0, : alone.shape[1]], alone[0], atol=1e-5, rtol=1e-5)


def test_padded_input_frames_get_no_gradient():
    enc = _encoder(chunk_size=3, left_chunks=1)
    x = (5 * _features(2, 45)).requires_grad_(True)
    y, _ = enc(x, torch.tensor([45, 29]))
    y.pow(2).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert (x.grad[1, 29:] == 0).all()
    assert (x.grad[1, :29] != 0).any()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in enc.parameters())


def test_full_attention_equals_a_chunk_covering_everything():
    enc = _encoder(chunk_size=None)
    x, lengths = _features(2, 61), torch.tensor([61, 50])
    full, _ = enc(x, lengths)
    T = full.shape[1]
    for chunk_size in (T, 1000):
        y, _ = enc(x, lengths, chunk_size=chunk_size, left_chunks=0)
        assert torch.equal(y, full)


def test_zero_init_residual_starts_each_block_as_its_norm():
    enc = _encoder(zero_init_residual=True)
    x, lengths = _features(2, 41), torch.tensor([41, 30])
    h, h_lens = enc.front_end(x, lengths)  # (B, T', D)
    valid = torch.arange(h.shape[1])[None, :] < h_lens[:, None]  # (B, T')
    out, _ = enc.run_blocks(h, h_lens, 0, 1)
    expected = enc.blocks[0].norm(h).masked_fill(~valid[:, :, None], 0.0)
    torch.testing.assert_close(out, expected)  # identity residual branches: only the block's LayerNorm acts
    assert ConformerConfig(input_dim=F_BINS, d_model=32, num_layers=1, num_heads=2).zero_init_residual
    random_branches = _encoder()  # zero_init_residual=False: the residual branches are not the identity
    assert not torch.allclose(random_branches.run_blocks(h, h_lens, 0, 1)[0], expected)


def test_per_call_mask_override():
    enc = _encoder(chunk_size=3)
    x, lengths = _features(1, 61), torch.tensor([61])
    default, _ = enc(x, lengths)
    assert torch.equal(enc(x, lengths, chunk_size=3, left_chunks=0)[0], default)
    assert not torch.allclose(enc(x, lengths, chunk_size=None)[0], default)
    with pytest.raises(ValueError, match="chunk_size"):
        enc(x, lengths, chunk_size="full")
    with pytest.raises(ValueError, match="left_chunks"):
        enc(x, lengths, left_chunks=-2)


def _changed_frames(enc, x, lo, hi, **mask):
    """Which encoder frames change when input feature frames [lo, hi) are perturbed: (T',) bool."""
    y1, _ = enc(x, torch.tensor([x.shape[1]]), **mask)
    x2 = x.clone()
    x2[:, lo:hi] += 3.0 * _features(1, hi - lo, seed=7)
    y2, _ = enc(x2, torch.tensor([x.shape[1]]), **mask)
    return (y1 - y2).abs().amax(dim=-1)[0] > 0


def test_disjoint_chunks_are_isolated_without_convolution_reach():
    """conv_kernel=1: with left_chunks=0 nothing crosses a chunk edge, so isolation is exact."""
    cs = 4
    enc = _encoder(conv_kernel=1, chunk_size=cs, left_chunks=0)
    x = _features(1, 4 * 24 + 3)  # T' = 24: 6 chunks
    # Encoder frame t reads feature frames 4t .. 4t+6, so chunk 2 (frames 8..11) reads features 32..50.
    changed = _changed_frames(enc, x, 0, 4 * 2 * cs)  # everything before chunk 2
    changed |= _changed_frames(enc, x, 4 * 3 * cs + 3, x.shape[1])  # everything after chunk 2
    assert not changed[2 * cs : 3 * cs].any()
    assert changed[: 2 * cs].all() and changed[3 * cs :].all()


@pytest.mark.parametrize("num_layers", [1, 3])
def test_disjoint_chunk_influence_is_confined_to_convolution_reach(num_layers):
    """conv_kernel=5: influence spreads over whole chunks (attention) and 2 frames per layer (conv), no more."""
    cs, T2 = 5, 40
    enc = _encoder(conv_kernel=5, chunk_size=cs, left_chunks=0, num_layers=num_layers)
    x = _features(1, 4 * T2 + 3)
    lo, hi = 4 * 22, 4 * 22 + 1  # one feature frame: touches encoder frames 21, 22
    reach = torch.zeros(T2, dtype=torch.bool)
    reach[(lo - 6 + 3) // 4 : hi // 4 + 1] = True  # frames t with 4t <= lo <= 4t + 6
    chunk = torch.arange(T2) // cs
    for _ in range(num_layers):
        reach = torch.isin(chunk, chunk[reach])  # attention: whole chunks
        reach = torch.nn.functional.max_pool1d(reach[None].float(), 5, stride=1, padding=2)[0].bool()  # conv: +-2
    assert torch.equal(_changed_frames(enc, x, lo, hi), reach)


@pytest.mark.parametrize("left_chunks", [-1, 1])
def test_causal_conv_with_left_context_ignores_the_future(left_chunks):
    cs = 4
    enc = _encoder(causal_conv=True, chunk_size=cs, left_chunks=left_chunks)
    x = _features(1, 4 * 24 + 3)
    for c in (0, 2, 4):
        # Frames of chunks <= c read feature frames < 4 (c + 1) cs + 3.
        changed = _changed_frames(enc, x, 4 * (c + 1) * cs + 3, x.shape[1])
        assert not changed[: (c + 1) * cs].any()
        assert changed[(c + 1) * cs :].any()


def _triton_available() -> bool:
    """The Triton kernel is another module's; run it when it is importable and can execute here."""
    try:
        import usmkit.kernels.chunk_attention.triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("impl", ["sdpa", "flex", "triton"])
@pytest.mark.parametrize(("chunk_size", "left_chunks"), [(None, 0), (3, 0), (3, 1), (5, -1)])
def test_every_attention_impl_gives_the_reference_encoder_output(impl, chunk_size, left_chunks):
    if impl == "triton" and not _triton_available():
        pytest.skip("triton chunk attention not present, or no CUDA and TRITON_INTERPRET!=1")
    ref_enc = _encoder(attention_impl="reference", chunk_size=chunk_size, left_chunks=left_chunks)
    enc = _encoder(attention_impl=impl, chunk_size=chunk_size, left_chunks=left_chunks)
    enc.load_state_dict(ref_enc.state_dict())
    x, lengths = _features(3, 50), torch.tensor([50, 37, 9])
    with torch.no_grad():  # flex has no CPU backward in torch 2.11
        ref, ref_lens = ref_enc(x, lengths)
        y, lens = enc(x, lengths)
    assert torch.equal(lens, ref_lens)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)


# ---- parts


@pytest.mark.parametrize("causal", [False, True])
def test_convolution_valid_frames_ignore_appended_padding(causal):
    torch.manual_seed(0)
    conv = ConvolutionModule(8, kernel_size=5, causal=causal, dropout=0.0)
    x = torch.randn(1, 10, 8)
    short = conv(x, torch.ones(1, 10, dtype=torch.bool))
    longer = torch.cat([x, 10 * torch.randn(1, 6, 8)], dim=1)
    valid = torch.arange(16)[None] < 10
    torch.testing.assert_close(conv(longer, valid)[:, :10], short, atol=1e-6, rtol=1e-6)


def test_causal_convolution_context_equals_the_full_sequence():
    """depthwise(y[:, t0:], context=y[:, t0-K+1:t0]) == depthwise(y)[:, t0:] (the streaming contract)."""
    torch.manual_seed(0)
    conv = ConvolutionModule(8, kernel_size=5, causal=True, dropout=0.0)
    y = torch.randn(2, 12, 8)
    full = conv.depthwise(y)
    t0 = 7
    part = conv.depthwise(y[:, t0:], context=y[:, t0 - conv.left_context : t0])
    torch.testing.assert_close(part, full[:, t0:], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("causal,kernel", [(False, 5), (True, 5), (False, 15), (True, 4)])
def test_compiled_depthwise_path_equals_the_conv1d_path(causal, kernel, monkeypatch):
    """Under torch.compile depthwise() takes K shifted multiply-adds; they equal nn.Conv1d, with and without context."""
    torch.manual_seed(0)
    conv = ConvolutionModule(8, kernel_size=kernel, causal=causal, dropout=0.0)
    y = torch.randn(2, 13, 8)
    eager_full = conv.depthwise(y)
    eager_part = conv.depthwise(y[:, 6:], context=y[:, 6 - conv.left_context : 6]) if causal else None
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    torch.testing.assert_close(conv.depthwise(y), eager_full, atol=1e-6, rtol=1e-6)
    if causal:
        part = conv.depthwise(y[:, 6:], context=y[:, 6 - conv.left_context : 6])
        torch.testing.assert_close(part, eager_part, atol=1e-6, rtol=1e-6)


def test_rotary_scores_depend_only_on_relative_position():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)

    def score(m, n):
        return (apply_rotary(q, torch.tensor([m])) * apply_rotary(k, torch.tensor([n]))).sum()

    torch.testing.assert_close(score(3, 1), score(103, 101), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(score(3, 1), score(1, 3))
    x = torch.randn(2, 3, 5, 16, generator=g)
    torch.testing.assert_close(apply_rotary(x, torch.arange(5)).norm(dim=-1), x.norm(dim=-1))
    offset = torch.arange(5)[None].repeat(2, 1) + torch.tensor([[0], [7]])  # (B, T): per-row offsets
    torch.testing.assert_close(apply_rotary(x, offset)[1], apply_rotary(x[1:], torch.arange(7, 12))[0])
    torch.testing.assert_close(apply_rotary(x, torch.zeros(5)), x)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(d_model=30, num_heads=4), "divisible"),
        (dict(d_model=36, num_heads=4), "even head dim"),
        (dict(attention_impl="fast"), "attention_impl"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(left_chunks=-5), "left_chunks"),
        (dict(conv_kernel=4), "odd"),
        (dict(dropout=1.0), "dropout"),
        (dict(input_dim=5), "input_dim"),
    ],
)
def test_config_rejects_bad_values(overrides, match):
    args = dict(d_model=32, num_layers=2, num_heads=2)
    with pytest.raises(ValueError, match=match):
        ConformerConfig(**{**args, **overrides})
    assert ConformerConfig(**{**args, "conv_kernel": 4, "causal_conv": True}).conv_kernel == 4


@pytest.mark.slow
def test_forward_compiles_with_fullgraph():
    enc = _encoder(chunk_size=3, left_chunks=1)
    x, lengths = _features(2, 45), torch.tensor([45, 30])
    compiled = torch.compile(enc, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, lengths)[0], enc(x, lengths)[0], atol=1e-5, rtol=1e-5)


# ---- the encoder in two parts (MOST: text enters at block k)


@pytest.mark.parametrize("k", [0, 1, 2, 3])
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_split_forward_equals_the_full_forward(k, chunk_size):
    """front_end + run_blocks(0, k) + run_blocks(k, n) is bit-identical to forward, intermediates too."""
    enc = _encoder(num_layers=3, chunk_size=chunk_size)
    feats, lens = _features(3, 70), torch.tensor([70, 51, 23])
    full, full_lens, (inter,) = enc.forward_with_intermediate(feats, lens, (2,))
    x, x_lens = enc.front_end(feats, lens)
    h, _ = enc.run_blocks(x, x_lens, 0, k)
    y, kept = enc.run_blocks(h, x_lens, k, 3, layers=(2,))
    assert torch.equal(x_lens, full_lens)
    assert torch.equal(y, full)
    if k < 2:
        assert torch.equal(kept[0], inter)


def test_run_blocks_rejects_a_bad_range():
    enc = _encoder(num_layers=2)
    x, lens = enc.front_end(_features(1, 40), torch.tensor([40]))
    with pytest.raises(ValueError, match="start <= stop"):
        enc.run_blocks(x, lens, 2, 1)
    with pytest.raises(ValueError, match="start <= stop"):
        enc.run_blocks(x, lens, 0, 3)
