"""CTC prefix beam search, resumable across chunks for streaming.

Shapes: B batch, T encoder frames, V vocabulary (id 0 = blank), k candidate tokens per frame.

The standard algorithm (Hannun et al. 2014; WeNet's ``ctc_prefix_beam_search``): every prefix keeps
two log-probabilities, ``pb`` (all alignments of the prefix seen so far that end in blank) and ``pnb``
(those that end in the prefix's last token). Per frame, with token ``c`` of log-prob ``p``:

- blank:            prefix        <- (pb + pnb) + p  into pb
- c == last token:  prefix        <- pnb + p         into pnb   (repeat collapses: "aa" -> "a")
                    prefix + (c,) <- pb + p          into pnb   (only through a blank: "a_a" -> "aa")
- c != last token:  prefix + (c,) <- (pb + pnb) + p  into pnb

Contributions reaching the same prefix are summed (log-add), so a prefix's score is the exact total
probability of all alignments that collapse to it, as long as pruning dropped none of them.
Alongside, each prefix tracks its best single alignment (max instead of sum) and where that
alignment starts each token: these are the token timestamps.

Written in plain Python on CPU floats: the work per frame is beam x k small updates on a dict keyed
by prefix, which tensors would not speed up (WeNet and ESPnet do the same).
"""

from __future__ import annotations

import math

import torch

from usmkit.decoding.hypothesis import Hypothesis

BLANK_ID = 0
NEG_INF = float("-inf")


def _log_add(a: float, b: float) -> float:
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    hi, lo = (a, b) if a > b else (b, a)
    return hi + math.log1p(math.exp(lo - hi))


class _PrefixScore:
    """Scores of one prefix: summed (pb, pnb) and best-alignment (vb, vnb) with its token start frames."""

    __slots__ = ("pb", "pnb", "vb", "vnb", "tb", "tnb")

    def __init__(self) -> None:
        self.pb = NEG_INF
        self.pnb = NEG_INF
        self.vb = NEG_INF
        self.vnb = NEG_INF
        self.tb: tuple[int, ...] = ()
        self.tnb: tuple[int, ...] = ()

    @property
    def total(self) -> float:
        return _log_add(self.pb, self.pnb)

    def best_alignment(self) -> tuple[float, tuple[int, ...]]:
        return (self.vb, self.tb) if self.vb >= self.vnb else (self.vnb, self.tnb)

    def add_blank(self, p: float, v: float, times: tuple[int, ...]) -> None:
        self.pb = _log_add(self.pb, p)
        if v > self.vb:
            self.vb, self.tb = v, times

    def add_nonblank(self, p: float, v: float, times: tuple[int, ...]) -> None:
        self.pnb = _log_add(self.pnb, p)
        if v > self.vnb:
            self.vnb, self.tnb = v, times


