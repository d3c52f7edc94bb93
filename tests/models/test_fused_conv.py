"""``conv_impl="triton"`` (the fused convolution-module kernel) in the whole encoder: the same outputs, CTC losses
and gradients as ``conv_impl="torch"`` with the same weights, one utterance per row and packed; the streaming step
(which runs the module's stages unfused) still equals the full forward. On CPU the kernel runs under Triton's
interpreter, set here as in tests/kernels/conftest.py (before the kernel module is first imported)."""

import os
import sys
from dataclasses import replace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from usmkit.data.packing import RowPacker  # noqa: E402
from usmkit.models.asr import AsrHeadConfig, AsrModel  # noqa: E402
from usmkit.models.config import ConformerConfig  # noqa: E402
from usmkit.models.conformer import ConformerEncoder  # noqa: E402
from usmkit.streaming.encoder import StreamingEncoder  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

F_BINS = 16
LENGTHS = [37, 50, 23, 61, 9, 44]


def _pair(**overrides) -> tuple[ConformerEncoder, ConformerEncoder]:
    args = dict(input_dim=F_BINS, d_model=24, num_layers=2, num_heads=2, subsampling_channels=8, dropout=0.0)
    args |= dict(zero_init_residual=False, chunk_size=4, left_chunks=0) | overrides
    torch.manual_seed(0)
    plain = ConformerEncoder(ConformerConfig(**args))
    fused = ConformerEncoder(ConformerConfig(**args, conv_impl="triton"))
    fused.load_state_dict(plain.state_dict())
    return plain, fused


def _batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(LENGTHS)
    feats = torch.randn(len(LENGTHS), max(LENGTHS), F_BINS, generator=g)
    return feats * (torch.arange(max(LENGTHS))[None, :] < lens[:, None])[:, :, None], lens


def test_conv_impl_is_checked():
    with pytest.raises(ValueError, match="conv_impl='cuda' is unknown"):
        ConformerConfig(d_model=8, num_layers=1, num_heads=2, conv_impl="cuda")


@pytest.mark.parametrize("packed", [False, True])
def test_fused_encoder_losses_and_gradients_equal_torch(packed):
    plain, fused = _pair()
    feats, lens = _batch()
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(4, 20, (len(LENGTHS), 3), generator=g)
    token_lens = torch.full((len(LENGTHS),), 3)
    if packed:
        order, rows, row_lens, packing = RowPacker(3, 96, 4).pack(feats, lens, LENGTHS)
        args = (rows, row_lens, tokens[order], token_lens[order], packing)
    else:
        args = (feats, lens, tokens, token_lens)
    results = []
    for encoder in (plain, fused):
        torch.manual_seed(3)  # the same head weights for both
        model = AsrModel(encoder, 24, AsrHeadConfig())
        losses = model.losses(*args)
        losses["loss"].backward()
        results.append((losses, {n: p.grad.clone() for n, p in encoder.named_parameters()}))
    (l0, g0), (l1, g1) = results
    assert "usmkit.kernels.conv_module.triton" in sys.modules, "the fused kernel ran"
    for key in l0:
        torch.testing.assert_close(l1[key], l0[key], atol=1e-5, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
    assert any(".conv.depthwise_conv." in n for n in g0)
    for name, grad in g0.items():
        torch.testing.assert_close(g1[name], grad, atol=2e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_streaming_a_fused_encoder_equals_its_full_forward():
    _, fused = _pair(causal_conv=True, conv_kernel=5, chunk_size=4, left_chunks=2)
    fused = fused.eval()
    feats, lens = _batch()
    x = feats[:1, : int(lens[0])]  # (1, T, F), one whole utterance
    with torch.no_grad():
        full, _ = fused(x, lens[:1])
        stream = StreamingEncoder(fused)
        streamed = torch.cat([stream.accept(x[:, :13]), stream.accept(x[:, 13:]), stream.flush()], dim=1)
    torch.testing.assert_close(streamed, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("chunk_size", "left_chunks"), [(None, 0), (4, 0), (3, 1)])
def test_packed_rows_through_both_triton_kernels_equal_one_utterance_per_row(chunk_size, left_chunks):
    """attention_impl=triton and conv_impl=triton on packed rows: each utterance's encoder output is what the
    plain encoder (sdpa, torch) gives it alone."""
    plain, fused = _pair(chunk_size=chunk_size, left_chunks=left_chunks, d_model=32)  # head dim 16, the kernel's least
    fused = ConformerEncoder(replace(fused.cfg, attention_impl="triton"))
    fused.load_state_dict(plain.state_dict())
    feats, lens = _batch()
    order, rows, row_lens, packing = RowPacker(3, 96, 4).pack(feats, lens, LENGTHS)
    with torch.no_grad():
        got, got_lens, _ = fused.eval().forward_packed(rows, row_lens, packing)
        want, want_lens = plain.eval()(feats[order], lens[order])
    assert torch.equal(got_lens, want_lens)
    for b, n in enumerate(want_lens.tolist()):
        torch.testing.assert_close(got[b, :n], want[b, :n], atol=1e-5, rtol=1e-5)
