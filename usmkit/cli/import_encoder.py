"""``python -m usmkit.cli.import_encoder source=DIR out=DIR``: a downloaded w2v-BERT 2.0 encoder as a usmkit experiment.

``source`` is the folder of ``facebook/w2v-bert-2.0`` as the Hugging Face hub holds it (``config.json``,
``model.safetensors``, ``preprocessor_config.json``), downloaded beforehand: nothing is fetched here. The
conversion is ``usmkit.models.w2vbert`` (pure); this module reads the source, checks it and writes ``out``::

    out/imported.json                         what was imported: the source's files and SHA-256, the tensors
                                              left out, the encoder and feature configs, the command to train
    out/checkpoints/step-000000/              a usmkit checkpoint (``usmkit.checkpointing.checkpoint``'s writer):
        model.safetensors                     the encoder, ``encoder.*``
        train_state.json, config.yaml         the files' sizes and SHA-256; the model and feature sections

so ``init_from=out`` starts any recipe from it. Only safetensors are read (a ``pytorch_model.bin`` is a pickle,
which could run code, and is refused). A source of another architecture, a config usmkit cannot reproduce
exactly, a tensor the encoder lacks or misses, or a damaged file is refused with one ``error:`` line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

USAGE = """\
usage: python -m usmkit.cli.import_encoder source=DIR out=DIR

  source=DIR   a downloaded facebook/w2v-bert-2.0 folder (config.json, model.safetensors[, preprocessor_config.json]),
               e.g. from: huggingface-cli download facebook/w2v-bert-2.0 --local-dir w2v-bert-2.0
  out=DIR      the experiment folder to write (e.g. exp/w2vbert); an earlier import there is replaced

Then: python -m usmkit.cli.train recipe=stage3_ctc model=w2v_bert_2 init_from=DIR (docs/pretrained.md).
"""

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
PREPROCESSOR = "preprocessor_config.json"
RECORD = "imported.json"
PRESET = "w2v_bert_2"
MODEL_SECTION = ("chunk_size", "left_chunks", "causal_conv", "attention_impl", "dropout", "subsampling_factor")


@dataclass(frozen=True)
class ImportArgs:
    source: str = ""
    out: str = ""


@dataclass(frozen=True)
class Imported:
    """What ``import_w2vbert`` wrote: the checkpoint, the record and the numbers a user is shown."""

    checkpoint: Path
    record: dict[str, Any]
    tensors: int
    parameters: int


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_json(path: Path) -> dict[str, Any]:
    from usmkit.models.w2vbert import ImportRefused

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ImportRefused(f"{path} is not readable JSON ({type(e).__name__}: {e}); download it again") from None
    if not isinstance(data, dict):
        raise ImportRefused(f"{path} holds a {type(data).__name__}, not a JSON object; download it again")
    return data


def _stack(source: Path) -> int:
    """Frames the source's feature extractor stacks (``preprocessor_config.json``'s ``stride``; 2 without it),
    after checking that it is SeamlessM4T's 80-bin 16 kHz filterbank, which usmkit computes."""
    from usmkit.models.w2vbert import ImportRefused

    path = source / PREPROCESSOR
    if not path.is_file():
        return 2
    pre = _read_json(path)
    kind = pre.get("feature_extractor_type", "SeamlessM4TFeatureExtractor")
    expected = {"num_mel_bins": 80, "sampling_rate": 16000}
    wrong = {k: pre[k] for k, v in expected.items() if k in pre and pre[k] != v}
    if kind != "SeamlessM4TFeatureExtractor" or wrong:
        raise ImportRefused(
            f"{path}: feature_extractor_type={kind!r} {wrong or ''}; usmkit computes SeamlessM4TFeatureExtractor's "
            "80-bin 16 kHz features only"
        )
    return int(pre.get("stride", 2))


def _load_weights(path: Path):
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from usmkit.models.w2vbert import ImportRefused

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ImportRefused(f"{path} is damaged or not a safetensors file ({e}); download it again") from None


def model_overrides(cfg) -> dict[str, Any]:
    """The fields of ``cfg`` (a ``ConformerConfig``) that differ from the ``w2v_bert_2`` preset with the model
    section's own keys (``MODEL_SECTION``) taken from ``cfg``: what ``model.overrides`` must say for it."""
    from usmkit.models.presets import w2v_bert_2

    base = w2v_bert_2(**{k: getattr(cfg, k) for k in MODEL_SECTION})
    return {
        f.name: getattr(cfg, f.name)
        for f in dataclasses.fields(cfg)
        if f.name not in MODEL_SECTION and getattr(cfg, f.name) != getattr(base, f.name)
    }


def train_command(out: Path, overrides: dict[str, Any]) -> str:
    """The command that fine-tunes the import with CTC."""
    extra = ""
    if overrides:
        extra = " 'model.overrides={" + ",".join(f"{k}:{v}" for k, v in overrides.items()) + "}'"
    return f"python -m usmkit.cli.train recipe=stage3_ctc model={PRESET} init_from={out}{extra}"


