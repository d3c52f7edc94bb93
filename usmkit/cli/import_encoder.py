"""``python -m usmkit.cli.import_encoder source=DIR|FILE.nemo out=DIR``: a downloaded w2v-BERT 2.0 or NEST encoder
as a usmkit experiment.

``source`` is the folder of ``facebook/w2v-bert-2.0`` as the Hugging Face hub holds it (``config.json``,
``model.safetensors``, ``preprocessor_config.json``), or a NEST ``.nemo`` archive (``ssl_en_nest_large_v1.0.nemo``:
a tar of ``model_config.yaml`` and ``model_weights.ckpt``), downloaded beforehand: nothing is fetched here. The
conversions are ``usmkit.models.w2vbert`` and ``usmkit.models.nest`` (pure); this module reads the source, checks
it and writes ``out``::

    out/imported.json                         what was imported: the source's files and SHA-256, the tensors
                                              left out, the encoder and feature configs, the command to train
    out/checkpoints/step-000000/              a usmkit checkpoint (``usmkit.checkpointing.checkpoint``'s writer):
        model.safetensors                     the encoder, ``encoder.*``
        train_state.json, config.yaml         the files' sizes and SHA-256; the model and feature sections

so ``init_from=out`` starts any recipe from it. Only safetensors are read (a ``pytorch_model.bin`` is a pickle,
which could run code, and is refused). From a ``.nemo`` only its two files are read, straight from the archive (no
member is extracted to disk), the config with ``yaml.safe_load`` and the weights with ``torch.load(weights_only=True)``,
which loads tensors and plain containers and refuses any other object. A source of another architecture, a config usmkit cannot reproduce
exactly, a tensor the encoder lacks or misses, or a damaged file is refused with one ``error:`` line.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from usmkit.checkpointing.checkpoint import _sha256  # what checkpoints record of their files

USAGE = """\
usage: python -m usmkit.cli.import_encoder source=DIR|FILE.nemo out=DIR

  source=DIR   a downloaded facebook/w2v-bert-2.0 folder (config.json, model.safetensors[, preprocessor_config.json]),
               e.g. from: huggingface-cli download facebook/w2v-bert-2.0 --local-dir w2v-bert-2.0
  source=FILE.nemo  a downloaded NEST archive (ssl_en_nest_large_v1.0.nemo or ssl_en_nest_xlarge_v1.0.nemo)
  out=DIR      the experiment folder to write (e.g. exp/w2vbert); an earlier import there is replaced

Then: python -m usmkit.cli.train recipe=stage3_ctc model=w2v_bert_2 init_from=DIR (model=nest_large for NEST;
docs/pretrained.md).
"""

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
PREPROCESSOR = "preprocessor_config.json"
RECORD = "imported.json"
PRESET = "w2v_bert_2"
NEMO_CONFIG = "model_config.yaml"
NEMO_WEIGHTS = "model_weights.ckpt"
NEST_PRESETS = ("nest_large", "nest_xlarge")
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


def model_overrides(cfg, preset: str = PRESET) -> dict[str, Any]:
    """The fields of ``cfg`` (a ``ConformerConfig``) that differ from the ``preset`` (``w2v_bert_2``) with the model
    section's own keys (``MODEL_SECTION``) taken from ``cfg``: what ``model.overrides`` must say for it."""
    from usmkit.models.presets import preset as build

    base = build(preset, **{k: getattr(cfg, k) for k in MODEL_SECTION})
    return {
        f.name: getattr(cfg, f.name)
        for f in dataclasses.fields(cfg)
        if f.name not in MODEL_SECTION and getattr(cfg, f.name) != getattr(base, f.name)
    }


def train_command(out: Path, overrides: dict[str, Any], preset: str = PRESET) -> str:
    """The command that fine-tunes the import with CTC."""
    extra = ""
    if overrides:
        extra = " 'model.overrides={" + ",".join(f"{k}:{v}" for k, v in overrides.items()) + "}'"
    return f"python -m usmkit.cli.train recipe=stage3_ctc model={preset} init_from={out}{extra}"


def import_w2vbert(source: str | Path, out: str | Path) -> Imported:
    """Convert the w2v-BERT 2.0 folder ``source`` into the usmkit experiment folder ``out`` (module doc)."""
    from usmkit.checkpointing.output_dir import check_output_dir
    from usmkit.data.config import seamless_m4t_features
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
    files = {n: _sha256(source / n) for n in (CONFIG, WEIGHTS, PREPROCESSOR) if (source / n).is_file()}
    return _write_import(source, out, cfg, converted, skipped, seamless_m4t_features(), "w2v-bert-2.0", files, PRESET)


