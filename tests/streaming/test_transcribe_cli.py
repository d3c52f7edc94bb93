"""``usmkit-transcribe`` end to end on a tiny untrained checkpoint: output format, JSON, timing report, bad input.

The checkpoint is built without training (the text it outputs is garbage, the plumbing is real): tiny
preset, causal convolution, chunk_size=4, left_chunks=2, a sentencepiece model trained on a few
sentences, and feature stats. Its CTC head is set to prefer one word-initial token everywhere, so the
model "speaks" wherever the audio does and the segmentation comes from the silence endpointer.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import yaml

from usmkit.checkpointing.checkpoint import save_checkpoint
from usmkit.cli.transcribe import format_time, main
from usmkit.config import DataConfig, ModelSection, TaskConfig, TrainConfig, TrainerConfig, to_dict
from usmkit.data.features import fbank_extractor
from usmkit.data.normalize import STATS_FILE, FeatureStats
from usmkit.data.tokenizer import Tokenizer, minimum_vocab_size
from usmkit.models.las import LASConfig
from usmkit.tasks import build_task

SR = 16000
TEXTS = [
    "the cat sat on the mat",
    "a dog ran to the park with a red ball",
    "streaming speech recognition with chunk wise attention",
    "hello world this is a test",
]
FINAL_LINE = re.compile(r"^\[(\d\d:\d\d\.\d\d) - (\d\d:\d\d\.\d\d)\] (.+)$")


def speechlike(seconds: float, seed: int = 0, level: float = 0.1) -> np.ndarray:
    """Harmonics of a wandering pitch under a syllable-rate envelope, plus a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * SR))) / SR
    f0 = 120 + 40 * np.sin(2 * np.pi * 1.3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / SR
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * 4.0 * t)
    return (level * envelope * voiced + 0.003 * rng.standard_normal(t.size)).astype(np.float32)


def speech_silence_speech() -> np.ndarray:
    """1.2 s speech, 1.2 s digital silence, 1.2 s speech."""
    return np.concatenate([speechlike(1.2, 1), np.zeros(int(1.2 * SR), np.float32), speechlike(1.2, 2)])


def make_checkpoint(
    root: Path,
    *,
    kind: str = "ctc",
    causal: bool = True,
    chunk: int | None = 4,
    left: int = 2,
    one_word: bool = True,
    manifest_dir: str | None = None,
) -> Path:
    """Experiment dir ``root`` with checkpoints/step-000001, config, tokenizer and feature stats
    (``manifest_dir``: the corpus its config names, none by default).

    ``one_word``: the CTC head prefers one word-initial token everywhere (see the module docstring);
    False keeps its random weights, so the (garbage) text depends on the audio.
    """
    tokenizer = Tokenizer.train(TEXTS, root / "tokenizer", vocab_size=minimum_vocab_size(TEXTS) + 8)
    cfg = TrainConfig(
        task=TaskConfig(kind=kind, ctc_weight=0.3 if kind == "las" else 1.0, las=LASConfig(num_layers=1)),
        model=ModelSection(
            preset="tiny",
            chunk_size=chunk,
            left_chunks=left,
            causal_conv=causal,
            dropout=0.0,
            overrides={"zero_init_residual": False},  # random residual branches: every path contributes
        ),  # fmt: skip
        data=DataConfig(manifest_dir=manifest_dir or str(root / "no-manifests")),
        trainer=TrainerConfig(exp_dir=str(root)),
        tokenizer=str(tokenizer.path),
    )
    torch.manual_seed(0)
    module = build_task(
        cfg.task, cfg.model.build_config(input_dim=cfg.data.features.num_mel_bins), tokenizer.vocab_size
    )
    word = next(i for i in tokenizer.encode("cat") if tokenizer.decode([i]).strip())  # a piece with letters
    if one_word:
        with torch.no_grad():
            module.ctc.proj.weight.zero_()
            module.ctc.proj.bias.zero_()
            module.ctc.proj.bias[word] = 5.0
    save_checkpoint(root / "checkpoints", 1, module, {}, yaml.safe_dump(to_dict(cfg)))
    feats = torch.as_tensor(fbank_extractor(cfg.data.features).extract(speechlike(2.0), SR))  # (T, 80)
    FeatureStats(mean=feats.mean(0), std=feats.std(0).clamp_min(1e-5)).save(root / STATS_FILE, cfg.data.features)
    return root


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("stream_ckpt"))


