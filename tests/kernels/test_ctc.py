"""The Triton CTC (forward nll, gradient) against the eager reference and aten's CTC.

On CPU the kernels run under TRITON_INTERPRET=1 (set by conftest.py) with tiny shapes; on a GPU the same tests
run compiled, plus the ``gpu``-marked ones (a realistic batch against aten's CUDA CTC, and capture in a CUDA graph).
"""

import pytest
import torch
import torch.nn.functional as F

from usmkit.kernels.ctc import ctc_nll_triton
from usmkit.kernels.ctc.api import ctc_triton_bwd, ctc_triton_fwd
from usmkit.kernels.ctc.reference import ctc_nll_reference
from usmkit.models.ctc import ctc_loss

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Each case: tokens per utterance (padded with 0 to U), frames per utterance, T. Covers repeated tokens (which
# need a blank between them), an empty target, an utterance too short for its target (no alignment: inf, and 0
# with zero_infinity), utterances shorter than T, and the shortest alignment exactly.
CASE = (
    [[1, 2, 3, 4], [3, 3, 5, 1], [2], [1, 1, 1, 1], [4, 5], [], [5, 4, 3]],
    [9, 7, 3, 4, 1, 5, 3],
    9,
)


def _batch(tokens, lengths, T, V=6, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    B, U = len(tokens), max(len(t) for t in tokens)
    logits = torch.randn(T, B, V, generator=gen, dtype=dtype)
    padded = torch.zeros(B, U, dtype=torch.long)
    for b, t in enumerate(tokens):
        padded[b, : len(t)] = torch.tensor(t, dtype=torch.long)
    token_lens = torch.tensor([len(t) for t in tokens])
    return logits.log_softmax(-1), padded, torch.tensor(lengths), token_lens


def test_reference_matches_aten():
    lp, tokens, lengths, token_lens = _batch(*CASE)
    ref = ctc_nll_reference(lp, tokens, lengths, token_lens)
    aten = F.ctc_loss(lp, tokens, lengths, token_lens, reduction="none", zero_infinity=False)
    torch.testing.assert_close(ref, aten)
    assert torch.isinf(ref[4]) and torch.isinf(ref[3])  # 2 tokens in 1 frame; 1,1,1,1 needs 7 frames, has 4


def test_forward_matches_reference():
    lp, tokens, lengths, token_lens = _batch(*CASE)
    ref = ctc_nll_reference(lp, tokens, lengths, token_lens)
    nll, _ = ctc_triton_fwd(lp.float().to(DEVICE), tokens.to(DEVICE), lengths.to(DEVICE), token_lens.to(DEVICE), 0)
    torch.testing.assert_close(nll.cpu().double(), ref, rtol=1e-5, atol=1e-5)
    zeroed = ctc_nll_triton(lp.float().to(DEVICE), tokens.to(DEVICE), lengths.to(DEVICE), token_lens.to(DEVICE), 0)
    assert zeroed[3].item() == 0.0 and zeroed[4].item() == 0.0  # zero_infinity


def test_gradient_matches_reference():
    lp, tokens, lengths, token_lens = _batch(*CASE, seed=1)
    g = torch.randn(lp.shape[1], generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ref_lp = lp.clone().requires_grad_()
    ref = ctc_nll_reference(ref_lp, tokens, lengths, token_lens)
    (torch.where(torch.isinf(ref), 0.0, ref) * g).sum().backward()

    lp32 = lp.float().to(DEVICE).requires_grad_()
    out = ctc_nll_triton(lp32, tokens.to(DEVICE), lengths.to(DEVICE), token_lens.to(DEVICE), 0)
    (out * g.float().to(DEVICE)).sum().backward()
    torch.testing.assert_close(lp32.grad.cpu().double(), ref_lp.grad, rtol=1e-5, atol=1e-5)
    assert lp32.grad[:, 3:5].abs().sum() == 0  # no alignment: no gradient
    assert lp32.grad[5:, 6].abs().sum() == 0  # frames past the utterance


def test_ctc_loss_gradient_through_log_softmax_matches_aten():
    """The model's loss (log-softmax head, transposed (B, T, V) log-probs, -1 padding) on the Triton path gives
    aten's gradients with respect to the logits (aten differentiates as if its inputs were logits; both
    agree once the log-softmax backward is applied)."""
    lp, tokens, lengths, token_lens = _batch(*CASE, V=7, seed=3, dtype=torch.float32)
    logits = lp.transpose(0, 1).contiguous()  # (B, T, V)
    padded = torch.where(torch.arange(tokens.shape[1]) < token_lens[:, None], tokens, -1)

    def loss_and_grad(fn, device):
        x = logits.clone().to(device).requires_grad_()
        loss = fn(x.log_softmax(-1), lengths.to(device), padded.to(device), token_lens.to(device))
        loss.backward()
        return loss.detach().cpu(), x.grad.cpu()

    def triton_loss(log_probs, lengths, tokens, token_lens):
        nll = ctc_nll_triton(log_probs.transpose(0, 1), tokens.clamp(min=0), lengths, token_lens, 0)
        return nll.sum() / log_probs.shape[0]

    want = loss_and_grad(ctc_loss, "cpu")  # aten on the CPU
    got = loss_and_grad(triton_loss, DEVICE)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-5)


def test_custom_ops_opcheck():
    """Fake implementations, autograd registration and schema agree with the real kernels."""
    lp, tokens, lengths, token_lens = _batch([[1, 2], [3]], [4, 3], 4)
    args = (lp.float().to(DEVICE), tokens.to(DEVICE), lengths.to(DEVICE), token_lens.to(DEVICE))
    torch.library.opcheck(ctc_triton_fwd, (*args, 0), test_utils=("test_schema", "test_faketensor"))
    nll, alpha = ctc_triton_fwd(*args, 0)
    bwd_args = (torch.ones_like(nll), *args, nll, alpha, 0)
    torch.library.opcheck(ctc_triton_bwd, bwd_args, test_utils=("test_faketensor",))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_realistic_batch_matches_aten_cuda():
    """A training-sized batch (vocabulary 512, up to 120 tokens in 300 frames): the loss agrees with aten's CUDA
    CTC, and the gradient on the logits is as close to aten's in fp64 as aten's own fp32 gradient is (within 2x)."""
    gen = torch.Generator().manual_seed(0)
    B, T, V, U = 24, 300, 512, 120
    lengths = torch.randint(100, T + 1, (B,), generator=gen).cuda()
    token_lens = torch.minimum(torch.randint(1, U + 1, (B,), generator=gen), lengths.cpu() // 3).cuda()
    tokens = torch.randint(1, V, (B, U), generator=gen).cuda()
    logits = torch.randn(B, T, V, generator=gen, dtype=torch.float64).cuda()

    def aten(lp):
        return F.ctc_loss(lp, tokens, lengths, token_lens, reduction="none", zero_infinity=True)

    def loss_and_grad(fn, dtype):
        x = logits.detach().to(dtype).requires_grad_()  # a new leaf per call
        loss = fn(x.log_softmax(-1).transpose(0, 1))
        loss.sum().backward()
        return loss.detach().double(), x.grad.double()

    ref_loss, ref_grad = loss_and_grad(aten, torch.float64)
    aten_loss, aten_grad = loss_and_grad(aten, torch.float32)
    ours_loss, ours_grad = loss_and_grad(lambda lp: ctc_nll_triton(lp, tokens, lengths, token_lens, 0), torch.float32)
    torch.testing.assert_close(ours_loss, ref_loss, rtol=1e-5, atol=1e-3)
    assert (ours_grad - ref_grad).abs().max() <= 2 * (aten_grad - ref_grad).abs().max() + 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_captured_in_a_cuda_graph():
    """No host synchronization: forward and backward capture in a CUDA graph and replay with new values."""
    lp, tokens, lengths, token_lens = _batch(*CASE)
    static_lp = lp.float().cuda().requires_grad_()
    args = (tokens.cuda(), lengths.cuda(), token_lens.cuda(), 0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up (compiles the kernels) outside the capture
        ctc_nll_triton(static_lp, *args).sum().backward()
    torch.cuda.current_stream().wait_stream(stream)
    static_lp.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = ctc_nll_triton(static_lp, *args).sum()
        loss.backward()
    new, _, _, _ = _batch(*CASE, seed=5)
    with torch.no_grad():
        static_lp.copy_(new.float())
    graph.replay()
    ref = ctc_nll_reference(new, tokens, lengths, token_lens)
    torch.testing.assert_close(loss.cpu().double(), torch.where(torch.isinf(ref), 0.0, ref).sum(), rtol=1e-5, atol=1e-4)
