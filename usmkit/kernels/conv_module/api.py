"""Public entry point for the convolution module's fused middle (GLU, mask, depthwise conv, LayerNorm, Swish).

Shapes: B batch, T frames, D channels, K taps. ``conv_mid(h (B, T, 2D), valid (B, T) bool, ids (B, T) or None,
weight (D, K), bias (D,), ln_weight (D,), ln_bias (D,), eps, left)`` -> (B, T, D) in h's dtype; the semantics
are ``reference.conv_mid_reference``'s, which the Triton kernels are tested against (forward and gradients).

As in ``usmkit.kernels.chunk_attention.api``: two ``torch.library`` custom ops (``usmkit::conv_mid_fwd`` ->
out, mean, rstd; ``usmkit::conv_mid_bwd`` -> the five gradients) with fake implementations and autograd, so
``torch.compile(fullgraph=True)`` traces a model through them; in eager mode the same launchers run under a
plain ``torch.autograd.Function`` (less host time per call). The kernel module is imported lazily, on the first
call: TRITON_INTERPRET must be set before it is imported.
"""

from __future__ import annotations

import os

import torch


def _kernels():
    from usmkit.kernels.conv_module import triton as kernels

    return kernels


def available(x: torch.Tensor) -> bool:
    """Whether the Triton kernels can run on x's device: CUDA, or any device under Triton's interpreter."""
    return x.is_cuda or os.environ.get("TRITON_INTERPRET", "0") == "1"


@torch.library.custom_op(
    "usmkit::conv_mid_fwd",
    mutates_args=(),
    schema="(Tensor h, Tensor valid, Tensor? ids, Tensor weight, Tensor bias, Tensor ln_weight, Tensor ln_bias,"
    " float eps, int left) -> (Tensor, Tensor, Tensor)",
)
def conv_mid_op(h, valid, ids, weight, bias, ln_weight, ln_bias, eps, left):
    """The Triton forward as a torch.library op: (out (B, T, D), mean (B, T), rstd (B, T))."""
    return _kernels().conv_mid_fwd(h, valid, ids, weight, bias, ln_weight, ln_bias, eps, left)


@conv_mid_op.register_fake
def _conv_mid_fake(h, valid, ids, weight, bias, ln_weight, ln_bias, eps, left):
    B, T, D2 = h.shape
    stats = h.new_empty((B, T), dtype=torch.float32)
    return h.new_empty((B, T, D2 // 2)), stats, stats.new_empty((B, T))


@torch.library.custom_op(
    "usmkit::conv_mid_bwd",
    mutates_args=(),
    schema="(Tensor dout, Tensor h, Tensor valid, Tensor? ids, Tensor weight, Tensor bias, Tensor ln_weight,"
    " Tensor ln_bias, Tensor mean, Tensor rstd, int left) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
)
def _conv_mid_bwd(dout, h, valid, ids, weight, bias, ln_weight, ln_bias, mean, rstd, left):
    return _kernels().conv_mid_bwd(dout, h, valid, ids, weight, bias, ln_weight, ln_bias, mean, rstd, left)


@_conv_mid_bwd.register_fake
def _conv_mid_bwd_fake(dout, h, valid, ids, weight, bias, ln_weight, ln_bias, mean, rstd, left):
    return (
        h.new_empty(h.shape),
        weight.new_empty(weight.shape),
        *(p.new_empty(p.shape) for p in (bias, ln_weight, ln_bias)),
    )


def _setup_context(ctx, inputs, output) -> None:
    h, valid, ids, weight, bias, ln_weight, ln_bias, eps, left = inputs
    _, mean, rstd = output
    ctx.save_for_backward(h, valid, ids, weight, bias, ln_weight, ln_bias, mean, rstd)
    ctx.left = left
    ctx.mark_non_differentiable(mean, rstd)


def _backward(ctx, dout, dmean, drstd):
    h, valid, ids, weight, bias, ln_weight, ln_bias, mean, rstd = ctx.saved_tensors
    grads = _conv_mid_bwd(dout, h, valid, ids, weight, bias, ln_weight, ln_bias, mean, rstd, ctx.left)
    dh, dw, db, dlnw, dlnb = grads
    return dh, None, None, dw, db, dlnw, dlnb, None, None


conv_mid_op.register_autograd(_backward, setup_context=_setup_context)


class _EagerConvMid(torch.autograd.Function):
    """The same kernels as the custom ops, with less host time per call (see the module doc)."""

    @staticmethod
    def forward(ctx, h, valid, ids, weight, bias, ln_weight, ln_bias, eps, left):
        out, mean, rstd = _kernels().conv_mid_fwd(h, valid, ids, weight, bias, ln_weight, ln_bias, eps, left)
        ctx.save_for_backward(h, valid, ids, weight, bias, ln_weight, ln_bias, mean, rstd)
        ctx.left = left
        return out

    @staticmethod
    def backward(ctx, dout):
        h, valid, ids, weight, bias, ln_weight, ln_bias, mean, rstd = ctx.saved_tensors
        dh, dw, db, dlnw, dlnb = _kernels().conv_mid_bwd(
            dout, h, valid, ids, weight, bias, ln_weight, ln_bias, mean, rstd, ctx.left
        )
        return dh, None, None, dw, db, dlnw, dlnb, None, None


def conv_mid(
    h: torch.Tensor,
    valid: torch.Tensor,
    ids: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor,
    ln_weight: torch.Tensor,
    ln_bias: torch.Tensor,
    eps: float,
    left: int,
) -> torch.Tensor:
    """Differentiable fused middle of the convolution module: the custom op under torch.compile, an
    autograd.Function in eager. h (B, T, 2D) -> (B, T, D) in h's dtype."""
    if torch.compiler.is_compiling():
        out, _, _ = conv_mid_op(h, valid, ids, weight, bias, ln_weight, ln_bias, eps, left)
        return out
    return _EagerConvMid.apply(h, valid, ids, weight, bias, ln_weight, ln_bias, eps, left)