def import_w2vbert(source: str | Path, out: str | Path) -> Imported:
    """Convert the w2v-BERT 2.0 folder ``source`` into the usmkit experiment folder ``out`` (module doc)."""
    import torch
    import yaml

    from usmkit.checkpointing.atomic import replaced_atomically
    from usmkit.checkpointing.checkpoint import CheckpointContent, tensors_for_save, write_checkpoint
    from usmkit.checkpointing.output_dir import check_output_dir
    from usmkit.data.config import seamless_m4t_features
    from usmkit.models.conformer import ConformerEncoder
    from usmkit.models.w2vbert import ImportRefused, convert_state_dict, encoder_config

    source, out = Path(source), Path(out)
    if not source.is_dir():
        raise ImportRefused(f"source={source} is not a folder; pass the downloaded w2v-BERT 2.0 folder")
    if not (source / WEIGHTS).is_file():
        pickled = [p.name for p in source.glob("*.bin")]
        hint = f" ({pickled[0]} is a pickle, which usmkit never loads)" if pickled else ""
        raise ImportRefused(f"source={source} has no {WEIGHTS}{hint}; download the safetensors weights")
    if not (source / CONFIG).is_file():
        raise ImportRefused(f"source={source} has no {CONFIG}; download the model's config.json too")
    check_output_dir(
        out, option="out=", own_kind="experiment", own_words="an imported encoder", own=lambda p: (p / RECORD).is_file()
    )
    hf = _read_json(source / CONFIG)
    cfg = encoder_config(hf, stack=_stack(source))
    converted, skipped = convert_state_dict(_load_weights(source / WEIGHTS), cfg)
    with torch.device("meta"):
        expected = {k: v.shape for k, v in ConformerEncoder(cfg).state_dict().items()}
    if set(expected) != set(converted) or any(converted[k].shape != s for k, s in expected.items()):
        raise ImportRefused(f"the converted tensors of {source / WEIGHTS} do not fit usmkit's encoder of {cfg}")
    bad = next((k for k, v in converted.items() if v.is_floating_point() and not bool(v.isfinite().all())), None)
    if bad is not None:
        raise ImportRefused(f"{source / WEIGHTS}: tensor for {bad!r} holds NaN or Inf; download it again")

    features = seamless_m4t_features()
    overrides = model_overrides(cfg)
    section = {k: getattr(cfg, k) for k in MODEL_SECTION} | {"preset": PRESET, "overrides": overrides or None}
    config = {"model": section, "data": {"features": dataclasses.asdict(features)}}
    record = {
        "format": 1,
        "kind": "w2v-bert-2.0",
        "source": str(source.resolve()),
        "source_files": {n: _sha256(source / n) for n in (CONFIG, WEIGHTS, PREPROCESSOR) if (source / n).is_file()},
        "skipped_tensors": skipped,
        "encoder": dataclasses.asdict(cfg),
        "features": dataclasses.asdict(features),
        "train": train_command(out, overrides),
    }
    weights = tensors_for_save({f"encoder.{k}": v.float() for k, v in converted.items()})
    content = CheckpointContent(weights, {"step": 0, "imported": record["kind"]}, {}, yaml.safe_dump(config))
    out.mkdir(parents=True, exist_ok=True)
    ckpt = write_checkpoint(out / "checkpoints", 0, content)
    with replaced_atomically(out / RECORD) as tmp:
        tmp.write_text(json.dumps(record, indent=1))
    return Imported(ckpt, record, len(weights), sum(v.numel() for v in weights.values()))


def main(argv: Sequence[str] | None = None) -> int:
    from usmkit.cli.compose import compose_dataclass
    from usmkit.errors import UsageError, strip_debug_flag, user_errors

    argv = strip_debug_flag(sys.argv[1:] if argv is None else argv)
    with user_errors():  # a bad source or out: one line, exit code 2 (--debug: the traceback)
        args = compose_dataclass(ImportArgs, argv, command="usmkit.cli.import_encoder", usage=USAGE)
        if not args.source or not args.out:
            raise UsageError("pass source=DIR and out=DIR (python -m usmkit.cli.import_encoder --help)")
        result = import_w2vbert(args.source, args.out)
    enc = result.record["encoder"]
    print(
        f"imported {result.record['source']}: {result.tensors} tensors, {result.parameters:,} parameters "
        f"({enc['num_layers']} layers x {enc['d_model']}, {enc['num_heads']} heads) -> {result.checkpoint}"
    )
    if result.record["skipped_tensors"]:
        print(f"  left out: {', '.join(result.record['skipped_tensors'])} (transformers' own training-time masking)")
    print(f"fine-tune it: {result.record['train']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
