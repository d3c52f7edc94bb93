"""AOTInductor packages against the PyTorch model they came from (slow: inductor compiles C++ for ~40 s)."""

from __future__ import annotations

import pytest
import torch

from usmkit.export import export_checkpoint, load_export, read_manifest
from usmkit.export.aoti import load_aoti
from usmkit.export.graphs import STEP_OUTPUTS
from usmkit.streaming.pipeline import load_model
from usmkit.streaming.step import init_state, stream_step

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

ATOL = 1e-4


@pytest.fixture(scope="module")
def aoti_export(export_ckpt, tmp_path_factory):
    return export_checkpoint(export_ckpt, "aoti", out=tmp_path_factory.mktemp("exports") / "aoti")[0]


@pytest.mark.parametrize("B,T", [(1, 150), (2, 77)])
def test_aoti_stream_step_equals_pytorch_chunk_by_chunk(export_ckpt, aoti_export, B, T):
    manifest = read_manifest(aoti_export)
    assert manifest.format == "aoti" and manifest.stream_step.file == "stream_step.pt2"
    model = load_model(export_ckpt).model
    runner = load_aoti(aoti_export / manifest.stream_step.file)
    feats = torch.randn(B, T, 80, generator=torch.Generator().manual_seed(T))
    n, C = manifest.chunk_input_frames, manifest.chunk_size
    state = init_state(model.encoder, feats[:, :3])
    aoti_state = state
    for start in range(3, T, n):
        valid = min(n, T - start)
        chunk = torch.nn.functional.pad(feats[:, start : start + valid], (0, 0, 0, n - valid))  # (B, 4C, F)
        lengths = torch.full((B,), valid, dtype=torch.long)
        with torch.no_grad():
            enc, out_lens, state = stream_step(model.encoder, chunk, state, lengths)
            expected = (enc, model.ctc(enc), out_lens, *state.tensors)
            got = runner(*(t.contiguous() for t in (chunk, lengths, *aoti_state.tensors)))  # dense inputs
        aoti_state = aoti_state.with_tensors(got[3:])  # carried to the next call
        for name, g, e in zip(STEP_OUTPUTS, got, expected, strict=True):
            torch.testing.assert_close(g, e, atol=ATOL, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
    assert int(out_lens[0]) < C


def test_aoti_offline_equals_the_full_forward(export_ckpt, aoti_export):
    manifest = read_manifest(aoti_export)
    model = load_model(export_ckpt).model
    runner = load_aoti(aoti_export / manifest.offline.file)
    for T in (11, 64, 301):
        feats = torch.randn(3, T, 80, generator=torch.Generator().manual_seed(T))
        lengths = torch.tensor([T, max(11, T - 20), 11])
        with torch.no_grad():
            enc, out_lens = model.encoder(feats, lengths)
            expected = model.ctc(enc)  # (B, T', V)
            log_probs, got_lens = runner(feats, lengths)
        assert torch.equal(got_lens, out_lens) and log_probs.shape == expected.shape
        for b, n in enumerate(out_lens.tolist()):
            torch.testing.assert_close(log_probs[b, :n], expected[b, :n], atol=ATOL, rtol=1e-4)


def test_engine_aoti_gives_the_eager_transcript(export_ckpt, aoti_export, speech_wav, capsys):
    from usmkit.cli.transcribe import main

    finals = {}
    for argv in (["--checkpoint", export_ckpt, "--step", "eager"], ["--engine", "aoti", "--model", aoti_export]):
        threads = torch.get_num_threads()
        code = main([str(speech_wav), "--no-partials", "--threads", "1", *map(str, argv)])
        torch.set_num_threads(threads)
        out, err = capsys.readouterr()
        assert code == 0, err
        finals[argv[0]] = [line for line in out.splitlines() if line.startswith("[")]
    assert finals["--engine"] == finals["--checkpoint"] and len(finals["--checkpoint"]) == 2


def test_aoti_engine_is_a_drop_in_for_stream_step_with_strided_inputs(export_ckpt, aoti_export):
    """``AotiStreamStep`` gives ``stream_step``'s output for two streams whose state and chunks are slices
    of one batch (not contiguous): the engine passes the package dense tensors."""
    loaded = load_export(aoti_export)
    model = load_model(export_ckpt).model
    feats = torch.randn(2, 40, 80, generator=torch.Generator().manual_seed(3))
    s_torch = init_state(model.encoder, feats[:, :3])
    s_aoti = init_state(loaded.model.encoder, feats[:, :3])
    for start, valid in ((3, 16), (19, 16), (35, 5)):
        chunk = feats[:, start : start + 16] if valid == 16 else feats[:, start:].new_zeros(2, 16, 80)
        lengths = torch.tensor([valid, valid])
        enc, lens, s_torch = stream_step(model.encoder, chunk, s_torch, lengths)
        got, got_lens, s_aoti = loaded.step(loaded.model.encoder, chunk, s_aoti, lengths)
        torch.testing.assert_close(got, enc, atol=ATOL, rtol=1e-4)
        assert torch.equal(got_lens, lens)
