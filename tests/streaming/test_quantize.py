"""int8 linear layers for CPU streaming: close to fp32, original untouched, CLI option works."""

from __future__ import annotations

import torch
from torch import nn

from usmkit.models.conformer import ConformerEncoder
from usmkit.models.presets import tiny
from usmkit.streaming.encoder import StreamingEncoder
from usmkit.streaming.quantize import quantize_linear_int8


def _encoder() -> ConformerEncoder:
    torch.manual_seed(0)
    return ConformerEncoder(
        tiny(chunk_size=4, left_chunks=2, causal_conv=True, dropout=0.0, zero_init_residual=False)
    ).eval()


def _stream(encoder: nn.Module, feats: torch.Tensor) -> torch.Tensor:
    stream = StreamingEncoder(encoder, 4, 2)
    with torch.no_grad():
        outs = [stream.accept(feats[:, i : i + 16]) for i in range(0, feats.shape[1], 16)]  # (B, n C, D) each
        outs.append(stream.flush())
    return torch.cat(outs, dim=1)  # (B, T', D)


def test_int8_copy_leaves_the_original_and_replaces_every_linear():
    enc = _encoder()
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    q = quantize_linear_int8(enc)
    assert not any(type(m) is nn.Linear for m in q.modules())
    assert any(type(m) is nn.Linear for m in enc.modules())
    assert all(torch.equal(before[k], v) for k, v in enc.state_dict().items())


def test_int8_streaming_output_is_close_to_fp32():
    enc = _encoder()
    feats = torch.randn(1, 203, 80)  # not a multiple of the chunk
    ref = _stream(enc, feats)
    out = _stream(quantize_linear_int8(enc), feats)
    assert out.shape == ref.shape
    rel = ((out - ref).norm() / ref.norm()).item()
    assert 0 < rel < 0.05  # int8 is not exact, but within a few percent of the fp32 output
    cos = torch.nn.functional.cosine_similarity(out.flatten(1), ref.flatten(1)).item()
    assert cos > 0.995


def test_int8_needs_cpu_weights():
    enc = _encoder().to("meta")
    import pytest

    with pytest.raises(ValueError, match="CPU"):
        quantize_linear_int8(enc)
