"""Every chunk-attention implementation against the reference (the oracle): forward and gradients.

Also on packed rows (several utterances per row, ``Segments``). CPU: ``sdpa`` forward + gradients; ``flex`` forward only (torch 2.11 has no FlexAttention backward on
CPU; its gradients are checked by the ``gpu`` tests: ``pytest -m gpu tests/models/test_attention_impls.py``).
"""

import pytest
import torch
from toy_batches import segments as packed_segments

from usmkit.kernels.chunk_attention.api import chunk_attention
from usmkit.kernels.chunk_attention.flex import chunk_block_layout, segment_block_layout
from usmkit.kernels.masks import lengths_to_padding_mask, padded_chunk_mask, segment_chunk_mask

# The CPU flex path is the eager (unfused) one on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

# (chunk_size, left_chunks): full, disjoint, chunk not dividing T, left context 1 and all, chunk >= T, 1-frame chunks.
MASKS = [(None, 0), (None, -1), (4, 0), (5, 0), (5, 1), (5, -1), (64, 0), (1, 0), (1, 2)]


def _inputs(T, lengths, device="cpu", dtype=torch.float32, B=3, H=2, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g).to(device, dtype) for _ in range(3))
    grad_out = torch.randn(B, H, T, D, generator=g).to(device, dtype)  # nonzero on padded rows too
    return q, k, v, torch.tensor(lengths, device=device), grad_out


def _run(impl, q, k, v, lengths, chunk_size, left_chunks, grad_out=None):
    q, k, v = (t.detach().clone().requires_grad_(grad_out is not None) for t in (q, k, v))
    out = chunk_attention(q, k, v, lengths, chunk_size, left_chunks, impl=impl)
    if grad_out is None:
        return out, None
    out.backward(grad_out)
    return out, (q.grad, k.grad, v.grad)


def _check_padding(out, grads, lengths):
    T = out.shape[2]
    padded = lengths_to_padding_mask(lengths, T)  # (B, T)
    assert torch.isfinite(out).all()
    assert (out.masked_select(padded[:, None, :, None]) == 0).all(), "padded query rows must be exactly 0"
    if grads is not None:
        for g in grads:
            assert torch.isfinite(g).all()
            assert (g.masked_select(padded[:, None, :, None]) == 0).all(), "padded rows/keys must get no gradient"


@pytest.mark.parametrize(("chunk_size", "left_chunks"), MASKS)
@pytest.mark.parametrize(("T", "lengths"), [(13, [13, 9, 0]), (37, [37, 30, 6])])
def test_sdpa_matches_reference_forward_and_grads(T, lengths, chunk_size, left_chunks):
    q, k, v, lengths, grad_out = _inputs(T, lengths)
    ref, ref_grads = _run("reference", q, k, v, lengths, chunk_size, left_chunks, grad_out)
    out, grads = _run("sdpa", q, k, v, lengths, chunk_size, left_chunks, grad_out)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for name, g, r in zip("qkv", grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"d{n}: {m}")
    _check_padding(out, grads, lengths)
    _check_padding(ref, ref_grads, lengths)


@pytest.mark.parametrize(("chunk_size", "left_chunks"), MASKS)
def test_flex_forward_matches_reference_on_cpu(chunk_size, left_chunks):
    q, k, v, lengths, _ = _inputs(37, [37, 30, 0])
    with torch.no_grad():
        ref, _ = _run("reference", q, k, v, lengths, chunk_size, left_chunks)
        out, _ = _run("flex", q, k, v, lengths, chunk_size, left_chunks)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    _check_padding(out, None, lengths)


def test_flex_refuses_cpu_training_with_a_clear_message():
    q, k, v, lengths, grad_out = _inputs(8, [8, 5, 3])
    with pytest.raises(NotImplementedError, match="attention_impl='sdpa'"):
        _run("flex", q, k, v, lengths, 4, 0, grad_out)


