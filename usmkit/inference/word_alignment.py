"""Words, their times and their confidences, from a CTC path.

Shapes: T encoder frames (40 ms each at 4x subsampling), K tokens of the path.

A path is its tokens, the frame where each starts (CTC greedy: where the frame-wise argmax changes to
it; the lexicon beam search: flashlight's timestep of the token), and what the model says at every
frame (``frame_ids``: the argmax token, ``frame_probs``: its posterior probability).

- A token's frames: its start frame and the frames after it whose argmax is still that token (the run
  of a repeated CTC label), up to the next token's start.
- A word: a token whose piece begins with sentencepiece's word boundary "▁" (or the first token) and
  the tokens up to the next such one; its text is their detokenized pieces. It starts at its first
  frame and ends at the end of its last frame (frame index x frame length, in seconds).
- Confidence of a frame: the posterior probability of the path's token there (the argmax's own for
  every frame but a lexicon path's start frames, whose token need not be the argmax).
  A word's confidence: the mean over its frames. An utterance's: the mean over the frames of all its
  words (so long words weigh more than short ones); without any word, the mean max posterior of all
  its frames (how sure the model is that nothing was said); with no frame at all, 0.

Blank frames between words do not enter a word's confidence: a CTC model is sure of blank most of the
time, which says nothing about the words. Low values flag substitutions well, and are the usual
filter for pseudo-labels (e.g. NeMo's "max_prob" frame confidence, aggregated by the mean).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from usmkit.decoding.ctc_lexicon import WORD_BOUNDARY


@dataclass(frozen=True)
class WordTiming:
    word: str
    start: float  # seconds from the start of the input
    end: float
    confidence: float
    frames: int = 1  # frames its confidence is the mean over

    def as_dict(self) -> dict:
        return {
            "word": self.word,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "confidence": round(self.confidence, 4),
        }


@dataclass(frozen=True)
class Transcript:
    text: str
    confidence: float
    words: tuple[WordTiming, ...]


def run_ends(frame_ids: np.ndarray) -> np.ndarray:
    """For each frame, the first later frame whose id differs (T if none): (T,) -> (T,).

    >>> run_ends(np.array([5, 5, 0, 7, 7, 7])).tolist()
    [2, 2, 3, 6, 6, 6]
    """
    T = frame_ids.shape[0]
    changes = np.flatnonzero(frame_ids[1:] != frame_ids[:-1]) + 1  # frames where a new run begins
    return np.append(changes, T)[np.searchsorted(changes, np.arange(T), side="right")]


def align_words(
    tokens: Sequence[int],
    starts: Sequence[int],
    start_probs: Sequence[float],
    frame_ids: np.ndarray,
    frame_probs: np.ndarray,
    tokenizer,
    frame_s: float,
    offset_s: float = 0.0,
) -> Transcript:
    """The words of a path (see the module docstring).

    tokens (K,), starts (K,) frame indices, start_probs (K,) the posterior of each token at its start
    frame; frame_ids (T,) argmax ids, frame_probs (T,) their posteriors; ``frame_s`` seconds per frame,
    ``offset_s`` added to every time (a piece of a longer input).
    """
    T = frame_ids.shape[0]
    empty = float(frame_probs.mean()) if T else 0.0
    if len(tokens) == 0 or T == 0:
        return transcript_of([], empty)
    # Vectorized over tokens: at a few thousand frames per second of batch, a Python loop per token
    # would make the host, not the device, the limit.
    tokens = np.asarray(tokens, dtype=np.int64)
    starts = np.minimum(np.asarray(starts, dtype=np.int64), T - 1)  # (K,)
    limits = np.append(starts[1:], T)  # a token's frames stop where the next one starts
    runs = np.where(frame_ids[starts] == tokens, run_ends(frame_ids)[starts], starts + 1)
    ends = np.maximum(starts + 1, np.minimum(runs, limits))  # (K,) exclusive
    cumulative = np.concatenate([[0.0], np.cumsum(frame_probs, dtype=np.float64)])
    sums = np.asarray(start_probs, dtype=np.float64) + cumulative[ends] - cumulative[starts + 1]  # (K,)
    counts = ends - starts  # (K,) frames per token
    first = word_starts(tokenizer)[tokens]
    first[0] = True
    heads = np.flatnonzero(first)  # (W,) each word's first token
    lasts = np.append(heads[1:], len(tokens)) - 1
    word_sums, word_counts = np.add.reduceat(sums, heads), np.add.reduceat(counts, heads)
    words = []
    for w, (a, b) in enumerate(zip(heads.tolist(), (lasts + 1).tolist(), strict=True)):
        text = tokenizer.decode(tokens[a:b].tolist()).strip()
        if text:
            start_s, end_s = offset_s + int(starts[a]) * frame_s, offset_s + int(ends[b - 1]) * frame_s
            n = int(word_counts[w])
            words.append(WordTiming(text, start_s, end_s, float(word_sums[w] / n), n))
    return transcript_of(words, empty)


_WORD_STARTS: dict[int, tuple[object, np.ndarray]] = {}


def word_starts(tokenizer) -> np.ndarray:
    """(V,) bool: which of the tokenizer's pieces begin a word ("▁"); computed once per tokenizer."""
    cached = _WORD_STARTS.get(id(tokenizer))
    if cached is None or cached[0] is not tokenizer:
        table = np.array([tokenizer.id_to_piece(i).startswith(WORD_BOUNDARY) for i in range(tokenizer.vocab_size)])
        cached = _WORD_STARTS[id(tokenizer)] = (tokenizer, table)
    return cached[1].copy()


