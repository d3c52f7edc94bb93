"""AN4 text only: the training transcripts plus new sentences in AN4's styles, for MOST text injection.

Writes ``{out}/an4_text_only.jsonl.gz``, one ``{"text": ..., "language": "en"}`` per line: every
training transcript once (one line per training supervision, in manifest order), then ``count``
generated sentences.

Reads only ``{out}/an4_supervisions_train.jsonl.gz`` (written by ``python -m usmkit.cli.prepare an4
out=...``) and the English word list of the installed ``wordfreq`` package. It never reads the dev or
test supervisions, the corpus transcriptions, nor ``etc/an4.dic``/``etc/an4.ug.lm`` (built from the
whole corpus, test vocabulary included): it is not even told where the corpus is.

A generated sentence takes the shape of a random training transcript (so the styles come in AN4's
proportions) with new content. The shape keeps the transcript's other words (``enter``, ``rubout``,
``erase``, ``yes``, ``hundred``, ``and a half``, ...) and turns the rest into slots:

- a run of two or more digit words (zip codes, phone numbers) -> as many random digits, zero said
  as the run said it (``oh`` or ``zero``; either when the run had none);
- any other number word -> a random word of its kind (``nine eighty nine`` -> ``four twenty six``,
  ``august sixteenth nineteen sixty five`` -> ``june thirteenth fourteen forty two``);
- spelled letters that form a word (a whole transcript of letters, or letters that spell a word of
  the list) -> a random word of the list with as many letters, spelled (two words when few have that
  length); a spelled month -> a random month, spelled;
- other letters (``rubout u g a m``) -> as many random letters.

>>> shape = sentence_shape("rubout u g a m thirty nine", vocabulary=frozenset())
>>> [(s.kind, s.value, s.length) for s in shape]
[('word', 'rubout', 0), ('letters', '', 4), ('class', 'tens', 0), ('class', 'digit', 0)]

CLI: ``python -m usmkit.cli.prepare an4_text out=data/an4 [count=20000] [seed=0]``
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from usmkit.data.corpora.an4 import CORPUS, normalize_an4
from usmkit.data.corpora.common import RecipeError
from usmkit.data.manifests import manifest_path, read_dicts, text_only_path, write_jsonl
from usmkit.data.validate import BadInputError

VOCABULARY_SIZE = 50000  # wordfreq.top_n_list('en', N) before keeping alphabetic words
MIN_WORDS_OF_LENGTH = 100  # fewer words of a length than this: spell two shorter words instead
_MONTHS = "january february march april may june july august september october november december".split()
CLASS_WORDS: dict[str, tuple[str, ...]] = {
    "digit": tuple("one two three four five six seven eight nine".split()),
    "zero": ("oh", "zero"),
    "teen": tuple("ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()),
    "tens": tuple("twenty thirty forty fifty sixty seventy eighty ninety".split()),
    "ordinal": tuple("first second third fourth fifth sixth seventh eighth ninth".split()),
    "ordinal_teen": tuple(
        "tenth eleventh twelfth thirteenth fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth".split()
    ),
    "ordinal_tens": tuple("twentieth thirtieth fortieth fiftieth sixtieth seventieth eightieth ninetieth".split()),
    "month": tuple(_MONTHS),
    "month_abbr": tuple(m[:3] for m in _MONTHS),  # spelled only: "f e b"
}
WORD_CLASS = {w: c for c, words in CLASS_WORDS.items() if c != "month_abbr" for w in words}
_NORMALIZED = re.compile(r"[a-z']+(?: [a-z']+)*")


@dataclass(frozen=True)
class Slot:
    """One part of a sentence shape: ``word`` (``value`` said as is), ``class`` (a random word of
    ``CLASS_WORDS[value]``), ``digits`` (``length`` random digit words, zero said as ``value`` or
    either), ``letters`` (``length`` random letters), ``spelled`` (a random word of ``CLASS_WORDS[value]``,
    or of the word list with ``length`` letters when ``value`` is empty, spelled letter by letter)."""

    kind: str
    value: str = ""
    length: int = 0


def english_words(n: int = VOCABULARY_SIZE) -> list[str]:
    """The alphabetic ASCII words among wordfreq's ``n`` most frequent English words, most frequent first."""
    import wordfreq

    return [w for w in wordfreq.top_n_list("en", n) if w.isascii() and w.isalpha()]


def _letters_slot(letters: str, whole: bool, vocabulary: frozenset[str]) -> Slot:
    for kind in ("month", "month_abbr"):
        if letters in CLASS_WORDS[kind]:
            return Slot("spelled", kind)
    if whole or (len(letters) >= 3 and letters in vocabulary):
        return Slot("spelled", length=len(letters))
    return Slot("letters", length=len(letters))


def sentence_shape(text: str, vocabulary: frozenset[str]) -> tuple[Slot, ...]:
    """The shape of a normalized transcript (see the module docstring); ``vocabulary`` tells which
    letter runs spell a word."""
    words = text.split()

    def is_letter(i: int) -> bool:  # "a" of "and a half" is a word, not a spelled letter
        return i < len(words) and len(words[i]) == 1 and not (words[i] == "a" and words[i + 1 : i + 2] == ["half"])

    def is_digit(i: int) -> bool:
        return i < len(words) and WORD_CLASS.get(words[i]) in ("digit", "zero")

    slots: list[Slot] = []
    i = 0
    while i < len(words):
        j = i + 1
        if is_letter(i):
            while is_letter(j):
                j += 1
            slots.append(_letters_slot("".join(words[i:j]), whole=j - i == len(words), vocabulary=vocabulary))
        elif is_digit(i) and is_digit(i + 1) and not (i and WORD_CLASS.get(words[i - 1]) == "tens"):
            while is_digit(j):
                j += 1
            zeros = [w for w in words[i:j] if WORD_CLASS[w] == "zero"]
            slots.append(Slot("digits", zeros[0] if zeros else "", j - i))
        elif words[i] in WORD_CLASS:  # "fifty six oh five": the six belongs to fifty
            slots.append(Slot("class", WORD_CLASS[words[i]]))
        else:
            slots.append(Slot("word", words[i]))
        i = j
    return tuple(slots)


