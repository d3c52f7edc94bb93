"""AN4 text only (``usmkit.data.corpora.an4_text``) on a tiny fake AN4 manifest directory in tmp_path."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from usmkit.cli.prepare import main as prepare_main
from usmkit.data.corpora.an4_text import CLASS_WORDS, sentence_shape

TRAIN = (
    "p i t t s b u r g h",
    "r o b e r t",
    "one five two one seven",
    "rubout u g a m thirty nine",
    "erase w f s o l eight four four",
    "enter six two five",
    "september twelfth nineteen fifty nine",
    "ten twelve sixty seven",
    "sixty three sixty four and a half",
    "o apostrophe h a r a",
    "fifty six oh five",
    "yes",
    "yes",
)
SENTINEL = "zqxsentinel"  # in the dev and test transcripts only
NORMALIZED = re.compile(r"[a-z']+(?: [a-z']+)*")
NUMBER_WORDS = {w for words in CLASS_WORDS.values() for w in words}


def write_supervisions(path: Path, texts: tuple[str, ...]) -> None:
    """Gzipped JSON lines like the AN4 recipe's supervisions manifest."""
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            record = {"id": f"an{i}-fash-b", "recording_id": f"an{i}-fash-b", "start": 0.0, "duration": 1.0}
            f.write(json.dumps({**record, "channel": 0, "text": text, "language": "en", "speaker": "fash"}) + "\n")


@pytest.fixture
def an4_out(tmp_path: Path) -> Path:
    out = tmp_path / "an4"
    out.mkdir()
    write_supervisions(out / "an4_supervisions_train.jsonl.gz", TRAIN)
    for split in ("dev", "test"):
        write_supervisions(out / f"an4_supervisions_{split}.jsonl.gz", (f"enter {SENTINEL} six", SENTINEL))
    return out


def run(out: Path, *args: str) -> list[str]:
    assert prepare_main(["an4_text", f"out={out}", *args]) == 0
    with gzip.open(out / "an4_text_only.jsonl.gz", "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    assert {r["language"] for r in records} == {"en"}
    return [r["text"] for r in records]


def test_writes_every_train_transcript_then_count_generated_lines(an4_out: Path, capsys) -> None:
    lines = run(an4_out, "count=300")
    assert lines[: len(TRAIN)] == list(TRAIN)
    assert len(lines) == len(TRAIN) + 300
    summary = capsys.readouterr().out.strip()
    assert "\n" not in summary and f"{len(TRAIN)} train transcripts + 300 generated" in summary


def test_same_seed_same_file_other_seed_other_file(an4_out: Path) -> None:
    first = run(an4_out, "count=200", "seed=3")
    assert run(an4_out, "count=200", "seed=3") == first
    assert run(an4_out, "count=200", "seed=4")[len(TRAIN) :] != first[len(TRAIN) :]


def test_lines_are_normalized_and_use_only_train_words_numbers_and_letters(an4_out: Path) -> None:
    lines = run(an4_out, "count=1000")
    train_words = {w for t in TRAIN for w in t.split()}
    for line in lines:
        assert NORMALIZED.fullmatch(line), line
        assert all(len(w) == 1 or w in train_words or w in NUMBER_WORDS for w in line.split()), line
    generated = lines[len(TRAIN) :]
    assert len(set(generated)) > 500  # new content, not copies of the training transcripts
    assert any(line.startswith("rubout ") for line in generated)


def test_never_reads_dev_or_test_transcripts(an4_out: Path) -> None:
    lines = run(an4_out, "count=2000")
    assert not any(SENTINEL in line for line in lines)


def test_sentence_shape_keeps_commands_and_makes_letters_digits_and_numbers_slots() -> None:
    shape = sentence_shape("rubout u g a m thirty nine", vocabulary=frozenset())
    assert [(s.kind, s.value, s.length) for s in shape] == [
        ("word", "rubout", 0),
        ("letters", "", 4),
        ("class", "tens", 0),
        ("class", "digit", 0),
    ]
    shape = sentence_shape("fifty six oh five and a half", vocabulary=frozenset())
    assert [(s.kind, s.value, s.length) for s in shape] == [
        ("class", "tens", 0),
        ("class", "digit", 0),
        ("digits", "oh", 2),
        ("word", "and", 0),
        ("word", "a", 0),
        ("word", "half", 0),
    ]
    shape = sentence_shape("b o x eight oh seven", vocabulary=frozenset({"box"}))
    assert [(s.kind, s.length) for s in shape] == [("spelled", 3), ("digits", 3)]
    assert [s.value for s in sentence_shape("f e b one two", vocabulary=frozenset())] == ["month_abbr", ""]


def test_missing_train_supervisions_is_one_error_line(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        prepare_main(["an4_text", f"out={tmp_path}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: ")
    assert "an4_supervisions_train.jsonl.gz" in err and "python -m usmkit.cli.prepare an4" in err


@pytest.mark.parametrize(
    ("train", "args", "expected"),
    [
        (b"not gzip at all", [], "unreadable manifest"),
        (("ENTER 5",), [], "bad supervision"),
        ((), [], "empty manifest"),
        (TRAIN, ["count=-1"], "count must be >= 0"),
    ],
)
def test_bad_input_is_one_error_line(an4_out: Path, capsys, train, args: list[str], expected: str) -> None:
    path = an4_out / "an4_supervisions_train.jsonl.gz"
    if isinstance(train, bytes):
        path.write_bytes(train)
    else:
        write_supervisions(path, train)
    with pytest.raises(SystemExit) as exc:
        prepare_main(["an4_text", f"out={an4_out}", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: ") and expected in err
