"""CTC head and loss.

Shapes: B batch, T encoder frames, D encoder dim, V vocabulary (id 0 = blank), U target tokens.
"""

from __future__ import annotations

import torch
from torch import nn

from usmkit.kernels.ctc import ctc_nll_triton

BLANK_ID = 0


class CTCHead(nn.Module):
    """Linear projection to the vocabulary, then log-softmax (in fp32, also under autocast)."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__()
        if vocab_size < 2:
            raise ValueError(f"CTC needs a vocabulary of blank plus at least one token, got vocab_size={vocab_size}")
        self.vocab_size = vocab_size
        self.proj = nn.Linear(d_model, vocab_size)

    def forward(self, enc: torch.Tensor) -> torch.Tensor:
        """enc (B, T, D) -> log-probs (B, T, V), float32."""
        return self.proj(enc).float().log_softmax(dim=-1)


def ctc_loss(
    log_probs: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor, token_lens: torch.Tensor
) -> torch.Tensor:
    """CTC loss summed over utterances and divided by the batch size (a scalar).

    log_probs (B, T, V) from ``CTCHead``; lengths (B,) valid frames; tokens (B, U) padded with -1;
    token_lens (B,). Runs in fp32 with autocast off (the forward-backward recursion underflows in
    half precision).

    Normalization: sum / B, i.e. the mean per-utterance negative log-likelihood (as WeNet). The
    alternative, PyTorch's ``reduction="mean"``, divides each utterance by its target length, which
    weighs a token of a short utterance more than one of a long utterance; sum / B keeps every
    token equal and stays on the same scale as the attention loss (also sum / B) it is mixed with.
    ``zero_infinity=True``: an utterance with fewer frames than its CTC alignment needs contributes 0
    instead of inf.
    """
    if log_probs.dim() != 3:
        raise ValueError(f"log_probs must be (B, T, V), got shape {tuple(log_probs.shape)}")
    if tokens.dim() != 2 or tokens.shape[0] != log_probs.shape[0]:
        raise ValueError(f"tokens must be (B, U) with B={log_probs.shape[0]}, got shape {tuple(tokens.shape)}")
    B = log_probs.shape[0]
    with torch.autocast(device_type=log_probs.device.type, enabled=False):
        loss = _ctc_loss_sum(
            log_probs.float().transpose(0, 1),  # (T, B, V)
            tokens.clamp(min=0),  # padding -1 -> 0; positions >= token_lens are ignored by ctc_loss
            lengths,
            token_lens,
        )
    return loss / B


# aten._ctc_loss allocates its alignment table (log_alpha) from the *values* of the target lengths,
# which torch.compile cannot trace (a "dynamic shape operator": a graph break, so no fullgraph).
# Wrapping it as a custom op with static output shapes hides that from the tracer: the forward
# returns only the per-utterance loss (B,), and the backward recomputes log_alpha inside a second
# custom op (one extra CTC forward, small next to the encoder) instead of saving it.
# Both ops are tagged cudagraph_unsafe: aten's CTC takes the lengths on the host (on CUDA a
# synchronization a CUDA graph cannot capture). They serve the CPU; on CUDA the loss runs our Triton
# kernels (``usmkit.kernels.ctc``), which read the lengths on the device: no synchronization, so the host
# queues the step's backward and the next step without waiting, and CUDA graphs may hold the loss.
_CUDAGRAPH_UNSAFE = (torch.Tag.cudagraph_unsafe,)


def _host_lengths(lengths: torch.Tensor, token_lens: torch.Tensor) -> tuple[list[int], list[int]]:
    """Both length vectors as host lists, in one device-to-host copy (one sync). aten's CTC reads its
    ``int[]`` lengths on the host; a device tensor passed there is read one element, one sync, at a time."""
    both = torch.stack([lengths, token_lens]).cpu().tolist()  # [[B], [B]]
    return both[0], both[1]


@torch.library.custom_op("usmkit::ctc_nll", mutates_args=(), tags=_CUDAGRAPH_UNSAFE)
def ctc_nll(
    log_probs: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor, token_lens: torch.Tensor
) -> torch.Tensor:
    """log_probs (T, B, V) fp32, tokens (B, U) >= 0 -> per-utterance negative log-likelihood (B,)."""
    il, tl = _host_lengths(lengths, token_lens)
    nll, _ = torch.ops.aten._ctc_loss(log_probs, tokens, il, tl, BLANK_ID, True)
    # zero_infinity: an impossible alignment (too few frames) contributes 0, as F.ctc_loss does.
    return torch.where(torch.isinf(nll), torch.zeros_like(nll), nll)


@ctc_nll.register_fake
def _(log_probs, tokens, lengths, token_lens):
    return log_probs.new_empty(log_probs.shape[1])


@torch.library.custom_op("usmkit::ctc_nll_backward", mutates_args=(), tags=_CUDAGRAPH_UNSAFE)
def ctc_nll_backward(
    grad: torch.Tensor, log_probs: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor, token_lens: torch.Tensor
) -> torch.Tensor:
    il, tl = _host_lengths(lengths, token_lens)
    nll, log_alpha = torch.ops.aten._ctc_loss(log_probs, tokens, il, tl, BLANK_ID, True)
    grad_lp = torch.ops.aten._ctc_loss_backward(
        grad.contiguous(), log_probs, tokens, il, tl, nll, log_alpha, BLANK_ID, True
    )
    # Contiguous, as the fake kernel promises: the CPU kernel returns a contiguous (T, B, V) tensor
    # whatever log_probs' strides (here a transposed view), so ``empty_like`` would promise the wrong
    # strides, which a dynamic-shape compiled graph asserts on.
    return grad_lp.contiguous()


@ctc_nll_backward.register_fake
def _(grad, log_probs, tokens, lengths, token_lens):
    return log_probs.new_empty(log_probs.shape)  # contiguous (T, B, V), as the real kernel returns


def _ctc_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _ctc_backward(ctx, grad):
    log_probs, tokens, lengths, token_lens = ctx.saved_tensors
    return ctc_nll_backward(grad, log_probs, tokens, lengths, token_lens), None, None, None


ctc_nll.register_autograd(_ctc_backward, setup_context=_ctc_setup_context)


def _ctc_loss_sum(
    log_probs: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor, token_lens: torch.Tensor
) -> torch.Tensor:
    if log_probs.is_cuda:  # our Triton kernels: the lengths stay on the device, the host never waits
        return ctc_nll_triton(log_probs, tokens, lengths, token_lens, BLANK_ID).sum()
    return ctc_nll(log_probs, tokens.long(), lengths.long(), token_lens.long()).sum()