@pytest.fixture(scope="module")
def audio(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("audio") / "speech.wav"
    sf.write(path, speech_silence_speech(), SR, subtype="PCM_16")
    return path


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """``--threads 1`` below sets torch's thread count for this process; put it back after each test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """``main`` in this process with one torch thread (a 4-frame chunk is too small to share out)."""
    code = main([str(a) for a in argv] + ["--threads", "1"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def finals(out: str) -> list[tuple[str, str, str]]:
    return [m.groups() for m in map(FINAL_LINE.match, out.splitlines()) if m]


def test_file_transcription_prints_finals_and_timing_and_writes_json(ckpt, audio, capsys, tmp_path):
    out_json = tmp_path / "out" / "speech.json"
    code, out, err = run_cli(capsys, audio, "--checkpoint", ckpt, "--json", out_json)
    assert code == 0, err
    lines = finals(out)
    assert len(lines) == 2  # speech, silence (the endpoint), speech
    assert all(text.strip() for _, _, text in lines)
    assert re.search(r"RTF \d+\.\d+, chunk latency p50 \d+ ms, p95 \d+ ms, \d+ chunks", err)
    assert "Traceback" not in err
    record = json.loads(out_json.read_text())
    assert record["streaming"] and (record["chunk_size"], record["left_chunks"]) == (4, 2)
    assert record["audio_seconds"] == pytest.approx(3.6)
    assert record["chunks"] == 3.6 // 0.16  # every 160 ms of audio completes one 4-frame chunk
    first, second = record["segments"]
    assert 0.0 <= first["start"] < first["end"] <= 1.2 + 0.6  # in the first speech (+ endpoint delay)
    assert 1.2 <= second["start"] < second["end"] <= 3.6
    for seg in record["segments"]:
        assert seg["words"] and all(seg["start"] <= w["start"] < w["end"] <= seg["end"] for w in seg["words"])
        assert [line[2] for line in lines].count(seg["text"]) >= 1


def test_resampled_flac_and_mp3_inputs(ckpt, capsys, tmp_path):
    x = speech_silence_speech()
    t = np.arange(int(x.size * 44100 / SR)) / 44100
    x44 = np.interp(t, np.arange(x.size) / SR, x).astype(np.float32)
    sf.write(tmp_path / "speech44.flac", x44, 44100)
    code, out, err = run_cli(capsys, tmp_path / "speech44.flac", "--checkpoint", ckpt, "--no-partials")
    assert code == 0, err
    assert len(finals(out)) == 2 and "partial:" not in out
    try:
        sf.write(tmp_path / "speech.mp3", x, SR, format="MP3")
    except (sf.LibsndfileError, TypeError, ValueError):
        pytest.skip(f"this libsndfile ({sf.__libsndfile_version__}) cannot write MP3")
    code, out, err = run_cli(capsys, tmp_path / "speech.mp3", "--checkpoint", ckpt)
    assert code == 0, err
    assert len(finals(out)) == 2


def test_beam_decoding_and_explicit_mask(ckpt, audio, capsys):
    code, out, err = run_cli(
        capsys,
        audio,
        "--checkpoint",
        ckpt,
        "--decode",
        "ctc_beam",
        "--beam-size",
        "3",
        "--chunk-size",
        "4",
        "--left-chunks",
        "2",
    )
    assert code == 0, err
    assert len(finals(out)) == 2 and "approximation" not in err


def test_other_mask_warns_it_is_an_approximation(ckpt, audio, capsys):
    code, out, err = run_cli(capsys, audio, "--checkpoint", ckpt, "--chunk-size", "8", "--left-chunks", "1")
    assert code == 0, err
    assert "chunk_size=8, left_chunks=1 but the model was trained with chunk_size=4, left_chunks=2" in err


def test_partials_rewrite_one_line_on_a_terminal(ckpt, audio, monkeypatch, capsys):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    code, out, err = run_cli(capsys, audio, "--checkpoint", ckpt)
    assert code == 0, err
    assert "\r\x1b[K" in out and "partial:" not in out
    assert len(finals(out.replace("\r\x1b[K", "\n"))) == 2


def test_stdin_raw_pcm_cut_mid_sample(ckpt, monkeypatch, capsys):
    pcm = (speech_silence_speech() * 32767).astype("<i2").tobytes()
    stdin = io.TextIOWrapper(io.BufferedReader(io.BytesIO(pcm[: len(pcm) // 2 * 2 - 3001])))  # odd: cut mid-sample
    monkeypatch.setattr(sys, "stdin", stdin)
    code, out, err = run_cli(capsys, "-", "--checkpoint", ckpt)
    assert code == 0, err
    assert len(finals(out)) == 2  # the open segment is flushed at the end of the input
    assert "stdin ended in the middle of a 16-bit sample: dropped the last 1 byte" in err


def test_stdin_at_another_rate(ckpt, monkeypatch, capsys, tmp_path):
    x = speech_silence_speech()[::2]  # 8 kHz (crudely decimated: fine for plumbing)
    stdin = io.TextIOWrapper(io.BufferedReader(io.BytesIO((x * 32767).astype("<i2").tobytes())))
    monkeypatch.setattr(sys, "stdin", stdin)
    code, out, err = run_cli(
        capsys, "-", "--checkpoint", ckpt, "--sample-rate", "8000", "--json", str(tmp_path / "out.json")
    )
    assert code == 0, err
    assert "3.60 s of audio" in err


def test_stdin_pipe_closed_mid_stream_in_a_real_process(ckpt):
    """The console entry in a subprocess: the writer stops after 2 s of audio and closes the pipe."""
    pcm = (speech_silence_speech() * 32767).astype("<i2").tobytes()[: 2 * SR * 2 + 1]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "usmkit.cli.transcribe",
            "-",
            "--checkpoint",
            str(ckpt),
            "--no-partials",
            "--threads",
            "1",
        ],
        input=pcm,
        capture_output=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, err
    assert len(finals(out)) == 1 and "Traceback" not in err
    assert "dropped the last 1 byte" in err and "2.00 s of audio" in err


def test_silence_only_prints_no_segment(ckpt, capsys, tmp_path):
    sf.write(tmp_path / "silence.wav", np.zeros(2 * SR, np.float32), SR)
    code, out, err = run_cli(capsys, tmp_path / "silence.wav", "--checkpoint", ckpt, "--json", tmp_path / "s.json")
    assert code == 0, err
    assert finals(out) == []
    assert "no speech detected in" in err and "RTF" in err
    assert json.loads((tmp_path / "s.json").read_text())["segments"] == []


def test_clipped_audio_warns_and_still_transcribes(ckpt, capsys, tmp_path):
    loud = np.clip(speech_silence_speech() * 20, -1, 1)
    sf.write(tmp_path / "loud.wav", loud, SR, subtype="PCM_16")
    code, out, err = run_cli(capsys, tmp_path / "loud.wav", "--checkpoint", ckpt)
    assert code == 0, err
    assert re.search(r"warning: .*loud\.wav: \d+\.\d% of the samples are clipped", err)
    assert len(finals(out)) == 2 and "RTF" in err


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("empty.wav", b"", r"empty\.wav: the file is empty \(0 bytes\)"),
        (
            "corrupt.wav",
            b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(256)) * 4,
            r"corrupt\.wav: cannot decode it as audio",
        ),
        ("notes.txt", b"hello, this is text\n", r"notes\.txt: cannot decode it as audio.*unsupported"),
        ("truncated.flac", None, r"truncated\.flac: (cannot decode|decoding failed)"),
    ],
)
def test_bad_files_exit_2_with_a_message(ckpt, capsys, tmp_path, name, content, message):
    path = tmp_path / name
    if content is None:
        sf.write(tmp_path / "full.flac", speechlike(2.0), SR)
        content = (tmp_path / "full.flac").read_bytes()[:3000]  # the header and the start of the frames
    path.write_bytes(content)
    code, out, err = run_cli(capsys, path, "--checkpoint", ckpt)
    if name == "truncated.flac" and code == 0:
        pytest.skip("this libsndfile reads a truncated FLAC up to the cut without an error")
    assert code == 2
    assert re.search(message, err) and err.strip().splitlines()[-1].startswith("usmkit-transcribe: error:")
    assert "Traceback" not in err


def test_missing_input_and_usage_errors(ckpt, capsys, tmp_path):
    code, _, err = run_cli(capsys, tmp_path / "nope.wav", "--checkpoint", ckpt)
    assert code == 2 and "nope.wav: no such file" in err
    code, _, err = run_cli(capsys, "--checkpoint", ckpt)
    assert code == 2 and "no input" in err
    code, _, err = run_cli(capsys, tmp_path / "x.wav", "--checkpoint", ckpt, "--chunk-size", "0")
    assert code == 2 and "--chunk-size" in err and "positive" in err
    code, _, err = run_cli(capsys, tmp_path / "x.wav", "--checkpoint", tmp_path / "no-ckpt")
    assert code == 2 and "cannot load checkpoint" in err
    code, _, err = run_cli(capsys, tmp_path / "x.wav", "--checkpoint", ckpt, "--rescore")
    assert code == 2 and "CTC-only" in err


def test_empty_stdin_is_an_error(ckpt, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(b""))))
    code, _, err = run_cli(capsys, "-", "--checkpoint", ckpt)
    assert code == 2 and "stdin: no audio samples arrived" in err


def test_missing_feature_stats_exit_2(ckpt, audio, capsys, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(ckpt / "checkpoints", bare / "checkpoints")
    code, _, err = run_cli(capsys, audio, "--checkpoint", bare)
    assert code == 2 and "no feature normalization stats" in err and "feature_stats.safetensors" in err


def test_full_context_checkpoint_is_refused_for_streaming(tmp_path_factory, audio, capsys):
    root = make_checkpoint(tmp_path_factory.mktemp("offline_ckpt"), causal=False, chunk=None, left=0)
    code, out, err = run_cli(capsys, audio, "--checkpoint", root)
    assert code == 2
    assert "cannot stream: the encoder's convolution is not causal" in err and "--no-streaming" in err
    assert "Traceback" not in err
    code, out, err = run_cli(capsys, audio, "--checkpoint", root, "--no-streaming", "--json", root / "o.json")
    assert code == 0, err
    assert "whole input at once" in err
    record = json.loads((root / "o.json").read_text())
    assert not record["streaming"] and len(record["segments"]) == 2


def test_unbounded_left_context_needs_an_explicit_cap(tmp_path_factory, audio, capsys):
    root = make_checkpoint(tmp_path_factory.mktemp("unbounded_ckpt"), left=-1)
    code, _, err = run_cli(capsys, audio, "--checkpoint", root)
    assert code == 2 and "left_chunks=-1" in err and "left_chunks=K" in err
    code, out, err = run_cli(capsys, audio, "--checkpoint", root, "--left-chunks", "4")
    assert code == 0, err
    assert "an approximation" in err and len(finals(out)) == 2


def test_two_pass_rescoring_with_a_las_checkpoint(tmp_path_factory, audio, capsys):
    root = make_checkpoint(tmp_path_factory.mktemp("las_ckpt"), kind="las")
    code, out, err = run_cli(capsys, audio, "--checkpoint", root, "--rescore", "--json", root / "r.json")
    assert code == 0, err
    record = json.loads((root / "r.json").read_text())
    assert record["decode"] == "ctc_beam" and record["rescore"]
    assert record["segments"] and all(seg["rescored"] for seg in record["segments"])
    code, _, err = run_cli(capsys, audio, "--checkpoint", root, "--rescore", "--decode", "ctc_greedy")
    assert code == 2 and "--decode ctc_beam" in err


def test_microphone_without_sounddevice_is_a_clear_error(ckpt, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "sounddevice", None)  # import fails as if not installed
    code, _, err = run_cli(capsys, "--mic", "--checkpoint", ckpt)
    assert code == 2 and "pip install 'usmkit[mic]'" in err


def test_format_time():
    assert format_time(0) == "00:00.00"
    assert format_time(83.456) == "01:23.46"
    assert format_time(3725.5) == "1:02:05.50"


def test_int8_quantized_transcription_matches_fp32_text(ckpt, audio, capsys):
    code, out_fp32, err = run_cli(capsys, audio, "--checkpoint", ckpt, "--no-partials")
    assert code == 0, err
    code, out_int8, err = run_cli(capsys, audio, "--checkpoint", ckpt, "--no-partials", "--quantize", "int8")
    assert code == 0, err
    assert [t for _, _, t in finals(out_int8)] == [t for _, _, t in finals(out_fp32)]
    assert finals(out_int8)


def test_traced_step_gives_the_eager_transcript_and_timings(ckpt, audio, capsys, tmp_path):
    runs = {}
    for step in ("jit", "eager"):
        out_json = tmp_path / f"{step}.json"
        code, out, err = run_cli(
            capsys, audio, "--checkpoint", ckpt, "--no-partials", "--step", step, "--json", out_json
        )
        assert code == 0, err
        runs[step] = (finals(out), json.loads(out_json.read_text()))
    assert runs["jit"][0] == runs["eager"][0] and runs["jit"][0]
    jit = runs["jit"][1]
    assert jit["setup_seconds"] > 0 and jit["chunks"] == runs["eager"][1]["chunks"]
    assert [s["text"] for s in jit["segments"]] == [s["text"] for s in runs["eager"][1]["segments"]]


@pytest.mark.parametrize("option", ["utterance_mean_norm", "speaker_mean_norm"])
def test_checkpoint_trained_with_a_whole_audio_mean_is_refused(tmp_path, audio, capsys, option):
    from usmkit.checkpointing.checkpoint import CONFIG_FILE, STATE_FILE, file_record

    root = make_checkpoint(tmp_path / "cmn")
    config = root / "checkpoints" / "step-000001" / CONFIG_FILE
    cfg = yaml.safe_load(config.read_text())
    cfg["data"][option] = True
    config.write_text(yaml.safe_dump(cfg))
    state = json.loads((config.parent / STATE_FILE).read_text())  # as if the run had saved this config
    for key, values in file_record(config.parent, (CONFIG_FILE,)).items():
        state[key].update(values)
    (config.parent / STATE_FILE).write_text(json.dumps(state))
    code, _, err = run_cli(capsys, audio, "--checkpoint", root)
    assert code == 2 and option in err and "usmkit.cli.evaluate" in err
    assert "Traceback" not in err


def test_pipeline_api_streams_what_the_whole_input_gives(ckpt):
    """``usmkit.streaming.pipeline`` without the command line (as a server uses it): blocks of uneven
    sizes through ``StreamingTranscriber`` give the segments ``transcribe_whole`` gives under the same mask."""
    from usmkit.streaming.decoder import DecoderConfig
    from usmkit.streaming.features import StreamingFbank
    from usmkit.streaming.pipeline import ModelError, StreamingTranscriber, load_model, streaming_mask, transcribe_whole

    loaded = load_model(ckpt)
    C, K, warning = streaming_mask(loaded.model)
    assert (C, K, warning) == (4, 2, None)
    assert "an approximation" in streaming_mask(loaded.model, 8, 1)[2]
    samples = speech_silence_speech()
    features = loaded.cfg.data.features
    stream = StreamingTranscriber(
        loaded.model, loaded.tokenizer, StreamingFbank(features, loaded.stats), DecoderConfig()
    )
    segments = []
    for start, stop in zip((0, 1000, 1003, 9000), (1000, 1003, 9000, samples.size), strict=True):
        segments += stream.accept(samples[start:stop])
    segments += stream.finish()
    whole, stats, _ = transcribe_whole(
        loaded.model, loaded.tokenizer, StreamingFbank(features, loaded.stats), DecoderConfig(), samples, C, K
    )
    assert len(segments) == 2 and [s.text for s in segments] == [s.text for s in whole]
    assert [t for s in segments for t in (s.start, s.end)] == pytest.approx(
        [t for s in whole for t in (s.start, s.end)]
    )
    assert stream.stats.audio_s == pytest.approx(stats.audio_s) and len(stream.stats.latencies_s) == 22
    with pytest.raises(ModelError, match="--rescore needs an attention"):
        load_model(ckpt, rescore=True)


def trained_here(root: Path) -> Path:
    """``root/exp``, a model "trained in" ``root``: its config names the corpus ``data/corpus`` relative to
    ``root`` (as ``make demo`` does), and that corpus has a train split of ``TEXTS``."""
    from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

    from usmkit.data.manifests import manifest_path, write_manifest

    corpus = root / "data" / "corpus"
    corpus.mkdir(parents=True)
    sf.write(corpus / "speech.wav", speechlike(1.0), SR, subtype="PCM_16")
    rec = Recording.from_file(corpus / "speech.wav")
    cuts = [
        MonoCut(f"t{i}", 0.0, rec.duration, 0, recording=rec,
                supervisions=[SupervisionSegment(f"t{i}", rec.id, 0.0, rec.duration, text=text)])
        for i, text in enumerate(TEXTS)
    ]  # fmt: skip
    write_manifest(CutSet.from_cuts(cuts), manifest_path(corpus, "synth", "cuts", "train"))
    return make_checkpoint(root / "exp", one_word=False, manifest_dir="data/corpus")


def test_lexicon_travels_with_the_experiment(capsys, tmp_path, audio, monkeypatch):
    """A run carries the lexicon and LM of its training transcripts (``exp/lexicon/``, written when training
    starts), so ``--lexicon`` works from any folder; one trained before that still works from its own folder
    (rebuilt from the corpus) and elsewhere says why it cannot, in one line."""
    from usmkit.data.manifests import load_cuts
    from usmkit.streaming.pipeline import load_model
    from usmkit.training.run_lexicon import write_run_lexicon

    (tmp_path / "here").mkdir()
    exp = trained_here(tmp_path / "here")
    lexicon = ("--lexicon", "--word-score", "3", "--no-partials")
    monkeypatch.chdir(tmp_path / "here")
    code, rebuilt, err = run_cli(capsys, audio, "--checkpoint", exp, *lexicon)  # no lexicon/: rebuilt
    assert code == 0 and finals(rebuilt), err
    loaded = load_model(exp)
    data = loaded.cfg.data
    train_cuts = load_cuts(data.manifest_dir, data.train_split, corpus=data.corpus)
    assert write_run_lexicon(train_cuts, loaded.tokenizer, exp) == exp / "lexicon"
    assert {p.name for p in (exp / "lexicon").iterdir()} == {"tokens.txt", "lexicon.txt", "lm.arpa"}

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, carried, err = run_cli(capsys, audio, "--checkpoint", exp, *lexicon)
    assert code == 0, err
    assert finals(carried) == finals(rebuilt)  # the same words and LM as the rebuild from the corpus

    shutil.rmtree(exp / "lexicon")  # an experiment trained before runs carried their lexicon
    code, _, err = run_cli(capsys, audio, "--checkpoint", exp, *lexicon)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "carries no lexicon/" in err and "Run from the folder the model was trained in" in err
    assert "data/corpus" in err
