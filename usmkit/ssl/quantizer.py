"""BEST-RQ random-projection quantizer: frozen random projection + frozen random codebook -> code ids.

Shapes: B batch, T feature frames, F feature bins, S stacked frames, T2 = T // S target frames,
N codebooks, K codebook size, C code dim.

Nothing here learns. ``S`` consecutive (globally normalized) feature frames are stacked, projected
by a Xavier-initialized matrix to ``C`` dims, l2-normalized and matched to the nearest of ``K``
l2-normalized standard-normal codes by cosine similarity. USM uses ``N = 16`` independent
projection/codebook pairs ("multi-softmax"). Both tensors are drawn from a dedicated generator seeded
by ``cfg.seed`` (targets never depend on the global RNG) and kept as persistent buffers, so they are
saved in ``model.safetensors`` and a reloaded model produces the same targets.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from usmkit.ssl.bestrq_config import BestRQConfig


class RandomProjectionQuantizer(nn.Module):
    """Frozen targets for BEST-RQ: ``targets(features (B, T, F), lengths) -> (codes (B, T2, N), lens)``."""

    projections: torch.Tensor  # (N, S * F, C)
    codebooks: torch.Tensor  # (N, K, C), unit rows

    def __init__(self, input_dim: int, cfg: BestRQConfig) -> None:
        super().__init__()
        if not isinstance(input_dim, int) or isinstance(input_dim, bool) or input_dim <= 0:
            raise ValueError(
                f"RandomProjectionQuantizer input_dim must be a positive int (feature bins), got {input_dim!r}"
            )
        self.input_dim = input_dim
        self.stack_frames = cfg.stack_frames
        self.num_codebooks = cfg.num_codebooks
        self.codebook_size = cfg.codebook_size
        N, S, C, K = cfg.num_codebooks, cfg.stack_frames, cfg.code_dim, cfg.codebook_size
        g = torch.Generator().manual_seed(cfg.seed)
        projections = torch.empty(N, S * input_dim, C)
        for n in range(N):
            # Each (S*F, C) slice is one projection: fan_in = S*F, fan_out = C.
            nn.init.xavier_uniform_(projections[n], generator=g)
        codebooks = F.normalize(torch.randn(N, K, C, generator=g), dim=-1)
        self.register_buffer("projections", projections, persistent=True)
        self.register_buffer("codebooks", codebooks, persistent=True)

    @torch.no_grad()
    def targets(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Code ids of the stacked frames.

        features (B, T, F) normalized log-mel, lengths (B,) -> codes (B, T // S, N) int64 and target
        lengths (B,) = lengths // S (a partial last stack is dropped). Always computed in fp32, even
        under autocast, so bf16 training sees the same targets as fp32. Codes at padded frames are
        meaningless: use the returned lengths.
        """
        if features.dim() != 3 or features.shape[-1] != self.input_dim:
            raise ValueError(
                f"features must be (batch, frames, {self.input_dim}) for this quantizer, got {tuple(features.shape)}; "
                "is data.features.num_mel_bins the encoder's input_dim?"
            )
        B, T, Fdim = features.shape
        S = self.stack_frames
        T2 = T // S
        with torch.autocast(device_type=features.device.type, enabled=False):
            x = features[:, : T2 * S].float().reshape(B, T2, S * Fdim)  # (B, T2, S*F)
            z = F.normalize(torch.einsum("btf,nfc->btnc", x, self.projections.float()), dim=-1)  # (B, T2, N, C)
            # One codebook at a time keeps the similarity tensor at (B, T2, K) instead of (B, T2, N, K):
            # 16 x 8192 codes on a 200 s batch would otherwise take ~2.6 GB.
            codes = torch.stack(
                [(z[:, :, n] @ self.codebooks[n].float().T).argmax(dim=-1) for n in range(self.num_codebooks)],
                dim=-1,
            )  # (B, T2, N)
        target_lens = torch.div(lengths, S, rounding_mode="floor")
        return codes, target_lens
