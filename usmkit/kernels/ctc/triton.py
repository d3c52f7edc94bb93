"""Triton CTC: the forward (alpha) and backward (beta, gradient) recursions with the lengths read on the device.

Shapes: T frames, B batch, V vocabulary, U target tokens, S = 2U + 1 states of the extended target (blank, y1,
blank, ..., yU, blank), S_PAD the next power of two. log_probs (T, B, V) fp32, any strides; tokens (B, U) int64
>= 0; lengths, token_lens (B,) int64 on the same device. ``reference.py`` is the oracle.

One program per utterance walks its frames in order, one state per lane. A frame's alpha row goes to global
memory (it is kept for the backward anyway) and the next frame reads its s - 1 and s - 2 neighbours back after
a block barrier. aten's CUDA CTC reads the lengths on the host (synchronizing the stream on every call); these
kernels take them as device tensors, so the loss can be captured in a CUDA graph and the host runs ahead.

Gradient: d nll / d log_probs[t, b, c] = -sum over states s of label c of exp(alpha_t(s) + beta_t(s) - lp_t(s)
+ nll), times the incoming gradient (the gradient with respect to the log-probabilities themselves; zero for
frames past the utterance, and everywhere for an utterance with no alignment, as ``zero_infinity``). Blank
states are summed in the program; a token that occurs twice in a target is accumulated with atomic adds, so
its gradient's last bits may vary between runs (as in aten's CUDA CTC).

CPU: set ``TRITON_INTERPRET=1`` before this module is imported (triton reads it when kernels are defined).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from usmkit.kernels.ctc.layout import padded_states
from usmkit.kernels.interpreter import patch_interpreter_loop_bounds

if os.environ.get("TRITON_INTERPRET", "0") == "1":
    patch_interpreter_loop_bounds()

NEG = tl.constexpr(float("-inf"))  # log(0); a constexpr, so the kernels may read it


@triton.jit
def _lse3(a, b, c):
    """log(exp(a) + exp(b) + exp(c)), -inf when all three are."""
    m = tl.maximum(tl.maximum(a, b), c)
    none = m == float("-inf")
    m_safe = tl.where(none, 0.0, m)
    total = tl.exp(a - m_safe) + tl.exp(b - m_safe) + tl.exp(c - m_safe)
    return tl.where(none, float("-inf"), m_safe + tl.log(tl.where(none, 1.0, total)))


@triton.jit
def _states(tok_ptr, stride_tok_b, b, U_b, BLANK: tl.constexpr, S_PAD: tl.constexpr):
    """Each state's label, whether it is a state of this utterance, and whether s - 2 -> s is allowed."""
    s = tl.arange(0, S_PAD)
    valid = s < 2 * U_b + 1
    is_token = (s % 2) == 1
    u = (s - 1) // 2
    label = tl.load(tok_ptr + b * stride_tok_b + u, mask=valid & is_token, other=BLANK)
    before = tl.load(tok_ptr + b * stride_tok_b + u - 1, mask=valid & is_token & (s >= 3), other=BLANK)
    can_jump = valid & is_token & (s >= 3) & (label != before)
    return s, label, valid, can_jump


