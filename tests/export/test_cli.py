"""``python -m usmkit.cli.export`` and ``usmkit-transcribe --engine onnx``: end to end, and their bad input."""

from __future__ import annotations

import json
import re

import pytest
import torch

from usmkit.cli.export import main as export_main
from usmkit.cli.transcribe import main as transcribe_main
from usmkit.export import ExportError, read_manifest

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """``--threads 1`` sets torch's thread count for this process; put it back after each test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


FINAL_LINE = re.compile(r"^\[\d\d:\d\d\.\d\d - \d\d:\d\d\.\d\d\] .+$")


def transcribe(capsys, *argv) -> tuple[int, str, str, list[str]]:
    code = transcribe_main([str(a) for a in argv] + ["--threads", "1", "--no-partials"])
    out, err = capsys.readouterr()
    return code, out, err, [line for line in out.splitlines() if FINAL_LINE.match(line)]


def test_engine_onnx_gives_the_eager_transcript(export_ckpt, onnx_export, speech_wav, capsys, tmp_path):
    code, _, err, eager = transcribe(capsys, speech_wav, "--checkpoint", export_ckpt, "--step", "eager",
                                     "--json", tmp_path / "eager.json")  # fmt: skip
    assert code == 0, err
    code, _, err, onnx = transcribe(capsys, speech_wav, "--engine", "onnx", "--model", onnx_export,
                                    "--json", tmp_path / "onnx.json")  # fmt: skip
    assert code == 0, err
    assert onnx == eager and len(eager) == 2  # speech, silence (an endpoint), speech
    assert re.search(r"RTF \d+\.\d+, chunk latency", err) and "Traceback" not in err
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("eager", "onnx"))
    assert [s["words"] for s in b["segments"]] == [s["words"] for s in a["segments"]]  # word timings too
    assert b["chunks"] == a["chunks"] and b["checkpoint"] == str(onnx_export)


def test_engine_onnx_int8_transcribes(int8_export, speech_wav, capsys):
    code, _, err, finals = transcribe(capsys, speech_wav, "--engine", "onnx", "--model", int8_export)
    assert code == 0, err
    assert len(finals) == 2


def test_engine_option_errors_exit_2(export_ckpt, onnx_export, speech_wav, capsys, tmp_path):
    cases = [
        (["--engine", "onnx"], "--engine onnx needs --model"),
        (["--engine", "onnx", "--model", tmp_path], "is not an export directory: no export.json"),
        (["--engine", "aoti", "--model", onnx_export], "holds an export of format onnx; pass --engine onnx"),
        (["--engine", "onnx", "--model", onnx_export, "--quantize", "int8"], "export with quantize=int8"),
        (["--engine", "onnx", "--model", onnx_export, "--no-streaming"], "--no-streaming does not go with"),
        (["--engine", "onnx", "--model", onnx_export, "--chunk-size", "8"], "the export was made for 4"),
        (["--engine", "onnx", "--model", onnx_export, "--checkpoint", export_ckpt], "pass it as --model"),
        (["--model", onnx_export], "no model: pass --checkpoint"),
    ]
    for argv, message in cases:
        code, _, err, _ = transcribe(capsys, speech_wav, *argv)
        assert code == 2 and message in err, (argv, err)
        assert "Traceback" not in err


def test_export_cli_writes_the_directory_and_refuses_bad_input(onnx_cli_export, export_ckpt, capsys, tmp_path,
                                                               checkpoint_factory):  # fmt: skip
    out, printed = onnx_cli_export
    assert f"usmkit-transcribe AUDIO --engine onnx --model {out}" in printed
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["export.json", "stream_step.onnx", "offline.onnx", "tokenizer.model", "feature_stats.safetensors",
         "ctc_head.safetensors"]
    )  # fmt: skip
    assert read_manifest(out).source_checkpoint == str(export_ckpt / "checkpoints" / "step-000001")
    assert not list(out.parent.glob(".tmp-*"))  # written beside, then renamed into place

    offline_ckpt = checkpoint_factory(tmp_path / "offline", causal=False, chunk=None)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    cases = [
        (
            [f"checkpoint={offline_ckpt}", "format=onnx"],
            "cannot export checkpoint .* as a streaming model: .*not causal",
        ),
        ([f"checkpoint={export_ckpt}", "format=aoti", "quantize=int8"], "quantize=int8 .* with format=onnx"),
        ([f"checkpoint={export_ckpt}", "format=tflite"], "format='tflite': use format=onnx or format=aoti"),
        ([f"checkpoint={tmp_path / 'nope'}", "format=onnx"], "cannot load checkpoint"),
        ([f"checkpoint={export_ckpt}", "format=onnx", f"out={tmp_path / 'mine'}"], "exists and is not an export"),
        (["format=onnx"], "pass checkpoint=EXP and format=onnx|aoti"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_:
            export_main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and re.search(message, err), (argv, err)
        assert err.startswith("error: ") and "Traceback" not in err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_damaged_export_directory_is_named(onnx_export, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(onnx_export, broken)
    (broken / "stream_step.onnx").unlink()
    with pytest.raises(ExportError, match=r"broken/stream_step\.onnx is missing"):
        read_manifest(broken)
    record = json.loads((onnx_export / "export.json").read_text())
    (broken / "export.json").write_text(json.dumps({**record, "chunk_size": "four"}))
    with pytest.raises(ExportError, match="chunk_size: expected int"):
        read_manifest(broken)
    (broken / "export.json").write_text(json.dumps({**record, "version": 99}))
    with pytest.raises(ExportError, match="manifest version 99"):
        read_manifest(broken)


def test_damaged_onnx_file_exits_2_naming_it(onnx_export, speech_wav, capsys, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(onnx_export, broken)
    data = (broken / "stream_step.onnx").read_bytes()
    (broken / "stream_step.onnx").write_bytes(data[: len(data) // 2])
    code, _, err, _ = transcribe(capsys, speech_wav, "--engine", "onnx", "--model", broken)
    assert code == 2 and "broken/stream_step.onnx is damaged: its SHA-256 does not match" in err
    assert "Traceback" not in err
    # A manifest without SHA-256 (version 1): onnxruntime's refusal, naming the file.
    record = json.loads((broken / "export.json").read_text())
    del record["sha256"], record["lexicon"]
    (broken / "export.json").write_text(json.dumps({**record, "version": 1}))
    code, _, err, _ = transcribe(capsys, speech_wav, "--engine", "onnx", "--model", broken)
    assert code == 2 and "onnxruntime cannot load" in err and "broken/stream_step.onnx" in err
    assert "Traceback" not in err
