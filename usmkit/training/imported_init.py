"""``init_from`` of an imported encoder (``usmkit.cli.import_encoder``'s folder): the run's encoder must be the one
imported, up to what fine-tuning may change (the chunk mask, attention implementation, dropout, conv impl).

Checked before any data is read, so a run that forgot ``model=w2v_bert_2`` is told so in one line instead of a
list of mismatched tensor shapes after data preparation.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from usmkit.config import ConfigError
from usmkit.models.config import ConformerConfig

RECORD = "imported.json"  # written by usmkit.cli.import_encoder
TUNABLE = ("chunk_size", "left_chunks", "attention_impl", "conv_impl", "dropout", "zero_init_residual")


def check_imported_fit(init_from: str | Path, encoder_cfg: ConformerConfig) -> None:
    """``ConfigError`` where ``init_from`` is an imported encoder's folder whose encoder ``encoder_cfg`` is not."""
    record_path = Path(init_from) / RECORD
    if not record_path.is_file():
        return
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        imported = record["encoder"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{record_path} is damaged ({type(e).__name__}: {e}); import the encoder again") from None
    differs = [
        f"{f.name}={getattr(encoder_cfg, f.name)!r} (imported: {imported.get(f.name)!r})"
        for f in dataclasses.fields(encoder_cfg)
        if f.name not in TUNABLE and getattr(encoder_cfg, f.name) != imported.get(f.name, f.default)
    ]
    if differs:
        raise ConfigError(
            f"init_from={init_from} is an imported {record.get('kind', 'encoder')} whose encoder this run's model "
            f"section does not build ({'; '.join(differs[:4])}{' ...' if len(differs) > 4 else ''}); train it with: "
            f"{record.get('train', 'model=w2v_bert_2')}"
        )
