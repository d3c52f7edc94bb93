"""An imported w2v-BERT 2.0 encoder (stacking front end, relative_key bias) fine-tuned with a chunk size exports to
ONNX: onnxruntime's stream step and offline graph equal PyTorch's (the step chunk by chunk, state carried)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
import yaml

from usmkit.checkpointing.checkpoint import save_checkpoint
from usmkit.config import DataConfig, ModelSection, TaskConfig, TrainConfig, TrainerConfig, to_dict
from usmkit.data.config import seamless_m4t_features
from usmkit.data.normalize import STATS_FILE, FeatureStats
from usmkit.data.tokenizer import Tokenizer, minimum_vocab_size
from usmkit.export import read_manifest
from usmkit.export.graphs import STATE_NAMES, STEP_INPUTS, STEP_OUTPUTS
from usmkit.streaming.pipeline import load_model
from usmkit.streaming.step import init_state, stream_step
from usmkit.tasks import build_task

pytestmark = pytest.mark.usefixtures("one_thread")

CHUNK, LEFT = 4, 2
TEXTS = ["one two three", "four five six", "seven eight nine zero"]
TINY = {"d_model": 32, "num_layers": 2, "num_heads": 4, "ff_mult": 2, "conv_kernel": 5, "relative_left": 3,
        "relative_right": 2}  # fmt: skip


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint dir, its ONNX export): a random streaming CTC model of the w2v_bert_2 layout (tiny)."""
    root = tmp_path_factory.mktemp("w2vbert_export")
    tokenizer = Tokenizer.train(TEXTS, root / "tokenizer", vocab_size=minimum_vocab_size(TEXTS) + 4)
    features = seamless_m4t_features(normalize="global")  # streaming: the corpus's statistics
    cfg = TrainConfig(
        task=TaskConfig(kind="ctc"),
        model=ModelSection(
            preset="w2v_bert_2",
            chunk_size=CHUNK,
            left_chunks=LEFT,
            causal_conv=True,
            dropout=0.0,
            subsampling_factor=2,
            overrides=TINY,
        ),  # fmt: skip
        data=DataConfig(manifest_dir=str(root / "no-manifests"), features=features),
        trainer=TrainerConfig(exp_dir=str(root)),
        tokenizer=str(tokenizer.path),
    )
    torch.manual_seed(0)
    module = build_task(cfg.task, cfg.model.build_config(features.num_mel_bins), tokenizer.vocab_size)
    save_checkpoint(root / "checkpoints", 1, module, {}, yaml.safe_dump(to_dict(cfg)))
    FeatureStats(mean=torch.zeros(80), std=torch.ones(80)).save(root / STATS_FILE, features)
    from usmkit.cli.export import main

    out = root / "onnx"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([f"checkpoint={root}", "format=onnx", f"out={out}"]) == 0
    return root, out


def _session(path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def test_manifest_geometry(exported):
    manifest = read_manifest(exported[1])
    assert (manifest.chunk_size, manifest.left_chunks) == (CHUNK, LEFT)
    assert (manifest.chunk_input_frames, manifest.feature_context) == (2 * CHUNK, 0)  # 2 stacked frames, no context
    assert manifest.offline.outputs[0].shape[1] == "frames // 2"
    assert manifest.encoder.position == "relative_key" and manifest.features.fbank == "seamless_m4t"


@pytest.mark.parametrize("B,T", [(1, 61), (2, 30)])  # several cache rolls; a short last chunk
def test_onnx_stream_step_equals_pytorch(exported, B, T):
    ckpt, out = exported
    manifest = read_manifest(out)
    model = load_model(ckpt).model
    session = _session(out / manifest.stream_step.file)
    feats = torch.randn(B, T, 80, generator=torch.Generator().manual_seed(T))
    n = manifest.chunk_input_frames
    state = init_state(model.encoder, feats[:, :0], CHUNK, LEFT)
    onnx_state = [t.numpy() for t in state.tensors]
    names_in, names_out = list(STEP_INPUTS), list(STEP_OUTPUTS)
    chunks = 0
    for start in range(0, T, n):
        valid = min(n, T - start)
        chunk = torch.nn.functional.pad(feats[:, start : start + valid], (0, 0, 0, n - valid))  # (B, 2C, F)
        lengths = torch.full((B,), valid, dtype=torch.long)
        with torch.no_grad():
            enc, out_lens, state = stream_step(model.encoder, chunk, state, lengths)
            log_probs = model.ctc(enc)
        expected = dict(zip(names_out, (enc, log_probs, out_lens, *state.tensors), strict=True))
        got = dict(zip(names_out, session.run(names_out, dict(zip(names_in, [chunk.numpy(), lengths.numpy(),
                                                                             *onnx_state], strict=True))), strict=True))  # fmt: skip
        onnx_state = [got[f"new_{name}"] for name in STATE_NAMES]
        for name, want in expected.items():
            np.testing.assert_allclose(got[name], want.numpy(), atol=1e-4, rtol=1e-4, err_msg=f"{name}, chunk {chunks}")
        chunks += 1
    assert chunks == -(-T // n)


def test_onnx_offline_equals_the_full_forward(exported):
    ckpt, out = exported
    manifest = read_manifest(out)
    model = load_model(ckpt).model
    session = _session(out / manifest.offline.file)
    for T in (9, 64, 151):
        feats = torch.randn(2, T, 80, generator=torch.Generator().manual_seed(T))
        lengths = torch.tensor([T, max(2, T - 20)])
        with torch.no_grad():
            enc, out_lens = model.encoder(feats, lengths)
            expected = model.ctc(enc)
        log_probs, got_lens = session.run(
            ["log_probs", "out_lens"], {"features": feats.numpy(), "lengths": lengths.numpy()}
        )
        np.testing.assert_array_equal(got_lens, out_lens.numpy())
        for b, n in enumerate(out_lens.tolist()):
            np.testing.assert_allclose(log_probs[b, :n], expected[b, :n].numpy(), atol=1e-4, rtol=1e-4)


def test_transcribe_streams_the_checkpoint_and_its_export_alike(exported, speech_wav, capsys, tmp_path):
    """``usmkit-transcribe`` end to end (SeamlessM4T features chunk by chunk, the stacked stream step): the
    checkpoint in PyTorch and its ONNX export give the same finals and word times."""
    import json

    from usmkit.cli.transcribe import main as transcribe_main

    threads = torch.get_num_threads()
    results = []
    for name, args in (("eager", ["--checkpoint", exported[0], "--step", "eager"]), ("onnx", ["--engine", "onnx",
                       "--model", exported[1]])):  # fmt: skip
        code = transcribe_main([str(a) for a in [speech_wav, *args, "--json", tmp_path / f"{name}.json"]]
                               + ["--threads", "1", "--no-partials"])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 0, err
        results.append(json.loads((tmp_path / f"{name}.json").read_text()))
    torch.set_num_threads(threads)
    eager, onnx = results
    assert eager["chunks"] == onnx["chunks"] > 10
    assert [s["words"] for s in onnx["segments"]] == [s["words"] for s in eager["segments"]]
