"""Compiled against eager: the CTC custom op, and the whole ASR model under fullgraph=True."""

import pytest
import torch
import torch.nn.functional as F

from usmkit.models.asr import AsrHeadConfig, AsrModel
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.ctc import ctc_loss
from usmkit.models.las import LASConfig
from usmkit.models.presets import tiny


def _ctc_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 20, 10, generator=g).requires_grad_()
    lengths = torch.tensor([20, 15, 4])  # the last one is too short for its 6 tokens: loss 0 (zero_infinity)
    tokens = torch.randint(1, 10, (3, 6), generator=g)
    tokens[1, 3:] = -1
    return x, lengths, tokens, torch.tensor([6, 3, 6])


def test_ctc_custom_op_matches_functional_ctc_loss():
    x, lengths, tokens, token_lens = _ctc_inputs()
    ours = ctc_loss(x.log_softmax(-1), lengths, tokens, token_lens)
    ref = (
        F.ctc_loss(
            x.log_softmax(-1).transpose(0, 1),
            tokens.clamp(min=0),
            lengths,
            token_lens,
            reduction="sum",
            zero_infinity=True,
        )
        / 3
    )
    (g_ours,) = torch.autograd.grad(ours, x)
    (g_ref,) = torch.autograd.grad(ref, x)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(g_ours, g_ref)
    assert torch.isfinite(ours)


def test_ctc_custom_op_passes_opcheck():
    x, lengths, tokens, token_lens = _ctc_inputs()
    lp = x.detach().log_softmax(-1).transpose(0, 1).contiguous().requires_grad_()
    torch.library.opcheck(torch.ops.usmkit.ctc_nll.default, (lp, tokens.clamp(min=0), lengths, token_lens))


def test_ctc_loss_compiles_with_dynamic_shapes():
    """dynamic=True: the backward op's fake kernel must promise the strides the real kernel returns.

    log_probs reach the op as a transposed (T, B, V) view; the CPU kernel's gradient is contiguous.
    A fake kernel promising the view's strides made inductor's stride assertion fail here.
    """

    def loss_fn(x, lengths, tokens, token_lens):
        return ctc_loss(x.log_softmax(-1), lengths, tokens, token_lens)

    compiled = torch.compile(loss_fn, dynamic=True)
    # A cached compiled graph from before a fix would hide (or fake) the failure: compile afresh.
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        for B, T in [(3, 20), (4, 26)]:  # two shapes, one graph
            x, lengths, tokens, token_lens = _ctc_inputs()
            x = torch.randn(B, T, 10, generator=torch.Generator().manual_seed(T)).requires_grad_()
            lengths = torch.full((B,), T)
            tokens, token_lens = tokens[:1].expand(B, -1).contiguous(), torch.full((B,), 6)
            (g_compiled,) = torch.autograd.grad(compiled(x, lengths, tokens, token_lens), x)
            (g_eager,) = torch.autograd.grad(loss_fn(x, lengths, tokens, token_lens), x)
            torch.testing.assert_close(g_compiled, g_eager)


def _model(las: bool) -> AsrModel:
    torch.manual_seed(0)
    enc = ConformerEncoder(
        tiny(d_model=64, num_layers=2, num_heads=2, dropout=0.0, chunk_size=8, left_chunks=1, zero_init_residual=False)
    )
    head = (
        AsrHeadConfig(ctc_weight=0.3, las=LASConfig(num_layers=1, num_heads=2, dropout=0.0)) if las else AsrHeadConfig()
    )
    return AsrModel(enc, vocab_size=40, cfg=head)


