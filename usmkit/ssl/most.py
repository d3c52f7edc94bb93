"""MOST (stage 2): multi-objective supervised pre-training with text injection, after Maestro / USM.

Shapes: B batch, T feature frames, F feature bins, T' encoder frames (40 ms), D model dim, U tokens,
V vocabulary (0 = blank), k the block where text enters, L the encoder's blocks.

One shared Conformer encoder, split at block k (``ConformerEncoder.front_end`` / ``run_blocks``):

    speech: features -> front end -> blocks 0..k-1 -> h_k (B, T', D) -> blocks k..L-1 -> CTC head
    text:   tokens -> TextEncoder (embedding, duration model, upsampler) ---^  (replaces h_k)

Where text enters, and why: at the input of block k, a third of the way up by default. The blocks
below k stay speech-only (the acoustic front: noise, speaker, channel, which text has none of), as in
Maestro, whose text encoder joins the speech encoder's upper layers; every block from k up is shared,
so what text-only data teaches them (words the paired speech never says) serves speech as well.
k = 0 shares every block; a larger k leaves fewer shared blocks to learn from text.

Losses, each ``weight * term``; a weight of 0 skips its term (not computed), and a stream that no
active loss reads is not even loaded (``MostConfig.active_streams``):

- ``bestrq``: BEST-RQ on the unlabeled audio (``BestRQModel.masked_prediction`` on the whole encoder).
- ``ctc``: CTC of the paired transcripts on the paired speech.
- ``duration``: MSE between predicted and aligned log durations of the paired tokens.
- ``consistency``: MSE between the text encoder's frames (paired tokens upsampled by their aligned
  durations) and h_k, at every valid frame of the aligned utterances: 0 when the two agree.
- ``text``: text-only sentences upsampled by their *predicted* durations, frames masked (spans
  replaced by a learned vector), through blocks k.. and the CTC head: CTC against their own tokens.
  Starts after ``text_warmup_steps``. With ``text_detach_encoder`` its gradient stops at the text
  encoder's frames: the text encoder then learns only from ``duration`` and ``consistency``. With
  ``text_noise`` the frames get Gaussian noise scaled to the spread of speech around text (per
  dimension, over the step's aligned paired frames).

Alignments: ``usmkit.ssl.alignment`` (forced alignment on the CTC posteriors of this model, or of the
frozen ``align_from`` checkpoint). The module's state has ``encoder.*`` (what stage 3 loads with
``init_from``), ``ctc.*`` (named as in ``AsrModel``, so ``usmkit.cli.evaluate`` decodes a stage-2
checkpoint too), ``text_encoder.*``, ``text_mask`` and ``bestrq.*`` (quantizer buffers and heads).
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch import nn

from usmkit.data.batch import Batch
from usmkit.data.mixer import MostBatch
from usmkit.data.text_only import TextBatch
from usmkit.models.conformer import ConformerEncoder
from usmkit.models.ctc import CTCHead, ctc_loss
from usmkit.models.output import StepOutput
from usmkit.models.subsampling import conv_out_size
from usmkit.ssl.alignment import forced_durations
from usmkit.ssl.bestrq import BestRQConfig, BestRQModel
from usmkit.ssl.duration import durations_from_log, log_duration_errors
from usmkit.ssl.masking import expand_spans, sample_span_starts, valid_mask
from usmkit.ssl.most_config import LOSSES, MostConfig
from usmkit.ssl.text_encoder import TextEncoder

log = logging.getLogger(__name__)


def _frame_variance(x: torch.Tensor, weight: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Per-dimension variance (D,) of x (B, T, D) over the frames where weight (B, T) is 1; n their number."""
    w = weight[:, :, None]
    mean = (x * w).sum((0, 1)) / n  # (D,)
    return ((x - mean).pow(2) * w).sum((0, 1)) / n


