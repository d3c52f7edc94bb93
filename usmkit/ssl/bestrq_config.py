"""BEST-RQ's settings (``task.bestrq``), apart from the model so that the masking and the quantizer
read them without importing the model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BestRQConfig:
    """BEST-RQ hyper-parameters; defaults are the BEST-RQ / USM paper's (``min_one_span`` is ours).

    ``frame_shift_ms`` must be the feature hop (the recipe ties it to ``data.features.frame_shift_ms``);
    a span covers ``round(mask_span_ms / frame_shift_ms)`` frames. ``stack_frames`` must be the
    encoder's subsampling factor, one target per encoder frame (the recipe ties it to
    ``model.subsampling_factor``; ``check_stack_frames``). ``seed`` seeds the quantizer's own
    generator (and the fixed masks used in eval mode), so targets never depend on the global RNG.
    """

    num_codebooks: int = 16  # independent projection + codebook + softmax each (USM's multi-softmax)
    codebook_size: int = 8192
    code_dim: int = 16
    stack_frames: int = 4  # feature frames per target = one encoder frame (4 x 10 ms, or 8)
    mask_prob: float = 0.01  # probability that a frame starts a masked span
    mask_span_ms: float = 400.0
    frame_shift_ms: float = 10.0  # spans are counted in feature frames
    noise_std: float = 0.1  # masked frames are replaced by N(0, 0.1) noise
    min_one_span: bool = True  # an utterance that drew no span gets one, so every utterance adds to the loss
    seed: int = 0  # the quantizer's own seed: fixed targets whatever trainer.seed is

    def __post_init__(self) -> None:
        for name in ("num_codebooks", "codebook_size", "code_dim", "stack_frames"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"BestRQConfig.{name} must be a positive int, got {value!r}")
        if self.codebook_size < 2:
            raise ValueError(f"BestRQConfig.codebook_size must be >= 2 codes, got {self.codebook_size}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"BestRQConfig.seed must be a non-negative int, got {self.seed!r}")
        if not 0.0 < self.mask_prob <= 1.0:
            raise ValueError(
                f"BestRQConfig.mask_prob must be in (0, 1] (probability that a frame starts a masked span; "
                f"BEST-RQ uses 0.01), got {self.mask_prob}"
            )
        if self.frame_shift_ms <= 0:
            raise ValueError(f"BestRQConfig.frame_shift_ms must be > 0 (the feature hop), got {self.frame_shift_ms}")
        if self.mask_span_ms < self.frame_shift_ms:
            raise ValueError(
                f"BestRQConfig.mask_span_ms={self.mask_span_ms} must cover at least one frame "
                f"(frame_shift_ms={self.frame_shift_ms}); BEST-RQ uses 400 ms"
            )
        if self.noise_std < 0:
            raise ValueError(f"BestRQConfig.noise_std must be >= 0, got {self.noise_std}")
        if not isinstance(self.min_one_span, bool):
            raise ValueError(f"BestRQConfig.min_one_span must be true or false, got {self.min_one_span!r}")

    @property
    def span_frames(self) -> int:
        """Frames masked from each span start (400 ms / 10 ms = 40)."""
        return max(1, round(self.mask_span_ms / self.frame_shift_ms))


def check_stack_frames(cfg: BestRQConfig, subsampling_factor: int) -> None:
    """ValueError unless a target stacks as many feature frames as one encoder frame reads (4 or 8)."""
    if cfg.stack_frames != subsampling_factor:
        raise ValueError(
            f"task.bestrq.stack_frames={cfg.stack_frames} does not match model.subsampling_factor="
            f"{subsampling_factor}: BEST-RQ predicts one target per encoder frame, so set "
            f"task.bestrq.stack_frames={subsampling_factor}"
        )
