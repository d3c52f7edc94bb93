"""Frame-synchronous streaming decoding: CTC greedy or prefix beam, partials, endpoints, two-pass rescoring.

Shapes: t encoder frames of one chunk (40 ms each), V vocabulary (0 = blank), D encoder dim.

The decoder takes CTC log-probs chunk by chunk and keeps one *segment* open. After every chunk its
best hypothesis is the partial result. An endpoint closes the segment at the frame where one of
these first holds (all computed on the chunk as vectors, no Python loop over frames):

- trailing blank: the last ``trailing_blank_s`` of frames are blank-dominant (blank is the argmax)
  and some earlier frame of the segment was not;
- trailing silence: the last ``trailing_silence_s`` of frames are silent (the caller passes a
  per-frame silence flag, e.g. energy below a dBFS threshold) after a non-blank frame;
- length: the segment reached ``max_segment_s``.

At an endpoint the segment is finalized: optionally its n-best is rescored by the LAS decoder over
the segment's encoder frames (WeNet's two-pass decoding), then it is emitted with start/end times and
word timings from the CTC token emission frames (frame index x 40 ms), and the search restarts (the
encoder state is the caller's and is not touched). A segment whose frames were all silent is
dropped: what a CTC head emits over pure silence is noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import torch

from usmkit.decoding import Hypothesis, PrefixBeamState, attention_rescore
from usmkit.decoding.ctc_lexicon import WORD_BOUNDARY

BLANK_ID = 0


class TokenizerLike(Protocol):
    def decode(self, ids: list[int]) -> str: ...

    def id_to_piece(self, token_id: int) -> str: ...


@dataclass(frozen=True)
class EndpointConfig:
    """When a segment ends (seconds; one encoder frame is ``frame_s``)."""

    trailing_blank_s: float = 0.8
    trailing_silence_s: float = 0.5
    max_segment_s: float = 20.0
    frame_s: float = 0.04

    def __post_init__(self) -> None:
        for name in ("trailing_blank_s", "trailing_silence_s", "max_segment_s", "frame_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EndpointConfig.{name} must be > 0 seconds, got {getattr(self, name)}")

    def frames(self, seconds: float) -> int:
        return max(1, round(seconds / self.frame_s))


@dataclass(frozen=True)
class DecoderConfig:
    """``mode``: ``ctc_greedy`` or ``ctc_beam`` (prefix beam search). ``rescore``: at each endpoint rank
    the beam's n-best with the attention decoder (needs ``ctc_beam`` and a LAS model)."""

    mode: Literal["ctc_greedy", "ctc_beam"] = "ctc_greedy"
    beam_size: int = 8
    rescore: bool = False
    rescore_ctc_weight: float = 0.3
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)

    def __post_init__(self) -> None:
        if self.mode not in ("ctc_greedy", "ctc_beam"):
            raise ValueError(f"DecoderConfig.mode must be 'ctc_greedy' or 'ctc_beam', got {self.mode!r}")
        if self.beam_size < 1:
            raise ValueError(f"DecoderConfig.beam_size must be >= 1, got {self.beam_size}")
        if self.rescore and self.mode != "ctc_beam":
            raise ValueError("rescoring ranks the n-best of a beam search: use mode='ctc_beam' with rescore=True")
        if not 0.0 <= self.rescore_ctc_weight <= 1.0:
            raise ValueError(f"DecoderConfig.rescore_ctc_weight must be in [0, 1], got {self.rescore_ctc_weight}")


@dataclass(frozen=True)
class Word:
    text: str
    start: float  # seconds from the start of the stream
    end: float


@dataclass(frozen=True)
class Segment:
    """A finalized piece of the transcript; times in seconds from the start of the stream."""

    text: str
    start: float
    end: float
    tokens: tuple[int, ...]
    words: tuple[Word, ...]
    score: float
    rescored: bool = False
    alternatives: tuple[Segment, ...] = ()  # the beam's other hypotheses of the same audio, best first (ctc_beam)

    def as_dict(self) -> dict:
        return {
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "text": self.text,
            "words": [{"word": w.text, "start": round(w.start, 3), "end": round(w.end, 3)} for w in self.words],
            "score": self.score,
            "rescored": self.rescored,
        }


