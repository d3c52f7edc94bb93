"""Lexicon finals from every engine: the lexicon and word LM bundled in an export, and ``--lexicon`` of
``usmkit-transcribe`` with a checkpoint (eager, traced, int8) or an export (ONNX fp32 and int8, AOTI).

The model is ``lexicon_ckpt`` (tests/export/conftest.py): random weights whose CTC frames spell pieces
of letters, trained on nothing, with a training split of four sentences. Its greedy text is a jumble of
pieces; the lexicon search turns the same log-probs into words of those sentences, so equal lexicon
finals across engines mean equal log-probs into one search over the same lexicon and LM.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace

import onnxruntime as ort
import pytest
import soundfile as sf
import torch

from usmkit.cli.transcribe import main as transcribe_main
from usmkit.decoding.ctc_lexicon import STREAMING_LEXICON, LexiconConfig, LexiconDecoder
from usmkit.export import ExportError, load_export, read_manifest
from usmkit.export.build import export_checkpoint
from usmkit.export.manifest import MANIFEST_FILE, file_digests
from usmkit.inference.batch_audio import FbankFrontEnd
from usmkit.inference.batch_transcribe import BatchConfig, transcribe_batch
from usmkit.inference.lexicon_pool import lexicon_transcript
from usmkit.runs import lexicon_texts
from usmkit.streaming.pipeline import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

FINAL_LINE = re.compile(r"^\[\d\d:\d\d\.\d\d - \d\d:\d\d\.\d\d\] (.+)$")
WORD_SCORE = ("--word-score", "3")  # a random model: words only when they are cheap enough to beat blank


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def finals(capsys, *argv) -> list[str]:
    """The final lines of ``usmkit-transcribe argv`` (one thread, no partials); asserts it exits 0."""
    code = transcribe_main([str(a) for a in argv] + ["--threads", "1", "--no-partials"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [line for line in out.splitlines() if FINAL_LINE.match(line)]


def words_of(lines: list[str]) -> list[str]:
    return [w for line in lines for w in FINAL_LINE.match(line).group(1).split()]


def test_export_bundles_the_training_transcripts_lexicon_with_sha256(lexicon_ckpt, lexicon_onnx, tmp_path):
    manifest = read_manifest(lexicon_onnx)
    bundle = manifest.lexicon
    assert bundle is not None and bundle.config == STREAMING_LEXICON and bundle.transcripts == 4
    # The files are the ones usmkit-transcribe --checkpoint --lexicon builds from the training transcripts.
    loaded = load_model(lexicon_ckpt)
    texts = lexicon_texts(loaded.cfg)
    LexiconDecoder.build(texts, loaded.tokenizer, tmp_path / "built", STREAMING_LEXICON)
    for name in (bundle.tokens, bundle.lexicon, bundle.lm):
        assert (lexicon_onnx / name).read_bytes() == (tmp_path / "built" / name.split("/")[-1]).read_bytes(), name
    assert bundle.words == len({w for t in texts for w in t.split()})
    # Every file of the export has its SHA-256 in the manifest, and the manifest is plain JSON.
    files = sorted(p.relative_to(lexicon_onnx).as_posix() for p in lexicon_onnx.rglob("*") if p.is_file())
    assert sorted(manifest.sha256) == [f for f in files if f != MANIFEST_FILE]
    assert manifest.sha256 == file_digests(lexicon_onnx, manifest.sha256)
    record = json.loads((lexicon_onnx / MANIFEST_FILE).read_text())
    assert record["lexicon"]["config"]["lm_weight"] == STREAMING_LEXICON.lm_weight and record["version"] == 2


def test_a_changed_lexicon_file_is_refused_naming_it(lexicon_onnx, speech_wav, capsys, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(lexicon_onnx, broken)
    lexicon = broken / "lexicon" / "lexicon.txt"
    lexicon.write_text(lexicon.read_text() + "zzz\t\u2581z z z\n")
    with pytest.raises(ExportError, match=r"broken/lexicon/lexicon\.txt is damaged: its SHA-256"):
        load_export(broken)
    code = transcribe_main([str(speech_wav), "--engine", "onnx", "--model", str(broken), "--lexicon"])
    err = capsys.readouterr().err
    assert code == 2 and "lexicon.txt is damaged" in err and "Traceback" not in err


def test_lexicon_finals_are_equal_across_engines(lexicon_ckpt, lexicon_onnx, speech_wav, capsys):
    """The same audio through PyTorch eager, the traced step and ONNX: the same lexicon finals (text and
    times), all words of the training transcripts, unlike the greedy finals of the same log-probs."""
    eager = finals(capsys, speech_wav, "--checkpoint", lexicon_ckpt, "--step", "eager", "--lexicon", *WORD_SCORE)
    traced = finals(capsys, speech_wav, "--checkpoint", lexicon_ckpt, "--lexicon", *WORD_SCORE)
    onnx = finals(capsys, speech_wav, "--engine", "onnx", "--model", lexicon_onnx, "--lexicon", *WORD_SCORE)
    assert eager == traced == onnx and len(eager) == 2
    vocabulary = {w for t in lexicon_texts(load_model(lexicon_ckpt).cfg) for w in t.split()}
    assert set(words_of(eager)) <= vocabulary and len(words_of(eager)) >= 2
    greedy = finals(capsys, speech_wav, "--engine", "onnx", "--model", lexicon_onnx)
    assert greedy != eager and not set(words_of(greedy)) <= vocabulary


def test_int8_lexicon_finals(lexicon_ckpt, lexicon_int8, speech_wav, capsys, tmp_path):
    """int8 weights move the log-probs a little (``test_onnx.py``), so int8 finals are not held to fp32's: jit
    int8 (PyTorch) and ONNX int8 each give a lexicon final, in lexicon words, for every segment of their own
    greedy finals."""
    vocabulary = {w for t in lexicon_texts(load_model(lexicon_ckpt).cfg) for w in t.split()}
    for engine in (("--checkpoint", lexicon_ckpt, "--quantize", "int8"), ("--engine", "onnx", "--model", lexicon_int8)):
        greedy = finals(capsys, speech_wav, *engine)
        words = finals(capsys, speech_wav, *engine, "--lexicon", *WORD_SCORE, "--json", tmp_path / "int8.json")
        segments = json.loads((tmp_path / "int8.json").read_text())["segments"]
        assert len(words) == len(greedy) == 2 and all(s["rescored"] for s in segments), engine
        assert set(words_of(words)) <= vocabulary and not set(words_of(greedy)) <= vocabulary, engine


def test_lexicon_settings_from_the_export_and_the_command_line(lexicon_ckpt, lexicon_onnx, tmp_path):
    out, _ = export_checkpoint(
        lexicon_ckpt, "onnx", out=tmp_path / "bigram", lexicon=LexiconConfig(order=2, lm_weight=0.8, beam_size=32)
    )
    loaded = load_export(out)
    assert loaded.manifest.lexicon.config == LexiconConfig(order=2, lm_weight=0.8, beam_size=32)
    assert (
        "2-grams:" in (out / "lexicon" / "lm.arpa").read_text()
        and "\t<s> the" in (out / "lexicon" / "lm.arpa").read_text()
    )
    cfg = loaded.lexicon_config(lm_weight=None, word_score=1.5)  # None keeps the bundled value
    assert (cfg.order, cfg.lm_weight, cfg.word_score, cfg.beam_size) == (2, 0.8, 1.5, 32)
    assert cfg.lm_path == str(out / "lexicon" / "lm.arpa")
    assert loaded.word_decoder(word_score=1.5).cfg == cfg
    # Your own LM (lexicon.lm_path) is copied into the export.
    own = tmp_path / "own.arpa"
    shutil.copyfile(lexicon_onnx / "lexicon" / "lm.arpa", own)
    out, manifest = export_checkpoint(
        lexicon_ckpt, "onnx", out=tmp_path / "own", lexicon=LexiconConfig(lm_path=str(own))
    )
    assert manifest.lexicon.lm == "lexicon/lm.arpa" and manifest.lexicon.config.lm_path is None
    assert (out / "lexicon" / "lm.arpa").read_bytes() == own.read_bytes()


def test_an_export_without_transcripts_decodes_greedy_and_refuses_lexicon(onnx_export, speech_wav, capsys):
    assert read_manifest(onnx_export).lexicon is None  # export_ckpt names no training manifest
    code = transcribe_main([str(speech_wav), "--engine", "onnx", "--model", str(onnx_export), "--lexicon"])
    err = capsys.readouterr().err
    assert code == 2 and "holds no lexicon" in err and "export it again where its training manifests are" in err


def test_lexicon_json_records_the_settings(lexicon_onnx, speech_wav, capsys, tmp_path):
    finals(capsys, speech_wav, "--engine", "onnx", "--model", lexicon_onnx, "--lexicon", "--lm-weight", "0.25",
           "--json", tmp_path / "out.json")  # fmt: skip
    record = json.loads((tmp_path / "out.json").read_text())
    assert record["lexicon"]["lm_weight"] == 0.25 and record["lexicon"]["order"] == 1
    assert any(s["rescored"] for s in record["segments"])  # finals chosen by the lexicon search


def test_batch_lexicon_transcript_is_the_exports_bundled_lexicon_on_its_offline_graph(
    lexicon_ckpt, lexicon_onnx, speech_wav, tmp_path
):
    """``python -m usmkit.cli.transcribe_batch decode=ctc_lexicon`` (the checkpoint's training transcripts, read
    at run time) gives the transcript that the export alone gives: its offline ONNX graph's log-probs
    searched with its bundled lexicon and LM."""
    lexicon = replace(STREAMING_LEXICON, word_score=3.0)
    out = tmp_path / "out.jsonl"
    transcribe_batch(BatchConfig(checkpoint=str(lexicon_ckpt), inputs=str(speech_wav), out=str(out), device="cpu",
                                 num_workers=0, progress=False, decode="ctc_lexicon", lexicon=lexicon,
                                 lexicon_workers=0))  # fmt: skip
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    loaded = load_export(lexicon_onnx)
    samples, rate = sf.read(speech_wav, dtype="float32")
    assert rate == loaded.features.sample_rate
    feats, lens = FbankFrontEnd(loaded.features, loaded.stats)(
        torch.from_numpy(samples)[None], torch.tensor([len(samples)])
    )
    session = ort.InferenceSession(str(lexicon_onnx / loaded.manifest.offline.file), providers=["CPUExecutionProvider"])
    log_probs, out_lens = session.run(["log_probs", "out_lens"], {"features": feats.numpy(), "lengths": lens.numpy()})
    words = loaded.word_decoder(word_score=3.0)
    expected = lexicon_transcript(words, loaded.tokenizer, torch.from_numpy(log_probs[0, : out_lens[0]]), 0.04)
    vocabulary = {w for t in lexicon_texts(load_model(lexicon_ckpt).cfg) for w in t.split()}
    assert record["text"] == expected.text and expected.text and set(expected.text.split()) <= vocabulary
    assert [w["word"] for w in record["words"]] == [w.word for w in expected.words]


@pytest.mark.slow  # inductor compiles both graphs (about a minute on 2 cores)
def test_aoti_lexicon_finals_equal_eager(lexicon_ckpt, speech_wav, capsys, tmp_path):
    out, manifest = export_checkpoint(lexicon_ckpt, "aoti", out=tmp_path / "aoti")
    assert manifest.lexicon is not None and (out / manifest.lexicon.lexicon).is_file()
    eager = finals(capsys, speech_wav, "--checkpoint", lexicon_ckpt, "--step", "eager", "--lexicon", *WORD_SCORE)
    aoti = finals(capsys, speech_wav, "--engine", "aoti", "--model", out, "--lexicon", *WORD_SCORE)
    assert aoti == eager and len(eager) == 2


def test_bias_phrases_from_every_front_end(lexicon_ckpt, lexicon_onnx, speech_wav, capsys, tmp_path):
    """``--bias-phrases`` (usmkit.decoding.biasing): the held-out name "tom" (not in the training transcripts)
    appears in the lexicon finals only with the phrase list, the same from the checkpoint and the export,
    and from the batch command's lexicon workers."""
    phrases = tmp_path / "phrases.tsv"
    phrases.write_text("# a name the training transcripts never had\ntom\t4\n")
    plain = finals(capsys, speech_wav, "--engine", "onnx", "--model", lexicon_onnx, "--lexicon", *WORD_SCORE)
    biased = [
        finals(capsys, speech_wav, *model, "--lexicon", *WORD_SCORE, "--bias-phrases", phrases)
        for model in (("--checkpoint", lexicon_ckpt, "--step", "eager"), ("--engine", "onnx", "--model", lexicon_onnx))
    ]
    assert "tom" not in words_of(plain) and "tom" in words_of(biased[0]) and biased[0] == biased[1]
    out = tmp_path / "out.jsonl"
    transcribe_batch(BatchConfig(checkpoint=str(lexicon_ckpt), inputs=str(speech_wav), out=str(out), device="cpu",
                                 num_workers=0, progress=False, decode="ctc_lexicon", lexicon_workers=1,
                                 lexicon=replace(STREAMING_LEXICON, word_score=3.0),
                                 bias_phrases=str(phrases)))  # fmt: skip
    assert "tom" in json.loads(out.read_text())["text"].split()
    # Bad use: one line each, exit 2.
    (tmp_path / "bad.tsv").write_text("tom\tloud\n")
    for argv, message in (
        (["--bias-phrases", phrases], "boosts phrases in the lexicon search: add --lexicon"),
        (["--lexicon", "--bias-phrases", tmp_path / "bad.tsv"], "bad.tsv, line 1: 'tom\\tloud' is not"),
        (["--lexicon", "--bias-phrases", tmp_path / "none.tsv"], "cannot read the bias phrases"),
        (["--lexicon", "--lm-weight", "0", "--bias-phrases", phrases], "use --lm-weight > 0"),
    ):
        code = transcribe_main([str(speech_wav), "--engine", "onnx", "--model", str(lexicon_onnx), *map(str, argv)])
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err, (argv, err)
