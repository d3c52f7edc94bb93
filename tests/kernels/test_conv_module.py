"""The fused convolution-module middle (Triton: GLU, mask, depthwise conv, LayerNorm, Swish) against its reference.

Forward and the five gradients (h, depthwise weight and bias, LayerNorm weight and bias), one utterance per row
and packed rows, centred and causal kernels, D not a power of two. On CPU the kernels run under
TRITON_INTERPRET=1 (conftest.py) with tiny shapes; on a GPU the same tests run compiled, plus the ``gpu``-marked
ones at model sizes.
"""

import pytest
import torch
import torch.nn.functional as F

from usmkit.kernels.conv_module.api import conv_mid
from usmkit.kernels.conv_module.reference import conv_mid_reference
from usmkit.models.convolution import ConvolutionModule

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _packed_ids(B: int, T: int, gen: torch.Generator) -> torch.Tensor:
    """(B, T) utterance ids of packed rows: runs of 1-6 frames, sometimes a padded frame between, -1 at the end."""
    ids = torch.full((B, T), -1, dtype=torch.long)
    u = 0
    for b in range(B):
        t = 0
        while t < T - 3:
            n = int(torch.randint(1, 7, (), generator=gen))
            ids[b, t : t + n] = u
            u += 1
            t += n + int(torch.randint(0, 2, (), generator=gen))
    return ids


