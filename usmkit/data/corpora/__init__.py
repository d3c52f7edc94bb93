"""Corpus recipes: turn a corpus on disk into lhotse manifests named the usmkit way.

Every recipe writes ``{out}/{corpus}_{recordings,supervisions,cuts}_{split}.jsonl.gz``
(see :func:`usmkit.data.manifests.manifest_path`). This module holds the few helpers the recipes
share: the per-split summary table; ``python -m usmkit.cli.prepare CORPUS`` runs a recipe (transcripts are normalized by
``usmkit.metrics.normalize_text``, as scoring does).
Bad input (missing, corrupt, untranscribed files; ``on_error=fail|skip``, every left-out item counted)
and writing a split's manifests are in ``usmkit.data.corpora.common``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


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
