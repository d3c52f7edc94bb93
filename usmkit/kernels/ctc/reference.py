"""Eager CTC negative log-likelihood: the oracle the Triton kernels are tested against.

Shapes: T frames, B batch, V vocabulary (id ``blank`` = blank), U target tokens, S = 2U + 1 states of the
extended target (blank, y1, blank, y2, ..., blank). log_probs: (T, B, V) fp32; tokens (B, U) >= 0;
lengths, token_lens (B,) int.
"""

from __future__ import annotations

import torch

# log(0) as a finite number: an all-impossible logsumexp then has a finite gradient (0), where -inf would
# give NaN (0 * inf) in autograd. A total below IMPOSSIBLE means no alignment fits: the loss is inf.
NEG_INF = -1e30
IMPOSSIBLE = -1e29


def ctc_nll_reference(
    log_probs: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor, token_lens: torch.Tensor, blank: int = 0
) -> torch.Tensor:
    """-log p(tokens | log_probs) per utterance (B,); inf where no alignment fits. Differentiable (autograd)."""
    T, B, _ = log_probs.shape
    out = []
    for b in range(B):
        t_len, u_len = int(lengths[b]), int(token_lens[b])
        labels = torch.full((2 * u_len + 1,), blank, dtype=torch.long)
        labels[1::2] = tokens[b, :u_len]
        S = labels.numel()
        emit = log_probs[:t_len, b, :].index_select(1, labels.to(log_probs.device))  # (t_len, S)
        # s - 2 -> s is allowed into a token that differs from the token two states back
        skip = torch.zeros(S, dtype=torch.bool)
        skip[3::2] = labels[3::2] != labels[1:-2:2]
        skip = skip.to(log_probs.device)
        alpha = log_probs.new_full((S,), NEG_INF)
        if t_len > 0:  # an alignment starts with the first blank or the first token
            alpha = torch.cat([emit[0, : min(2, S)], alpha[min(2, S) :]])
        for t in range(1, t_len):
            stay = alpha
            step = torch.cat([alpha.new_full((1,), NEG_INF), alpha])[:S]  # alpha[s - 1]
            jump = torch.cat([alpha.new_full((2,), NEG_INF), alpha])[:S].masked_fill(~skip, NEG_INF)  # alpha[s - 2]
            alpha = torch.logsumexp(torch.stack([stay, step, jump]), dim=0) + emit[t]
        if t_len == 0:
            out.append(log_probs.new_tensor(0.0 if u_len == 0 else float("inf")))
            continue
        total = torch.logsumexp(alpha[max(S - 2, 0) :], dim=0)
        out.append(torch.where(total < IMPOSSIBLE, total.new_tensor(float("inf")), -total))
    return torch.stack(out)
