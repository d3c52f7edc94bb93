"""``init_from`` of an imported encoder: a run whose model section builds another encoder is told the command."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import pytest

from usmkit.config import ConfigError
from usmkit.models.presets import tiny, w2v_bert_2
from usmkit.training.imported_init import check_imported_fit


def test_imported_encoder_needs_its_model_section(tmp_path):
    imported = w2v_bert_2(d_model=32, num_layers=2, num_heads=4)
    (tmp_path / "imported.json").write_text(
        json.dumps({"kind": "w2v-bert-2.0", "encoder": dataclasses.asdict(imported), "train": "TRAIN-COMMAND"})
    )
    check_imported_fit(tmp_path, imported)
    check_imported_fit(tmp_path, replace(imported, chunk_size=8, left_chunks=4, dropout=0.1))  # fine-tuning's own
    with pytest.raises(ConfigError, match=r"d_model=128 \(imported: 32\).*train it with: TRAIN-COMMAND"):
        check_imported_fit(tmp_path, tiny())
    check_imported_fit(tmp_path / "elsewhere", tiny())  # not an import: nothing to check
    (tmp_path / "imported.json").write_text("{")
    with pytest.raises(ConfigError, match="imported.json is damaged"):
        check_imported_fit(tmp_path, imported)
