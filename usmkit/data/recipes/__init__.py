"""Corpus recipes: turn a corpus on disk into lhotse manifests named the usmkit way.

Every recipe writes ``{out}/{corpus}_{recordings,supervisions,cuts}_{split}.jsonl.gz``
(see :func:`usmkit.data.manifests.manifest_path`). This module holds the few helpers the recipes
share: the ``key=value`` command line, transcript normalization and the per-split summary table.
Bad input (missing, corrupt, untranscribed files; ``on_error=fail|skip``, every left-out item counted)
and writing a split's manifests are in ``usmkit.data.recipes.common``.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

_NON_WORD = re.compile(r"[^\w']+|_")
_APOSTROPHE = re.compile(r"'+")


def normalize_text(text: str, keep_apostrophes: bool = False) -> str:
    """Lowercase (NFC), turn punctuation into spaces, collapse whitespace; digits are kept as they are.

    >>> normalize_text("Hello, World!  It's  ME.")
    'hello world it s me'
    >>> normalize_text("It's", keep_apostrophes=True)
    "it's"
    """
    text = unicodedata.normalize("NFC", text).lower()
    text = _NON_WORD.sub(" ", text)
    if not keep_apostrophes:
        text = _APOSTROPHE.sub(" ", text)
    return " ".join(text.split())


def parse_key_value_args(config_cls: type[T], argv: Sequence[str], usage: str) -> T:
    """Parse ``key=value`` arguments into the dataclass ``config_cls`` (typed, validated).

    OmegaConf does the parsing and type checking (ints, bools, paths, unknown keys); the caller gets
    a plain dataclass instance, never a DictConfig. ``-h``/``--help`` prints ``usage`` and exits 0;
    a bad argument prints the error and the usage and exits 2.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if any(arg in ("-h", "--help", "help") for arg in argv):
        print(usage)
        raise SystemExit(0)
    malformed = [arg for arg in argv if "=" not in arg or arg.startswith("=")]
    if malformed:
        print(f"error: arguments must look like key=value, got {malformed}\n\n{usage}", file=sys.stderr)
        raise SystemExit(2)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(config_cls), OmegaConf.from_dotlist(list(argv)))
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        first_line = str(err).splitlines()[0]
        print(f"error: {first_line}\n\n{usage}", file=sys.stderr)
        raise SystemExit(2) from None


def split_rows(cut_sets: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per-split hours, utterances, speakers and languages of lhotse CutSets, for :func:`print_split_table`.

    Audio-only cuts (no supervisions) count by the ``speaker``/``language`` in their ``custom``."""
    rows = {}
    for split, cuts in cut_sets.items():
        speakers, languages = set(), set()
        for c in cuts:
            pairs = [(s.speaker, s.language) for s in c.supervisions]
            if not pairs and c.custom:
                pairs = [(c.custom.get("speaker"), c.custom.get("language"))]
            for speaker, language in pairs:
                speakers.add(speaker)
                languages.add(language)
        rows[split] = {
            "hours": sum(c.duration for c in cuts) / 3600,
            "utterances": len(cuts),
            "speakers": len(speakers),
            "languages": sorted(lang for lang in languages if lang),
        }
    return rows


def print_split_table(title: str, rows: Mapping[str, Mapping[str, Any]], footer: str | None = None) -> None:
    """Print a rich table: one row per split with hours, utterances, voices/speakers and languages.

    ``rows[split]`` has keys ``hours`` (float, or None for text), ``utterances`` (int), ``speakers`` (int) and
    ``languages`` (mapping language -> utterances, or a sequence of codes).
    """
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for name, justify in (("split", "left"), ("hours", "right"), ("utterances", "right")):
        table.add_column(name, justify=justify)
    table.add_column("voices/speakers", justify="right")
    table.add_column("languages", justify="left")
    for split, row in rows.items():
        languages = row.get("languages", ())
        langs = ", ".join(sorted(languages)) if languages else "-"
        table.add_row(
            split,
            "-" if row.get("hours") is None else f"{row['hours']:.3f}",
            str(row.get("utterances", 0)),
            str(row.get("speakers", "-")),
            langs,
        )
    console = Console()
    console.print(table)
    if footer:
        console.print(footer)
