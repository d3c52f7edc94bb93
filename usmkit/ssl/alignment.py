"""Token durations from CTC forced alignment (``torchaudio.functional.forced_align``), for MOST.

Shapes: B batch, T encoder frames, V vocabulary (0 = blank), U tokens.

The Viterbi path of the paired tokens through a CTC model's posteriors labels each frame with a
token or blank. A token's duration is its frames in the path plus the blanks after it, up to the next
token; the blanks before the first token go to the first token. So the durations of an utterance sum
to its encoder frames, and upsampling the text by them lines each text frame up with a speech frame.

Which CTC model: the one being trained (``task.most.align_from=null``) costs nothing extra and its
alignments improve as it learns, but a stage-2 run started from a BEST-RQ encoder has a random CTC
head at first, whose alignments are noise until CTC has learned (``task.most.align_warmup_steps``
holds the duration and consistency losses back meanwhile). A separate CTC checkpoint
(``align_from``, e.g. a short stage-3 run with the same tokenizer) aligns well from the first step,
at the cost of training it first and one more encoder forward per paired batch.
"""

from __future__ import annotations

import torch
import torchaudio.functional as taf

from usmkit.models.ctc import BLANK_ID


def token_durations(path: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """A CTC path (T,) of token ids and blanks -> each token's frames (num_tokens,) int64, summing to T.

    A token starts where the path shows a non-blank that differs from the frame before (a repeated
    token is separated by a blank in any CTC path).

    >>> token_durations(torch.tensor([0, 5, 5, 0, 7, 0, 7, 0]), 3).tolist()
    [4, 2, 2]
    """
    previous = torch.cat([path.new_full((1,), BLANK_ID), path[:-1]])
    starts = torch.nonzero((path != BLANK_ID) & (path != previous)).squeeze(1)  # (U,)
    if starts.numel() != num_tokens:
        raise ValueError(f"the path holds {starts.numel()} tokens, expected {num_tokens}")
    starts[0] = 0  # leading blanks belong to the first token
    ends = torch.cat([starts[1:], starts.new_full((1,), path.shape[0])])
    return ends - starts


def frames_needed(tokens: list[int]) -> int:
    """The fewest frames a CTC path of ``tokens`` takes: one per token, one blank between repeats."""
    return len(tokens) + sum(a == b for a, b in zip(tokens, tokens[1:], strict=False))


@torch.no_grad()
def forced_durations(
    log_probs: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor, token_lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Aligned durations of every utterance of a batch.

    log_probs (B, T, V) CTC log-posteriors, lengths (B,) valid frames, tokens (B, U) padded with -1,
    token_lens (B,) -> durations (B, U) int64 (0 at padded tokens; each row sums to its length) and
    ok (B,) bool, on log_probs' device. A row is not ok (all zeros) when it has no token or too few
    frames for its tokens. ``forced_align`` takes one utterance at a time, so this loops over the
    batch, on the CPU: one copy of the posteriors there costs less than a GPU launch and a host sync
    per utterance (the Viterbi search over a few hundred frames is small).
    """
    device = log_probs.device
    log_probs, tokens = log_probs.detach().float().cpu(), tokens.cpu()
    B, U = tokens.shape
    durations = torch.zeros(B, U, dtype=torch.int64)
    ok = torch.zeros(B, dtype=torch.bool)
    for b, (T, n) in enumerate(zip(lengths.tolist(), token_lens.tolist(), strict=True)):
        row = tokens[b, :n]
        if n == 0 or T < frames_needed(row.tolist()):
            continue
        path, _ = taf.forced_align(log_probs[b : b + 1, :T], row[None].int(), blank=BLANK_ID)  # (1, T)
        durations[b, :n] = token_durations(path[0], n)
        ok[b] = True
    return durations.to(device), ok.to(device)
