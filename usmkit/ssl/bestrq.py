"""BEST-RQ self-supervised pre-training (stage 1): predict frozen random-projection codes of masked audio.

Shapes: B batch, T feature frames (10 ms), F feature bins, S stacked frames (the encoder's subsampling
factor: 4, or 8), T2 = T // S target frames, T' encoder frames (~T / S), D encoder dim, N codebooks,
K codebook size, M masked encoder frames in the batch.

One step (``BestRQModel.forward``):

1. targets: ``RandomProjectionQuantizer`` on the *unmasked* features -> codes (B, T2, N);
2. masking: spans of ``mask_span_ms`` start at each valid frame with probability ``mask_prob``;
   masked frames are replaced by N(0, ``noise_std``) noise (``usmkit.ssl.masking``);
3. the encoder reads the masked features; encoder frame t is "masked" when any of the S input frames
   of target t is masked;
4. N softmax heads (one ``Linear(D, N * K)``) predict the codes at the masked frames only; the loss is
   the cross-entropy averaged over masked frames and codebooks.

Packed batches (``Batch.packing``): the encoder runs on the packed rows (``ConformerEncoder.encode_packed``);
targets stack S feature frames of one utterance (utterances start at multiples of S), spans are drawn and
clipped per utterance (``mask_packed_spans``), and a frame counts where it is valid for its own utterance,
so each utterance adds what it adds alone in a row.

The quantizer is stored as persistent buffers (``quantizer.*`` in the state dict) and the heads as
``heads.*``; only ``encoder.*`` is meant to be carried to later stages (``init_from`` loads that
prefix), so neither leaks into fine-tuning.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from usmkit.data.batch import Batch
from usmkit.data.packing import Packing
from usmkit.kernels.masks import Segments
from usmkit.models.output import StepOutput
from usmkit.models.packing import feature_segments
from usmkit.ssl.bestrq_config import BestRQConfig, check_stack_frames
from usmkit.ssl.masking import mask_packed_spans, mask_spans, valid_mask
from usmkit.ssl.quantizer import RandomProjectionQuantizer

__all__ = ["BestRQConfig", "BestRQModel", "RandomProjectionQuantizer", "mask_spans", "code_perplexity"]

_EVAL_MASK_SEED_OFFSET = 1  # eval masks use seed + 1: a stream of their own, apart from the quantizer's


def code_perplexity(codes: torch.Tensor, weights: torch.Tensor, codebook_size: int) -> torch.Tensor:
    """Per-codebook perplexity ``exp(entropy)`` of the code-usage histogram.

    codes (..., N) int64, weights (...) float (1 = counted, 0 = ignored) -> (N,). It is K when every
    code is used equally and 1 when one code takes everything (collapse); 1 also when nothing is counted.
    Histogram by ``index_add_`` into a fixed (N * K) vector (no data-dependent shapes).
    """
    N = codes.shape[-1]
    offsets = torch.arange(N, device=codes.device) * codebook_size  # (N,)
    flat = (codes + offsets).reshape(-1)  # (... * N,)
    w = weights.to(torch.float32).unsqueeze(-1).expand(codes.shape).reshape(-1)  # (... * N,)
    hist = torch.zeros(N * codebook_size, device=codes.device).index_add_(0, flat, w)
    hist = hist.view(N, codebook_size)  # (N, K)
    p = hist / hist.sum(dim=-1, keepdim=True).clamp(min=1.0)
    entropy = -torch.special.xlogy(p, p).sum(dim=-1)  # (N,), 0 * log 0 = 0
    return entropy.exp()


class BestRQModel(nn.Module):
    """Encoder + frozen quantizer + N softmax heads; ``forward(batch) -> StepOutput``.

    ``encoder``: ``forward(features (B, T, F), lengths (B,)) -> (enc (B, T', D), enc_lens (B,))`` with
    an ``output_dim`` property (``ConformerEncoder``); T' may be shorter than T // S by a frame or so,
    the two are aligned on their common prefix.

    Logits are computed only at the M masked encoder frames (gathered first): with the defaults
    (N * K = 131072 outputs) a dense (B, T', N * K) tensor would not fit. The gather has a
    data-dependent size M, which ``torch.compile`` handles as a dynamic shape (or a graph break);
    ``forward`` has no data-dependent Python branch.

    Every non-empty utterance gets at least one span (``cfg.min_one_span``); a batch that still has no
    masked encoder frame (``min_one_span=False``, or utterances too short for the encoder) gives loss 0
    with zero gradients, not NaN: the mean over masked frames divides by ``max(M, 1)``.

    In eval mode the masks and noise come from a generator of the module's own, restarted from
    ``cfg.seed + 1`` at every switch between train and eval mode: one dev pass draws different masks
    for its batches, every dev pass draws the same ones (the dev loss is comparable across evaluations),
    and evaluation takes nothing from the global RNG (which resume restores).
    """

    def __init__(
        self, encoder: nn.Module | None, cfg: BestRQConfig, input_dim: int, encoder_dim: int | None = None
    ) -> None:
        super().__init__()
        if not isinstance(cfg, BestRQConfig):
            raise TypeError(f"BestRQModel needs a BestRQConfig, got {type(cfg).__name__}")
        if (encoder is None) == (encoder_dim is None):
            raise ValueError("BestRQModel takes an encoder, or encoder=None and its encoder_dim (the objective alone)")
        factor = getattr(encoder, "subsampling_factor", None)  # ConformerEncoder's; None: not known
        if factor is not None:
            check_stack_frames(cfg, factor)
        self.cfg = cfg
        # encoder=None: the objective alone (quantizer, masking, heads) for a model that owns the encoder
        # and passes it to ``masked_prediction`` (MOST, usmkit/ssl/most.py); its state has no encoder.*.
        self.encoder = encoder
        self.quantizer = RandomProjectionQuantizer(input_dim, cfg)
        dim = encoder.output_dim if encoder is not None else encoder_dim
        self.heads = nn.Linear(dim, cfg.num_codebooks * cfg.codebook_size)
        self._eval_generator: torch.Generator | None = None

    def train(self, mode: bool = True) -> BestRQModel:
        self._eval_generator = None  # the next eval pass restarts its masks from cfg.seed + 1
        return super().train(mode)

    def _mask_generator(self, device: torch.device) -> torch.Generator | None:
        """None (the global RNG) in training; the module's eval-pass generator in eval mode."""
        if self.training:
            return None
        if self._eval_generator is None or self._eval_generator.device != device:
            self._eval_generator = torch.Generator(device=device).manual_seed(self.cfg.seed + _EVAL_MASK_SEED_OFFSET)
        return self._eval_generator

    def mask_features(
        self,
        features: torch.Tensor,
        lengths: torch.Tensor,
        generator: torch.Generator | None = None,
        packing: Packing | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """features (B, T, F), lengths (B,) -> (masked features (B, T, F), mask (B, T) bool); packed rows
        (``packing``): features (R, N, F), lengths (U,) per utterance.

        Masked valid frames are replaced by N(0, noise_std) noise; padding stays as it was.
        """
        if packing is None:
            mask = mask_spans(lengths, features.shape[1], self.cfg, generator)  # (B, T)
        else:
            seg = feature_segments(packing)  # (R, N)
            mask = mask_packed_spans(
                seg.ids, seg.positions, packing.rows, packing.offsets, lengths, self.cfg, generator
            )  # (R, N)
        noise = torch.randn(features.shape, generator=generator, device=features.device, dtype=features.dtype)
        return torch.where(mask.unsqueeze(-1), noise * self.cfg.noise_std, features), mask

    def health_check(self, scalars: dict[str, float], step: int, warmup_steps: int) -> str | None:
        """A warning when the heads have collapsed, else None (the trainer asks after each log line).

        Collapse: after warm-up, each head predicts about one code (prediction perplexity < 2) while
        the targets use many, as many large codebooks on a small encoder with a short warm-up do
        (``experiments/bestrq_study``).
        """
        pred = scalars.get("train/pred_perplexity_mean")
        target = scalars.get("train/perplexity_mean")
        if pred is None or target is None or step <= 2 * max(warmup_steps, 1):
            return None
        if pred < 2.0 and target > 10.0:
            return (
                f"BEST-RQ heads look collapsed at step {step}: prediction perplexity {pred:.2f} against "
                f"{target:.0f} in the targets (each head predicts about one code). Lower optim.lr, raise "
                "optim.warmup_steps, or use fewer codebooks (task.bestrq.num_codebooks)."
            )
        return None

    def forward(self, batch: Batch) -> StepOutput:
        packing = batch.packing
        if packing is None:
            return self.masked_prediction(batch.features, batch.feature_lens, self.encoder)

        def encode_rows(features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, Segments]:
            x, segments, _ = self.encoder.encode_packed(features, lengths, packing)
            return x, segments

        return self.masked_prediction(batch.features, batch.feature_lens, encode_rows, packing)

    def masked_prediction(
        self,
        features: torch.Tensor,
        lengths: torch.Tensor,
        encoder: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | Segments]],
        packing: Packing | None = None,
    ) -> StepOutput:
        """The BEST-RQ loss and metrics of ``encoder`` on features (B, T, F) with (B,) valid frames.

        ``packing``: features are packed rows (R, N, F), lengths (U,) per utterance, and ``encoder`` returns
        the packed encoder frames (R, T', D) with their ``Segments`` instead of (B,) valid lengths.
        """
        generator = self._mask_generator(features.device)
        masked_features, mask = self.mask_features(features, lengths, generator, packing)  # (B, T, F), (B, T)
        return self.predict_masked(features, masked_features, mask, lengths, encoder, packing)

    def predict_masked(
        self,
        features: torch.Tensor,
        masked_features: torch.Tensor,
        mask: torch.Tensor,
        lengths: torch.Tensor,
        encoder: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | Segments]],
        packing: Packing | None = None,
    ) -> StepOutput:
        """``masked_prediction`` from a drawn ``mask`` (B, T) and the ``masked_features`` it gave."""
        cfg = self.cfg
        N, K, S = cfg.num_codebooks, cfg.codebook_size, cfg.stack_frames
        B, T, _ = features.shape

        codes, target_lens = self.quantizer.targets(features, lengths)  # (B, T2, N), (B,) or (U,)
        enc, frames = encoder(masked_features, lengths)  # (B, T', D); (B,) valid frames, or Segments (B, T')

        T2 = T // S
        Tc = min(enc.shape[1], T2)  # common prefix of encoder and target frames (static ints)
        frame_masked = mask[:, : T2 * S].reshape(B, T2, S).any(dim=-1)[:, :Tc]  # (B, Tc)
        if isinstance(frames, Segments):  # encoder frame p of an utterance predicts its target p
            ids = frames.ids[:, :Tc]  # (B, Tc)
            frame_valid = (ids >= 0) & (frames.positions[:, :Tc] < target_lens[ids.clamp(min=0)])
        else:
            frame_valid = valid_mask(torch.minimum(frames, target_lens), Tc)  # (B, Tc)
        selected = frame_masked & frame_valid  # (B, Tc)
        codes = codes[:, :Tc]  # (B, Tc, N)

        hidden = enc[:, :Tc][selected]  # (M, D)
        targets = codes[selected]  # (M, N)
        logits = self.heads(hidden).view(-1, N, K).float()  # (M, N, K)
        ce = F.cross_entropy(logits.reshape(-1, K), targets.reshape(-1), reduction="none").view(-1, N)  # (M, N)
        num_masked = selected.sum().clamp(min=1).to(torch.float32)
        loss = ce.sum() / (num_masked * N)

        with torch.no_grad():
            predictions = logits.argmax(dim=-1)  # (M, N)
            acc = (predictions == targets).to(torch.float32).sum(dim=0) / num_masked  # (N,)
            target_ppl = code_perplexity(codes, frame_valid, K)  # (N,)
            pred_ppl = code_perplexity(predictions, torch.ones(predictions.shape[0], device=features.device), K)
            input_frames = lengths.sum() if packing is not None else valid_mask(lengths, T).sum()
            mask_frac = mask.sum().to(torch.float32) / input_frames.clamp(min=1).to(torch.float32)
        metrics = {"loss": loss.detach(), "acc_mean": acc.mean(), "perplexity_mean": target_ppl.mean()}
        metrics |= {f"acc_cb{i}": acc[i] for i in range(N)}
        metrics |= {f"perplexity_cb{i}": target_ppl[i] for i in range(N)}
        metrics |= {"pred_perplexity_mean": pred_ppl.mean(), "mask_frac": mask_frac}
        return StepOutput(loss=loss, metrics=metrics)