def _case(B, T, D, K, left, packed, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(B, T, 2 * D, generator=gen)
    if packed:
        ids = _packed_ids(B, T, gen)
        valid = ids >= 0
    else:
        lengths = torch.randint(T // 2, T + 1, (B,), generator=gen)
        lengths[0] = T
        ids, valid = None, torch.arange(T)[None, :] < lengths[:, None]
    params = [
        torch.randn(D, K, generator=gen) * 0.5,  # depthwise weight
        torch.randn(D, generator=gen) * 0.1,  # depthwise bias
        1 + 0.1 * torch.randn(D, generator=gen),  # LayerNorm weight
        0.1 * torch.randn(D, generator=gen),  # LayerNorm bias
    ]
    dout = torch.randn(B, T, D, generator=gen)
    to = dict(device=DEVICE)
    ids = ids.to(**to) if ids is not None else None
    return h.to(dtype=dtype, **to), valid.to(**to), ids, [p.to(**to) for p in params], dout.to(**to)


def _grads(fn, h, valid, ids, params, dout, left):
    leaves = [h.clone().requires_grad_(), *(p.clone().requires_grad_() for p in params)]
    out = fn(leaves[0], valid, ids, *leaves[1:], 1e-5, left)
    grads = torch.autograd.grad(out, leaves, dout.to(out.dtype))
    return out, grads


@pytest.mark.parametrize(
    "B, T, D, K, left, packed",
    [
        (2, 13, 24, 5, 2, False),  # centred, D not a power of two
        (2, 13, 16, 4, 3, False),  # causal (left = K - 1)
        (3, 17, 16, 5, 2, True),  # packed rows
        (2, 11, 8, 3, 2, True),  # packed, causal
        (1, 7, 8, 1, 0, False),  # a pointwise "depthwise" conv
    ],
)
def test_fp32_matches_reference(B, T, D, K, left, packed):
    h, valid, ids, params, dout = _case(B, T, D, K, left, packed)
    out, grads = _grads(conv_mid, h, valid, ids, params, dout, left)
    ref, ref_grads = _grads(conv_mid_reference, h, valid, ids, params, dout, left)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for name, g, r in zip(("h", "weight", "bias", "ln_weight", "ln_bias"), grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, atol=2e-5, rtol=1e-4, msg=lambda m, n=name: f"d{n}: {m}")


def test_masked_frames_get_no_gradient_and_pass_nothing():
    """A frame that is not valid contributes nothing to any output and gets a zero gradient."""
    h, valid, ids, params, dout = _case(2, 12, 8, 5, 2, packed=True, seed=3)
    out, (dh, *_) = _grads(conv_mid, h, valid, ids, params, dout, 2)
    assert dh[~valid].abs().max() == 0
    h2 = h.clone()
    h2[~valid] = 1e3  # padding's values must not matter
    out2, _ = _grads(conv_mid, h2, valid, ids, params, dout, 2)
    torch.testing.assert_close(out2, out, atol=0, rtol=0)


def test_bf16_input_matches_fp32_reference():
    """bf16 h (the pointwise projection's output under autocast) -> bf16 out within bf16 rounding of fp32."""
    h, valid, ids, params, dout = _case(2, 16, 32, 5, 2, packed=False, dtype=torch.bfloat16, seed=1)
    dout = dout.bfloat16().float()  # the gradient reaches the kernel in bf16: give the reference the same
    out, (dh, *grads) = _grads(conv_mid, h, valid, ids, params, dout, 2)
    ref, (ref_dh, *ref_grads) = _grads(conv_mid_reference, h.float(), valid, ids, params, dout, 2)
    assert out.dtype == dh.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)  # one bf16 rounding of the output
    torch.testing.assert_close(dh.float(), ref_dh, atol=2e-2, rtol=2e-2)
    for g, r in zip(grads, ref_grads, strict=True):  # fp32 parameter gradients, computed in fp32 from bf16 h
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_is_the_modules_function(packed, causal):
    """The reference computes exactly what ConvolutionModule's three stages compute, so the fused module is it."""
    torch.manual_seed(0)
    D, K = 16, 5
    module = ConvolutionModule(D, K, causal=causal, dropout=0.0).eval()
    h, valid, ids, _, _ = _case(2, 13, D, K, module.left_context, packed, seed=2)
    x = torch.randn(2, 13, D).to(DEVICE)
    module = module.to(DEVICE)
    staged = F.silu(module.norm_mid(module.depthwise(module.pointwise_in(x, valid), segment_ids=ids)))
    h = module.pointwise1(module.norm_in(x))
    ref = conv_mid_reference(
        h, valid, ids, module.depthwise_conv.weight[:, 0, :], module.depthwise_conv.bias, module.norm_mid.weight,
        module.norm_mid.bias, module.norm_mid.eps, module.left_context,
    )  # fmt: skip
    torch.testing.assert_close(ref, staged, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("packed", [False, True])
def test_fused_module_equals_torch_module(packed):
    """ConvolutionModule(impl="triton") gives the torch module's output and parameter gradients."""
    torch.manual_seed(0)
    D, K = 24, 5
    torch_mod = ConvolutionModule(D, K, causal=False, dropout=0.0).to(DEVICE)
    fused = ConvolutionModule(D, K, causal=False, dropout=0.0, impl="triton").to(DEVICE)
    fused.load_state_dict(torch_mod.state_dict())
    _, valid, ids, _, _ = _case(2, 14, D, K, 2, packed, seed=4)
    x = torch.randn(2, 14, D, device=DEVICE)
    outs = []
    for module in (torch_mod, fused):
        out = module(x, valid, ids)
        out.square().sum().backward()
        outs.append(out)
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(torch_mod.named_parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_compile_fullgraph_forward_backward():
    """torch.compile traces through the custom ops with no graph break (inductor on GPU, aot_eager on CPU)."""
    h, valid, ids, params, dout = _case(2, 12, 16, 5, 2, packed=True, seed=5)
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"

    def step(h_, *params_):
        return (conv_mid(h_, valid, ids, *params_, 1e-5, 2) * dout).sum()

    leaves = [h.clone().requires_grad_(), *(p.clone().requires_grad_() for p in params)]
    torch.compile(step, fullgraph=True, backend=backend)(*leaves).backward()
    _, ref_grads = _grads(conv_mid_reference, h, valid, ids, params, dout, 2)
    for leaf, r in zip(leaves, ref_grads, strict=True):
        torch.testing.assert_close(leaf.grad, r, atol=2e-5, rtol=1e-4)


def test_opcheck_registered_ops():
    """torch.library.opcheck: schema, fake (meta) implementation, autograd registration, AOT dispatch."""
    h, valid, ids, params, dout = _case(1, 9, 8, 3, 1, packed=True, seed=6)
    leaves = [h.clone().requires_grad_(), *(p.clone().requires_grad_() for p in params)]
    args = (leaves[0], valid, ids, *leaves[1:], 1e-5, 1)
    torch.library.opcheck(torch.ops.usmkit.conv_mid_fwd.default, args)
    out, mean, rstd = torch.ops.usmkit.conv_mid_fwd(h, valid, ids, *params, 1e-5, 1)
    torch.library.opcheck(torch.ops.usmkit.conv_mid_bwd.default, (dout, h, valid, ids, *params, mean, rstd, 1))


def test_bad_inputs_raise():
    h, valid, ids, params, _ = _case(1, 8, 8, 3, 1, packed=False)
    with pytest.raises(ValueError, match="h must be"):
        conv_mid(h[..., :-1], valid, ids, *params, 1e-5, 1)
    with pytest.raises(ValueError, match="left=3"):
        conv_mid(h, valid, ids, *params, 1e-5, 3)
    with pytest.raises(ValueError, match="valid must be bool"):
        conv_mid(h, valid.long(), ids, *params, 1e-5, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("D, K, packed", [(1024, 5, False), (1024, 5, True), (512, 15, True), (1536, 31, False)])
def test_gpu_model_sizes(D, K, packed):
    """Model widths on the GPU (one tile spans all channels), bf16 as under autocast."""
    h, valid, ids, params, dout = _case(4, 301, D, K, (K - 1) // 2, packed, dtype=torch.bfloat16, seed=D + K)
    dout = dout.bfloat16().float()
    out, (dh, *grads) = _grads(conv_mid, h, valid, ids, params, dout, (K - 1) // 2)
    ref, (ref_dh, *ref_grads) = _grads(conv_mid_reference, h.float(), valid, ids, params, dout, (K - 1) // 2)
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(dh.float(), ref_dh, atol=3e-2, rtol=3e-2)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, atol=1e-2 * r.abs().max().item(), rtol=1e-2)