def spelled_word(length: int, by_length: dict[int, list[str]], rng: random.Random) -> str:
    """A random word of ``length`` letters, or two words together when fewer than
    ``MIN_WORDS_OF_LENGTH`` have that length (``eastendavenue``)."""
    words = by_length.get(length, [])
    if len(words) >= MIN_WORDS_OF_LENGTH or (words and length < 6):
        return rng.choice(words)
    if length < 6:  # a word list without words this short
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(length))
    first = rng.randint(3, length - 3)
    return spelled_word(first, by_length, rng) + spelled_word(length - first, by_length, rng)


def fill(shape: Sequence[Slot], by_length: dict[int, list[str]], rng: random.Random) -> str:
    """A new sentence of this shape."""
    out: list[str] = []
    for slot in shape:
        if slot.kind == "word":
            out.append(slot.value)
        elif slot.kind == "class":
            out.append(rng.choice(CLASS_WORDS[slot.value]))
        elif slot.kind == "digits":
            zero = slot.value or rng.choice(CLASS_WORDS["zero"])
            digits = [rng.randrange(10) for _ in range(slot.length)]
            out.extend(CLASS_WORDS["digit"][d - 1] if d else zero for d in digits)
        elif slot.kind == "letters":
            out.extend(rng.choice(string.ascii_lowercase) for _ in range(slot.length))
        else:
            word = rng.choice(CLASS_WORDS[slot.value]) if slot.value else spelled_word(slot.length, by_length, rng)
            out.extend(word)
    return " ".join(out)


def generate_sentences(train_texts: Sequence[str], count: int, seed: int, words: Sequence[str]) -> list[str]:
    """``count`` sentences, each the shape of a random training transcript filled with new content
    (letters, digits, number words, spelled ``words``); the same arguments give the same sentences."""
    if count < 0:
        raise RecipeError(f"count must be >= 0, got {count}")
    by_length: dict[int, list[str]] = {}
    for w in words:
        by_length.setdefault(len(w), []).append(w)
    vocabulary = frozenset(words)
    shapes = [sentence_shape(t, vocabulary) for t in train_texts]
    rng = random.Random(seed)
    return [fill(rng.choice(shapes), by_length, rng) for _ in range(count)]


def read_train_transcripts(out_dir: Path) -> list[str]:
    """The normalized transcripts of ``{out_dir}/an4_supervisions_train.jsonl.gz``, in file order."""
    path = manifest_path(out_dir, CORPUS, "supervisions", "train")
    rebuild = f"rebuild it with `python -m usmkit.cli.prepare an4 out={out_dir}`"
    if not path.is_file():
        raise FileNotFoundError(
            f"no AN4 training supervisions at {path}; run `python -m usmkit.cli.prepare an4 out={out_dir}` first"
        )
    texts = []
    for line, record in enumerate(read_dicts(path), start=1):
        raw = record.get("text") if isinstance(record, dict) else None
        text = normalize_an4(raw) if isinstance(raw, str) else ""
        if not _NORMALIZED.fullmatch(text):
            where = f"{path}, line {line}"
            raise BadInputError("bad supervision", where, f"expected a transcript of a-z words, got {raw!r}", rebuild)
        texts.append(text)
    if not texts:
        raise BadInputError("empty manifest", str(path), "it holds no supervisions", hint=rebuild)
    return texts


def prepare_an4_text(out_dir: str | Path, count: int = 20000, seed: int = 0) -> tuple[list[str], list[str]]:
    """Write ``{out_dir}/an4_text_only.jsonl.gz`` (train transcripts, then ``count`` generated sentences);
    returns the two lists."""
    out_dir = Path(out_dir)
    train_texts = read_train_transcripts(out_dir)
    generated = generate_sentences(train_texts, count, seed, english_words())
    write_jsonl(({"text": t, "language": "en"} for t in [*train_texts, *generated]), text_only_path(out_dir, CORPUS))
    return train_texts, generated


@dataclass(frozen=True)
class An4TextArgs:
    out: Path = Path("data/an4")
    count: int = 20000
    seed: int = 0


USAGE = """\
usage: python -m usmkit.cli.prepare an4_text [key=value ...]

  out=PATH     AN4 manifest directory (default data/an4): reads an4_supervisions_train.jsonl.gz there,
               writes an4_text_only.jsonl.gz
  count=N      generated sentences after the training transcripts (default 20000)
  seed=S       seed of the generated sentences (default 0)
"""


def run(args: An4TextArgs) -> None:
    """``python -m usmkit.cli.prepare an4_text key=value ...`` (``USAGE``)."""
    train_texts, generated = prepare_an4_text(args.out, count=args.count, seed=args.seed)
    distinct = len({w for t in [*train_texts, *generated] for w in t.split()})
    print(
        f"an4 text only: {len(train_texts)} train transcripts + {len(generated)} generated sentences, "
        f"{distinct} distinct words -> {text_only_path(args.out, CORPUS)}"
    )


ARGS = An4TextArgs