@pytest.mark.parametrize("T", [1, 7, 8, 9, 30])
@pytest.mark.parametrize(("chunk_size", "left_chunks"), [(None, 0), (3, 0), (4, 0), (5, 1), (3, -1), (2, 2)])
def test_flex_block_layout_matches_the_dense_mask(T, chunk_size, left_chunks):
    """Closed-form tiles == tiles read off the dense mask (block 4, so several tiles per sequence)."""
    bs = 4
    lengths = torch.tensor([T, max(T - 3, 0), 0, min(T, 5)])
    partial, full = chunk_block_layout(lengths, T, chunk_size, left_chunks, block_size=bs)
    n = (T + bs - 1) // bs
    dense = torch.zeros(len(lengths), n * bs, n * bs, dtype=torch.bool)
    dense[:, :T, :T] = padded_chunk_mask(lengths, T, chunk_size, left_chunks)
    tiles = dense.view(len(lengths), n, bs, n, bs).permute(0, 1, 3, 2, 4)  # (B, nq, nk, bs, bs)
    inside = torch.zeros(n * bs, dtype=torch.bool)
    inside[:T] = True
    inside_tiles = inside.view(n, bs)[:, None, :, None] & inside.view(n, bs)[None, :, None, :]  # (nq, nk, bs, bs)
    any_allowed = tiles.flatten(-2).any(-1)  # (B, nq, nk)
    all_allowed = (tiles | ~inside_tiles).flatten(-2).all(-1)  # (B, nq, nk): every in-range pair allowed
    assert torch.equal(full, any_allowed & all_allowed)
    assert torch.equal(partial, any_allowed & ~all_allowed)


def test_unknown_impl_is_refused():
    q, k, v, lengths, _ = _inputs(4, [4, 4, 4])
    with pytest.raises(ValueError, match="unknown attention impl"):
        chunk_attention(q, k, v, lengths, None, 0, impl="fast")


# ---- GPU: flex gradients (compiled, fused kernel) and sdpa's CUDA backends; several 128-frame blocks.

GPU_MASKS = [(None, 0), (50, 0), (40, 1), (64, -1), (128, 0), (7, 0)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("impl", ["sdpa", "flex"])
@pytest.mark.parametrize(("chunk_size", "left_chunks"), GPU_MASKS)
def test_gpu_impl_matches_reference_fp32(impl, chunk_size, left_chunks):
    q, k, v, lengths, grad_out = _inputs(300, [300, 170, 0], device="cuda", D=64)
    ref, ref_grads = _run(
        "reference", q.double(), k.double(), v.double(), lengths, chunk_size, left_chunks, grad_out.double()
    )
    out, grads = _run(impl, q, k, v, lengths, chunk_size, left_chunks, grad_out)
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)
    for name, g, r in zip("qkv", grads, ref_grads, strict=True):
        torch.testing.assert_close(g.double(), r, atol=1e-4, rtol=1e-4, msg=lambda m, n=name: f"d{n}: {m}")
    _check_padding(out, grads, lengths)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("impl", ["sdpa", "flex"])
@pytest.mark.parametrize(("chunk_size", "left_chunks"), [(50, 0), (40, 1)])
def test_gpu_impl_bf16_error_no_worse_than_torch_bf16(impl, chunk_size, left_chunks):
    """|impl_bf16 - ref64| <= 2 |reference_bf16 - ref64| + atol, forward and every gradient."""
    q, k, v, lengths, grad_out = _inputs(300, [300, 170, 0], device="cuda", D=64)
    ref, ref_grads = _run(
        "reference", q.double(), k.double(), v.double(), lengths, chunk_size, left_chunks, grad_out.double()
    )
    base, base_grads = _run(
        "reference", *(t.bfloat16() for t in (q, k, v)), lengths, chunk_size, left_chunks, grad_out.bfloat16()
    )
    out, grads = _run(impl, *(t.bfloat16() for t in (q, k, v)), lengths, chunk_size, left_chunks, grad_out.bfloat16())
    for got, torch_same, exact in zip((out, *grads), (base, *base_grads), (ref, *ref_grads), strict=True):
        err = (got.double() - exact).abs().max()
        base_err = (torch_same.double() - exact).abs().max()
        assert err <= 2 * base_err + 1e-2, (err, base_err)
    _check_padding(out, grads, lengths)


