"""Bad input: each case raises naming the file (on_bad="error") or is skipped and counted (on_bad="skip")."""

from __future__ import annotations

import gzip
import json
import logging
import os
from pathlib import Path

import pytest
from lhotse import CutSet, MonoCut, Recording
from lhotse.serialization import deserialize_item

from usmkit.data.loader import prepare_cuts
from usmkit.data.manifests import read_cuts, write_manifest
from usmkit.data.validate import BadInputError, read_kaldi_text, read_transcript, validate_cuts


@pytest.fixture
def good(tmp_path, wav_writer, cut_builder) -> list[MonoCut]:
    return [
        cut_builder(wav_writer(tmp_path / f"ok{i}.wav", 0.5, seed=i), f"ok{i}", "a fine transcript") for i in range(3)
    ]


def _corrupt(tmp_path, wav_writer, cut_builder) -> MonoCut:
    cut = cut_builder(wav_writer(tmp_path / "noise.wav", 0.5), "corrupt", "hello")
    Path(cut.recording.sources[0].source).write_bytes(os.urandom(4000))  # not a format anyone knows
    return cut


def _truncated(tmp_path, wav_writer, cut_builder) -> MonoCut:
    cut = cut_builder(wav_writer(tmp_path / "cut_short.wav", 1.0), "truncated", "hello")
    path = Path(cut.recording.sources[0].source)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # a copy that stopped half-way
    return cut


def _empty_file(tmp_path, wav_writer, cut_builder) -> MonoCut:
    cut = cut_builder(wav_writer(tmp_path / "zero.wav", 0.5), "zero-bytes", "hello")
    Path(cut.recording.sources[0].source).write_bytes(b"")
    return cut


def _missing(tmp_path, wav_writer, cut_builder) -> MonoCut:
    cut = cut_builder(wav_writer(tmp_path / "gone.wav", 0.5), "missing", "hello")
    Path(cut.recording.sources[0].source).unlink()
    return cut


def _wrong_rate(tmp_path, wav_writer, cut_builder) -> MonoCut:
    """An 8 kHz file whose manifest entry claims 16 kHz."""
    cut = cut_builder(wav_writer(tmp_path / "rate8k.wav", 1.0, sr=8000), "wrong-rate", "hello")
    rec = cut.recording
    lie = Recording(id=rec.id, sources=rec.sources, sampling_rate=16000, num_samples=16000, duration=1.0)
    return MonoCut(id=cut.id, start=0, duration=1.0, channel=0, recording=lie, supervisions=cut.supervisions)


def _no_transcript(tmp_path, wav_writer, cut_builder) -> MonoCut:
    return cut_builder(wav_writer(tmp_path / "untranscribed.wav", 0.5), "no-text", None)


def _empty_transcript(tmp_path, wav_writer, cut_builder) -> MonoCut:
    return cut_builder(wav_writer(tmp_path / "blank.wav", 0.5), "empty-text", "   ")


def _non_utf8_transcript(tmp_path, wav_writer, cut_builder) -> MonoCut:
    latin1 = "caf\xe9 cr\xe8me".encode("latin-1").decode("utf-8", errors="surrogateescape")
    return cut_builder(wav_writer(tmp_path / "latin.wav", 0.5), "latin1-text", latin1)


