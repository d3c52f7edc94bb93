"""Fixtures of the export tests: a small streaming CTC checkpoint, its exports, and features to stream.

The checkpoint is untrained (random weights, like ``tests/streaming/test_transcribe_cli.py``'s, whose
tokenizer texts and speech-like audio it reuses) with two layers of the ``tiny`` preset, so an ONNX
export takes seconds. Its CTC head is random too, so every frame's log-probs (and the greedy
transcript) depend on the encoder output: equal transcripts mean equal encoder frames.

``export_ckpt`` names no training manifest (its exports have no lexicon); ``lexicon_ckpt`` is the same
model with a training split whose transcripts are the tokenizer's texts, so that exports bundle their
lexicon and word LM and ``--lexicon`` works from the checkpoint.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import yaml

from usmkit.checkpointing.checkpoint import save_checkpoint
from usmkit.config import DataConfig, ModelSection, TaskConfig, TrainConfig, TrainerConfig, to_dict
from usmkit.data.features import fbank_extractor
from usmkit.data.manifests import manifest_path, write_manifest
from usmkit.data.normalize import STATS_FILE, FeatureStats
from usmkit.data.tokenizer import Tokenizer, minimum_vocab_size
from usmkit.tasks import build_task

_spec = importlib.util.spec_from_file_location(
    "streaming_cli_helpers", Path(__file__).resolve().parents[1] / "streaming" / "test_transcribe_cli.py"
)
streaming_cli = importlib.util.module_from_spec(_spec)  # speechlike(), speech_silence_speech(), TEXTS, SR
_spec.loader.exec_module(streaming_cli)

CHUNK, LEFT = 4, 2


def write_training_split(manifest_dir: Path, texts: list[str]) -> None:
    """A ``synth`` train split of one cut per text (all on one short recording): what a lexicon is built from."""
    import soundfile as sf
    from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

    manifest_dir.mkdir(parents=True, exist_ok=True)
    wav = manifest_dir / "speech.wav"
    sf.write(wav, streaming_cli.speechlike(1.0), streaming_cli.SR, subtype="PCM_16")
    rec = Recording.from_file(wav)
    cuts = [
        MonoCut(f"t{i}", 0.0, rec.duration, 0, recording=rec,
                supervisions=[SupervisionSegment(f"t{i}", rec.id, 0.0, rec.duration, text=text)])
        for i, text in enumerate(texts)
    ]  # fmt: skip
    write_manifest(CutSet.from_cuts(cuts), manifest_path(manifest_dir, "synth", "cuts", "train"))


def make_export_checkpoint(
    root: Path, *, causal: bool = True, chunk: int | None = CHUNK, transcripts: bool = False
) -> Path:
    """Experiment dir ``root``: a 2-layer tiny streaming CTC model, its tokenizer and feature stats;
    ``transcripts``: and a training split (``write_training_split``) named by its config."""
    texts = streaming_cli.TEXTS
    if transcripts:
        write_training_split(root / "manifests", texts)
    tokenizer = Tokenizer.train(texts, root / "tokenizer", vocab_size=minimum_vocab_size(texts) + 8)
    cfg = TrainConfig(
        task=TaskConfig(kind="ctc"),
        model=ModelSection(
            preset="tiny",
            chunk_size=chunk,
            left_chunks=LEFT,
            causal_conv=causal,
            dropout=0.0,
            overrides={"num_layers": 2, "zero_init_residual": False},  # every path contributes
        ),  # fmt: skip
        data=DataConfig(manifest_dir=str(root / ("manifests" if transcripts else "no-manifests"))),
        trainer=TrainerConfig(exp_dir=str(root)),
        tokenizer=str(tokenizer.path),
    )
    torch.manual_seed(0)
    module = build_task(cfg.task, cfg.model.build_config(cfg.data.features.num_mel_bins), tokenizer.vocab_size)
    # Logits of a few units, blank ahead by 4: blank on most frames, tokens on others; only pieces of
    # letters (no byte pieces, whose text is not printable).
    letters = torch.tensor([tokenizer.decode([i]).strip().isalpha() for i in range(tokenizer.vocab_size)])
    with torch.no_grad():
        module.ctc.proj.weight.mul_(4.0)
        module.ctc.proj.bias.masked_fill_(~letters, -30.0)
        module.ctc.proj.bias[0] = 4.0
    save_checkpoint(root / "checkpoints", 1, module, {}, yaml.safe_dump(to_dict(cfg)))
    audio = streaming_cli.speechlike(2.0)
    feats = torch.as_tensor(fbank_extractor(cfg.data.features).extract(audio, streaming_cli.SR))  # (T, 80)
    FeatureStats(mean=feats.mean(0), std=feats.std(0).clamp_min(1e-5)).save(root / STATS_FILE, cfg.data.features)
    return root


@pytest.fixture(scope="session")
def checkpoint_factory():
    """``make_export_checkpoint`` for tests that need a checkpoint of their own (another mask)."""
    return make_export_checkpoint


@pytest.fixture(scope="session")
def export_ckpt(tmp_path_factory) -> Path:
    return make_export_checkpoint(tmp_path_factory.mktemp("export_ckpt"))


def _export_cli(*argv: str) -> tuple[Path, str]:
    """``python -m usmkit.cli.export argv`` in this process: (the export directory, what it printed)."""
    import contextlib
    import io

    from usmkit.cli.export import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(list(argv)) == 0
    out = next(a.removeprefix("out=") for a in argv if a.startswith("out="))
    return Path(out), printed.getvalue()


@pytest.fixture(scope="session")
def onnx_cli_export(export_ckpt, tmp_path_factory) -> tuple[Path, str]:
    """The fp32 ONNX export, made by the command line: (directory, what it printed)."""
    return _export_cli(f"checkpoint={export_ckpt}", "format=onnx", f"out={tmp_path_factory.mktemp('exports') / 'onnx'}")


@pytest.fixture(scope="session")
def onnx_export(onnx_cli_export) -> Path:
    return onnx_cli_export[0]


@pytest.fixture(scope="session")
def int8_export(export_ckpt, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("exports") / "onnx_int8"
    return _export_cli(f"checkpoint={export_ckpt}", "format=onnx", "quantize=int8", f"out={out}")[0]


@pytest.fixture(scope="session")
def lexicon_ckpt(tmp_path_factory) -> Path:
    return make_export_checkpoint(tmp_path_factory.mktemp("lexicon_ckpt"), transcripts=True)


@pytest.fixture(scope="session")
def lexicon_onnx(lexicon_ckpt, tmp_path_factory) -> Path:
    """``lexicon_ckpt`` exported to ONNX, with its lexicon bundled (the default settings)."""
    out = tmp_path_factory.mktemp("exports") / "lexicon_onnx"
    return _export_cli(f"checkpoint={lexicon_ckpt}", "format=onnx", f"out={out}")[0]


@pytest.fixture(scope="session")
def lexicon_int8(lexicon_ckpt, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("exports") / "lexicon_int8"
    return _export_cli(f"checkpoint={lexicon_ckpt}", "format=onnx", "quantize=int8", f"out={out}")[0]


@pytest.fixture(scope="session")
def speech_wav(tmp_path_factory) -> Path:
    import soundfile as sf

    path = tmp_path_factory.mktemp("export_audio") / "speech.wav"
    sf.write(path, streaming_cli.speech_silence_speech(), streaming_cli.SR, subtype="PCM_16")
    return path
