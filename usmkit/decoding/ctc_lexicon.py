"""CTC beam search constrained to a word lexicon, scored with a word n-gram language model.

Shapes: B batch, T encoder frames, V vocabulary (id 0 = blank).

The search itself is torchaudio's ``ctc_decoder`` (flashlight-text's lexicon beam search in C++, with
KenLM for the LM). What is ours is the glue around it, all of it small:

- ``tokens.txt``: the tokenizer's pieces in id order (flashlight's token dictionary);
- ``lexicon.txt``: every word of the training transcripts spelled with the tokenizer's pieces, so the
  beam can only end words that exist;
- ``lm.arpa``: a word n-gram (order 1 or 2, absolute discounting with back-off) estimated from the
  same transcripts. We write ARPA ourselves because KenLM's estimator (``lmplz``) is a separate binary
  that no wheel ships; KenLM reads the file.

This is the classic "lexicon + LM" decoding of Kaldi/wav2letter-style toolkits. It turns most
near-miss spellings of a CTC model into the closest word of the lexicon; words outside the lexicon
(out-of-vocabulary) cannot be produced.
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from usmkit.decoding.hypothesis import Hypothesis
from usmkit.errors import UsageError

WORD_BOUNDARY = "\u2581"  # sentencepiece's "▁", the first character of a word-initial piece

UNK_WORD = "<unk>"
BOS_WORD, EOS_WORD = "<s>", "</s>"
TOKENS_FILE, LEXICON_FILE, LM_FILE = "tokens.txt", "lexicon.txt", "lm.arpa"  # what ``LexiconDecoder.build`` writes
LEXICON_DIR = "lexicon"  # their folder beside a model: in an experiment directory and in an export


@dataclass(frozen=True)
class LexiconConfig:
    """Settings of lexicon-constrained CTC decoding (``decode=ctc_lexicon``).

    - ``order``: word n-gram order of the LM built from the training transcripts (1 or 2); 0 = no LM.
    - ``lm_weight``: weight of the LM log-probability (natural log) against the CTC score.
    - ``word_score``: added per word (positive favours more, shorter words).
    - ``beam_size``: hypotheses kept per frame; ``beam_threshold``: prune below best minus this.
    - ``lm_path``: an ARPA or KenLM binary file to use instead of the built one (its words should be
      the lexicon's words).
    - ``nbest``: hypotheses kept per utterance; the transcript is the first, an ensemble
      (``usmkit.cli.evaluate ensemble=[...]``) takes them all as candidates.
    """

    order: int = 1
    lm_weight: float = 1.0
    word_score: float = 0.0
    beam_size: int = 200  # wider than flashlight's 50: fewer search errors on dev (usmkit.cli.tune_lexicon)
    beam_threshold: float = 50.0
    lm_path: str | None = None
    nbest: int = 1

    def __post_init__(self) -> None:
        if self.nbest < 1:
            raise ValueError(f"LexiconConfig.nbest must be >= 1, got {self.nbest}")
        if self.order not in (0, 1, 2):
            raise ValueError(f"LexiconConfig.order must be 0 (no LM), 1 or 2, got {self.order}")
        if self.beam_size < 1:
            raise ValueError(f"LexiconConfig.beam_size must be >= 1, got {self.beam_size}")


# What ``--lexicon`` of usmkit-transcribe and usmkit-serve, and an export's bundled lexicon, decode with
# unless told otherwise: the unigram LM of the training transcripts at half weight (the demo's setting).
STREAMING_LEXICON = LexiconConfig(order=1, lm_weight=0.5, word_score=0.0)


def write_arpa(sentences: Iterable[Sequence[str]], path: str | Path, order: int = 1, discount: float = 0.75) -> int:
    """Estimate a word n-gram (order 1 or 2) on ``sentences`` and write it as ARPA; returns the word count.

    Unigrams: relative frequencies of the words and ``</s>``, with one extra count for ``<unk>``.
    Bigrams: absolute discounting, p(w|h) = (c(h, w) - D) / c(h) for seen pairs, and the freed mass
    D * N1+(h) / c(h) given to the unigram distribution over the unseen words through the back-off
    weight of h, so that every p(.|h) sums to one.
    """
    if order not in (1, 2):
        raise ValueError(f"write_arpa supports order 1 or 2, got {order}")
    unigram: Counter[str] = Counter()
    bigram: dict[str, Counter[str]] = defaultdict(Counter)
    for words in sentences:
        seq = [BOS_WORD, *words, EOS_WORD]
        unigram.update(seq[1:])
        for h, w in zip(seq[:-1], seq[1:], strict=False):
            bigram[h][w] += 1
    if not unigram:
        raise ValueError("write_arpa: no sentences to estimate a language model from")
    total = sum(unigram.values()) + 1  # +1: the <unk> count
    p1 = {w: c / total for w, c in unigram.items()}
    p1[UNK_WORD] = 1 / total
    backoff: dict[str, float] = {}
    lines2: list[str] = []
    if order == 2:
        for h, nexts in sorted(bigram.items()):
            c_h = sum(nexts.values())
            seen_uni = sum(p1[w] for w in nexts)
            freed = discount * len(nexts) / c_h
            backoff[h] = freed / max(1.0 - seen_uni, 1e-12)
            for w, c in sorted(nexts.items()):
                lines2.append(f"{math.log10((c - discount) / c_h):.6f}\t{h} {w}")
    else:
        # KenLM loads bigram models and up: a unigram model is written as a bigram whose only history,
        # <s>, predicts with the unigram probabilities themselves (back-off weight 1), which is exact.
        backoff[BOS_WORD] = 1.0
        lines2 = [f"{math.log10(p):.6f}\t{BOS_WORD} {w}" for w, p in sorted(p1.items())]
    lines1 = [f"-99.000000\t{BOS_WORD}" + (f"\t{math.log10(backoff[BOS_WORD]):.6f}" if BOS_WORD in backoff else "")]
    for w in sorted(p1):
        line = f"{math.log10(p1[w]):.6f}\t{w}"
        if w in backoff:
            line += f"\t{math.log10(backoff[w]):.6f}"
        lines1.append(line)
    out = ["", "\\data\\", f"ngram 1={len(lines1)}", f"ngram 2={len(lines2)}"]
    out += ["", "\\1-grams:", *lines1, "", "\\2-grams:", *lines2, ""]
    out += ["\\end\\", ""]
    Path(path).write_text("\n".join(out), encoding="utf-8")
    return len(p1) - 2  # words, without </s> and <unk>


def write_tokens(tokenizer, path: str | Path) -> None:
    """The tokenizer's pieces, one per line in id order (flashlight's token dictionary)."""
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    Path(path).write_text("\n".join(pieces) + "\n", encoding="utf-8")


def write_lexicon(words: Iterable[str], tokenizer, path: str | Path) -> int:
    """``word<TAB>piece piece ...`` for each word (its tokenizer spelling as a standalone word)."""
    lines = []
    for word in sorted(set(words)):
        pieces = [tokenizer.id_to_piece(i) for i in tokenizer.encode(word)]
        if pieces:
            lines.append(f"{word}\t{' '.join(pieces)}")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


def write_lexicon_files(texts: Iterable[str], tokenizer, directory: str | Path, cfg: LexiconConfig) -> int:
    """Write ``tokens.txt``, ``lexicon.txt`` and (order > 0, no ``lm_path``) ``lm.arpa`` of ``texts`` (normalized
    transcripts) into ``directory``: what ``LexiconDecoder`` reads. Returns the lexicon's words."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sentences = [t.split() for t in texts if t.strip()]
    if not sentences:
        raise ValueError("LexiconDecoder.build: no transcripts to build a lexicon from")
    write_tokens(tokenizer, directory / TOKENS_FILE)
    words = write_lexicon((w for s in sentences for w in s), tokenizer, directory / LEXICON_FILE)
    if cfg.order > 0 and cfg.lm_path is None:
        write_arpa(sentences, directory / LM_FILE, order=cfg.order)
    return words