class GreedySearch:
    """CTC best path over a stream of chunks; timestamps count frames from the search's start."""

    def __init__(self, blank: int = BLANK_ID) -> None:
        self.blank = blank
        self.frames = 0
        self._last = -1  # argmax id of the previous frame (repeats across a chunk edge collapse too)
        self._tokens: list[int] = []
        self._times: list[int] = []
        self._score = 0.0

    def advance(self, log_probs: torch.Tensor) -> GreedySearch:
        """log_probs (t, V) of the next t frames."""
        if log_probs.shape[0] == 0:
            return self
        x = log_probs.detach().float().cpu().numpy()  # (t, V); a chunk's few frames: numpy's per-call cost is lower
        ids = x.argmax(axis=-1)  # (t,)
        best = np.take_along_axis(x, ids[:, None], axis=-1)[:, 0]  # (t,)
        prev = np.concatenate([[self._last], ids[:-1]])  # (t,)
        emit = (ids != self.blank) & (ids != prev)  # (t,): a new token starts here
        self._tokens += ids[emit].tolist()
        self._times += (np.flatnonzero(emit) + self.frames).tolist()
        self._score += float(best.sum())
        self._last = int(ids[-1])
        self.frames += x.shape[0]
        return self

    def nbest(self, n: int | None = None) -> list[Hypothesis]:
        return [Hypothesis(tuple(self._tokens), self._score, ctc_score=self._score, timestamps=tuple(self._times))]


def _run_lengths(flags: np.ndarray, carry: int) -> np.ndarray:
    """Length of the run of True ending at each frame: flags (t,) bool -> (t,) int; ``carry`` = the run
    length before the first frame."""
    idx = np.arange(flags.shape[0])
    last_false = np.maximum.accumulate(np.where(flags, -1, idx))  # (t,): last False at or before i
    return np.where(last_false >= 0, idx - last_false, idx + 1 + carry)


