"""``usmkit-serve`` on an export (``--engine onnx --model``) and with ``--lexicon``: the exported step runs
batches of streams at different positions as PyTorch does, and the server's finals are the ones
``usmkit-transcribe`` prints for the same audio and options (lexicon finals from a checkpoint or from
the lexicon bundled in the export).

The model and its export are the export tests' ``lexicon_ckpt`` (tests/export/conftest.py: random
weights, a training split of four sentences whose words and unigram LM the lexicon holds).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from serve_helpers import best_finals, pcm_bytes, start_server, stream

from usmkit.cli.serve import build_parser, build_recognizer
from usmkit.cli.transcribe import main as transcribe
from usmkit.errors import UsageError
from usmkit.streaming.step import init_state

_spec = importlib.util.spec_from_file_location(
    "export_fixtures", Path(__file__).resolve().parents[1] / "export" / "conftest.py"
)
export_fixtures = importlib.util.module_from_spec(_spec)  # make_export_checkpoint, _export_cli
_spec.loader.exec_module(export_fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")

WORD_SCORE = ("--word-score", "3")  # as tests/export/test_lexicon.py: words beat blank on a random model


@pytest.fixture(scope="module")
def lexicon_model(tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint with training transcripts, its ONNX export with the lexicon bundled)."""
    root = tmp_path_factory.mktemp("serve_lexicon")
    ckpt = export_fixtures.make_export_checkpoint(root / "ckpt", transcripts=True)
    onnx, _ = export_fixtures._export_cli(f"checkpoint={ckpt}", "format=onnx", f"out={root / 'onnx'}")
    return ckpt, onnx


def cli_texts(wav: Path, *flags: str, tmp: Path) -> list[str]:
    out = tmp / "cli.json"
    assert transcribe([str(wav), *flags, "--json", str(out), "--no-partials", "--threads", "1"]) == 0
    return [s["text"] for s in json.loads(out.read_text())["segments"]]


@pytest.mark.parametrize("engine", ["checkpoint", "onnx"])
def test_server_lexicon_finals_are_the_command_lines(lexicon_model, wavs, tmp_path, engine):
    ckpt, onnx = lexicon_model
    model = ["--checkpoint", str(ckpt)] if engine == "checkpoint" else ["--engine", "onnx", "--model", str(onnx)]
    expected = cli_texts(wavs["a"], *model, "--lexicon", *WORD_SCORE, tmp=tmp_path)
    greedy = cli_texts(wavs["a"], *model, tmp=tmp_path)
    assert len(expected) == 2 and expected != greedy
    recognizer = build_recognizer(build_parser().parse_args([*model, "--lexicon", *WORD_SCORE, "--threads", "1"]))
    recognizer.warm_up()
    running = start_server(recognizer)
    try:
        messages, code = stream(running.url, pcm_bytes(wavs["a"]))
    finally:
        running.close()
    assert code == 1000
    assert [f["sentence"] for f in best_finals(messages)] == expected


def test_serve_model_options_are_checked(lexicon_model, audio_ckpt):
    ckpt, onnx = lexicon_model
    cases = [
        ([], "no model: pass --checkpoint"),
        (["--engine", "onnx"], "--engine onnx needs --model"),
        (["--engine", "onnx", "--model", str(onnx), "--quantize", "int8"], "export with quantize=int8"),
        (["--engine", "aoti", "--model", str(onnx)], "holds an export of format onnx"),
        (["--checkpoint", str(audio_ckpt), "--lexicon"], "carries no lexicon/"),  # no lexicon, no training manifest
        (["--checkpoint", str(ckpt), "--lexicon", "--decode", "ctc_beam", "--rescore"], "rescore"),
    ]
    for argv, message in cases:
        with pytest.raises(UsageError, match=message):
            recognizer_for_args(argv)
    phrases = onnx.parent / "phrases.tsv"
    phrases.write_text("tom\t4\n")
    biased = recognizer_for_args(
        ["--engine", "onnx", "--model", str(onnx), "--lexicon", "--bias-phrases", str(phrases)]
    )
    assert biased.words.bias_words == ["tom"]  # every stream's finals search with the phrase


def recognizer_for_args(argv: list[str]):
    return build_recognizer(build_parser().parse_args(argv))


def test_an_exported_server_without_lexicon_serves_greedy(lexicon_model, wavs, tmp_path):
    _, onnx = lexicon_model
    recognizer = recognizer_for_args(["--engine", "onnx", "--model", str(onnx), "--threads", "1"])
    recognizer.warm_up()
    assert recognizer.words is None
    running = start_server(recognizer)
    try:
        messages, _ = stream(running.url, pcm_bytes(wavs["a"]))
    finally:
        running.close()
    expected = cli_texts(wavs["a"], "--engine", "onnx", "--model", str(onnx), tmp=tmp_path)
    assert [f["sentence"] for f in best_finals(messages)] == expected


def test_an_exported_step_runs_streams_at_different_positions_like_pytorch(lexicon_model):
    """The exported step takes one position for its whole batch: the recognizer runs each group of streams
    at one position as one call. Three streams, one a chunk ahead and one with a short last chunk, in one
    round: the same frames and states as PyTorch's batched step."""
    ckpt, onnx = lexicon_model
    exported = recognizer_for_args(["--engine", "onnx", "--model", str(onnx), "--threads", "1"])
    eager = recognizer_for_args(["--checkpoint", str(ckpt), "--step", "eager", "--threads", "1"])
    encoder, n = eager.model.encoder, 4 * eager.chunk_size  # feature frames of a chunk
    feats = torch.randn(3, 3 + 2 * n, 80, generator=torch.Generator().manual_seed(0))  # (3, T, F)
    states = [init_state(encoder, feats[i : i + 1, :3], eager.chunk_size, eager.left_chunks) for i in range(3)]
    full = torch.tensor([n])
    _, _, [states[1]] = eager.run([feats[1:2, 3 : 3 + n]], [full], [states[1]])  # stream 1: a chunk ahead
    chunks = [feats[0:1, 3 : 3 + n], feats[1:2, 3 + n :], torch.nn.functional.pad(feats[2:3, 3:12], (0, 0, 0, n - 9))]
    lengths = [full, full, torch.tensor([9])]
    want_out, want_frames, want_states = eager.run(chunks, lengths, states)
    got_out, got_frames, got_states = exported.run(chunks, lengths, states)
    assert got_frames == want_frames == [4, 4, 2]
    for b, frames in enumerate(want_frames):
        torch.testing.assert_close(got_out[b, :frames], want_out[b, :frames], atol=1e-4, rtol=1e-4)
    for got, want in zip(got_states, want_states, strict=True):
        for g, w in zip(got.tensors, want.tensors, strict=True):
            torch.testing.assert_close(g.reshape(w.shape), w, atol=1e-4, rtol=1e-4)


def test_the_default_step_is_traced_on_a_cpu_and_cuda_graphs_on_a_gpu():
    import torch

    from usmkit.cli.serve import chosen_step

    assert chosen_step("auto", torch.device("cpu")) == "jit"
    assert chosen_step("auto", torch.device("cuda", 0)) == "graphs"
    assert chosen_step("auto", torch.device("mps")) == "eager"
    assert chosen_step("jit", torch.device("cuda", 0)) == "jit"
