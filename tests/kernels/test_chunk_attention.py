"""The Triton chunk-wise attention (forward, dq/dk/dv) against the eager reference.

On CPU the kernels run under TRITON_INTERPRET=1 (set by conftest.py) with tiny shapes; on a GPU the same tests
run compiled, plus the ``gpu``-marked ones. Tolerance (per output tensor, max norm), after flash-attention's tests:
``|kernel - ref64| <= 2 * |reference_in_kernel_dtype - ref64| + atol`` where ref64 is the reference on fp64 copies.
bf16 on CPU: the interpreter's bf16 dot is broken in triton 3.6, so there the kernel upcasts dot operands to fp32
(exact); everything else (loads, casts of P and dS to bf16, stores) is the GPU code path.
"""

import pytest
import torch
from toy_batches import segments as packed_segments

from usmkit.kernels.chunk_attention import chunk_attention
from usmkit.kernels.chunk_attention.reference import chunk_attention_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# atol: for 16-bit types about two units in the last place at magnitude 1 (outputs and grads here are O(1)).
ATOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


@pytest.fixture(autouse=True, scope="module")
def _one_block_config():
    """On the GPU, test with the first block config instead of autotuning every new shape key (slow to compile)."""
    if DEVICE != "cuda":
        yield
        return
    from usmkit.kernels.chunk_attention import triton as kernels

    tuners = (kernels._fwd_kernel, kernels._dkdv_kernel, kernels._dq_kernel)
    saved = [tuner.configs for tuner in tuners]
    for tuner in tuners:
        tuner.configs = tuner.configs[:1]
    yield
    for tuner, configs in zip(tuners, saved, strict=True):
        tuner.configs = configs


