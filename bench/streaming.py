"""Streaming speed on this CPU: real-time factor and per-chunk latency of ``usmkit-transcribe``.

    PYTHONPATH=. python bench/streaming.py [--data data/synth] [--seconds 60] [--threads 1]
        [--sizes tiny,small] [--chunks 320,640,1280] [--variants eager,jit,jit_int8,onnx,onnx_int8,aoti]

For ``tiny`` and ``small`` at 320 / 640 / 1280 ms chunks (8 / 16 / 32 encoder frames, 2.56 s of left
context, causal convolution), it builds a streaming checkpoint (random weights: speed does not
depend on them; the corpus tokenizer and feature statistics), streams a recording of held-out test
utterances through the real CLI path (incremental fbank -> encoder ``stream_step`` -> CTC ->
streaming decoder), and reads RTF and chunk latency from the CLI's ``--json`` output. Each setting
runs its variants back to back: ``eager`` (plain PyTorch, ``--step eager``), ``jit`` (the CLI's default:
the traced, frozen step), ``jit_int8`` (traced, int8 linear weights: ``--quantize int8``), and the
exported step (``python -m usmkit.cli.export``, ``--engine onnx|aoti --model DIR``): ``onnx`` (onnxruntime,
fp32), ``onnx_int8`` (onnxruntime, int8 linear weights: ``quantize=int8``) and ``aoti`` (an
AOTInductor package). Only the encoder step differs between them; features, CTC and decoding are the
same code. The top-level ``rtf`` / latency keys of a setting are the default's (``jit``); every
variant is under ``variants``. Tracing time (``setup_s``) is start-up, as loading the checkpoint is,
and not in the RTF; so is exporting (``export_s``, once per model). Writes ``bench/results/streaming.json``;
the settings of the previous file that this run did not measure (``--sizes`` / ``--chunks``) are kept
under ``earlier``, with the command and date that measured them.
"""

from __future__ import annotations

import usmkit.cli  # noqa: F401  (first: the OpenMP wait policy of the entry points, before torch loads)

# isort: split
import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import yaml

from tools.results import result_path, run_header, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from usmkit.checkpointing.checkpoint import save_checkpoint  # noqa: E402
from usmkit.cli.transcribe import main as transcribe  # noqa: E402
from usmkit.config import DataConfig, ModelSection, TaskConfig, TrainConfig, TrainerConfig, to_dict  # noqa: E402
from usmkit.data.manifests import load_cuts  # noqa: E402
from usmkit.data.normalize import load_or_compute_stats  # noqa: E402
from usmkit.data.tokenizer import Tokenizer  # noqa: E402
from usmkit.export import export_checkpoint  # noqa: E402
from usmkit.tasks import build_task  # noqa: E402

CHUNKS_MS = (320, 640, 1280)
VARIANTS = {  # name -> (export (format, quantize) or None for the checkpoint in PyTorch, usmkit-transcribe flags)
    "eager": (None, ("--step", "eager")),
    "jit": (None, ("--step", "jit")),
    "jit_int8": (None, ("--step", "jit", "--quantize", "int8")),
    "onnx": (("onnx", "none"), ("--engine", "onnx")),
    "onnx_int8": (("onnx", "int8"), ("--engine", "onnx")),
    "aoti": (("aoti", "none"), ("--engine", "aoti")),
}
LEFT_CONTEXT_MS = 2560


def make_checkpoint(root: Path, data: Path, size: str, chunk: int, left: int) -> Path:
    tok = Tokenizer.load(data / "tokenizer" / "tokenizer.model")
    cfg = TrainConfig(
        task=TaskConfig(kind="ctc"),
        model=ModelSection(preset=size, chunk_size=chunk, left_chunks=left, causal_conv=True, dropout=0.0),
        data=DataConfig(manifest_dir=str(data)),
        trainer=TrainerConfig(exp_dir=str(root)),
        tokenizer=str(tok.path),
    )
    torch.manual_seed(0)
    module = build_task(cfg.task, cfg.model.build_config(input_dim=80), tok.vocab_size)
    save_checkpoint(root / "checkpoints", 1, module, {}, yaml.safe_dump(to_dict(cfg)))
    stats = load_or_compute_stats(load_cuts(data, "train"), cfg.data)  # a corpus no run has trained on yet has none
    stats.save(root / "feature_stats.safetensors", cfg.data.features)
    return root


