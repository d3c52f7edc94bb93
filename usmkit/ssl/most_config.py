"""Typed configuration of MOST (stage 2: multi-objective supervised pre-training with text injection).

``TaskConfig.most`` holds one ``MostConfig``; the BEST-RQ objective on unlabeled audio reads its
settings from ``TaskConfig.bestrq`` (the same keys as stage 1, so both stages draw the same targets).
See ``docs/most.md`` for what each loss does and ``usmkit/conf/recipe/stage2.yaml`` for the recipe.
"""

from __future__ import annotations

from dataclasses import dataclass

from usmkit.errors import UsageError

LOSSES: tuple[str, ...] = ("bestrq", "ctc", "duration", "consistency", "text")
STREAMS: tuple[str, ...] = ("unlabeled", "paired", "text")


@dataclass(frozen=True)
class MostConfig:
    """MOST's knobs.

    Where text enters: ``text_layer`` = k, the shared encoder block whose *input* the text encoder's
    output replaces (0 = the front end's output, i.e. every block is shared); ``None`` = a third of the
    blocks (``num_layers // 3``).

    Loss weights (each 0 = that loss is not computed at all, and a stream no loss needs is not loaded):
    ``bestrq_weight`` (BEST-RQ on unlabeled audio), ``ctc_weight`` (CTC on paired speech),
    ``duration_weight`` (MSE of predicted against aligned log durations), ``consistency_weight`` (MSE
    between the text encoder's frames and the speech encoder's block-k input, paired data),
    ``text_weight`` (CTC reconstruction of masked text-only data through the shared blocks).

    Schedules, in optimizer steps: the text-only loss starts after ``text_warmup_steps`` (its durations
    come from the duration model, which needs alignments to have learned first); the duration and
    consistency losses start after ``align_warmup_steps`` (alignments from a CTC head that is still
    random are noise).

    Alignments: ``align_from`` = a CTC checkpoint (run dir or checkpoint dir, same tokenizer) whose
    frozen model aligns the paired data; ``None`` = the CTC head of the model being trained.

    Padding: ``pad_text_to`` > 0 (feature frames, as ``data.pad_to_frames``) pads the text encoder's tokens
    and the text-only frames to a few lengths, the frames to those of speech padded alike (padding is masked:
    the losses do not change), so compiled training meets few text lengths.

    Streams (one batch of each active stream per step): a stream's batch holds at most
    ``<stream>_ratio * data.max_duration`` seconds; a text-only sentence of U tokens counts as
    ``U * text_seconds_per_token`` seconds (``None`` = measured on the paired training transcripts).
    ``unlabeled_split`` names the audio-only split; ``text_only`` the text-only file (jsonl or jsonl.gz
    of ``{"text", "language"}``), ``None`` = ``<data.manifest_dir>/<data.corpus>_text_only.jsonl.gz``.
    """

    text_layer: int | None = None  # text replaces the input of this encoder block; null = a third of the blocks
    text_token_blocks: int = 1  # Conformer blocks over the token embeddings (context for the durations)
    text_frame_blocks: int = 1  # Conformer blocks over the upsampled frames
    max_token_frames: int = 32  # a predicted duration is clipped to this many encoder frames (1.28 s)
    bestrq_weight: float = 1.0  # BEST-RQ on unlabeled audio (each weight: 0 = that loss is off, not computed)
    ctc_weight: float = 1.0  # CTC on paired speech
    duration_weight: float = 1.0  # MSE of predicted against aligned log durations
    consistency_weight: float = 1.0  # MSE between text-encoder frames and the speech encoder's block-k input
    text_weight: float = 1.0  # CTC reconstruction of masked text-only data through the shared blocks
    text_warmup_steps: int = 500  # the text-only loss starts after this many steps
    align_warmup_steps: int = 0  # the duration and consistency losses start after this many steps
    align_from: str | None = None  # a CTC checkpoint to align the paired data with; null = this model's own CTC head
    consistency_detach_speech: bool = True  # the speech side is the target: consistency moves only the text encoder
    text_mask_prob: float = 0.08  # a text frame starts a masked span with this probability
    text_mask_span: int = 4  # encoder frames per masked span (0.08 and 4 mask ~28% of the frames)
    # The text-only loss trains the shared blocks and the CTC head but not the text encoder, which then
    # learns only to imitate the speech encoder (consistency, duration): with its gradient the text encoder
    # can drift into a code of its own that the shared blocks read easily but speech never produces.
    text_detach_encoder: bool = False
    # Gaussian noise on the text-only loss's frames, per dimension ``text_noise`` x the standard deviation
    # of speech minus text over the step's aligned paired frames (0 = none): speech's spread around what
    # text predicts, so the shared blocks learn to read text frames as unsure as speech frames are.
    text_noise: float = 0.0
    unlabeled_split: str = "unlabeled"
    text_only: str | None = None  # JSON lines of {"text", "language"}; null = <corpus>_text_only.jsonl.gz
    unlabeled_ratio: float = 1.0  # each stream's batch holds <ratio> * data.max_duration seconds
    paired_ratio: float = 1.0
    text_ratio: float = 1.0  # a sentence counts as tokens * text_seconds_per_token seconds
    text_seconds_per_token: float | None = None  # null = measured on the paired training transcripts
    # Text padded as ``data.pad_to_frames`` pads audio, in the same feature frames (0 = none; set both
    # alike): the text-only frames to the encoder length of audio padded to a multiple of it, so the shared
    # blocks meet the speech's lengths, and the text encoder's tokens to a multiple of it / the
    # subsampling factor. Compiled training is static in time: this keeps the text path to a few lengths.
    pad_text_to: int = 0

    def __post_init__(self) -> None:
        if self.text_layer is not None and self.text_layer < 0:
            raise ValueError(
                f"task.most.text_layer must be >= 0 or null (a third of the blocks), got {self.text_layer}"
            )
        for name in (
            "text_token_blocks",
            "text_frame_blocks",
            "text_warmup_steps",
            "align_warmup_steps",
            "pad_text_to",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"task.most.{name} must be >= 0, got {getattr(self, name)}")
        if self.max_token_frames < 1:
            raise ValueError(f"task.most.max_token_frames must be >= 1, got {self.max_token_frames}")
        for name in LOSSES:
            value = getattr(self, f"{name}_weight")
            if not value >= 0:
                raise ValueError(f"task.most.{name}_weight must be >= 0 (0 = off), got {value}")
        if not any(self.weight(name) > 0 for name in LOSSES):
            raise ValueError("task.most: every loss weight is 0; switch at least one loss on")
        for name in STREAMS:
            value = getattr(self, f"{name}_ratio")
            if not value > 0:
                raise ValueError(
                    f"task.most.{name}_ratio must be > 0 (its batch size relative to data.max_duration), got {value}; "
                    f"to leave the stream out, set the weights of its losses to 0"
                )
        if not 0.0 <= self.text_mask_prob <= 1.0:
            raise ValueError(f"task.most.text_mask_prob must be in [0, 1], got {self.text_mask_prob}")
        if self.text_mask_span < 1:
            raise ValueError(f"task.most.text_mask_span must be >= 1 frame, got {self.text_mask_span}")
        if self.text_seconds_per_token is not None and not self.text_seconds_per_token > 0:
            raise ValueError(
                f"task.most.text_seconds_per_token must be > 0 or null (measured), got {self.text_seconds_per_token}"
            )
        if not self.text_noise >= 0:
            raise ValueError(f"task.most.text_noise must be >= 0 (0 = none), got {self.text_noise}")
        if self.text_noise > 0 and not (self.consistency_weight > 0 and self.text_weight > 0):
            raise ValueError(
                "task.most.text_noise > 0 scales with the consistency loss's residual and acts on the text-only "
                "loss: both need a weight > 0"
            )
        if not self.unlabeled_split or "/" in self.unlabeled_split:
            raise ValueError(f"task.most.unlabeled_split must be a split name, got {self.unlabeled_split!r}")

    def weight(self, loss: str) -> float:
        """The weight of ``loss`` (one of ``LOSSES``)."""
        return getattr(self, f"{loss}_weight")

    @property
    def needs_alignment(self) -> bool:
        return self.duration_weight > 0 or self.consistency_weight > 0

    def active_streams(self) -> tuple[str, ...]:
        """The streams some loss with a weight > 0 reads, in ``STREAMS`` order."""
        needed = {
            "unlabeled": self.bestrq_weight > 0,
            "paired": self.ctc_weight > 0 or self.needs_alignment,
            "text": self.text_weight > 0,
        }
        return tuple(name for name in STREAMS if needed[name])

    def check_run(self, num_layers: int, *, pack_to_frames: int, shar_dir: str | None, compiled: bool) -> None:
        """ValueError (UsageError for the compiled step) where a training run's settings do not fit MOST's three
        streams: packed rows, Shar shards, a text layer beyond the encoder's ``num_layers`` blocks, a compiled
        step without ``pad_text_to``."""
        if pack_to_frames:
            raise ValueError(
                f"data.pack_to_frames={pack_to_frames} packs the utterances of one stream; MOST "
                "(recipe=stage2) takes its three streams one utterance per row: set data.pack_to_frames=0"
            )
        if shar_dir:
            raise ValueError(
                "data.shar_dir streams one training split from shards; MOST (recipe=stage2) mixes three streams "
                "from the manifests: leave data.shar_dir unset"
            )
        self.resolve_text_layer(num_layers)  # where text enters must be one of the encoder's blocks
        if compiled and self.pad_text_to == 0:
            raise UsageError(
                "trainer.compile=true with recipe=stage2 needs task.most.pad_text_to (set it to data.pad_to_frames): "
                "unpadded text compiles a new graph for every token and frame length"
            )

    def resolve_text_layer(self, num_layers: int) -> int:
        """k, checked against the encoder's ``num_layers`` blocks: text replaces the input of block k."""
        k = num_layers // 3 if self.text_layer is None else self.text_layer
        if not 0 <= k < num_layers:
            raise ValueError(
                f"task.most.text_layer={k} must be below the encoder's {num_layers} blocks (text needs a shared block)"
            )
        return k