class StreamingDecoder:
    """CTC log-probs in, chunk by chunk; partial text after each chunk; finalized segments at endpoints.

    Usage::

        decoder = StreamingDecoder(tokenizer, DecoderConfig(mode="ctc_beam"))
        for log_probs, enc, silent in chunks:  # (t, V), (t, D), (t,)
            segments += decoder.accept(log_probs, enc, silent)
            show(decoder.partial)
        segments += decoder.finish()

    ``las``: the model's attention decoder, used only with ``cfg.rescore``. ``words``: a lexicon decoder
    (``usmkit.decoding.ctc_lexicon.LexiconDecoder``): each final is then its best path over the
    segment's log-probs that spells only lexicon words, scored with its word LM (partials stay the
    search's own, which can misspell).
    """

    def __init__(
        self,
        tokenizer: TokenizerLike,
        cfg: DecoderConfig = DecoderConfig(),
        las=None,
        blank: int = BLANK_ID,
        words=None,
    ):
        if cfg.rescore and las is None:
            raise ValueError("rescoring needs a model with a LAS (attention) decoder; this one is CTC-only")
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.las = las if cfg.rescore else None
        self.words = words
        if self.las is not None and words is not None:
            raise ValueError("choose LAS rescoring or lexicon finals, not both")
        self.blank = blank
        ep = cfg.endpoint
        self._blank_frames = ep.frames(ep.trailing_blank_s)
        self._silence_frames = ep.frames(ep.trailing_silence_s)
        self._max_frames = ep.frames(ep.max_segment_s)
        self.frames = 0  # encoder frames consumed since the start of the stream
        self._start_segment()

    def _start_segment(self) -> None:
        if self.cfg.mode == "ctc_beam":
            self._search: GreedySearch | PrefixBeamState = PrefixBeamState(self.cfg.beam_size, blank=self.blank)
        else:
            self._search = GreedySearch(self.blank)
        self._seg_start = self.frames  # absolute frame of the segment's first frame
        self._blank_run = 0  # blank-dominant frames at the end of the segment so far
        self._silence_run = 0
        self._nonblank = False  # some frame of the segment had a non-blank argmax
        self._speech = False  # some frame of the segment was not silent
        self._enc: list[torch.Tensor] = []  # the segment's encoder frames, kept only for rescoring
        self._log_probs: list[torch.Tensor] = []  # the segment's log-probs, kept only for lexicon finals

    # ------------------------------------------------------------------ feeding
    def accept(
        self, log_probs: torch.Tensor, enc: torch.Tensor | None = None, silent: torch.Tensor | None = None
    ) -> list[Segment]:
        """Consume log_probs (t, V) of the next t frames; returns the segments finalized in them.

        ``enc`` (t, D): the encoder frames (needed when rescoring). ``silent`` (t,) bool: frames whose
        audio is silence (enables the silence endpoint and the dropping of all-silent segments);
        None: no silence information, every frame counts as audio.
        """
        if log_probs.dim() != 2:
            raise ValueError(f"log_probs must be (t, V) for one stream, got shape {tuple(log_probs.shape)}")
        t = log_probs.shape[0]
        if self.las is not None and (enc is None or enc.shape[0] != t):
            raise ValueError("rescoring needs the encoder frames of every chunk: pass enc (t, D) with log_probs")
        if silent is not None and silent.shape != (t,):
            raise ValueError(f"silent must be (t,) = ({t},) flags, got shape {tuple(silent.shape)}")
        log_probs = log_probs.detach().float().cpu()
        # The endpoint bookkeeping of a chunk's few frames in numpy, whose per-call cost is a fraction of torch's.
        silent = np.zeros(t, dtype=bool) if silent is None else silent.cpu().bool().numpy()
        blank_dom = log_probs.numpy().argmax(axis=-1) == self.blank  # (t,)
        finals: list[Segment] = []
        i = 0
        while i < t:
            lp, b, s = log_probs[i:], blank_dom[i:], silent[i:]
            blank_run = _run_lengths(b, self._blank_run)  # (n,)
            silence_run = _run_lengths(s, self._silence_run)  # (n,)
            nonblank = np.maximum.accumulate(~b) | self._nonblank  # (n,)
            seg_len = np.arange(1, lp.shape[0] + 1) + (self.frames - self._seg_start)  # (n,)
            end = (
                (nonblank & (blank_run >= self._blank_frames))
                | (nonblank & (silence_run >= self._silence_frames))
                | (seg_len >= self._max_frames)
            )
            hits = np.flatnonzero(end)
            stop = int(hits[0]) + 1 if hits.size else lp.shape[0]  # frames taken now
            self._search.advance(lp[:stop])
            if self.las is not None:
                self._enc.append(enc[i : i + stop].detach())
            if self.words is not None:
                self._log_probs.append(lp[:stop])
            self._blank_run = int(blank_run[stop - 1])
            self._silence_run = int(silence_run[stop - 1])
            self._nonblank = bool(nonblank[stop - 1])
            self._speech = self._speech or not bool(s[:stop].all())
            self.frames += stop
            i += stop
            if bool(end[stop - 1]):
                finals += self._finalize()
        return finals

    @property
    def partial(self) -> str:
        """Text of the open segment's best hypothesis."""
        return self.tokenizer.decode(list(self._best().tokens))

    def partial_nbest(self, n: int) -> list[str]:
        """Texts of the open segment's ``n`` best hypotheses (one with greedy search), best first."""
        return [self.tokenizer.decode(list(h.tokens)) for h in self._search.nbest(n)]

    def finish(self) -> list[Segment]:
        """End of stream: finalize the open segment (if it has any text)."""
        return self._finalize()

    # ------------------------------------------------------------------ finalizing
    def _best(self) -> Hypothesis:
        return self._search.nbest(1)[0]

    def _finalize(self) -> list[Segment]:
        """Close the open segment, start a new one; returns the segment unless it is empty or all silence."""
        hyp, rescored = self._best(), False
        nbest = self._search.nbest()
        if hyp.tokens and self._speech and self.las is not None:
            enc = torch.cat(self._enc)[None]  # (1, T, D)
            lens = torch.tensor([enc.shape[1]], device=enc.device)
            hyp = attention_rescore(self.las, enc, lens, nbest, ctc_weight=self.cfg.rescore_ctc_weight)
            rescored = True
        if hyp.tokens and self._speech and self.words is not None:
            words = self.words.best_hypothesis(torch.cat(self._log_probs))  # (T, V) of the segment
            hyp = words or hyp
            rescored = words is not None
        seg_start, speech = self._seg_start, self._speech
        self._start_segment()
        if not hyp.tokens or not speech:
            return []
        others = tuple(self._segment(h, seg_start, False) for h in nbest if h.tokens and h.tokens != hyp.tokens)
        segment = self._segment(hyp, seg_start, rescored, others)
        return [segment] if segment.text.strip() else []  # e.g. only a lone word-boundary piece

    def _segment(self, hyp: Hypothesis, seg_start: int, rescored: bool, others: tuple[Segment, ...] = ()) -> Segment:
        frame_s = self.cfg.endpoint.frame_s
        times = [seg_start + t for t in hyp.timestamps] or [seg_start] * len(hyp.tokens)
        words: list[Word] = []
        word_ids: list[int] = []
        word_times: list[int] = []
        for token, frame in zip(hyp.tokens, times, strict=True):
            if word_ids and self.tokenizer.id_to_piece(token).startswith(WORD_BOUNDARY):
                words.append(self._word(word_ids, word_times))
                word_ids, word_times = [], []
            word_ids.append(token)
            word_times.append(frame)
        if word_ids:
            words.append(self._word(word_ids, word_times))
        return Segment(
            text=self.tokenizer.decode(list(hyp.tokens)),
            start=times[0] * frame_s,
            end=(times[-1] + 1) * frame_s,
            tokens=hyp.tokens,
            words=tuple(w for w in words if w.text),
            score=hyp.score,
            rescored=rescored,
            alternatives=others,
        )

    def _word(self, ids: list[int], frames: list[int]) -> Word:
        """A word from its tokens: from its first token's frame to the end of its last token's frame."""
        frame_s = self.cfg.endpoint.frame_s
        return Word(self.tokenizer.decode(ids).strip(), frames[0] * frame_s, (frames[-1] + 1) * frame_s)
