"""Word-timed transcripts as SubRip subtitles (``.srt``) and NIST CTM lines.

A record is a line of batch transcription's JSONL: ``{"id", "text", "words": [{"word", "start", "end",
"confidence"}, ...], ...}`` with times in seconds.

SRT cues group consecutive words: a cue ends before a pause of ``MAX_GAP_S``, or before it would run
past ``MAX_CUE_S`` seconds or ``MAX_CUE_CHARS`` characters (two subtitle lines of 42).
CTM: ``<id> 1 <start> <duration> <word> <confidence>``, one line per word, times in seconds (the
channel is always 1; whitespace in an id or a word becomes ``_`` so the fields stay whitespace-separated).
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_GAP_S = 0.8
MAX_CUE_S = 6.0
MAX_CUE_CHARS = 84


def srt_time(seconds: float) -> str:
    """``3725.5`` -> ``01:02:05,500``."""
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d},{ms:03d}"


def cues(words: list[dict]) -> list[tuple[float, float, str]]:
    """(start, end, text) of the cues of ``words`` (see the module docstring).

    >>> cues([{"word": "a", "start": 0.0, "end": 0.2}, {"word": "b", "start": 0.3, "end": 0.5},
    ...       {"word": "c", "start": 2.0, "end": 2.4}])
    [(0.0, 0.5, 'a b'), (2.0, 2.4, 'c')]
    """
    out: list[tuple[float, float, str]] = []
    current: list[dict] = []
    for w in words:
        if current:
            text = " ".join(x["word"] for x in current) + " " + w["word"]
            if (
                w["start"] - current[-1]["end"] > MAX_GAP_S
                or w["end"] - current[0]["start"] > MAX_CUE_S
                or len(text) > MAX_CUE_CHARS
            ):
                out.append(_cue(current))
                current = []
        current.append(w)
    if current:
        out.append(_cue(current))
    return out


def _cue(words: list[dict]) -> tuple[float, float, str]:
    return words[0]["start"], words[-1]["end"], " ".join(w["word"] for w in words)


def srt(record: dict) -> str:
    """The SubRip text of one record (empty when it has no word)."""
    blocks = [
        f"{i}\n{srt_time(start)} --> {srt_time(end)}\n{text}\n"
        for i, (start, end, text) in enumerate(cues(record["words"]), 1)
    ]
    return "\n".join(blocks)


def ctm_lines(records: Iterable[dict]) -> Iterable[str]:
    """The CTM lines of every word of ``records``, in order."""
    for record in records:
        utt = "_".join(record["id"].split())
        for w in record["words"]:
            word = "_".join(w["word"].split())
            yield f"{utt} 1 {w['start']:.3f} {w['end'] - w['start']:.3f} {word} {w['confidence']:.4f}\n"