def _write_import(source: Path, out: Path, cfg, converted, skipped, features, kind, files, preset) -> Imported:
    """Check the converted tensors against usmkit's encoder of ``cfg`` and write ``out`` (module doc)."""
    import torch
    import yaml

    from usmkit.checkpointing.atomic import replaced_atomically
    from usmkit.checkpointing.checkpoint import CheckpointContent, tensors_for_save, write_checkpoint
    from usmkit.models.conformer import ConformerEncoder
    from usmkit.models.w2vbert import ImportRefused

    with torch.device("meta"):
        expected = {k: v.shape for k, v in ConformerEncoder(cfg).state_dict().items()}
    if set(expected) != set(converted) or any(converted[k].shape != s for k, s in expected.items()):
        raise ImportRefused(f"the converted tensors of {source} do not fit usmkit's encoder of {cfg}")
    bad = next((k for k, v in converted.items() if v.is_floating_point() and not bool(v.isfinite().all())), None)
    if bad is not None:
        raise ImportRefused(f"{source}: tensor for {bad!r} holds NaN or Inf; download it again")

    overrides = model_overrides(cfg, preset)
    section = {k: getattr(cfg, k) for k in MODEL_SECTION} | {"preset": preset, "overrides": overrides or None}
    config = {"model": section, "data": {"features": dataclasses.asdict(features)}}
    record = {
        "format": 1,
        "kind": kind,
        "source": str(source.resolve()),
        "source_files": files,
        "skipped_tensors": skipped,
        "encoder": dataclasses.asdict(cfg),
        "features": dataclasses.asdict(features),
        "train": train_command(out, overrides, preset),
    }
    weights = tensors_for_save({f"encoder.{k}": v.float() for k, v in converted.items()})
    content = CheckpointContent(weights, {"step": 0, "imported": record["kind"]}, {}, yaml.safe_dump(config))
    out.mkdir(parents=True, exist_ok=True)
    ckpt = write_checkpoint(out / "checkpoints", 0, content)
    with replaced_atomically(out / RECORD) as tmp:
        tmp.write_text(json.dumps(record, indent=1))
    return Imported(ckpt, record, len(weights), sum(v.numel() for v in weights.values()))


def _read_nemo(path: Path) -> tuple[bytes, dict[str, Any]]:
    """``model_config.yaml`` (bytes) and the tensors of ``model_weights.ckpt`` of the ``.nemo`` tar ``path``.

    Only regular-file members whose name, without a leading ``./``, is one of the two are read, straight from the
    archive; nothing is extracted, so no member's path (absolute, ``..``, links) can reach the file system."""
    import tarfile

    from usmkit.models.w2vbert import ImportRefused

    config: bytes | None = None
    weights: dict[str, Any] | None = None
    try:
        with tarfile.open(path, mode="r:*") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                if name not in (NEMO_CONFIG, NEMO_WEIGHTS):
                    continue
                seen = config if name == NEMO_CONFIG else weights
                if not member.isfile() or seen is not None:
                    raise ImportRefused(
                        f"{path}: {name} is {'listed twice' if seen is not None else 'not a regular file'}"
                    )
                handle = tar.extractfile(member)
                assert handle is not None  # a regular file's
                if name == NEMO_CONFIG:
                    config = handle.read()
                else:
                    weights = _nemo_weights(path, handle)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise ImportRefused(
            f"{path} is damaged or not a .nemo archive ({type(e).__name__}: {e}); download it again"
        ) from None
    for name, value in ((NEMO_CONFIG, config), (NEMO_WEIGHTS, weights)):
        if value is None:
            raise ImportRefused(f"{path} has no {name}: not a NeMo model archive (.nemo)")
    return config, weights


def _nemo_weights(path: Path, handle) -> dict[str, Any]:
    """The tensors of ``model_weights.ckpt`` (``handle``: the member, a seekable binary file):
    ``torch.load(weights_only=True)``, which unpickles tensors and plain containers only and refuses every other
    object."""
    import pickle

    import torch

    from usmkit.models.w2vbert import ImportRefused

    try:
        state = torch.load(handle, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, AttributeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ImportRefused(
            f"{path}: {NEMO_WEIGHTS} is damaged or holds more than tensors ({first}); usmkit loads tensors only: "
            "download the archive again"
        ) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]  # a Lightning checkpoint's layout
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ImportRefused(f"{path}: {NEMO_WEIGHTS} is not a flat dict of tensors (a model's state_dict)")
    return state


