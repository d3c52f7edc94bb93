"""usmkit.training.curves: a metric's series from a run's metrics.jsonl."""

from __future__ import annotations

import json

from usmkit.training.curves import metric_series


def test_metric_series_keeps_the_rows_holding_the_key_in_order(tmp_path):
    rows = [{"step": 10, "train/loss": 3.0}, {"step": 20, "dev/dev_cer": 0.5}, {"step": 40, "dev/dev_cer": 0.25}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")  # a blank last line, as after a kill
    assert metric_series(path, "dev/dev_cer") == [(20, 0.5), (40, 0.25)]
    assert metric_series(path, "dev/dev_wer") == []