@triton.jit
def _ctc_forward_kernel(
    lp_ptr, tok_ptr, len_ptr, tlen_ptr, alpha_ptr, nll_ptr,
    T, U, stride_lp_t, stride_lp_b, stride_tok_b,
    BLANK: tl.constexpr, S_PAD: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    T_b = tl.minimum(tl.load(len_ptr + b), T)
    U_b = tl.minimum(tl.load(tlen_ptr + b), U)
    s, label, valid, can_jump = _states(tok_ptr, stride_tok_b, b, U_b, BLANK, S_PAD)
    row = alpha_ptr + b.to(tl.int64) * T * S_PAD
    lp_b = lp_ptr + b.to(tl.int64) * stride_lp_b
    emit = tl.load(lp_b + label, mask=valid, other=NEG)
    alpha = tl.where(valid & (s < 2), emit, NEG)
    tl.store(row + s, alpha)
    for t in range(1, T_b):
        tl.debug_barrier()  # the last frame's row is in memory for every lane
        prev = row + (t - 1) * S_PAD
        step = tl.load(prev + s - 1, mask=s >= 1, other=NEG, volatile=True)
        jump = tl.load(prev + s - 2, mask=can_jump, other=NEG, volatile=True)
        emit = tl.load(lp_b + t * stride_lp_t + label, mask=valid, other=0.0)
        alpha = tl.where(valid, _lse3(alpha, step, jump) + emit, NEG)
        tl.store(row + t * S_PAD + s, alpha)
    S_b = 2 * U_b + 1
    final = tl.where((s == S_b - 1) | (s == S_b - 2), alpha, NEG)
    m = tl.max(final, axis=0)
    none = m == float("-inf")  # no alignment fits
    m_safe = tl.where(none, 0.0, m)
    total = tl.sum(tl.exp(final - m_safe), axis=0)
    nll = tl.where(none, float("inf"), -(m_safe + tl.log(tl.where(none, 1.0, total))))
    nll = tl.where(T_b > 0, nll, tl.where(U_b == 0, 0.0, float("inf")))
    tl.store(nll_ptr + b, nll)


@triton.jit
def _ctc_backward_kernel(
    lp_ptr, tok_ptr, len_ptr, tlen_ptr, alpha_ptr, beta_ptr, nll_ptr, gout_ptr, grad_ptr,
    T, U, stride_lp_t, stride_lp_b, stride_tok_b, stride_g_t, stride_g_b,
    BLANK: tl.constexpr, S_PAD: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    T_b = tl.minimum(tl.load(len_ptr + b), T)
    U_b = tl.minimum(tl.load(tlen_ptr + b), U)
    nll = tl.load(nll_ptr + b)
    # zero_infinity: an utterance with no alignment contributes no gradient
    scale = tl.where(nll == float("inf"), 0.0, tl.load(gout_ptr + b))
    nll = tl.where(nll == float("inf"), 0.0, nll)
    s, label, valid, can_jump = _states(tok_ptr, stride_tok_b, b, U_b, BLANK, S_PAD)
    # s -> s + 2 is allowed where s + 2 may jump from s
    s2 = s + 2
    u2 = (s2 - 1) // 2
    valid2 = s2 < 2 * U_b + 1
    label2 = tl.load(tok_ptr + b * stride_tok_b + u2, mask=valid2 & ((s2 % 2) == 1), other=BLANK)
    can_jump_in = valid2 & ((s % 2) == 1) & (label2 != label)
    S_b = 2 * U_b + 1
    a_row = alpha_ptr + b.to(tl.int64) * T * S_PAD
    b_row = beta_ptr + b.to(tl.int64) * 2 * S_PAD  # two rows, alternating frames
    lp_b = lp_ptr + b.to(tl.int64) * stride_lp_b
    g_b = grad_ptr + b.to(tl.int64) * stride_g_b
    beta = tl.full([S_PAD], NEG, tl.float32)
    for i in range(0, T_b):
        t = T_b - 1 - i
        emit = tl.load(lp_b + t * stride_lp_t + label, mask=valid, other=0.0)
        if i == 0:
            beta = tl.where(valid & ((s == S_b - 1) | (s == S_b - 2)), emit, NEG)
        else:
            nxt = b_row + ((i - 1) % 2) * S_PAD
            step = tl.load(nxt + s + 1, mask=(s + 1) < S_PAD, other=NEG, volatile=True)
            jump = tl.load(nxt + s + 2, mask=can_jump_in & ((s + 2) < S_PAD), other=NEG, volatile=True)
            beta = tl.where(valid, _lse3(beta, step, jump) + emit, NEG)
        tl.store(b_row + (i % 2) * S_PAD + s, beta)
        alpha = tl.load(a_row + t * S_PAD + s, mask=valid, other=NEG)
        log_post = alpha + beta - emit + nll
        post = tl.where(valid & (log_post > float("-inf")), tl.exp(log_post), 0.0) * scale
        blank_total = tl.sum(tl.where((s % 2) == 0, post, 0.0), axis=0)
        tl.store(g_b + t * stride_g_t + BLANK, -blank_total)
        tl.atomic_add(g_b + t * stride_g_t + label, -post, mask=valid & ((s % 2) == 1))
        tl.debug_barrier()  # this frame's beta row is in memory before the next frame reads it


def ctc_forward(
    log_probs: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor, token_lens: torch.Tensor, blank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> nll (B,) fp32 (inf where no alignment fits) and the alpha table (B, T, S_PAD) fp32 for the backward."""
    T, B, _ = log_probs.shape
    U = tokens.shape[1]
    s_pad = padded_states(U)
    alpha = log_probs.new_empty((B, T, s_pad))
    nll = log_probs.new_empty((B,))
    if B == 0:
        return nll, alpha
    _ctc_forward_kernel[(B,)](
        log_probs, tokens, lengths, token_lens, alpha, nll,
        T, U, log_probs.stride(0), log_probs.stride(1), tokens.stride(0),
        BLANK=blank, S_PAD=s_pad, num_warps=_warps(s_pad),
    )  # fmt: skip
    return nll, alpha


def ctc_backward(
    grad_nll: torch.Tensor,
    log_probs: torch.Tensor,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    token_lens: torch.Tensor,
    nll: torch.Tensor,
    alpha: torch.Tensor,
    blank: int,
) -> torch.Tensor:
    """-> d loss / d log_probs, (T, B, V) fp32 contiguous."""
    T, B, _ = log_probs.shape
    U = tokens.shape[1]
    s_pad = alpha.shape[2]
    grad = torch.zeros(log_probs.shape, dtype=torch.float32, device=log_probs.device)
    if B == 0:
        return grad
    beta = log_probs.new_empty((B, 2, s_pad))
    _ctc_backward_kernel[(B,)](
        log_probs, tokens, lengths, token_lens, alpha, beta, nll, grad_nll.contiguous(), grad,
        T, U, log_probs.stride(0), log_probs.stride(1), tokens.stride(0), grad.stride(0), grad.stride(1),
        BLANK=blank, S_PAD=s_pad, num_warps=_warps(s_pad),
    )  # fmt: skip
    return grad


def _warps(s_pad: int) -> int:
    return 1 if s_pad <= 64 else 2 if s_pad <= 128 else 4 if s_pad <= 512 else 8