CASES = {
    # case: (builder, kind in the message, name the message must carry)
    "corrupt": (_corrupt, "corrupt audio", "noise.wav"),
    "truncated": (_truncated, "truncated audio", "cut_short.wav"),
    "zero_bytes": (_empty_file, "empty file", "zero.wav"),
    "missing_file": (_missing, "missing file", "gone.wav"),
    "wrong_rate": (_wrong_rate, "sample-rate mismatch", "rate8k.wav"),
    "no_transcript": (_no_transcript, "missing transcript", "no-text"),
    "empty_transcript": (_empty_transcript, "empty transcript", "empty-text"),
    "non_utf8_transcript": (_non_utf8_transcript, "non-UTF-8 transcript", "latin1-text"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_cut_raises_naming_it(case, good, tmp_path, wav_writer, cut_builder):
    build, kind, name = CASES[case]
    cuts = CutSet.from_cuts([*good, build(tmp_path, wav_writer, cut_builder)])
    with pytest.raises(BadInputError) as err:
        validate_cuts(cuts, require_text=True, on_bad="error")
    msg = str(err.value)
    assert msg.startswith(kind) and name in msg and "on_bad_input=skip" in msg, msg
    assert err.value.kind == kind


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_cut_is_skipped_and_counted(case, good, tmp_path, wav_writer, cut_builder, caplog):
    build, kind, name = CASES[case]
    bad = build(tmp_path, wav_writer, cut_builder)
    with caplog.at_level(logging.WARNING, logger="usmkit.data.validate"):
        kept, report = validate_cuts(CutSet.from_cuts([*good, bad]), require_text=True, on_bad="skip")
    assert sorted(kept.ids) == sorted(c.id for c in good)
    assert report.total == 4 and report.num_skipped == 1 and report.problems[0].kind == kind
    line = report.summary()
    assert line.startswith(f"skipped 1 of 4 cuts: 1 {kind} (") and name in line
    assert line in caplog.text, "a skip is never silent"


def test_summary_lists_every_kind_once(good, tmp_path, wav_writer, cut_builder):
    bad = [b(tmp_path, wav_writer, cut_builder) for b in (_missing, _empty_transcript, _corrupt, _empty_file)]
    kept, report = validate_cuts(CutSet.from_cuts([*good, *bad]), require_text=True, on_bad="skip")
    assert len(kept) == 3
    assert report.summary() == (
        "skipped 4 of 7 cuts: 1 missing file (gone.wav), 1 empty transcript (empty-text), "
        "1 corrupt audio (noise.wav), 1 empty file (zero.wav)"
    )


def test_audio_only_cuts_pass_without_text_and_8khz_is_resampled(tmp_path, wav_writer, cut_builder):
    audio_only = cut_builder(wav_writer(tmp_path / "pool.wav", 0.5), "pool", None)
    narrowband = cut_builder(wav_writer(tmp_path / "tel.wav", 0.5, sr=8000), "tel", "hello")
    kept, report = validate_cuts(CutSet.from_cuts([audio_only, narrowband]), require_text=False, on_bad="error")
    assert report.num_skipped == 0 and [c.sampling_rate for c in kept] == [16000, 16000]
    with pytest.raises(BadInputError, match="missing transcript: pool"):
        validate_cuts(CutSet.from_cuts([audio_only]), require_text=True)


def test_prepare_cuts_follows_the_config_switch(good, tmp_path, wav_writer, cut_builder, build_config):
    cuts = CutSet.from_cuts([*good, _missing(tmp_path, wav_writer, cut_builder)])
    with pytest.raises(BadInputError, match="gone.wav"):
        prepare_cuts(cuts, build_config(on_bad_input="error"), split="train", require_text=True)
    kept, report = prepare_cuts(cuts, build_config(on_bad_input="skip"), split="train", require_text=True)
    assert len(kept) == 3 and report.num_skipped == 1


def test_transcript_files_with_invalid_bytes_name_file_and_line(tmp_path):
    kaldi = tmp_path / "text"
    kaldi.write_bytes(b"utt1 hello world\nutt2 caf\xe9 latin-1\nutt3\nutt4 fine again\n")
    with pytest.raises(BadInputError, match=r"non-UTF-8 transcript: .*text:2: byte 0xe9 \(byte 9 of the line\)"):
        read_kaldi_text(kaldi)
    texts, report = read_kaldi_text(kaldi, on_bad="skip")
    assert texts == {"utt1": "hello world", "utt4": "fine again"}
    assert report.summary() == "skipped 2 of 4 lines: 1 non-UTF-8 transcript (text:2), 1 empty transcript (text:3)"

    txt = tmp_path / "utt9.txt"
    txt.write_bytes("first line\nstra\u00dfe ".encode() + b"\xff\xfe tail\n")
    with pytest.raises(BadInputError, match=r"utt9.txt:2: byte 0xff \(byte 9 of the line\)"):
        read_transcript(txt)
    ok = tmp_path / "ok.txt"
    ok.write_text("gr\u00fc\u00dfe\n", encoding="utf-8")
    assert read_transcript(ok) == "gr\u00fc\u00dfe"


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("start", float("nan"), "its start is nan"),
        ("duration", float("inf"), "its duration is inf"),
        ("supervision", float("nan"), "its supervision 'ok0' start is nan"),
        ("start", -1.0, "it starts at -1.0 s"),
    ],
)
def test_a_cut_with_bad_timing_is_refused_naming_the_manifest_and_the_cut(good, tmp_path, field, value, says):
    """A ``start: NaN`` in a manifest failed training far away (``AssertionError`` in lhotse): reading the
    manifest names it and the cut, and ``validate_cuts`` refuses such a cut built in memory."""
    path = write_manifest(CutSet.from_cuts(good), tmp_path / "x_cuts_train.jsonl.gz")
    rows = [json.loads(line) for line in gzip.open(path, "rt")]
    if field == "supervision":
        rows[0]["supervisions"][0]["start"] = value
    else:
        rows[0][field] = value
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    for lazy in (False, True):
        with pytest.raises(BadInputError, match=rf"^bad timing: cut ok0 in {path}: {says}") as err:
            list(read_cuts(path, lazy=lazy))
        assert "\n" not in str(err.value)
    with pytest.raises(BadInputError, match=rf"^bad timing: cut ok0 in split train: {says}"):
        validate_cuts(CutSet.from_cuts([deserialize_item(rows[0])]), require_text=True, split="train")
