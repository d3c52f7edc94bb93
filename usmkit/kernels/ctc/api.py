"""The Triton CTC as ``torch.library`` custom ops with fake implementations and autograd.

Shapes: T frames, B batch, V vocabulary, U target tokens. ``ctc_nll_triton(log_probs (T, B, V) fp32, tokens
(B, U) >= 0, lengths (B,), token_lens (B,), blank)`` -> per-utterance negative log-likelihood (B,), 0 where no
alignment fits (``zero_infinity``). Unlike aten's CUDA CTC it never reads the lengths on the host, so it is not
tagged ``cudagraph_unsafe``: inductor keeps it inside CUDA graphs, and in eager mode the host does not wait.
The forward keeps its alpha table (B, T, S_PAD) for the backward instead of recomputing it.
The kernel module is imported lazily, on the first call: TRITON_INTERPRET must be set before it is imported.
"""

from __future__ import annotations

import torch

from usmkit.kernels.ctc.layout import padded_states


def _kernels():
    from usmkit.kernels.ctc import triton as kernels

    return kernels


@torch.library.custom_op("usmkit::ctc_triton_fwd", mutates_args=())
def ctc_triton_fwd(
    log_probs: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor, token_lens: torch.Tensor, blank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (nll (B,) with inf where no alignment fits, alpha (B, T, S_PAD))."""
    return _kernels().ctc_forward(log_probs, tokens, lengths, token_lens, blank)


@ctc_triton_fwd.register_fake
def _(log_probs, tokens, lengths, token_lens, blank):
    T, B, _ = log_probs.shape
    return log_probs.new_empty((B,)), log_probs.new_empty((B, T, padded_states(tokens.shape[1])))


@torch.library.custom_op("usmkit::ctc_triton_bwd", mutates_args=())
def ctc_triton_bwd(
    grad: torch.Tensor,
    log_probs: torch.Tensor,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    token_lens: torch.Tensor,
    nll: torch.Tensor,
    alpha: torch.Tensor,
    blank: int,
) -> torch.Tensor:
    """-> d loss / d log_probs (T, B, V), contiguous."""
    return _kernels().ctc_backward(grad, log_probs, tokens, lengths, token_lens, nll, alpha, blank)


@ctc_triton_bwd.register_fake
def _(grad, log_probs, tokens, lengths, token_lens, nll, alpha, blank):
    return log_probs.new_empty(log_probs.shape)


def _setup_context(ctx, inputs, output) -> None:
    log_probs, tokens, lengths, token_lens, blank = inputs
    nll, alpha = output
    ctx.save_for_backward(log_probs, tokens, lengths, token_lens, nll, alpha)
    ctx.blank = blank
    ctx.mark_non_differentiable(alpha)


def _backward(ctx, grad_nll, grad_alpha):
    log_probs, tokens, lengths, token_lens, nll, alpha = ctx.saved_tensors
    grad = ctc_triton_bwd(grad_nll, log_probs, tokens, lengths, token_lens, nll, alpha, ctx.blank)
    return grad, None, None, None, None


ctc_triton_fwd.register_autograd(_backward, setup_context=_setup_context)


def ctc_nll_triton(
    log_probs: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor, token_lens: torch.Tensor, blank: int
) -> torch.Tensor:
    """Per-utterance CTC negative log-likelihood (B,), 0 where no alignment fits; differentiable."""
    nll, _ = ctc_triton_fwd(log_probs, tokens.long(), lengths.long(), token_lens.long(), blank)
    return torch.where(torch.isinf(nll), torch.zeros_like(nll), nll)
