"""The synthetic training step that the step benchmarks and studies share: our CTC model and torchaudio's
Conformer of the same size, a fixed batch, one step as a closure, and its timing.

Used by ``bench/train_throughput.py``, ``bench/ddp_scaling.py``, ``bench/profile_step.py`` and
``experiments/inductor_bandwidth/``. One step = forward, CTC loss, backward and an AdamW update, bf16
autocast with fp32 weights on a GPU (fp32 on a CPU, where it only checks the plumbing).

Shapes: B utterances of T encoder frames, from the feature frames (10 ms, 80 bins) that give exactly T:
``4 T + 3`` through the 4x conv front end (40 ms frames), ``2 T`` through w2v-BERT 2.0's 2x frame stacking
(20 ms frames).
"""

from __future__ import annotations

import statistics
import time

import torch

from usmkit.models.conformer import ConformerEncoder
from usmkit.models.ctc import CTCHead, ctc_loss
from usmkit.models.presets import preset
from usmkit.models.subsampling import Conv2dSubsampling, output_lengths

SHAPES = {  # size -> (B, T encoder frames); the reference shapes
    "tiny": (2, 64),  # a CPU check of the plumbing
    "base": (32, 512),
    "large": (16, 768),
    "usm600m": (10, 768),  # 300 s of audio, the trainer's batch
    "w2v_bert_2": (10, 1536),  # the same 300 s at w2v-BERT 2.0's 20 ms frames (an imported encoder's size)
}
FEATURE_S = 0.01  # one feature frame
DATASHEET_BF16 = 989e12
VOCAB = 512


class OursCTC(torch.nn.Module):
    def __init__(self, size: str, impl: str, chunk: int | None, conv_impl: str = "torch"):
        super().__init__()
        cfg = preset(size, attention_impl=impl, chunk_size=chunk, left_chunks=0, dropout=0.0, conv_impl=conv_impl)
        self.encoder = ConformerEncoder(cfg)
        self.head = CTCHead(self.encoder.output_dim, VOCAB)

    def forward(self, feats, lens, tokens, token_lens):
        enc, enc_lens = self.encoder(feats, lens)
        return ctc_loss(self.head(enc), enc_lens, tokens, token_lens)


class TorchaudioCTC(torch.nn.Module):
    """torchaudio.models.Conformer between the same conv subsampling and CTC head as ours."""

    def __init__(self, size: str):
        super().__init__()
        import torchaudio

        cfg = preset(size)
        self.subsampling = Conv2dSubsampling(cfg.input_dim, cfg.conv_channels, cfg.d_model, 0.0)
        self.conformer = torchaudio.models.Conformer(
            input_dim=cfg.d_model,
            num_heads=cfg.num_heads,
            ffn_dim=cfg.ff_mult * cfg.d_model,
            num_layers=cfg.num_layers,
            depthwise_conv_kernel_size=cfg.conv_kernel,
            dropout=0.0,
        )
        self.head = CTCHead(cfg.d_model, VOCAB)

    def forward(self, feats, lens, tokens, token_lens):
        x, x_lens = self.subsampling(feats, lens)
        x, x_lens = self.conformer(x, x_lens)
        return ctc_loss(self.head(x), x_lens, tokens, token_lens)


def bf16_residual(model: OursCTC) -> None:
    """Make each block return its LayerNorm's output in bf16 (autocast gives fp32), for ``_bf16res``."""
    for block in model.encoder.blocks:
        norm = block.norm
        block.norm = torch.nn.Sequential(norm, _ToBF16())


class _ToBF16(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16)


def feature_frames(size: str, T: int) -> int:
    """The feature frames that give exactly ``T`` encoder frames through preset ``size``'s front end."""
    cfg = preset(size)
    n_feat = cfg.subsampling_factor * T if cfg.front_end == "stack" else 4 * T + 3
    assert int(output_lengths(torch.tensor([n_feat]), cfg.subsampling_factor, cfg.front_end)[0]) == T
    return n_feat


def make_batch(B: int, T: int, device, seed=0, size: str = "base"):
    """B utterances of ``T`` encoder frames of preset ``size`` (features, lengths, tokens, token lengths)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    n_feat = feature_frames(size, T)
    feats = torch.randn(B, n_feat, 80, generator=g)
    lens = torch.full((B,), n_feat, dtype=torch.long)
    U = T // 4
    tokens = torch.randint(4, VOCAB, (B, U), generator=g)
    token_lens = torch.full((B,), U, dtype=torch.long)
    return [t.to(device) for t in (feats, lens, tokens, token_lens)]


def measure_peak(device) -> float:
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * 8192**3 / statistics.median(times)


def compile_regions(model: torch.nn.Module, dynamic: bool, mode: str | None = None, whole: bool = False) -> None:
    if whole:
        model.compile(dynamic=dynamic, mode=mode)
        return
    if isinstance(model, OursCTC):
        regions = [model.encoder.subsampling, *model.encoder.blocks, model.head]
    else:
        regions = [model.subsampling, *model.conformer.conformer_layers, model.head]
    for r in regions:
        r.compile(dynamic=dynamic, mode=mode)


def make_step(model, batch, params=None):
    """One training step as a closure: zero grads, bf16-autocast forward (CTC loss), backward, fused AdamW
    (fp32 without autocast when ``batch`` is on the CPU).

    ``model`` may be a DDP wrapper; ``params`` are then the wrapped module's parameters.
    """
    opt = torch.optim.AdamW(model.parameters() if params is None else params, lr=1e-4, fused=True)

    device = batch[0].device.type  # bf16 autocast on a GPU; fp32 on a CPU

    def step():
        torch.compiler.cudagraph_mark_step_begin()  # a new step for CUDA-graph replays; a no-op otherwise
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(*batch)
        loss.backward()
        opt.step()
        return loss.detach().clone()  # a CUDA graph's output is overwritten by the next replay

    return step


def timed(step, n: int, before=None) -> list[float]:
    """GPU milliseconds of ``n`` calls of ``step`` (CUDA events, synchronized each time); ``before`` runs first
    each time. Without CUDA: wall milliseconds of each call."""
    times = []
    for _ in range(n):
        if before is not None:
            before()
        if not torch.cuda.is_available():
            start = time.perf_counter()
            step()
            times.append((time.perf_counter() - start) * 1e3)
            continue
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        step()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return times
