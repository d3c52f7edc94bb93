"""Lexicon + word-LM beam search (``decode=ctc_lexicon``) on CPU worker processes, beside the GPU.

Shapes: T encoder frames, V vocabulary.

The beam search (flashlight, ``usmkit.decoding.ctc_lexicon.LexiconDecoder``) runs on the CPU, one
utterance at a time, and is far slower than the encoder on a GPU. ``LexiconPool`` runs it in
``workers`` processes: the transcriber submits each batch's log-probs as soon as the batch is encoded
and goes on encoding the next while the pool decodes. At most ``2 x workers`` jobs wait at once
(``submit`` blocks on the oldest beyond that), so log-probs never pile up in memory when the encoder
outruns the search. ``workers=0`` decodes in the calling process, at ``submit``.

Each process builds its decoder once from the files the pool writes (tokens, lexicon, LM: the ones
``usmkit.cli.evaluate decode=ctc_lexicon`` builds from the checkpoint's training transcripts) and the
tokenizer's model. Processes are spawned (not forked): the parent may hold CUDA, which a fork must not inherit.
"""

from __future__ import annotations

import multiprocessing
import tempfile
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from usmkit.data.tokenizer import MODEL_FILE, Tokenizer
from usmkit.decoding.ctc_lexicon import LexiconConfig, LexiconDecoder
from usmkit.inference.word_alignment import Transcript, align_words, spread_starts, transcript_of


def lexicon_transcript(
    decoder: LexiconDecoder, tokenizer, log_probs: torch.Tensor, frame_s: float, offset_s: float = 0.0
) -> Transcript:
    """The best lexicon-constrained path of one utterance's CTC log-probs (T, V), with word times and
    confidences (``usmkit.inference.word_alignment``)."""
    log_probs = log_probs.float()
    if log_probs.shape[0] == 0:
        return Transcript("", 0.0, ())
    best, ids = log_probs.max(dim=-1)  # (T,) each
    frame_probs = best.exp().numpy()
    hyp = decoder.best_hypothesis(log_probs)
    if hyp is None:
        return transcript_of([], float(frame_probs.mean()))
    tokens, starts = list(hyp.tokens), spread_starts(hyp.timestamps, log_probs.shape[0])
    start_probs = log_probs[starts, tokens].exp().tolist()
    return align_words(tokens, starts, start_probs, ids.numpy(), frame_probs, tokenizer, frame_s, offset_s)


@dataclass
class LexiconJob:
    """Utterances to decode: each one's log-probs (T_i, V) on the CPU and the time of its first frame."""

    tag: Any  # the caller's, returned with the results
    log_probs: list[torch.Tensor]
    offsets_s: list[float]


_WORKER: dict[str, Any] = {}  # the decoder, tokenizer and frame length of this worker process


def _init_worker(directory: str, cfg: LexiconConfig, frame_s: float, bias: tuple = ()) -> None:
    torch.set_num_threads(1)
    tokenizer = Tokenizer.load(Path(directory) / MODEL_FILE)
    _WORKER.update(decoder=LexiconDecoder(tokenizer, directory, cfg, bias), tokenizer=tokenizer, frame_s=frame_s)


def _decode(job: LexiconJob) -> tuple[Any, list[Transcript]]:
    w = _WORKER
    return job.tag, [
        lexicon_transcript(w["decoder"], w["tokenizer"], lp, w["frame_s"], off)
        for lp, off in zip(job.log_probs, job.offsets_s, strict=True)
    ]


class LexiconPool:
    """Submit ``LexiconJob``s, collect ``(tag, transcripts)`` as they finish (``finished`` / ``drain``).
    ``bias``: phrases to boost (``usmkit.decoding.biasing``), in every worker's search."""

    def __init__(
        self, tokenizer: Tokenizer, texts: list[str], cfg: LexiconConfig, frame_s: float, workers: int, bias=()
    ) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="usmkit-lexicon-")
        directory = self._dir.name
        (Path(directory) / MODEL_FILE).write_bytes(tokenizer.model_proto)
        decoder = LexiconDecoder.build(texts, tokenizer, directory, cfg, bias)  # writes the files, checks they load
        self.workers = workers
        self._inline = None if workers else (decoder, tokenizer, frame_s)
        self._pool = None
        if workers:
            self._pool = ProcessPoolExecutor(
                workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(directory, cfg, frame_s, tuple(bias)),
            )
        self._pending: deque[Future] = deque()
        self._ready: list[tuple[Any, list[Transcript]]] = []

    def submit(self, job: LexiconJob) -> None:
        if self._pool is None:
            decoder, tokenizer, frame_s = self._inline
            self._ready.append(
                (job.tag, [lexicon_transcript(decoder, tokenizer, lp, frame_s, off)
                           for lp, off in zip(job.log_probs, job.offsets_s, strict=True)])
            )  # fmt: skip
            return
        while len(self._pending) >= 2 * self.workers:
            self._ready.append(self._pending.popleft().result())
        self._pending.append(self._pool.submit(_decode, job))

    def finished(self) -> Iterator[tuple[Any, list[Transcript]]]:
        """The results of the jobs that are done (in submission order, up to the first still running)."""
        while self._pending and self._pending[0].done():
            self._ready.append(self._pending.popleft().result())
        ready, self._ready = self._ready, []
        yield from ready

    def drain(self) -> Iterator[tuple[Any, list[Transcript]]]:
        """Every remaining result, waiting for the jobs still running."""
        while self._pending:
            self._ready.append(self._pending.popleft().result())
        yield from self.finished()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._dir.cleanup()