class PrefixBeamState:
    """CTC prefix beam search over a stream of log-prob chunks.

    >>> log_probs = torch.randn(10, 5).log_softmax(-1)  # (T, V)
    >>> state = PrefixBeamState(beam_size=4)
    >>> for chunk in log_probs.split(4):  # encoder frames as they arrive
    ...     partial = state.advance(chunk).nbest(1)[0].tokens
    >>> state.nbest()[0].tokens == ctc_prefix_beam_search(log_probs, beam_size=4)[0].tokens
    True

    Feeding the frames in any split gives exactly the one-shot result: the search is frame-synchronous.

    beam_size: prefixes kept after each frame. top_k: tokens tried per frame (the k most probable;
    default ``beam_size``). prune_threshold: also skip tokens whose log-prob is below this (e.g.
    ``math.log(1e-4)``); ``None`` keeps all top-k.
    """

    def __init__(
        self,
        beam_size: int = 10,
        top_k: int | None = None,
        prune_threshold: float | None = None,
        blank: int = BLANK_ID,
    ) -> None:
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
        self.beam_size = beam_size
        self.top_k = top_k or beam_size
        self.prune_threshold = prune_threshold
        self.blank = blank
        self.frames = 0  # frames consumed so far: the time offset of the next chunk
        start = _PrefixScore()
        start.pb = 0.0
        start.vb = 0.0
        self._beam: list[tuple[tuple[int, ...], _PrefixScore]] = [((), start)]

    def advance(self, log_probs: torch.Tensor) -> PrefixBeamState:
        """Consume log_probs (t, V) of the next t frames (t may be 0). Returns self."""
        if log_probs.dim() != 2:
            raise ValueError(f"log_probs must be (t, V) for one utterance, got shape {tuple(log_probs.shape)}")
        if not 0 <= self.blank < log_probs.shape[1]:
            raise ValueError(f"blank id {self.blank} is outside the vocabulary of {log_probs.shape[1]}")
        if log_probs.shape[0] == 0:
            return self
        k = min(self.top_k, log_probs.shape[1])
        vals, ids = log_probs.detach().float().cpu().topk(k, dim=-1)  # (t, k) each
        for i, (frame_vals, frame_ids) in enumerate(zip(vals.tolist(), ids.tolist(), strict=True)):
            if self.prune_threshold is not None:
                cand = [(c, p) for c, p in zip(frame_ids, frame_vals, strict=True) if p >= self.prune_threshold]
                cand = cand or [(frame_ids[0], frame_vals[0])]  # always keep the frame's best token
            else:
                cand = list(zip(frame_ids, frame_vals, strict=True))
            self._step(cand, self.frames + i)
        self.frames += log_probs.shape[0]
        return self

    def _step(self, cand: list[tuple[int, float]], t: int) -> None:
        nxt: dict[tuple[int, ...], _PrefixScore] = {}

        def get(prefix: tuple[int, ...]) -> _PrefixScore:
            s = nxt.get(prefix)
            if s is None:
                s = nxt[prefix] = _PrefixScore()
            return s

        for prefix, s in self._beam:
            last = prefix[-1] if prefix else None
            total = s.total
            v_best, t_best = s.best_alignment()
            for c, p in cand:
                if c == self.blank:
                    get(prefix).add_blank(total + p, v_best + p, t_best)
                elif c == last:
                    get(prefix).add_nonblank(s.pnb + p, s.vnb + p, s.tnb)  # "aa" -> "a"
                    get(prefix + (c,)).add_nonblank(s.pb + p, s.vb + p, s.tb + (t,))  # "a_a" -> "aa"
                else:
                    get(prefix + (c,)).add_nonblank(total + p, v_best + p, t_best + (t,))
        ranked = sorted(nxt.items(), key=lambda item: item[1].total, reverse=True)  # stable on ties
        self._beam = [(prefix, s) for prefix, s in ranked[: self.beam_size] if s.total > NEG_INF]
        if not self._beam:
            raise ValueError(f"frame {t}: every prefix has probability 0; the log-probs are -inf or NaN there")

    def nbest(self, n: int | None = None) -> list[Hypothesis]:
        """The current n best prefixes (all kept ones if n is None), most probable first."""
        out = []
        for prefix, s in self._beam[: n or len(self._beam)]:
            total = s.total
            out.append(Hypothesis(prefix, score=total, ctc_score=total, timestamps=s.best_alignment()[1]))
        return out


def ctc_prefix_beam_search(
    log_probs: torch.Tensor,
    beam_size: int = 10,
    top_k: int | None = None,
    prune_threshold: float | None = None,
    blank: int = BLANK_ID,
) -> list[Hypothesis]:
    """N-best of one utterance: log_probs (T, V) (valid frames only) -> up to ``beam_size`` hypotheses."""
    state = PrefixBeamState(beam_size, top_k=top_k, prune_threshold=prune_threshold, blank=blank)
    return state.advance(log_probs).nbest()


def ctc_prefix_beam_search_batch(
    log_probs: torch.Tensor,
    lengths: torch.Tensor,
    beam_size: int = 10,
    top_k: int | None = None,
    prune_threshold: float | None = None,
    blank: int = BLANK_ID,
) -> list[list[Hypothesis]]:
    """log_probs (B, T, V), lengths (B,) -> n-best list per utterance (one search per utterance)."""
    if log_probs.dim() != 3 or lengths.shape != log_probs.shape[:1]:
        raise ValueError(
            f"log_probs must be (B, T, V) and lengths (B,), got {tuple(log_probs.shape)} and {tuple(lengths.shape)}"
        )
    log_probs = log_probs.detach().float().cpu()
    return [
        ctc_prefix_beam_search(log_probs[b, :n], beam_size, top_k, prune_threshold, blank)
        for b, n in enumerate(lengths.tolist())
    ]
