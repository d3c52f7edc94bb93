"""ONNX exports under onnxruntime against the PyTorch model they came from.

The streaming step is driven the way an engine outside usmkit would drive it: by the input and
output names of ``export.json``, the state carried from each call's outputs to the next call's
inputs, over a whole utterance whose last chunk is short; every output of every chunk is compared
with PyTorch's ``stream_step`` + CTC head carrying its own state.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from usmkit.data.normalize import FeatureStats
from usmkit.data.tokenizer import Tokenizer
from usmkit.export import read_manifest
from usmkit.export.graphs import STATE_NAMES, STEP_INPUTS, STEP_OUTPUTS
from usmkit.streaming.pipeline import load_model
from usmkit.streaming.step import EncoderStreamState, init_state, stream_step

pytestmark = pytest.mark.usefixtures("one_thread")

ATOL = 1e-4


def _session(path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _features(B: int, T: int, F: int, seed: int) -> torch.Tensor:
    return torch.randn(B, T, F, generator=torch.Generator().manual_seed(seed))  # (B, T, F)


def _stream_both(model, session, manifest, feats: torch.Tensor):
    """Yield (PyTorch outputs, ONNX outputs) chunk by chunk over feats (B, T, F), states carried separately."""
    n, ctx = manifest.chunk_input_frames, manifest.feature_context
    names_in = [i.name for i in manifest.stream_step.inputs]
    names_out = [o.name for o in manifest.stream_step.outputs]
    B, T, _ = feats.shape
    state = init_state(model.encoder, feats[:, :ctx], manifest.chunk_size, manifest.left_chunks)
    onnx_state = [t.numpy() for t in state.tensors]
    for start in range(ctx, T, n):
        valid = min(n, T - start)
        chunk = torch.nn.functional.pad(feats[:, start : start + valid], (0, 0, 0, n - valid))  # (B, 4C, F)
        lengths = torch.full((B,), valid, dtype=torch.long)
        with torch.no_grad():
            enc, out_lens, state = stream_step(model.encoder, chunk, state, lengths)
            log_probs = model.ctc(enc)  # (B, C, V)
        expected = dict(zip(STEP_OUTPUTS, (enc, log_probs, out_lens, *state.tensors), strict=True))
        feeds = dict(zip(names_in, [chunk.numpy(), lengths.numpy(), *onnx_state], strict=True))
        got = dict(zip(names_out, session.run(names_out, feeds), strict=True))
        onnx_state = [got[f"new_{name}"] for name in STATE_NAMES]  # the next call's state inputs
        yield expected, got


def test_manifest_names_the_graphs_io_and_the_files(export_ckpt, onnx_export):
    manifest = read_manifest(onnx_export)
    loaded = load_model(export_ckpt)
    assert (manifest.format, manifest.quantize) == ("onnx", "none")
    assert (manifest.chunk_size, manifest.left_chunks, manifest.chunk_input_frames) == (4, 2, 16)
    assert manifest.encoder == loaded.model.encoder.cfg and manifest.features == loaded.cfg.data.features
    assert [i.name for i in manifest.stream_step.inputs] == list(STEP_INPUTS)
    assert [o.name for o in manifest.stream_step.outputs] == list(STEP_OUTPUTS)
    V, cfg = loaded.tokenizer.vocab_size, loaded.model.encoder.cfg
    specs = {s.name: s for s in manifest.stream_step.inputs + manifest.stream_step.outputs}
    assert specs["kv"].shape == (cfg.num_layers, 2, "batch", cfg.num_heads, 8, cfg.head_dim)
    assert specs["log_probs"].shape == ("batch", 4, V) and specs["cached"].shape == ()
    assert manifest.offline.outputs[0].shape == ("batch", "(frames - 3) // 4", V)
    for graph in (manifest.stream_step, manifest.offline):  # what onnxruntime sees agrees with the manifest
        session = _session(onnx_export / graph.file)
        for spec, arg in zip(graph.inputs + graph.outputs, session.get_inputs() + session.get_outputs(), strict=True):
            assert arg.name == spec.name and len(arg.shape) == len(spec.shape)
            assert [d for d in arg.shape if isinstance(d, int)] == [d for d in spec.shape if isinstance(d, int)]
    tokenizer = Tokenizer.load(onnx_export / manifest.tokenizer)
    assert tokenizer.model_proto == loaded.tokenizer.model_proto
    stats = FeatureStats.load(onnx_export / manifest.feature_stats)
    assert torch.equal(stats.mean, loaded.stats.mean) and torch.equal(stats.std, loaded.stats.std)


@pytest.mark.parametrize("B,T", [(1, 150), (2, 77)])  # several cache rolls; a short last chunk
def test_onnx_stream_step_equals_pytorch_chunk_by_chunk(export_ckpt, onnx_export, B, T):
    manifest = read_manifest(onnx_export)
    model = load_model(export_ckpt).model
    session = _session(onnx_export / manifest.stream_step.file)
    chunks = 0
    for expected, got in _stream_both(model, session, manifest, _features(B, T, 80, seed=T)):
        for name, want in expected.items():
            np.testing.assert_allclose(got[name], want.numpy(), atol=ATOL, rtol=1e-4, err_msg=f"{name}, chunk {chunks}")
            assert got[name].shape == tuple(want.shape), name
        chunks += 1
    assert chunks == -(-(T - 3) // 16)
    assert int(expected["out_lens"][0]) < manifest.chunk_size  # the last chunk was short


def test_onnx_offline_equals_the_full_forward(export_ckpt, onnx_export):
    manifest = read_manifest(onnx_export)
    model = load_model(export_ckpt).model
    session = _session(onnx_export / manifest.offline.file)
    for T in (7, 64, 301):
        feats = _features(3, T, 80, seed=T)
        lengths = torch.tensor([T, max(7, T - 20), 7])
        with torch.no_grad():
            enc, out_lens = model.encoder(feats, lengths)  # (B, T', D)
            expected = model.ctc(enc)  # (B, T', V)
        log_probs, got_lens = session.run(
            ["log_probs", "out_lens"], {"features": feats.numpy(), "lengths": lengths.numpy()}
        )
        np.testing.assert_array_equal(got_lens, out_lens.numpy())
        assert log_probs.shape == tuple(expected.shape)
        for b, n in enumerate(out_lens.tolist()):  # padded frames are unspecified
            np.testing.assert_allclose(log_probs[b, :n], expected[b, :n].numpy(), atol=ATOL, rtol=1e-4)


def test_int8_onnx_runs_close_to_fp32(export_ckpt, int8_export):
    """int8 weights are not exact: the step runs, each frame's distribution stays near PyTorch fp32's
    (total variation; log-probs of unlikely tokens may move more) and picks the same token on most
    frames; the offline graph too."""
    manifest = read_manifest(int8_export)
    assert manifest.quantize == "int8" and manifest.stream_step.file.endswith(".int8.onnx")
    model = load_model(export_ckpt).model
    session = _session(int8_export / manifest.stream_step.file)
    same = total = 0
    for expected, got in _stream_both(model, session, manifest, _features(1, 203, 80, seed=1)):
        want = expected["log_probs"][0].numpy()  # (C, V)
        n = int(expected["out_lens"][0])
        variation = 0.5 * np.abs(np.exp(got["log_probs"][0, :n]) - np.exp(want[:n])).sum(-1)  # (n,)
        assert variation.max() < 0.1
        same += int((got["log_probs"][0, :n].argmax(-1) == want[:n].argmax(-1)).sum())
        total += n
    assert total == (203 - 3) // 4 and same >= 0.9 * total
    offline = _session(int8_export / manifest.offline.file)
    feats = _features(1, 120, 80, seed=2)
    log_probs, _ = offline.run(None, {"features": feats.numpy(), "lengths": np.array([120])})
    with torch.no_grad():
        want = model.ctc(model.encoder(feats, torch.tensor([120]))[0])[0].numpy()
    assert (log_probs[0].argmax(-1) == want.argmax(-1)).mean() >= 0.9


def test_engine_is_a_drop_in_for_stream_step(export_ckpt, onnx_export):
    """``OnnxStreamStep`` takes and returns what ``stream_step`` does (the pipeline's contract)."""
    from usmkit.export import load_export

    loaded = load_export(onnx_export, threads=1)
    model = load_model(export_ckpt).model
    feats = _features(2, 40, 80, seed=3)
    s_torch = init_state(model.encoder, feats[:, :3])
    s_onnx = init_state(loaded.model.encoder, feats[:, :3])
    for start, valid in ((3, 16), (19, 16), (35, 5)):
        chunk = torch.nn.functional.pad(feats[:, start : start + valid], (0, 0, 0, 16 - valid))
        lengths = torch.tensor([valid, valid])
        enc, lens, s_torch = stream_step(model.encoder, chunk, s_torch, lengths)
        got, got_lens, s_onnx = loaded.step(loaded.model.encoder, chunk, s_onnx, lengths)
        assert isinstance(s_onnx, EncoderStreamState) and s_onnx.cached.shape == () and s_onnx.offset.shape == ()
        torch.testing.assert_close(got, enc, atol=ATOL, rtol=1e-4)
        assert torch.equal(got_lens, lens)
    with torch.no_grad():  # the exported CTC head the pipeline applies is the checkpoint's
        torch.testing.assert_close(loaded.model.ctc(enc), model.ctc(enc))