def transcript_of(words: Sequence[WordTiming], empty: float) -> Transcript:
    """The transcript of ``words``: their text, and the mean confidence over all their frames (``empty``
    when there is no word)."""
    frames = sum(w.frames for w in words)
    confidence = sum(w.confidence * w.frames for w in words) / frames if frames else empty
    return Transcript(" ".join(w.word for w in words), float(confidence), tuple(words))


def spread_starts(starts: Sequence[int], T: int) -> list[int]:
    """Token start frames made strictly increasing within [0, T) (given at most T tokens), each moved as
    little as it takes: a lexicon path can put two tokens on one frame (a word spelled with more pieces
    than the path emitted for it), which would give two words one frame.

    >>> spread_starts([3, 3, 4, 9], T=10), spread_starts([7, 9, 9, 9], T=10)
    ([3, 4, 5, 9], [6, 7, 8, 9])
    """
    out: list[int] = []
    for s in starts:  # forward: after the one before
        out.append(max(int(s), out[-1] + 1 if out else 0))
    limit = T
    for k in range(len(out) - 1, -1, -1):  # backward: before the one after, inside the input
        limit = out[k] = max(min(out[k], limit - 1), 0)
    return out


def greedy_path(frame_ids: np.ndarray, blank: int = 0) -> tuple[list[int], list[int]]:
    """CTC best path of frame-wise argmax ids (T,): (tokens, their start frames); repeats collapse, blanks go.

    >>> greedy_path(np.array([0, 4, 4, 0, 4, 6, 6]))
    ([4, 4, 6], [1, 4, 5])
    """
    prev = np.concatenate([[-1], frame_ids[:-1]])
    emit = np.flatnonzero((frame_ids != blank) & (frame_ids != prev))
    return frame_ids[emit].tolist(), emit.tolist()


def greedy_transcript(
    frame_ids: np.ndarray, frame_probs: np.ndarray, tokenizer, frame_s: float, offset_s: float = 0.0
) -> Transcript:
    """The CTC greedy transcript of one utterance from its argmax ids (T,) and their posteriors (T,)."""
    tokens, starts = greedy_path(frame_ids, tokenizer.blank_id)
    start_probs = frame_probs[starts] if starts else []
    return align_words(tokens, starts, start_probs, frame_ids, frame_probs, tokenizer, frame_s, offset_s)


def merge_transcripts(parts: Sequence[Transcript], frames: Sequence[int]) -> Transcript:
    """One transcript of consecutive pieces of an input (their times already absolute); ``frames``: each
    piece's frame count, which weighs its confidence when no piece has a word."""
    total = sum(frames)
    empty = sum(p.confidence * n for p, n in zip(parts, frames, strict=True)) / total if total else 0.0
    return transcript_of([w for p in parts for w in p.words], empty)