def _inputs(B, H, T, D, lengths, seed=0):
    """q, k, v, dout in fp64 on DEVICE (the caller casts) and lengths."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(B, H, T, D, generator=gen, dtype=torch.float64) for _ in range(4))
    return [x.to(DEVICE) for x in (q, k, v, dout)], torch.tensor(lengths, device=DEVICE)


def _run(fn, q, k, v, dout, dtype):
    """Forward + backward of fn on dtype copies. Returns [out, dq, dk, dv]."""
    leaves = [x.detach().to(dtype, copy=True).requires_grad_() for x in (q, k, v)]
    out = fn(*leaves)
    out.backward(dout.to(dtype))
    return [out.detach()] + [x.grad for x in leaves]


def _assert_close_to_reference(got, ref64, same, dtype, what):
    for name, g, r, s in zip(("out", "dq", "dk", "dv"), got, ref64, same, strict=True):
        assert g.dtype == dtype and g.shape == r.shape, f"{what} {name}: {g.dtype} {tuple(g.shape)}"
        assert torch.isfinite(g).all(), f"{what} {name}: non-finite values"
        err = (g.double() - r).abs().max().item()
        base = (s.double() - r).abs().max().item()
        assert err <= 2 * base + ATOL[dtype], f"{what} {name}: |kernel-ref|={err:.3g} > 2*{base:.3g}+{ATOL[dtype]}"


def _check_case(B, H, T, D, chunk, left, lengths, dtype, dq_mode=None, seed=0):
    (q, k, v, dout), lengths_t = _inputs(B, H, T, D, lengths, seed)
    what = f"T={T} D={D} chunk={chunk} left={left} lengths={lengths} {dtype}"

    def reference(q_, k_, v_):
        return chunk_attention_reference(q_, k_, v_, lengths_t, chunk, left)

    def kernel(q_, k_, v_):
        return chunk_attention(q_, k_, v_, lengths_t, chunk, left, impl="triton")

    ref64 = _run(reference, q, k, v, dout, torch.float64)
    same = _run(reference, q, k, v, dout, dtype)
    if dq_mode is None:
        got = _run(kernel, q, k, v, dout, dtype)
    else:
        from usmkit.kernels.chunk_attention import triton as kernels

        q_, k_, v_ = (x.to(dtype) for x in (q, k, v))
        out, lse = kernels.chunk_attention_fwd(q_, k_, v_, lengths_t, chunk, left)
        got = [
            out,
            *kernels.chunk_attention_bwd(dout.to(dtype), q_, k_, v_, out, lse, lengths_t, chunk, left, dq_mode=dq_mode),
        ]
    _assert_close_to_reference(got, ref64, same, dtype, what)

    # Padded queries: output 0 and dq 0, exactly; padded keys: dk = dv = 0, exactly.
    out, dq, dk, dv = got
    for b, n in enumerate(lengths):
        for name, x in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
            assert (x[b, :, n:] == 0).all(), f"{what} {name}: padded frames of batch {b} are not exactly 0"


# (T, D, chunk_size, left_chunks, lengths): chunk sizes that do not divide T, padded lengths, left 0/1/-1.
CASES_FP32 = [
    (48, 16, 7, 0, [48, 29]),
    (48, 16, 7, 1, [48, 29]),
    (48, 16, 5, -1, [41, 17]),
    (64, 32, 16, 1, [64, 33]),  # chunk divides T and the block sizes
    (48, 16, 12, 2, [48, 0]),  # a sequence of length 0
    (48, 16, 7, 10, [37, 48]),  # left context past frame 0: same as -1
    (40, 16, None, 0, [40, 23]),  # full attention
    (24, 16, 100, 0, [24, 11]),  # one chunk longer than T
]


@pytest.mark.parametrize("T, D, chunk, left, lengths", CASES_FP32)
def test_fp32_matches_reference(T, D, chunk, left, lengths):
    _check_case(2, 1, T, D, chunk, left, lengths, torch.float32)


@pytest.mark.parametrize(
    "dtype, T, D, chunk, left, lengths",
    [
        (torch.float16, 48, 16, 7, 1, [48, 30]),
        (torch.float16, 40, 96, 6, 0, [40, 19]),  # head dim 96: padded to 128 inside the kernel
        (torch.bfloat16, 48, 32, 7, 0, [35, 48]),
        (torch.bfloat16, 48, 16, 12, -1, [48, 26]),
    ],
)
def test_half_precision_matches_reference(dtype, T, D, chunk, left, lengths):
    _check_case(2, 1, T, D, chunk, left, lengths, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_atomic_dq_matches_reference(dtype):
    """dq accumulated with atomics inside the dK/dV kernel (the other tests cover the default dQ kernel)."""
    _check_case(2, 1, 48, 16, 7, 1, [48, 21], dtype, dq_mode="atomic", seed=1)


@pytest.fixture
def _single_loop_configs():
    """Every kernel walks its visible range in one masked loop (the SINGLE_LOOP configs) instead of three."""
    import triton

    from usmkit.kernels.chunk_attention import triton as kernels

    tuners = (kernels._fwd_kernel, kernels._dkdv_kernel, kernels._dq_kernel)
    saved = [tuner.configs for tuner in tuners]
    for tuner in tuners:
        first = tuner.configs[0]
        kwargs = {**first.kwargs, "SINGLE_LOOP": True}
        tuner.configs = [triton.Config(kwargs, num_warps=first.num_warps, num_stages=first.num_stages)]
    kernels._BEST_CONFIGS.clear()
    yield
    for tuner, configs in zip(tuners, saved, strict=True):
        tuner.configs = configs
    kernels._BEST_CONFIGS.clear()


@pytest.mark.usefixtures("_single_loop_configs")
@pytest.mark.parametrize("dtype, chunk, left", [(torch.float32, 7, 1), (torch.bfloat16, 5, -1)])
def test_single_loop_variant_matches_reference(dtype, chunk, left):
    _check_case(2, 1, 48, 16, chunk, left, [48, 27], dtype, seed=6)


def test_strided_inputs_match_reference():
    """q, k, v as (B, T, H, D) memory viewed as (B, H, T, D), as a fused projection hands them over."""
    B, H, T, D = 1, 2, 40, 16
    (q, k, v, dout), lengths = _inputs(B, H, T, D, [27], seed=2)
    leaves = [x.transpose(1, 2).contiguous().transpose(1, 2).float().requires_grad_() for x in (q, k, v)]
    assert not leaves[0].is_contiguous()
    out = chunk_attention(*leaves, lengths, 6, 1, impl="triton")
    out.backward(dout.float())
    ref = [x.detach().clone().requires_grad_() for x in leaves]
    out_ref = chunk_attention_reference(*ref, lengths, 6, 1)
    out_ref.backward(dout.float())
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    for leaf, r in zip(leaves, ref, strict=True):
        torch.testing.assert_close(leaf.grad, r.grad, atol=1e-5, rtol=1e-5)


def test_bad_inputs_raise():
    q = torch.randn(1, 1, 8, 16, device=DEVICE)
    lengths = torch.tensor([8], device=DEVICE)
    with pytest.raises(ValueError, match="fp16, bf16 or fp32"):
        chunk_attention(q.double(), q.double(), q.double(), lengths, 4, 0, impl="triton")
    with pytest.raises(ValueError, match="head dims"):
        chunk_attention(q[..., :8], q[..., :8], q[..., :8], lengths, 4, 0, impl="triton")
    with pytest.raises(ValueError, match="lengths"):
        chunk_attention(q, q, q, torch.tensor([8, 8], device=DEVICE), 4, 0, impl="triton")
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_attention(q, q, q, lengths, 0, 0, impl="triton")
    with pytest.raises(ValueError, match="unknown attention impl"):
        chunk_attention(q, q, q, lengths, 4, 0, impl="cuda")  # type: ignore[arg-type]


# Utterances crossing the 32-query and 16-key blocks, one frame long, back to back and with gaps; an empty row.
PACKED_ROWS = [[(0, 9), (9, 1), (10, 23), (35, 13)], [(2, 40)], [], [(0, 48)]]


@pytest.mark.parametrize(("chunk", "left"), [(None, 0), (7, 0), (5, 1), (4, -1), (6, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_rows_match_reference(chunk, left, dtype):
    """Packed rows (each frame's utterance bounds): every utterance attends as if alone, chunks from its start;
    padding between and after utterances gets exactly 0 (out, dq, dk, dv)."""
    T = 48
    seg = packed_segments(T, PACKED_ROWS, DEVICE)
    (q, k, v, dout), _ = _inputs(len(PACKED_ROWS), 2, T, 16, [T] * len(PACKED_ROWS), seed=7)

    def reference(q_, k_, v_):
        return chunk_attention_reference(q_, k_, v_, seg, chunk, left)

    def kernel(q_, k_, v_):
        return chunk_attention(q_, k_, v_, seg, chunk, left, impl="triton")

    got = _run(kernel, q, k, v, dout, dtype)
    _assert_close_to_reference(got, _run(reference, q, k, v, dout, torch.float64),
                               _run(reference, q, k, v, dout, dtype), dtype, f"packed chunk={chunk} left={left}")  # fmt: skip
    padded = ~seg.valid
    for name, x in zip(("out", "dq", "dk", "dv"), got, strict=True):
        assert (x.transpose(1, 2)[padded] == 0).all(), f"{name}: padded frames are not exactly 0"


def test_segment_bounds_give_each_frame_its_utterance():
    from usmkit.kernels.chunk_attention.api import segment_bounds

    seg = packed_segments(12, [[(0, 3), (3, 1), (6, 4)], []], DEVICE)
    bounds = segment_bounds(seg).cpu()
    assert bounds.dtype == torch.int32 and bounds.shape == (2, 2, 12)
    assert bounds[0, 0].tolist() == [0, 0, 0, 3, 0, 0, 6, 6, 6, 6, 0, 0]
    assert bounds[0, 1].tolist() == [3, 3, 3, 4, 0, 0, 10, 10, 10, 10, 0, 0]
    assert (bounds[1] == 0).all()


def test_compile_fullgraph_forward_backward():
    """torch.compile traces through the custom ops with no graph break (inductor on GPU, aot_eager on CPU)."""
    B, H, T, D = 2, 1, 32, 16
    (q, k, v, dout), lengths = _inputs(B, H, T, D, [32, 19], seed=3)
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"

    def step(q_, k_, v_):
        out = chunk_attention(q_, k_, v_, lengths, 8, 1, impl="triton")
        return (out * dout.float()).sum()

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    leaves = [x.float().requires_grad_() for x in (q, k, v)]
    compiled(*leaves).backward()
    ref = [x.float().requires_grad_() for x in (q, k, v)]
    (chunk_attention_reference(*ref, lengths, 8, 1) * dout.float()).sum().backward()
    for leaf, r in zip(leaves, ref, strict=True):
        torch.testing.assert_close(leaf.grad, r.grad, atol=1e-5, rtol=1e-5)


def test_opcheck_registered_ops():
    """torch.library.opcheck: schema, fake (meta) implementation, autograd registration, AOT dispatch."""
    (q, k, v, dout), lengths = _inputs(1, 1, 16, 16, [13], seed=4)
    q, k, v, dout = (x.float() for x in (q, k, v, dout))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    torch.library.opcheck(torch.ops.usmkit.chunk_attention_fwd.default, (*leaves, lengths, 5, 1, None))
    out, lse = torch.ops.usmkit.chunk_attention_fwd(q, k, v, lengths, 5, 1, None)
    torch.library.opcheck(torch.ops.usmkit.chunk_attention_bwd.default, (dout, q, k, v, out, lse, lengths, 5, 1, None))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "T, D, chunk, left, dtype",
    [
        (512, 64, 64, 0, torch.bfloat16),
        (512, 64, 32, 4, torch.bfloat16),
        (600, 96, 200, 0, torch.bfloat16),
        (512, 128, 128, 2, torch.bfloat16),
        (512, 128, 128, 2, torch.float16),
        (333, 64, 50, -1, torch.float32),
    ],
)
def test_gpu_benchmark_like_shapes(T, D, chunk, left, dtype):
    """Realistic sizes on the GPU: every block loop (masked and unmasked) runs many times."""
    gen = torch.Generator().manual_seed(T + D)
    lengths = torch.randint(T // 2, T + 1, (3,), generator=gen).tolist()
    lengths[0] = T
    _check_case(3, 2, T, D, chunk, left, lengths, dtype, seed=5)
