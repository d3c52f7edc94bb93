"""Batch transcription (usmkit.inference.batch_transcribe, python -m usmkit.cli.transcribe_batch) on the tiny
``teacher`` (conftest.py) and the embedded corpus: the transcripts usmkit.cli.evaluate decodes, long files
as the whole-file forward, resume after a kill, two processes under torchrun, bad inputs."""

from __future__ import annotations

import doctest
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from usmkit.cli.transcribe_batch import main as cli_main
from usmkit.data.features import fbank_extractor
from usmkit.data.loader import split_loader
from usmkit.data.manifests import load_cuts, manifest_path
from usmkit.decoding.ctc_lexicon import LexiconConfig
from usmkit.inference import batch_inputs, batch_runner, subtitles, transcript_journal, word_alignment
from usmkit.inference.batch_inputs import AudioItem, LongUnit, plan_units
from usmkit.inference.batch_transcribe import BatchConfig, largest_batch, transcribe_batch
from usmkit.inference.batches import transcribe_batches
from usmkit.inference.evaluate import EvalConfig, build_word_decoder, load_for_eval
from usmkit.inference.lexicon_pool import lexicon_transcript
from usmkit.inference.transcript_journal import read_records
from usmkit.metrics import normalize_text
from usmkit.streaming.pipeline import load_model

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = Path(__file__).resolve().parents[2]
LEXICON = LexiconConfig(beam_size=20, word_score=10.0)  # an untrained model: words only when they are cheap


def _cfg(teacher, inputs, out, **kw) -> BatchConfig:
    return BatchConfig(
        checkpoint=str(teacher), inputs=str(inputs), out=str(out), device="cpu", num_workers=0, progress=False, **kw
    )


def _records(path) -> dict[str, dict]:
    records = list(read_records(Path(path)))
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)), "an id written twice"
    return {r["id"]: r for r in records}


def _evaluate_hypotheses(teacher, decode: str) -> dict[str, str]:
    """usmkit.cli.evaluate's hypotheses on the test split (its loader, batches and decoder)."""
    cfg = EvalConfig(checkpoint=str(teacher), device="cpu", decode=decode, lexicon=LEXICON)
    loaded = load_for_eval(cfg)
    words = build_word_decoder(cfg, loaded.train_cfg, loaded.tokenizer) if decode == "ctc_lexicon" else None
    loader, _ = split_loader(loaded.data, "test", tokenizer=loaded.tokenizer, stats=loaded.stats)
    records, _ = transcribe_batches(loaded.module, loader, loaded.tokenizer, mode=decode, word_decoder=words)
    return {r["id"]: r["hyp"] for r in records}


def _check_words(record: dict) -> None:
    """Words join to the text, lie inside the input in order, and the utterance's confidence is the
    frame-weighted mean of its words' (the definition in usmkit.inference.word_alignment)."""
    words = record["words"]
    assert " ".join(w["word"] for w in words) == record["text"]
    ends = [0.0] + [w["end"] for w in words]
    for w, prev_end in zip(words, ends, strict=False):
        assert prev_end - 1e-6 <= w["start"] < w["end"] <= record["duration"] + 0.1
        assert 0.0 <= w["confidence"] <= 1.0
    assert 0.0 <= record["confidence"] <= 1.0


@pytest.fixture(scope="module")
def test_manifest(synth_corpus) -> Path:
    return manifest_path(synth_corpus, "synth", "cuts", "test")