class LMReadError(UsageError):
    """A word LM file that KenLM cannot read."""


def lexicon_problem(lexicon: Path, tokens: Path) -> str | None:
    """The first line of ``lexicon`` that flashlight cannot read, as ``"FILE, line N: what"`` (None: every line
    is a word, a tab and pieces listed in ``tokens``). Ours: flashlight's reader names the piece, not the line.

    A line reads ``word<TAB>piece piece ...`` (``write_lexicon``)."""
    try:
        pieces = set(tokens.read_text(encoding="utf-8").splitlines())
        lines = lexicon.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        return f"{lexicon} cannot be read ({e})"
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        word, _, spelling = line.partition("\t")
        if not word.strip() or not spelling.split():
            return f"{lexicon}, line {n}: {line[:80]!r} is not a word, a tab and its pieces"
        unknown = [p for p in spelling.split() if p not in pieces]
        if unknown:
            return f"{lexicon}, line {n}: the piece {unknown[0][:40]!r} of {word[:40]!r} is not a token of the model"
    return None


class LexiconDecoder:
    """Words of the best lexicon-constrained beam per utterance: ``decoder(log_probs, lengths) -> [str]``.

    ``directory`` holds the files ``build`` writes. ``bias``: phrases whose words are added to the lexicon
    and boosted in the search (``usmkit.decoding.biasing``).
    """

    def __init__(self, tokenizer, directory: str | Path, cfg: LexiconConfig, bias: Sequence = ()) -> None:
        try:
            from torchaudio.models.decoder import ctc_decoder
        except (ImportError, RuntimeError) as err:  # torchaudio raises RuntimeError without flashlight-text
            raise RuntimeError(
                f"decode=ctc_lexicon needs the flashlight-text package (pip install flashlight-text): {err}"
            ) from err
        directory = Path(directory)
        self._blank_id, self._sil_id = tokenizer.blank_id, tokenizer.unk_id
        self._piece, self._encode = tokenizer.id_to_piece, tokenizer.encode
        lm = cfg.lm_path or (str(directory / LM_FILE) if cfg.order > 0 else None)
        if cfg.lm_path and not Path(cfg.lm_path).is_file():
            raise UsageError(f"lexicon.lm_path={cfg.lm_path}: no such file; pass an ARPA or KenLM binary LM")
        self.cfg = cfg
        self.bias = tuple(bias)
        self.bias_words: list[str] = []  # the bias phrases' words the lexicon did not have
        try:
            if self.bias:
                self._decoder = self._build_biased(ctc_decoder, directory, lm, tokenizer, cfg)
            else:
                self._decoder = self._build(ctc_decoder, directory / LEXICON_FILE, directory, lm, tokenizer, cfg)
        except (RuntimeError, ValueError) as e:  # flashlight's lexicon reader, or KenLM's: a file it cannot read
            problem = lexicon_problem(directory / LEXICON_FILE, directory / TOKENS_FILE)
            if problem is not None:
                raise UsageError(
                    f"{problem}: each line of a lexicon is a word, a tab and its pieces, every piece a line of "
                    f"{directory / TOKENS_FILE}; build the lexicon again"
                ) from e
            if not cfg.lm_path or not isinstance(e, RuntimeError):
                raise
            first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise LMReadError(
                f"lexicon.lm_path={cfg.lm_path} cannot be read as an ARPA or KenLM binary LM ({first}); "
                "pass one (e.g. made by KenLM's lmplz) or leave lexicon.lm_path out to use the built one"
            ) from e

    def _build_biased(self, ctc_decoder, directory: Path, lm: str | None, tokenizer, cfg: LexiconConfig):
        """The search over the lexicon plus the bias phrases' words, with the phrase-boosting LM."""
        from usmkit.decoding.biasing import biased_lm, extend_lexicon

        with tempfile.TemporaryDirectory(prefix="usmkit-bias-") as tmp:  # flashlight reads the lexicon once
            lexicon = Path(tmp) / LEXICON_FILE
            self.bias_words = extend_lexicon(directory / LEXICON_FILE, self.bias, tokenizer, lexicon)
            self._lm = biased_lm(lm, lexicon, self.bias, cfg.lm_weight)  # held: the search calls into it
            return self._build(ctc_decoder, lexicon, directory, self._lm, tokenizer, cfg)

    @staticmethod
    def _build(ctc_decoder, lexicon: Path, directory: Path, lm, tokenizer, cfg: LexiconConfig):
        return ctc_decoder(
            lexicon=str(lexicon),
            tokens=str(directory / TOKENS_FILE),
            lm=lm,
            nbest=cfg.nbest,
            beam_size=cfg.beam_size,
            beam_threshold=cfg.beam_threshold,
            lm_weight=cfg.lm_weight,
            word_score=cfg.word_score,
            unk_score=float("-inf"),
            sil_score=0.0,
            blank_token=tokenizer.id_to_piece(tokenizer.blank_id),
            # Our pieces carry word boundaries themselves ("▁word"); there is no silence token, so the
            # never-emitted <unk> piece stands in for flashlight's optional between-word silence.
            sil_token=tokenizer.id_to_piece(tokenizer.unk_id),
            unk_word=UNK_WORD,
        )

    @classmethod
    def build(
        cls, texts: Iterable[str], tokenizer, directory: str | Path, cfg: LexiconConfig, bias: Sequence = ()
    ) -> LexiconDecoder:
        """Write tokens, lexicon and LM for ``texts`` (normalized transcripts) into ``directory``, then load
        (with the ``bias`` phrases, if any)."""
        write_lexicon_files(texts, tokenizer, directory, cfg)
        return cls(tokenizer, directory, cfg, bias)

    def __call__(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[str]:
        """log_probs (B, T, V) CTC log-probabilities; lengths (B,) valid frames. Returns B transcripts."""
        return [texts[0] if texts else "" for texts in self.nbest(log_probs, lengths)]

    def best_hypothesis(self, log_probs: torch.Tensor) -> Hypothesis | None:
        """The best lexicon-constrained path of one utterance, log_probs (T, V), as a ``Hypothesis``
        (None when no word fits): the words spelled with the tokenizer's pieces, each piece stamped
        with a frame of its word in the path. Streaming finals use it (``StreamingDecoder``)."""
        emissions = log_probs.detach().float().cpu().contiguous()[None]  # (1, T, V)
        hyps = self._decoder(emissions, torch.tensor([emissions.shape[1]], dtype=torch.int32))[0]
        words = [w for w in hyps[0].words if w != UNK_WORD] if hyps else []
        if not words:
            return None
        best = hyps[0]
        # The path's frames, split into words where a word-initial piece starts (its tokens are
        # collapsed, so double letters appear once: the spelling comes from the words).
        starts: list[list[int]] = []
        for token, frame in zip(best.tokens.tolist(), best.timesteps.tolist(), strict=True):
            if token in (self._blank_id, self._sil_id):
                continue
            if not starts or self._piece(token).startswith(WORD_BOUNDARY):
                starts.append([])
            starts[-1].append(int(frame))
        tokens: list[int] = []
        frames: list[int] = []
        for i, word in enumerate(words):
            pieces = self._encode(word)
            word_frames = starts[i] if i < len(starts) and starts[i] else (frames[-1:] or [0])
            tokens += pieces
            frames += [word_frames[min(j, len(word_frames) - 1)] for j in range(len(pieces))]
        return Hypothesis(tokens=tuple(tokens), score=float(best.score), timestamps=tuple(frames))

    def nbest(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[str]]:
        """Like ``__call__``, but up to ``cfg.nbest`` distinct transcripts per utterance, best first."""
        return [[text for text, _ in scored] for scored in self.scored_nbest(log_probs, lengths)]

    def scored_nbest(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[tuple[str, float]]]:
        """``nbest`` with each transcript's search score (CTC path log-prob, weighted LM and word scores), best
        first: what attention rescoring of the lexicon's n-best (``usmkit.decoding.rescoring``) combines."""
        if log_probs.dim() != 3 or lengths.shape != log_probs.shape[:1]:
            raise ValueError(
                f"need log_probs (B, T, V) and lengths (B,), got {tuple(log_probs.shape)} and {tuple(lengths.shape)}"
            )
        emissions = log_probs.detach().float().cpu().contiguous()
        results = self._decoder(emissions, lengths.detach().cpu().to(torch.int32))
        out = []
        for hyps in results:
            scored: dict[str, float] = {}  # alignments of the same words count once, at their best score
            for hyp in hyps:
                scored.setdefault(" ".join(w for w in hyp.words if w != UNK_WORD), float(hyp.score))
            out.append(list(scored.items()))
        return out