def _batch(B, T, U, seed):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(B, T, 80, generator=g)
    lens = torch.randint(T // 2, T + 1, (B,), generator=g)
    lens[0] = T
    tokens = torch.randint(4, 40, (B, U), generator=g)
    token_lens = torch.randint(1, U + 1, (B,), generator=g)
    tokens[torch.arange(U)[None, :] >= token_lens[:, None]] = -1
    return feats, lens, tokens, token_lens


@pytest.mark.parametrize(
    "las", [pytest.param(False, id="ctc"), pytest.param(True, id="ctc+las", marks=pytest.mark.slow)]
)
def test_whole_model_compiles_fullgraph_without_recompiling(las):
    """No graph break (fullgraph=True) and one graph for three batch shapes (dynamic shapes)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = _model(las)
    compiled = torch.compile(model.losses, fullgraph=True, dynamic=True, backend="aot_eager")
    for B, T, U, seed in ((3, 64, 5, 0), (2, 96, 7, 1), (4, 80, 4, 2)):
        batch = _batch(B, T, U, seed)
        model.zero_grad()
        eager = model.losses(*batch)
        eager["loss"].backward()
        g_eager = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        comp = compiled(*batch)
        comp["loss"].backward()
        for k in eager:
            torch.testing.assert_close(comp[k], eager[k], rtol=1e-4, atol=1e-4)
        for a, b in zip([p.grad for p in model.parameters()], g_eager, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


@pytest.mark.gpu
def test_ctc_loss_never_syncs_with_the_host_on_cuda():
    """On CUDA the CTC loss (our Triton kernels, usmkit.kernels.ctc) reads the lengths on the device:
    no synchronization with the host, forward or backward, at any batch size."""
    import warnings

    def syncs(B):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(B, 40, 10, generator=g).cuda().requires_grad_()
        lengths = torch.full((B,), 40).cuda()
        tokens = torch.randint(1, 10, (B, 6), generator=g).cuda()
        token_lens = torch.full((B,), 6).cuda()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                ctc_loss(x.log_softmax(-1), lengths, tokens, token_lens).backward()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchronizing" in str(w.message) for w in caught)

    syncs(4)  # the first CUDA call's one-time syncs (lazy initialisation) are not the CTC op's
    assert syncs(4) == 0 and syncs(64) == 0


@pytest.mark.gpu
def test_whole_model_replays_as_cuda_graphs_like_the_default_compiled_model():
    """mode="reduce-overhead" (trainer.compile_mode): over two batch shapes, each seen twice (a recording,
    then replays), no part of the step is left out of the CUDA graphs, and losses and gradients equal those of the same model compiled without CUDA graphs
    (the same kernels), and eager's within GPU rounding."""
    from torch._dynamo.utils import counters

    def run(step_fn, batch):
        model.zero_grad()
        torch.compiler.cudagraph_mark_step_begin()
        out = step_fn(*batch)
        out["loss"].backward()
        return {k: v.detach().clone() for k, v in out.items()}, [p.grad.clone() for p in model.parameters()]

    torch._dynamo.reset()
    counters.clear()
    model = _model(las=True).cuda()
    plain = torch.compile(model.losses, dynamic=False)
    graphed = torch.compile(model.losses, dynamic=False, mode="reduce-overhead")
    for B, T, U, seed in ((3, 64, 5, 0), (3, 64, 5, 1), (3, 64, 5, 2), (2, 96, 7, 3), (2, 96, 7, 4)):
        batch = [t.cuda() for t in _batch(B, T, U, seed)]
        out_eager, g_eager = run(model.losses, batch)
        out_plain, g_plain = run(plain, batch)
        out_graph, g_graph = run(graphed, batch)
        for k in out_eager:
            torch.testing.assert_close(out_graph[k], out_plain[k], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(out_graph[k], out_eager[k], rtol=1e-3, atol=1e-4)
        for a, b, c in zip(g_graph, g_plain, g_eager, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(a, c, rtol=1e-2, atol=1e-4)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])


def _packed_batch(lengths, seed):
    """Utterances of ``lengths`` frames packed into 3 rows of 256 frames (always the same shape)."""
    from usmkit.data.packing import RowPacker

    feats, lens, tokens, token_lens = _batch(len(lengths), max(lengths), 4, seed)
    lens = torch.tensor(lengths)
    order, packed, lens, packing = RowPacker(3, 256, 4).pack(feats, lens, lengths)
    return packed, lens, tokens[order], token_lens[order], packing


def test_packed_model_compiles_fullgraph_without_recompiling():
    """Packed batches (``data.pack_to_frames``): no graph break, and one graph for batches of other
    numbers of utterances in the same rows (the utterance and token axes dynamic, as the trainer marks them)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = _model(las=False)
    compiled = torch.compile(model.losses, fullgraph=True, backend="aot_eager")
    for lengths, seed in (([100, 60, 90, 40, 120], 0), ([70, 50, 30, 110, 64, 80], 1), ([128, 127, 20, 33], 2)):
        batch = _packed_batch(lengths, seed)
        for t, dim in (
            (batch[1], 0),
            (batch[2], 0),
            (batch[2], 1),
            (batch[3], 0),
            (batch[4].rows, 0),
            (batch[4].offsets, 0),
        ):
            torch._dynamo.maybe_mark_dynamic(t, dim)
        model.zero_grad()
        eager = model.losses(*batch)
        eager["loss"].backward()
        g_eager = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        comp = compiled(*batch)
        comp["loss"].backward()
        torch.testing.assert_close(comp["loss"], eager["loss"], rtol=1e-4, atol=1e-4)
        for a, b in zip([p.grad for p in model.parameters()], g_eager, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
