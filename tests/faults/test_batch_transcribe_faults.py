"""Faults of batch transcription (usmkit.inference.batch_transcribe)."""

from __future__ import annotations

import json

import pytest
from fault_helpers import (
    UNUSABLE_RATES,
    run_module,
    wav_declaring,
)


def test_unusable_sample_rates_are_named_by_batch_transcription_and_corpus_validation(ctc_ckpt, tmp_path):
    """Batch transcription called the 2 GHz file "too short" and planned the 1 Hz one as 16000 s of audio;
    corpus validation passed all three into training. Now each is named (the skipped files' summary; the
    44101 Hz file's reason is logged as transcribe's), and validation names the file and its rate."""
    from lhotse import CutSet, Recording

    from usmkit.data.validate import BadInputError, validate_cuts

    inputs = tmp_path / "in"
    inputs.mkdir()
    for rate in (*UNUSABLE_RATES, 16000, 44100):
        wav_declaring(inputs / f"r{rate}.wav", rate)
    out = tmp_path / "out.jsonl"
    proc = run_module("usmkit.cli.transcribe_batch", f"checkpoint={ctc_ckpt}", f"inputs={inputs}", f"out={out}",
                "num_workers=0", cwd=tmp_path)  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert "2 unusable sample rate (r1.wav, r2000000000.wav), 1 unreadable audio (r44101.wav)" in err, err[-3000:]
    assert sorted(json.loads(line)["id"] for line in out.read_text().splitlines()) == ["r16000.wav", "r44100.wav"]

    for rate, words in UNUSABLE_RATES.items():
        cuts = CutSet.from_cuts([Recording.from_file(inputs / f"r{rate}.wav").to_cut()])
        with pytest.raises(BadInputError, match=f"unusable sample rate.*r{rate}.wav.*{words}"):
            validate_cuts(cuts, require_text=False)
    good = CutSet.from_cuts([Recording.from_file(inputs / f"r{r}.wav").to_cut() for r in (16000, 44100)])
    assert len(validate_cuts(good, require_text=False)[0]) == 2