@pytest.fixture(scope="module")
def greedy_run(teacher, test_manifest, tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("greedy") / "out.jsonl"
    summary = transcribe_batch(_cfg(teacher, test_manifest, out, batch_seconds=20.0))
    assert summary.transcribed == summary.records == 12 and not summary.report.problems
    return _records(out)


def test_greedy_transcripts_are_evaluates_hypotheses(teacher, greedy_run):
    expected = _evaluate_hypotheses(teacher, "ctc_greedy")
    assert set(greedy_run) == set(expected)
    assert {k: normalize_text(r["text"]) for k, r in greedy_run.items()} == expected
    assert sum(len(r["words"]) for r in greedy_run.values()) >= 12  # the transcripts have words to compare
    for record in greedy_run.values():
        _check_words(record)
    confidences = [r["confidence"] for r in greedy_run.values()]
    assert max(confidences) - min(confidences) > 0.02  # they differ between utterances


def test_lexicon_transcripts_are_evaluates_hypotheses_with_a_worker_process(teacher, test_manifest, tmp_path):
    out = tmp_path / "lex.jsonl"
    transcribe_batch(_cfg(teacher, test_manifest, out, decode="ctc_lexicon", lexicon=LEXICON, lexicon_workers=1))
    records = _records(out)
    expected = _evaluate_hypotheses(teacher, "ctc_lexicon")
    assert {k: r["text"] for k, r in records.items()} == expected
    assert any(r["words"] for r in records.values())
    for record in records.values():
        _check_words(record)


def test_features_on_the_device_and_a_compiled_encoder_give_the_same_transcripts(
    teacher, test_manifest, greedy_run, tmp_path, aot_eager
):
    out = tmp_path / "out.jsonl"
    transcribe_batch(_cfg(teacher, test_manifest, out, features="device", compile=True, batch_seconds=20.0))
    records = _records(out)
    assert {k: r["text"] for k, r in records.items()} == {k: r["text"] for k, r in greedy_run.items()}
    for k, r in records.items():
        assert r["confidence"] == pytest.approx(greedy_run[k]["confidence"], abs=1e-3)


@pytest.mark.parametrize("features", ["workers", "device"])
def test_a_compiled_encoder_compiles_in_the_warm_up_only(
    teacher, test_manifest, tmp_path, aot_eager, monkeypatch, features
):
    """Every graph is made before the clock starts: batches of other shapes, and features made in the workers
    (ordinary tensors, where the warm-up's are inference tensors), reuse the warm-up's graphs."""
    from torch._dynamo.utils import counters

    after_warm_up = []
    warm_up = batch_runner.DeviceRunner.warm_up

    def counted(self, *args):
        warm_up(self, *args)
        after_warm_up.append(counters["stats"]["unique_graphs"])

    monkeypatch.setattr(batch_runner.DeviceRunner, "warm_up", counted)
    out = tmp_path / "out.jsonl"
    transcribe_batch(_cfg(teacher, test_manifest, out, features=features, compile=True, batch_seconds=10.0))
    assert len(_records(out)) > 3 and after_warm_up[0] > 0
    assert counters["stats"]["unique_graphs"] == after_warm_up[0]


def test_the_warm_up_shape_is_the_batch_with_the_most_padded_audio():
    item = lambda i, d: AudioItem(f"f{i}", f"f{i}.flac", d)  # noqa: E731
    units = [
        batch_inputs.BatchUnit((item(0, 9.0), item(1, 8.0))),  # 2 rows x 9 s = 18 s
        batch_inputs.BatchUnit(tuple(item(2 + i, 4.0) for i in range(5))),  # 5 x 4 s = 20 s
        LongUnit(item(9, 3600.0)),  # one row of at most long_seconds
    ]
    assert largest_batch(units, long_seconds=15.0) == (5, 4.0)
    assert largest_batch(units, long_seconds=60.0) == (1, 60.0)


def test_a_folder_in_loader_workers_with_srt_and_ctm(teacher, synth_corpus, greedy_run, tmp_path):
    """The test split's audio folder (ids: file names), two DataLoader workers, SRT per file and one CTM."""
    out, srt_dir, ctm = tmp_path / "out.jsonl", tmp_path / "srt", tmp_path / "all.ctm"
    cfg = replace(
        _cfg(teacher, synth_corpus / "audio" / "test", out), num_workers=2, srt_dir=str(srt_dir), ctm=str(ctm)
    )
    transcribe_batch(cfg)
    records = _records(out)
    cuts = load_cuts(synth_corpus, "test")
    by_file = {Path(c.recording.sources[0].source).name: c.id for c in cuts}
    assert {by_file[k]: r["text"] for k, r in records.items()} == {k: r["text"] for k, r in greedy_run.items()}
    assert sorted(p.name for p in srt_dir.iterdir()) == sorted(k.replace(".flac", ".srt") for k in records)
    some = next(r for r in records.values() if r["words"])
    text = (srt_dir / some["id"].replace(".flac", ".srt")).read_text()
    assert text.startswith("1\n00:00:") and some["words"][0]["word"] in text
    lines = ctm.read_text().splitlines()
    assert len(lines) == sum(len(r["words"]) for r in records.values())
    first = some["words"][0]
    assert f"{some['id']} 1 {first['start']:.3f} {first['end'] - first['start']:.3f} {first['word']}" in ctm.read_text()


# ------------------------------------------------------------------------------------------------ long files
@pytest.fixture(scope="module")
def long_file(synth_corpus, tmp_path_factory) -> Path:
    """About 45 s: the test split's utterances one after the other."""
    cuts = load_cuts(synth_corpus, "test")
    audio = np.concatenate([c.load_audio()[0] for c in cuts])
    path = tmp_path_factory.mktemp("long") / "long.wav"
    sf.write(path, audio, 16000)
    return path


def _whole_file_log_probs(teacher, path: Path) -> torch.Tensor:
    """The whole file at once: offline fbank, the encoder's full forward, CTC (T', V)."""
    loaded = load_model(teacher)
    samples, rate = sf.read(path, dtype="float32")
    feats = torch.as_tensor(fbank_extractor(loaded.cfg.data.features).extract(samples, rate))
    feats = ((feats - loaded.stats.mean) / loaded.stats.std)[None]
    with torch.no_grad():
        enc, _ = loaded.model.encoder(feats, torch.tensor([feats.shape[1]]))
        return loaded.model.ctc(enc)[0]


def test_a_long_file_in_windows_gives_the_whole_file_transcript(teacher, long_file, tmp_path):
    out = tmp_path / "long.jsonl"
    summary = transcribe_batch(_cfg(teacher, long_file, out, long_seconds=10.0, window_chunks=1))
    assert summary.transcribed == 1
    (record,) = _records(out).values()
    log_probs = _whole_file_log_probs(teacher, long_file)
    best, ids = log_probs.max(-1)
    loaded = load_model(teacher)
    whole = word_alignment.greedy_transcript(ids.numpy(), best.exp().numpy(), loaded.tokenizer, 0.04)
    assert record["text"] == whole.text and len(whole.words) > 10
    assert [w["start"] for w in record["words"]] == pytest.approx([w.start for w in whole.words])
    assert record["confidence"] == pytest.approx(whole.confidence, abs=1e-4)


@pytest.mark.parametrize("segment_frames", [750, 100])
def test_a_long_file_decoded_with_the_lexicon_in_segments(teacher, long_file, tmp_path, monkeypatch, segment_frames):
    """The lexicon search of a long file: its windows' log-probs (the whole file's), cut at blank runs into
    segments of ``SEGMENT_FRAMES`` to twice that, each searched alone, the words joined with their times.
    With the default (30 s) the 45 s file is one segment: the whole file's transcript."""
    monkeypatch.setattr(batch_runner, "SEGMENT_FRAMES", segment_frames)
    out = tmp_path / "long.jsonl"
    transcribe_batch(_cfg(teacher, long_file, out, long_seconds=10.0, decode="ctc_lexicon", lexicon=LEXICON,
                          lexicon_workers=0))  # fmt: skip
    (record,) = _records(out).values()
    log_probs = _whole_file_log_probs(teacher, long_file)
    loaded = load_model(teacher)
    decoder = build_word_decoder(EvalConfig(checkpoint=str(teacher), lexicon=LEXICON), loaded.cfg, loaded.tokenizer)
    parts, frames, start = [], [], 0
    while log_probs.shape[0] - start > 0:
        rest = log_probs[start:]
        cut = (
            batch_runner.blank_cut(rest[: 2 * segment_frames]) if rest.shape[0] >= 2 * segment_frames else rest.shape[0]
        )
        parts.append(lexicon_transcript(decoder, loaded.tokenizer, rest[:cut], 0.04, offset_s=start * 0.04))
        frames.append(cut)
        start += cut
    assert (len(parts) == 1) == (segment_frames == 750)
    expected = word_alignment.merge_transcripts(parts, frames)
    assert record["text"] == expected.text and expected.text
    assert [w["start"] for w in record["words"]] == pytest.approx([w.start for w in expected.words])
    assert record["confidence"] == pytest.approx(expected.confidence, abs=1e-4)
    _check_words(record)


def test_a_full_attention_model_refuses_files_longer_than_fit(teacher, long_file, tmp_path, monkeypatch):
    from usmkit.inference import batch_transcribe as bt

    monkeypatch.setattr(bt, "FULL_ATTENTION_BYTES", 17 * 200**2)  # 200 frames: 8 s for the 2-head model
    out = tmp_path / "out.jsonl"
    summary = transcribe_batch(_cfg(teacher, long_file, out, chunk_size=None))
    assert summary.transcribed == 0
    (problem,) = summary.report.problems
    assert problem.kind == "too long for full attention" and "chunk_size=N left_chunks=K" in problem.detail


# ------------------------------------------------------------------------------------------------ resume and ranks
def test_resume_after_a_line_cut_short_writes_each_id_once(teacher, test_manifest, greedy_run, tmp_path):
    out = tmp_path / "out.jsonl"
    lines = [json.dumps(greedy_run[k]) + "\n" for k in sorted(greedy_run)]
    out.write_text("".join(lines[:5]) + lines[5][: len(lines[5]) // 2])  # what a kill in mid-write leaves
    summary = transcribe_batch(_cfg(teacher, test_manifest, out))
    assert (summary.already_done, summary.transcribed) == (5, 7)
    records = _records(out)  # asserts each id once
    assert {k: r["text"] for k, r in records.items()} == {k: r["text"] for k, r in greedy_run.items()}
    again = transcribe_batch(_cfg(teacher, test_manifest, out))
    assert (again.already_done, again.transcribed) == (12, 0)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def test_resume_after_a_real_kill(teacher, synth_corpus, tmp_path):
    """A run over 600 files (links to the test audio), one file a batch, killed (SIGKILL) once it has
    written a line; the rerun writes the rest, each id once."""
    folder = tmp_path / "audio"
    folder.mkdir()
    sources = sorted((synth_corpus / "audio" / "test").glob("*.flac"))
    inputs = 600  # a few seconds of work: the kill comes while most of it is still to do, even on a busy machine
    for i in range(inputs):
        (folder / f"f{i:03d}.flac").symlink_to(sources[i % len(sources)])
    out = tmp_path / "out.jsonl"
    args = [f"checkpoint={teacher}", f"inputs={folder}", f"out={out}", "device=cpu", "num_workers=0",
            "progress=false", "batch_seconds=1"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "usmkit.cli.transcribe_batch", *args], env=_env(), stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if out.is_file() and out.stat().st_size > 0:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait(timeout=60)
    written = out.read_bytes().count(b"\n")
    assert proc.returncode == -signal.SIGKILL and 0 < written < inputs, proc.stderr.read().decode()[-2000:]
    before = {r["id"] for r in read_records(out)}  # whole lines (a cut tail is not one)
    summary = transcribe_batch(_cfg(teacher, folder, out))
    assert (summary.already_done, summary.transcribed) == (len(before), inputs - len(before))
    assert len(_records(out)) == inputs


def test_two_processes_under_torchrun_write_one_complete_output(teacher, test_manifest, greedy_run, tmp_path):
    out, ctm = tmp_path / "out.jsonl", tmp_path / "out.ctm"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "usmkit.cli.transcribe_batch", f"checkpoint={teacher}", f"inputs={test_manifest}", f"out={out}",
           f"ctm={ctm}", "device=cpu", "num_workers=0", "progress=false", "batch_seconds=15"]  # fmt: skip
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = _records(out)
    assert {k: r["text"] for k, r in records.items()} == {k: r["text"] for k, r in greedy_run.items()}
    assert not list(tmp_path.glob("*.part"))  # merged and removed
    assert "transcribed 12 inputs" in done.stderr
    assert len(ctm.read_text().splitlines()) == sum(len(r["words"]) for r in records.values())


def test_parts_of_a_killed_two_process_run_count_as_done_and_are_merged(teacher, test_manifest, greedy_run, tmp_path):
    out = tmp_path / "out.jsonl"
    ids = sorted(greedy_run)
    (tmp_path / "out.jsonl.rank0.part").write_text("".join(json.dumps(greedy_run[k]) + "\n" for k in ids[:3]))
    (tmp_path / "out.jsonl.rank1.part").write_text(
        "".join(json.dumps(greedy_run[k]) + "\n" for k in ids[3:5]) + '{"id": "cut sh'
    )
    summary = transcribe_batch(_cfg(teacher, test_manifest, out))
    assert (summary.already_done, summary.transcribed, summary.records) == (5, 7, 12)
    assert set(_records(out)) == set(ids) and not list(tmp_path.glob("*.part"))


def test_each_rank_gets_an_interleaved_share_of_the_sorted_inputs():
    items = [AudioItem(f"u{i}", "", float(d)) for i, d in enumerate([5, 80, 3, 9, 1, 7, 2, 70, 4])]
    shares = [plan_units(items, rank=r, world=2, batch_seconds=10, max_batch_size=4, long_seconds=60) for r in (0, 1)]
    ids = [[i.id for u in s for i in ([u.item] if isinstance(u, LongUnit) else u.items)] for s in shares]
    assert sorted(ids[0] + ids[1]) == sorted(i.id for i in items) and not set(ids[0]) & set(ids[1])
    assert [u.item.id for u in shares[0] if isinstance(u, LongUnit)] == ["u1"]  # 80 s, the longest
    assert [u.item.id for u in shares[1] if isinstance(u, LongUnit)] == ["u7"]  # 70 s, the second
    totals = [sum(items[int(i[1:])].duration for i in share) for share in ids]
    # Sorted d1 >= d2 >= ...: rank 0 gets d1 + d3 + ..., rank 1 d2 + d4 + ...; they differ by at most d1 - d_last.
    assert 0 <= totals[0] - totals[1] <= 80 - 1
    for share in shares:
        for unit in share:
            if not isinstance(unit, LongUnit):
                assert len(unit.items) * max(i.duration for i in unit.items) <= 10 or len(unit.items) == 1


# ------------------------------------------------------------------------------------------------ bad inputs
def test_unreadable_files_among_good_ones_are_reported_counted_and_skipped(teacher, synth_corpus, tmp_path, caplog):
    folder = tmp_path / "audio"
    folder.mkdir()
    good = sorted((synth_corpus / "audio" / "test").glob("*.flac"))[:3]
    for p in good:
        (folder / p.name).write_bytes(p.read_bytes())
    (folder / "garbage.flac").write_bytes(os.urandom(4000))  # no audio header: found when planning
    (folder / "empty.wav").write_bytes(b"")
    samples, rate = sf.read(good[0], dtype="float32")
    sf.write(folder / "cut.wav", samples, rate)
    data = (folder / "cut.wav").read_bytes()
    (folder / "cut.wav").write_bytes(data[: len(data) // 2])  # a copy cut short: found while decoding
    out = tmp_path / "out.jsonl"
    summary = transcribe_batch(_cfg(teacher, folder, out))
    assert set(_records(out)) == {p.name for p in good}
    kinds = sorted(p.kind for p in summary.report.problems)
    assert kinds == ["corrupt audio", "empty audio", "unreadable audio"]
    assert "truncated" in next(p.detail for p in summary.report.problems if p.kind == "unreadable audio")
    assert "skipped 3 of 6 files" in summary.report.summary()


@pytest.mark.parametrize(
    "case, message",
    [
        ("empty_folder", "holds no audio files"),
        ("missing_checkpoint", "cannot load checkpoint"),
        ("missing_inputs", "no such file or folder"),
        ("out_is_a_folder", "is a folder"),
        ("bad_decode", "decode=beam: choose one of ctc_greedy, ctc_lexicon"),
    ],
)
def test_bad_arguments_are_one_error_line(teacher, tmp_path, capsys, case, message):
    (tmp_path / "empty").mkdir()
    args = {"checkpoint": str(teacher), "inputs": str(tmp_path / "empty"), "out": str(tmp_path / "o.jsonl")}
    if case == "missing_checkpoint":
        args |= {"checkpoint": str(tmp_path / "nope"), "inputs": str(REPO / "README.md")}
    if case == "missing_inputs":
        args["inputs"] = str(tmp_path / "nothing")
    if case == "out_is_a_folder":
        args["out"] = str(tmp_path)
    if case == "bad_decode":
        args["decode"] = "beam"
    with pytest.raises(SystemExit) as exit_info:
        cli_main([f"{k}={v}" for k, v in args.items()] + ["device=cpu", "progress=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


# ------------------------------------------------------------------------------------------------ pieces
def test_word_alignment_of_a_hand_made_path():
    class Pieces:
        pieces = {0: "<blank>", 1: "<unk>", 2: "<s>", 3: "</s>", 4: "\u2581ab", 5: "c", 6: "\u2581d"}
        blank_id, vocab_size = 0, 7

        def id_to_piece(self, i):
            return self.pieces[i]

        def decode(self, ids):
            return "".join(self.pieces[i] for i in ids).replace("\u2581", " ").strip()

    ids = np.array([0, 4, 4, 5, 0, 0, 6, 0])
    probs = np.array([0.9, 0.5, 0.7, 0.6, 0.8, 0.9, 0.4, 0.9])
    t = word_alignment.greedy_transcript(ids, probs, Pieces(), frame_s=0.04, offset_s=1.0)
    assert t.text == "abc d"
    (abc, d) = t.words
    assert (abc.start, abc.end, abc.confidence, abc.frames) == pytest.approx((1.04, 1.16, 0.6, 3))
    assert (d.start, d.end, d.confidence, d.frames) == pytest.approx((1.24, 1.28, 0.4, 1))
    assert t.confidence == pytest.approx((0.5 + 0.7 + 0.6 + 0.4) / 4)  # over the words' frames, not the blanks
    empty = word_alignment.greedy_transcript(np.array([0, 0]), np.array([0.9, 0.7]), Pieces(), 0.04)
    assert (empty.text, empty.confidence) == ("", pytest.approx(0.8))
    # A lexicon path: "d" where the argmax is blank (its own posterior 0.05 there), two tokens on frame 2.
    starts = word_alignment.spread_starts([0, 2, 2], T=8)
    assert starts == [0, 2, 3]
    t = word_alignment.align_words([6, 4, 5], starts, [0.05, 0.7, 0.6], ids, probs, Pieces(), frame_s=1.0)
    assert t.text == "d abc"
    assert [(w.start, w.end, w.frames) for w in t.words] == [(0, 1, 1), (2, 4, 2)]
    assert [w.confidence for w in t.words] == pytest.approx([0.05, (0.7 + 0.6) / 2])


def test_journal_repair_keeps_whole_lines_and_merge_drops_duplicates(tmp_path):
    out = tmp_path / "o.jsonl"
    out.write_text('{"id": "a"}\n{"id": "b"}\n{"id": "c", "te')
    assert [r["id"] for r in read_records(out)] == ["a", "b"]  # a reader leaves the tail alone
    assert transcript_journal.repair(out) == len('{"id": "c", "te') and out.read_text().endswith('"b"}\n')
    transcript_journal.part_path(out, 1).write_text('{"id": "b"}\n{"id": "d"}\n')
    assert transcript_journal.done_ids(out) == {"a", "b", "d"}
    assert transcript_journal.merge(out) == 3 and [r["id"] for r in read_records(out)] == ["a", "b", "d"]
    assert not transcript_journal.part_paths(out)
    out.write_text('{"id": "a"}\nnot json\n')
    with pytest.raises(ValueError, match="not a transcript file"):
        list(read_records(out))


def test_output_names_stay_inside_the_output_folder():
    assert batch_inputs.output_name("talks/day1.flac", ".srt") == "talks/day1.srt"
    assert batch_inputs.output_name("/data/../x.wav", ".srt") == "data/x.srt"
    assert batch_inputs.output_name("cut-0001", ".srt") == "cut-0001.srt"


@pytest.mark.parametrize("module", [batch_inputs, batch_runner, subtitles, word_alignment])
def test_doctests_hold(module):
    assert doctest.testmod(module, verbose=False).failed == 0


@pytest.mark.slow  # flaky under CI's load: twice the whole run finished before the signal acted (exit 0); cause not found
def test_ctrl_c_is_one_line_and_a_rerun_goes_on(teacher, synth_corpus, tmp_path):
    """Ctrl-C in a terminal (SIGINT to the process group: the command and its loader worker) once a line is
    written: one ``error:`` line saying where the transcripts are and exit 130, no traceback; the lines written
    are kept and the rerun writes the rest, each id once."""
    folder = tmp_path / "audio"
    folder.mkdir()
    sources = sorted((synth_corpus / "audio" / "test").glob("*.flac"))
    inputs = 600  # a few seconds of work: the signal comes while most of it is still to do, even on a busy machine
    for i in range(inputs):
        (folder / f"f{i:03d}.flac").symlink_to(sources[i % len(sources)])
    out = tmp_path / "out.jsonl"
    args = [f"checkpoint={teacher}", f"inputs={folder}", f"out={out}", "device=cpu", "num_workers=1",
            "progress=false", "batch_seconds=1"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "usmkit.cli.transcribe_batch", *args], env=_env(), stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if out.is_file() and out.stat().st_size > 0:
                os.killpg(proc.pid, signal.SIGINT)
                break
            time.sleep(0.005)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, err[-3000:]
    assert f"error: interrupted (Ctrl-C); every input transcribed so far is in {out}" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    before = {r["id"] for r in read_records(out)}
    assert 0 < len(before) < inputs
    summary = transcribe_batch(_cfg(teacher, folder, out))
    assert (summary.already_done, summary.transcribed) == (len(before), inputs - len(before))
    assert len(_records(out)) == inputs


# ---- outputs: ctm=, srt_dir= and the inputs they must not replace -----------------------------------------
def _one_error_line(capsys, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main([*argv, "device=cpu", "num_workers=0", "progress=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_ctm_over_a_checkpoints_weights_or_a_text_file_is_refused(teacher, test_manifest, tmp_path, capsys):
    """``ctm=MODEL/checkpoints/step-N/model.safetensors`` replaced the weights with CTM text,
    and ``ctm=`` replaced any text file (``out=`` was guarded, ``ctm=`` was not)."""
    import shutil

    model = tmp_path / "MODEL"
    shutil.copytree(teacher.parent.parent, model)
    weights = model / "checkpoints" / teacher.name / "model.safetensors"
    before = weights.read_bytes()
    base = [f"checkpoint={model}", f"inputs={test_manifest}", f"out={tmp_path / 'out.jsonl'}"]
    _one_error_line(capsys, [*base, f"ctm={weights}"], f"ctm={weights} lies inside")
    assert weights.read_bytes() == before
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    _one_error_line(capsys, [*base, f"ctm={notes}"], f"ctm={notes} exists and is not a CTM file of ours")
    assert notes.read_text() == "my notes\n" and not (tmp_path / "out.jsonl").exists()
    earlier = tmp_path / "earlier.jsonl"  # an earlier run's transcript
    earlier.write_text(
        '{"id": "a.flac", "path": "a.flac", "duration": 1.0, "text": "", "confidence": 0.5, "words": []}\n'
    )
    _one_error_line(capsys, [*base, f"ctm={earlier}"], f"ctm={earlier} exists and is not a CTM file of ours")
    assert earlier.read_text().startswith('{"id": "a.flac"')


def test_srt_dir_inside_a_corpus_or_a_folder_of_other_files_is_refused(teacher, test_manifest, tmp_path, capsys):
    """``srt_dir=`` wrote into any folder, a corpus's among them."""
    corpus = tmp_path / "C"
    corpus.mkdir()
    (corpus / "mine_cuts_train.jsonl.gz").write_bytes(b"")  # a corpus folder, as its manifests' names say
    base = [f"checkpoint={teacher}", f"inputs={test_manifest}", f"out={tmp_path / 'out.jsonl'}"]
    _one_error_line(capsys, [*base, f"srt_dir={corpus / 'srt'}"], "lies inside the corpus folder of mine")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "report.txt").write_text("mine")
    _one_error_line(capsys, [*base, f"srt_dir={tmp_path / 'docs'}"], "is not a folder of SubRip files")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["C", "docs", "mine_cuts_train.jsonl.gz", "report.txt"]


def test_a_manifest_with_a_cut_id_twice_is_refused_in_one_line(teacher, test_manifest, tmp_path, capsys):
    """a manifest repeating a cut id gave two lines with that id (training refuses it, and
    every id is one line of ``out``)."""
    from usmkit.data.manifests import read_cuts, write_manifest

    cuts = list(read_cuts(test_manifest))[:3]
    manifest = tmp_path / "m" / "twice_cuts_test.jsonl.gz"
    write_manifest([*cuts, cuts[1]], manifest)
    out = tmp_path / "out.jsonl"
    argv = [f"checkpoint={teacher}", f"inputs={manifest}", f"out={out}"]
    _one_error_line(capsys, argv, f"inputs={manifest}: cut 4 repeats the id {cuts[1].id!r} (cut 2)")
    assert not out.exists()