def _nest_features(model_cfg: dict[str, Any], input_dim: int):
    """usmkit's nearest ``FeatureConfig`` to the archive's ``AudioToMelSpectrogramPreprocessor``: its bins, window
    and hop; ``normalize: per_feature`` -> each utterance normalized on its own (docs/pretrained.md: what differs)."""
    from usmkit.data.config import FeatureConfig
    from usmkit.models.nest import resolve
    from usmkit.models.w2vbert import ImportRefused

    pre = resolve(model_cfg).get("preprocessor") or {}
    rate = pre.get("sample_rate", 16000)
    if rate != 16000:
        raise ImportRefused(f"model_config.yaml: preprocessor.sample_rate={rate!r}; usmkit imports 16 kHz models only")
    window, hop = pre.get("window_size", 0.025), pre.get("window_stride", 0.01)
    return FeatureConfig(
        num_mel_bins=input_dim,
        frame_length_ms=round(1000 * float(window), 3),
        frame_shift_ms=round(1000 * float(hop), 3),
        normalize="utterance" if pre.get("normalize", "per_feature") == "per_feature" else "global",
    )


def import_nest(source: str | Path, out: str | Path) -> Imported:
    """Convert the NEST ``.nemo`` archive ``source`` into the usmkit experiment folder ``out`` (module doc)."""
    import yaml

    from usmkit.checkpointing.output_dir import check_output_dir
    from usmkit.models.nest import convert_state_dict, encoder_config, xscale
    from usmkit.models.presets import preset
    from usmkit.models.w2vbert import ImportRefused

    source, out = Path(source), Path(out)
    if not source.is_file():
        raise ImportRefused(f"source={source} is not a file; pass the downloaded .nemo archive")
    check_output_dir(
        out, option="out=", own_kind="experiment", own_words="an imported encoder", own=lambda p: (p / RECORD).is_file()
    )
    config_bytes, weights = _read_nemo(source)
    try:
        model_cfg = yaml.safe_load(config_bytes.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ImportRefused(
            f"{source}: {NEMO_CONFIG} is not readable YAML ({type(e).__name__}); download it again"
        ) from None
    if not isinstance(model_cfg, dict):
        raise ImportRefused(f"{source}: {NEMO_CONFIG} holds a {type(model_cfg).__name__}, not a mapping")
    cfg = encoder_config(model_cfg)
    converted, skipped = convert_state_dict(weights, cfg, xscale(model_cfg))
    name = next((n for n in NEST_PRESETS if preset(n).d_model == cfg.d_model), NEST_PRESETS[0])
    files = {source.name: _sha256(source)}
    return _write_import(
        source, out, cfg, converted, skipped, _nest_features(model_cfg, cfg.input_dim), "nest", files, name
    )


def import_encoder(source: str | Path, out: str | Path) -> Imported:
    """``import_nest`` for a ``.nemo`` file, else ``import_w2vbert``."""
    return import_nest(source, out) if Path(source).is_file() else import_w2vbert(source, out)


def main(argv: Sequence[str] | None = None) -> int:
    from usmkit.cli.compose import compose_dataclass
    from usmkit.errors import UsageError, strip_debug_flag, user_errors

    argv = strip_debug_flag(sys.argv[1:] if argv is None else argv)
    with user_errors():  # a bad source or out: one line, exit code 2 (--debug: the traceback)
        args = compose_dataclass(ImportArgs, argv, command="usmkit.cli.import_encoder", usage=USAGE)
        if not args.source or not args.out:
            raise UsageError("pass source=DIR and out=DIR (python -m usmkit.cli.import_encoder --help)")
        result = import_encoder(args.source, args.out)
    enc = result.record["encoder"]
    print(
        f"imported {result.record['source']}: {result.tensors} tensors, {result.parameters:,} parameters "
        f"({enc['num_layers']} layers x {enc['d_model']}, {enc['num_heads']} heads) -> {result.checkpoint}"
    )
    if result.record["skipped_tensors"]:
        skipped = result.record["skipped_tensors"]
        if result.record["kind"] == "nest":  # the preprocessor's buffers and the SSL heads: many keys
            heads = sorted({k.split(".")[0] for k in skipped})
            print(f"  left out: {len(skipped)} tensors usmkit's encoder does not use ({', '.join(heads)})")
        else:
            print(f"  left out: {', '.join(skipped)} (transformers' own training-time masking)")
    print(f"fine-tune it: {result.record['train']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