class MostModel(nn.Module):
    """The shared encoder, its CTC head, the text encoder and the BEST-RQ objective; ``forward(batch) -> StepOutput``.

    ``forward`` takes a ``MostBatch`` (training) or a plain paired ``Batch`` (dev evaluation: the paired
    losses with every warm-up over). ``usmkit.decoding.modes`` decodes with ``encode`` and the CTC head, as it
    does an ``AsrModel``'s.
    """

    las = None  # no attention decoder (what decoding asks of a model before a mode that reads one)

    def __init__(
        self, encoder: ConformerEncoder, vocab_size: int, cfg: MostConfig, bestrq: BestRQConfig, input_dim: int
    ) -> None:
        super().__init__()
        if vocab_size < 5:
            raise ValueError(f"vocab_size={vocab_size} leaves no room for tokens after blank, <unk>, <s>, </s>")
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.text_layer = cfg.resolve_text_layer(len(encoder.blocks))
        D = encoder.output_dim
        self.encoder = encoder
        self.ctc = CTCHead(D, vocab_size)
        self.text_encoder = TextEncoder(
            vocab_size, encoder.cfg, cfg.text_token_blocks, cfg.text_frame_blocks, cfg.max_token_frames
        )
        self.text_mask = nn.Parameter(torch.zeros(D))  # what masked text frames are replaced by
        self.bestrq = BestRQModel(None, bestrq, input_dim, encoder_dim=D)
        self._aligner: list[nn.Module] = []  # the frozen align_from model (set_aligner); not in the state

    # ---------------------------------------------------------------- helpers
    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features (B, T, F), lengths (B,) -> enc (B, T', D), enc_lens (B,) (the whole speech encoder)."""
        return self.encoder(features, lengths)

    def health_check(self, scalars: dict[str, float], step: int, warmup_steps: int) -> str | None:
        """BEST-RQ's collapse warning (its metrics are logged under ``bestrq_``)."""
        renamed = {
            f"train/{k}": scalars[f"train/bestrq_{k}"]
            for k in ("perplexity_mean", "pred_perplexity_mean")
            if f"train/bestrq_{k}" in scalars
        }
        return self.bestrq.health_check(renamed, step, warmup_steps)

    def _pad_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, U) padded with -1 -> (B, U'), U' the next multiple of ``pad_text_to`` / the subsampling
        factor (U' = U without ``pad_text_to``)."""
        multiple = max(1, self.cfg.pad_text_to // self.encoder.subsampling_factor) if self.cfg.pad_text_to else 1
        extra = -tokens.shape[1] % multiple
        return nn.functional.pad(tokens, (0, extra), value=-1) if extra else tokens

    def _text_frames(self, longest: int) -> int:
        """The padded length of text-only frames whose longest row has ``longest``: the encoder length of
        audio padded to the smallest multiple of ``pad_text_to`` feature frames that holds it."""
        step, factor = self.cfg.pad_text_to, self.encoder.subsampling_factor
        n = max(1, -(-longest * factor // step))
        while conv_out_size(n * step, factor) < longest:
            n += 1
        return conv_out_size(n * step, factor)

    def set_aligner(self, aligner: nn.Module) -> None:
        """The frozen CTC model (``encode`` and ``ctc``) that aligns the paired data when
        ``cfg.align_from`` is set (``usmkit.runs.load_aligner`` builds it). It is not part of the state."""
        self._aligner[:] = [aligner]

    def _aligner_log_probs(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """CTC log-posteriors (B, T', V) and lengths (B,) of the frozen ``align_from`` model."""
        if not self._aligner:
            raise RuntimeError(
                f"task.most.align_from={self.cfg.align_from} but no aligner was given: call set_aligner with "
                "usmkit.runs.load_aligner(align_from, device)"
            )
        aligner = self._aligner[0]
        if aligner.training:
            aligner.eval()
        with torch.no_grad():
            enc, enc_lens = aligner.encode(features, lengths)
            return aligner.ctc(enc), enc_lens

    def init_heads_from(self, weights: dict[str, torch.Tensor]) -> list[str]:
        """Load what fits of another stage's heads from its weights: stage 1's BEST-RQ quantizer and
        heads (``quantizer.*``, ``heads.*`` -> ``bestrq.*``), a MOST run's text encoder. Tensors whose
        shapes differ (other codebooks) are left as they are. Returns the keys loaded. The CTC head is
        not among them: its token ids mean something only with its run's tokenizer, which
        ``usmkit.training.recipe.init_ctc_head`` checks for every task."""
        own = self.state_dict()
        renamed = {}
        for key, value in weights.items():
            if key.startswith(("quantizer.", "heads.")):
                renamed[f"bestrq.{key}"] = value
            elif key.startswith(("bestrq.", "text_encoder.")) or key == "text_mask":
                renamed[key] = value
        fitting = {k: v for k, v in renamed.items() if k in own and own[k].shape == v.shape}
        self.load_state_dict(fitting, strict=False)
        return sorted(fitting)

    # ---------------------------------------------------------------- the losses
    def forward(self, batch: MostBatch | Batch) -> StepOutput:
        dev = isinstance(batch, Batch)
        if dev:
            batch = MostBatch(paired=batch)
        step = None if dev else batch.step  # None: every warm-up is over
        cfg = self.cfg
        terms: dict[str, torch.Tensor] = {}
        metrics: dict[str, torch.Tensor] = {}
        if cfg.bestrq_weight > 0 and batch.unlabeled is not None:
            out = self.bestrq.masked_prediction(batch.unlabeled.features, batch.unlabeled.feature_lens, self.encoder)
            terms["bestrq"] = out.loss
            for k in ("acc_mean", "perplexity_mean", "pred_perplexity_mean", "mask_frac"):
                metrics[f"bestrq_{k}"] = out.metrics[k]
        residual_std = None  # (D,) speech minus text on this step's aligned frames, once there are some
        if batch.paired is not None:
            align_on = cfg.needs_alignment and (step is None or step >= cfg.align_warmup_steps)
            residual_std = self._paired_losses(batch.paired, align_on, terms, metrics)
        text_on = step is None or step >= cfg.text_warmup_steps
        if cfg.text_weight > 0 and batch.text is not None and text_on:
            terms["text"], metrics["text_mask_frac"] = self._text_loss(batch.text, residual_std)

        device = next(self.parameters()).device
        loss = torch.zeros((), device=device)
        for name in LOSSES:
            on = name in terms
            weight = cfg.weight(name) if on else 0.0
            metrics[f"weight_{name}"] = torch.tensor(weight, device=device)
            if on:
                metrics[f"loss_{name}"] = terms[name].detach()
                loss = loss + weight * terms[name]
        metrics["loss"] = loss.detach()
        if self.training and dist.is_available() and dist.is_initialized():
            # DDP reduces every parameter's gradient each step: the parameters of a term that is off in
            # this step (warm-up, a missing stream) join the graph with a zero gradient.
            loss = loss + sum(p.view(-1)[0] for p in self.parameters() if p.requires_grad) * 0.0
        return StepOutput(loss=loss, metrics=metrics)

    def _paired_losses(
        self, batch: Batch, align_on: bool, terms: dict[str, torch.Tensor], metrics: dict[str, torch.Tensor]
    ) -> torch.Tensor | None:
        """CTC, duration and consistency terms of a paired batch, into ``terms`` / ``metrics``; returns the
        per-dimension standard deviation (D,) of speech minus text at the aligned frames when
        ``text_noise`` needs it, else None."""
        cfg, k = self.cfg, self.text_layer
        own_alignment = align_on and cfg.align_from is None
        x, lengths = self.encoder.front_end(batch.features, batch.feature_lens)  # (B, T', D), (B,)
        h_k, _ = self.encoder.run_blocks(x, lengths, 0, k)  # (B, T', D)
        log_probs = None
        if cfg.ctc_weight > 0 or own_alignment:
            enc, _ = self.encoder.run_blocks(h_k, lengths, k, len(self.encoder.blocks))
            log_probs = self.ctc(enc)  # (B, T', V)
            if cfg.ctc_weight > 0:
                terms["ctc"] = ctc_loss(log_probs, lengths, batch.tokens, batch.token_lens)
        if not align_on:
            return None
        if own_alignment:
            durations, ok = forced_durations(log_probs.detach(), lengths, batch.tokens, batch.token_lens)
        else:
            align_lp, align_lens = self._aligner_log_probs(batch.features, batch.feature_lens)
            if not torch.equal(align_lens, lengths):
                raise ValueError("the align_from model's encoder frames differ from this model's (another front end?)")
            durations, ok = forced_durations(align_lp, lengths, batch.tokens, batch.token_lens)
        metrics["align_ok_frac"] = ok.float().mean()
        tokens = self._pad_tokens(batch.tokens)  # (B, U')
        durations = nn.functional.pad(durations, (0, tokens.shape[1] - durations.shape[1]))  # (B, U'), 0 at padding
        token_valid = valid_mask(batch.token_lens, tokens.shape[1]) & ok[:, None]  # (B, U')
        metrics["dur_mean_frames"] = (durations * token_valid).sum() / token_valid.sum().clamp(min=1)

        states = self.text_encoder.encode_tokens(tokens, batch.token_lens)  # (B, U', D)
        if cfg.duration_weight > 0:
            predicted = self.text_encoder.log_durations(states)  # (B, U')
            mse, abs_err = log_duration_errors(predicted, durations, token_valid.float())
            terms["duration"] = mse
            metrics["dur_abs_log_err"] = abs_err.detach()
        if cfg.consistency_weight > 0:
            text_frames, _ = self.text_encoder.frames(states, durations, num_frames=h_k.shape[1])  # (B, T', D)
            target = h_k.detach() if cfg.consistency_detach_speech else h_k
            frame_valid = (valid_mask(lengths, h_k.shape[1]) & ok[:, None]).float()  # (B, T')
            sq = (text_frames.float() - target.float()).pow(2).mean(-1)  # (B, T')
            n = frame_valid.sum().clamp(min=1)
            terms["consistency"] = (sq * frame_valid).sum() / n
            with torch.no_grad():
                t = target.float()
                # The MSE relative to the speech states' variance: 1 = no closer than their mean.
                var = _frame_variance(t, frame_valid, n).mean()
                metrics["consistency_rel"] = terms["consistency"] / var.clamp(min=1e-12)
                if cfg.text_noise > 0:
                    return _frame_variance(text_frames.float() - t, frame_valid, n).sqrt()
        return None

    def _text_loss(
        self, batch: TextBatch, residual_std: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """CTC reconstruction of masked text-only sentences through blocks k..; (loss, masked fraction).
        ``residual_std`` (D,): the spread of speech around text that ``text_noise`` scales."""
        cfg = self.cfg
        states = self.text_encoder.encode_tokens(self._pad_tokens(batch.tokens), batch.token_lens)  # (B, U', D)
        durations = durations_from_log(self.text_encoder.log_durations(states), batch.token_lens, cfg.max_token_frames)
        # (B, T', D), (B,); T' the longest row's frames, or with pad_text_to a speech length that holds them
        round_up = self._text_frames if cfg.pad_text_to else None
        frames, lengths = self.text_encoder.frames(states, durations, round_up=round_up)
        if cfg.text_detach_encoder:
            frames = frames.detach()
        if cfg.text_noise > 0 and residual_std is not None:
            frames = frames + torch.randn_like(frames) * (cfg.text_noise * residual_std).to(frames.dtype)
        valid = valid_mask(lengths, frames.shape[1])  # (B, T')
        starts = sample_span_starts(valid, cfg.text_mask_prob)
        masked = expand_spans(starts, cfg.text_mask_span, valid)  # (B, T')
        frames = torch.where(masked[:, :, None], self.text_mask.to(frames.dtype), frames)
        enc, _ = self.encoder.run_blocks(frames, lengths, self.text_layer, len(self.encoder.blocks))
        loss = ctc_loss(self.ctc(enc), lengths, batch.tokens, batch.token_lens)
        return loss, masked.sum().float() / valid.sum().clamp(min=1).float()
