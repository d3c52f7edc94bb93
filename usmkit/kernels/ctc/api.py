"""The Triton CTC as ``torch.library`` custom ops with fake implementations and autograd.

Shapes: T frames, B batch, V vocabulary, U target tokens. ``ctc_nll_triton(log_probs (T, B, V) fp32, tokens
(B, U) >= 0, lengths (B,), token_lens (B,))`` -> per-utterance negative log-likelihood (B,), 0 where no
alignment fits (``zero_infinity``). Unlike aten's CUDA CTC it never reads the lengths on the host, so it is not
tagged ``cudagraph_unsafe``: inductor keeps it inside CUDA graphs, and in eager mode the host does not wait.
The forward keeps its alpha table (B, T, S_PAD) for the backward instead of recomputing it.
The kernel module is imported lazily, on the first call: TRITON_INTERPRET must be set before it is imported.
"""

from __future__ import annotations

import torch

BLANK_ID = 0


def _kernels():
    from usmkit.kernels.ctc import triton as kernels

    return kernels


def _s_pad(tokens: torch.Tensor) -> int:
    n = 2 * tokens.shape[1] + 1
    return 1 << (n - 1).bit_length()  # next power of two, as the kernels pad the states


@torch.library.custom_op("usmkit::ctc_triton_fwd", mutates_args=())
def ctc_triton_fwd(
    log_probs: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor, token_lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (nll (B,) with inf where no alignment fits, alpha (B, T, S_PAD))."""
    return _kernels().ctc_forward(log_probs, tokens, lengths, token_lens, BLANK_ID)


@ctc_triton_fwd.register_fake
def _(log_probs, tokens, lengths, token_lens):
    T, B, _ = log_probs.shape
    return log_probs.new_empty((B,)), log_probs.new_empty((B, T, _s_pad(tokens)))


@torch.library.custom_op("usmkit::ctc_triton_bwd", mutates_args=())
def ctc_triton_bwd(
    grad: torch.Tensor,
    log_probs: torch.Tensor,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    token_lens: torch.Tensor,
    nll: torch.Tensor,
    alpha: torch.Tensor,
) -> torch.Tensor:
    """-> d loss / d log_probs (T, B, V), contiguous."""
    return _kernels().ctc_backward(grad, log_probs, tokens, lengths, token_lens, nll, alpha, BLANK_ID)


@ctc_triton_bwd.register_fake
def _(grad, log_probs, tokens, lengths, token_lens, nll, alpha):
    return log_probs.new_empty(log_probs.shape)


def _setup_context(ctx, inputs, output) -> None:
    log_probs, tokens, lengths, token_lens = inputs
    nll, alpha = output
    ctx.save_for_backward(log_probs, tokens, lengths, token_lens, nll, alpha)
    ctx.mark_non_differentiable(alpha)


def _backward(ctx, grad_nll, grad_alpha):
    log_probs, tokens, lengths, token_lens, nll, alpha = ctx.saved_tensors
    return ctc_triton_bwd(grad_nll, log_probs, tokens, lengths, token_lens, nll, alpha), None, None, None


ctc_triton_fwd.register_autograd(_backward, setup_context=_setup_context)


def ctc_nll_triton(
    log_probs: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor, token_lens: torch.Tensor
) -> torch.Tensor:
    """Per-utterance CTC negative log-likelihood (B,), 0 where no alignment fits; differentiable."""
    nll, _ = ctc_triton_fwd(log_probs, tokens.long(), lengths.long(), token_lens.long())
    return torch.where(torch.isinf(nll), torch.zeros_like(nll), nll)
