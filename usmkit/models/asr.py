"""The ASR model: an encoder with a CTC head, a LAS attention decoder, or both (joint CTC/attention).

Shapes: B batch, T feature frames, F feature bins, T' encoder frames, D encoder dim, U tokens,
V vocabulary (0 = blank, 1 = <unk>, 2 = <s>, 3 = </s>).

loss = ctc_weight * loss_ctc + (1 - ctc_weight) * loss_att, both summed over tokens and divided by
the batch size. With intermediate CTC (``inter_ctc_weight`` = w > 0; Lee & Watanabe, "Intermediate
loss regularization for CTC-based speech recognition", ICASSP 2021, as in ESPnet and WeNet),
loss_ctc = (1 - w) * CTC(final) + w * CTC(block ``inter_ctc_layer``), the same CTC head on both: it
regularizes the lower layers and adds no parameters, so decoding and streaming are unchanged.
``ctc_weight=1`` without a decoder is a pure CTC model (USM's long-form choice); ``ctc_weight=0.3``
with a decoder is the joint training of WeNet / ESPnet (the CTC branch speeds up and regularizes the
attention decoder's alignment learning and enables two-pass rescoring).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from usmkit.data.batch import Batch
from usmkit.data.packing import Packing
from usmkit.models.ctc import CTCHead, ctc_loss
from usmkit.models.las import LASConfig, LASDecoder
from usmkit.models.output import StepOutput


@dataclass(frozen=True)
class AsrHeadConfig:
    """Which heads sit on the encoder and how their losses mix.

    ctc_weight=1.0, las=None: pure CTC. 0 < ctc_weight < 1 with las: joint CTC/attention.
    ctc_weight=0.0 with las: attention only (no CTC head; CTC decode modes unavailable).
    """

    ctc_weight: float = 1.0
    las: LASConfig | None = None
    inter_ctc_weight: float = 0.0  # intermediate CTC's share of the CTC loss; 0 = off
    inter_ctc_layer: int = 0  # block whose output gets the intermediate CTC loss; 0 = the middle one

    def __post_init__(self) -> None:
        if not 0.0 <= self.ctc_weight <= 1.0:
            raise ValueError(f"AsrHeadConfig.ctc_weight must be in [0, 1], got {self.ctc_weight}")
        if not 0.0 <= self.inter_ctc_weight < 1.0:
            raise ValueError(f"AsrHeadConfig.inter_ctc_weight must be in [0, 1), got {self.inter_ctc_weight}")
        if self.inter_ctc_weight > 0 and self.ctc_weight == 0.0:
            raise ValueError("AsrHeadConfig.inter_ctc_weight needs a CTC head (ctc_weight > 0)")
        if self.inter_ctc_layer < 0:
            raise ValueError(
                f"AsrHeadConfig.inter_ctc_layer must be >= 0 (0 = the middle block), got {self.inter_ctc_layer}"
            )
        if self.las is None and self.ctc_weight != 1.0:
            raise ValueError(
                f"AsrHeadConfig.ctc_weight={self.ctc_weight} without a LAS decoder would only rescale the CTC "
                "loss; set ctc_weight=1.0 for pure CTC or add las=LASConfig(...) for joint training"
            )
        if self.las is not None and self.ctc_weight == 1.0:
            raise ValueError(
                "AsrHeadConfig has a LAS decoder but ctc_weight=1.0 gives it no loss (its weights would never "
                "train); use e.g. ctc_weight=0.3, or las=None for pure CTC"
            )


class AsrModel(nn.Module):
    """Encoder + CTC head and/or LAS decoder. ``forward`` trains; ``usmkit.decoding.modes`` decodes with
    ``encode`` and the heads (``ctc``, ``las``: None where absent).

    encoder: any module with ``forward(features (B, T, F), lengths (B,)) -> (enc (B, T', D), enc_lens (B,))``
    and an ``output_dim`` attribute (``usmkit.models.conformer.ConformerEncoder``).
    """

    def __init__(self, encoder: nn.Module, vocab_size: int, cfg: AsrHeadConfig) -> None:
        super().__init__()
        dim = getattr(encoder, "output_dim", None)
        if not isinstance(dim, int):
            raise ValueError(f"encoder {type(encoder).__name__} must expose an int `output_dim`, got {dim!r}")
        if vocab_size < 5:
            raise ValueError(f"vocab_size={vocab_size} leaves no room for tokens after blank, <unk>, <s>, </s>")
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.encoder = encoder
        self.ctc = CTCHead(dim, vocab_size) if cfg.ctc_weight > 0 else None
        self.las = LASDecoder(dim, vocab_size, cfg.las) if cfg.las is not None else None
        self.inter_layers: tuple[int, ...] = ()
        if cfg.inter_ctc_weight > 0:
            blocks = len(getattr(encoder, "blocks", ()))
            if not hasattr(encoder, "forward_with_intermediate") or blocks < 2:
                raise ValueError(
                    f"intermediate CTC needs an encoder with forward_with_intermediate and >= 2 blocks; "
                    f"{type(encoder).__name__} has {blocks}"
                )
            layer = cfg.inter_ctc_layer or blocks // 2
            if layer >= blocks:
                raise ValueError(
                    f"inter_ctc_layer={layer} must be below the encoder's {blocks} blocks (the last is the output)"
                )
            self.inter_layers = (layer,)

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features (B, T, F), lengths (B,) -> enc (B, T', D), enc_lens (B,)."""
        return self.encoder(features, lengths)

    def losses(
        self,
        features: torch.Tensor,
        feature_lens: torch.Tensor,
        tokens: torch.Tensor,
        token_lens: torch.Tensor,
        packing: Packing | None = None,
    ) -> dict[str, torch.Tensor]:
        """The training losses as tensors only (no ``.item()``, no data-dependent branches: compilable).

        Keys: ``loss`` (to backpropagate), ``loss_ctc`` (if CTC), ``loss_inter_ctc`` (if intermediate
        CTC), ``loss_att`` and ``acc_att`` (if LAS). ``packing``: features are packed rows (R, N, F) of the
        (B,) utterances of ``feature_lens``; the encoder returns them one per row, so every head and loss
        sees each utterance alone, as in an unpacked batch.
        """
        if packing is not None:
            if not hasattr(self.encoder, "forward_packed"):
                raise ValueError(
                    f"packed batches need an encoder with forward_packed; {type(self.encoder).__name__} has none"
                )
            enc, enc_lens, kept = self.encoder.forward_packed(features, feature_lens, packing, self.inter_layers)
            inter = kept[0] if kept else None
        elif self.inter_layers:
            enc, enc_lens, (inter,) = self.encoder.forward_with_intermediate(features, feature_lens, self.inter_layers)
        else:
            enc, enc_lens = self.encode(features, feature_lens)
        out: dict[str, torch.Tensor] = {}
        w = self.cfg.ctc_weight
        loss = enc.new_zeros((), dtype=torch.float32)
        if self.ctc is not None:
            out["loss_ctc"] = ctc_loss(self.ctc(enc), enc_lens, tokens, token_lens)
            ctc_total = out["loss_ctc"]
            if self.inter_layers:
                iw = self.cfg.inter_ctc_weight
                out["loss_inter_ctc"] = ctc_loss(self.ctc(inter), enc_lens, tokens, token_lens)
                ctc_total = (1.0 - iw) * ctc_total + iw * out["loss_inter_ctc"]
            loss = loss + w * ctc_total
        if self.las is not None:
            out["loss_att"], out["acc_att"] = self.las.loss(enc, enc_lens, tokens, token_lens)
            loss = loss + (1.0 - w) * out["loss_att"]
        out["loss"] = loss
        return out

    def forward(self, batch: Batch) -> StepOutput:
        losses = self.losses(batch.features, batch.feature_lens, batch.tokens, batch.token_lens, batch.packing)
        metrics = {name: value.detach() for name, value in losses.items()}
        return StepOutput(loss=losses["loss"], metrics=metrics)