def make_audio(data: Path, seconds: float, out: Path) -> float:
    pieces, total = [], 0.0
    for cut in load_cuts(data, "test"):
        audio = cut.load_audio()[0]
        pieces += [audio, np.zeros(4000, dtype=audio.dtype)]
        total += len(audio) / 16000 + 0.25
        if total >= seconds:
            break
    sf.write(out, np.concatenate(pieces), 16000, subtype="PCM_16")
    return total


def measure(wav: Path, root: Path, out: Path, threads: int, variant: str) -> dict:
    """RTF and chunk latency of one ``usmkit-transcribe`` run over ``wav`` (exporting the model first for an engine)."""
    export, flags = VARIANTS[variant]
    model, timing = ["--checkpoint", str(root)], {}
    if export is not None:
        torch.set_num_threads(threads)  # exporting (AOTI's C++ compile aside) on the same threads as the run
        start = time.perf_counter()
        out_dir, _ = export_checkpoint(root, *export, out=root / f"export_{variant}")
        timing["export_s"] = round(time.perf_counter() - start, 1)
        model = ["--model", str(out_dir)]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        code = transcribe([str(wav), *model, "--json", str(out), "--no-partials",
                           "--threads", str(threads), *flags])  # fmt: skip
    if code != 0:
        raise SystemExit(f"usmkit-transcribe failed ({code}) for {root} {variant}:\n{err.getvalue()}")
    r = json.loads(out.read_text())
    return {
        "rtf": r["rtf"],
        "latency_ms_p50": round(r["chunk_latency_ms"]["p50"], 2),
        "latency_ms_p95": round(r["chunk_latency_ms"]["p95"], 2),
        "chunks": r["chunks"],
        "setup_s": r["setup_seconds"],
        **timing,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/synth")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--chunks", default=",".join(map(str, CHUNKS_MS)), help="chunk sizes in ms")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"a subset of {','.join(VARIANTS)}")
    ap.add_argument("--note", default="", help="stored in the JSON (e.g. what else ran on the machine)")
    args = ap.parse_args()
    data = Path(args.data)
    names = args.variants.split(",")
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown --variants {unknown}; choose from {list(VARIANTS)}")
    results = run_header(threads=args.threads, left_context_ms=LEFT_CONTEXT_MS, note=args.note, models={})
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        wav = tmp / "stream.wav"
        results["audio_seconds"] = round(make_audio(data, args.seconds, wav), 1)
        print(f"{'model':6s} {'chunk':>7s} " + " ".join(f"{v + ' RTF':>14s} {'p50/p95 ms':>11s}" for v in names)
              + " (x: eager RTF / variant RTF)")  # fmt: skip
        for size in args.sizes.split(","):
            results["models"][size] = {}
            for chunk_ms in map(int, args.chunks.split(",")):
                chunk, left = chunk_ms // 40, LEFT_CONTEXT_MS // chunk_ms
                root = make_checkpoint(tmp / f"{size}_{chunk}", data, size, chunk, left)
                variants = {name: measure(wav, root, tmp / "out.json", args.threads, name) for name in names}
                entry = dict(variants.get("jit", {})) | {
                    "chunk_size_frames": chunk,
                    "left_chunks": left,
                    "variants": variants,
                }
                results["models"][size][f"{chunk_ms}ms"] = entry
                eager = variants["eager"]["rtf"] if "eager" in variants else float("nan")
                cells = " ".join(
                    f"{v['rtf']:7.3f} {eager / v['rtf']:5.2f}x {v['latency_ms_p50']:5.0f}/{v['latency_ms_p95']:<5.0f}"
                    for v in variants.values()
                )
                print(f"{size:6s} {chunk_ms:5d}ms {cells}", flush=True)
    path = result_path("streaming")
    results["earlier"] = earlier_runs(path, results["models"])
    print(f"wrote {write_result(path, results)}")


def earlier_runs(path: Path, measured: dict) -> list[dict]:
    """The settings of the previous result file (and of the runs it kept) that this run did not measure,
    each run with its own command and date: a run of a few settings keeps the others' rows."""
    if not path.is_file():
        return []
    old = json.loads(path.read_text())
    runs = []
    for run in [{k: v for k, v in old.items() if k != "earlier"}, *old.get("earlier", [])]:
        models = {
            size: rows
            for size, settings in run.get("models", {}).items()
            if (rows := {c: e for c, e in settings.items() if c not in measured.get(size, {})})
        }
        if models:
            runs.append({k: run[k] for k in ("command", "date", "machine", "device", "torch") if k in run} | {
                "models": models})  # fmt: skip
        measured = {size: {**measured.get(size, {}), **models.get(size, {})} for size in {*measured, *models}}
    return runs


if __name__ == "__main__":
    main()