# ---- packed rows (Segments): the same implementations, block-diagonal per utterance


# Three rows of 37 frames: utterances back to back, with gaps, one filling the row.
PACKED = [[(0, 9), (9, 14), (25, 11)], [(0, 3), (4, 5), (12, 20)], [(0, 37)]]


@pytest.mark.parametrize(("chunk_size", "left_chunks"), MASKS)
def test_sdpa_matches_reference_on_packed_rows_forward_and_grads(chunk_size, left_chunks):
    q, k, v, _, grad_out = _inputs(37, [37, 37, 37])
    segments = packed_segments(37, PACKED)
    ref, ref_grads = _run("reference", q, k, v, segments, chunk_size, left_chunks, grad_out)
    out, grads = _run("sdpa", q, k, v, segments, chunk_size, left_chunks, grad_out)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for name, g, r in zip("qkv", grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"d{n}: {m}")
    padded = ~segments.valid[:, None, :, None]  # (B, 1, T, 1)
    assert (out.masked_select(padded) == 0).all() and all((g.masked_select(padded) == 0).all() for g in grads)


@pytest.mark.parametrize(("chunk_size", "left_chunks"), MASKS)
def test_packed_rows_give_each_utterance_its_own_attention(chunk_size, left_chunks):
    """The reference on a packed row equals the reference on each utterance alone (its own row)."""
    q, k, v, _, _ = _inputs(37, [37, 37, 37])
    segments = packed_segments(37, PACKED)
    out = chunk_attention(q, k, v, segments, chunk_size, left_chunks, impl="reference")
    for r, row in enumerate(PACKED):
        for start, n in row:
            part = slice(start, start + n)
            alone = chunk_attention(
                q[r : r + 1, :, part], k[r : r + 1, :, part], v[r : r + 1, :, part], torch.tensor([n]),
                chunk_size, left_chunks, impl="reference",
            )  # fmt: skip
            torch.testing.assert_close(out[r : r + 1, :, part], alone, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(("chunk_size", "left_chunks"), MASKS)
def test_flex_forward_matches_reference_on_packed_rows(chunk_size, left_chunks):
    q, k, v, _, _ = _inputs(37, [37, 37, 37])
    segments = packed_segments(37, PACKED)
    with torch.no_grad():
        ref, _ = _run("reference", q, k, v, segments, chunk_size, left_chunks)
        out, _ = _run("flex", q, k, v, segments, chunk_size, left_chunks)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("chunk_size", "left_chunks"), [(None, 0), (3, 0), (4, 0), (5, 1), (3, -1), (2, 2)])
def test_flex_packed_block_layout_is_exact_where_full_and_misses_no_allowed_tile(chunk_size, left_chunks):
    """Tiles of 4: a full tile is one whose every in-range pair is allowed; every tile holding an allowed
    pair is full or partial; utterance ranges and chunk ranges skip tiles (fewer partial than all)."""
    bs, T = 4, 37
    segments = packed_segments(T, PACKED)
    partial, full = segment_block_layout(segments, chunk_size, left_chunks, block_size=bs)
    n = (T + bs - 1) // bs
    dense = torch.zeros(len(PACKED), n * bs, n * bs, dtype=torch.bool)
    dense[:, :T, :T] = segment_chunk_mask(segments, chunk_size, left_chunks)
    tiles = dense.view(len(PACKED), n, bs, n, bs).permute(0, 1, 3, 2, 4)  # (B, nq, nk, bs, bs)
    inside = torch.zeros(n * bs, dtype=torch.bool)
    inside[:T] = True
    inside_tiles = inside.view(n, bs)[:, None, :, None] & inside.view(n, bs)[None, :, None, :]
    any_allowed = tiles.flatten(-2).any(-1)  # (B, nq, nk)
    all_allowed = (tiles | ~inside_tiles).flatten(-2).all(-1) & any_allowed
    assert torch.equal(full, all_allowed)
    assert not (partial & full).any()
    assert torch.equal((partial | full) & any_allowed, any_allowed), "a tile with an allowed pair is skipped"
    assert (partial | full).sum() < partial.numel(), "nothing is skipped"
