"""w2v-BERT 2.0 (``facebook/w2v-bert-2.0``, transformers' ``Wav2Vec2BertModel``) as a usmkit ``ConformerEncoder``.

Pure conversion, no file I/O: ``encoder_config`` maps the source's ``config.json`` (a dict) to a
``ConformerConfig``, ``convert_state_dict`` maps its tensors to the encoder's state dict. Reading and writing
files is ``usmkit.cli.import_encoder``'s. Anything the conversion cannot map exactly raises ``ImportRefused``
with the key or value named; nothing is guessed.

What maps to what (w2v-BERT's ``Wav2Vec2BertEncoderLayer`` is usmkit's ``ConformerBlock`` with these options):

- ``feature_projection`` (LayerNorm + Linear over 2 stacked 80-bin frames) -> ``front_end="stack"``,
  ``subsampling_factor=2`` (the stacking moves from the feature extractor into the encoder, so features stay
  at 10 ms as everywhere in usmkit).
- ``self_attn`` with ``position_embeddings_type="relative_key"`` -> ``position="relative_key"``: linear_q/k/v
  fused into one ``qkv``; ``distance_embedding`` kept as it is.
- ``conv_module``: its depthwise convolution is padded on the left only (``causal_conv=True``); its three
  convolutions have no bias, ours get zero biases (the same function).
- ``ffnN_layer_norm`` + ``ffnN`` -> ``ffN`` (our feed-forward holds its pre-norm); ``final_layer_norm`` -> ``norm``.
- ``masked_spec_embed`` (the vector transformers' own SpecAugment writes over masked frames while training)
  is not part of the encoder's function and is left out (``SKIPPED``); usmkit masks features instead.

Refused: other position schemes (``rotary`` rotates before the projections, ``relative`` is Transformer-XL's),
the optional adapter (``add_adapter``) and the intermediate feed-forward before it.
"""

from __future__ import annotations

from typing import Any

import torch

from usmkit.errors import UsageError
from usmkit.models.config import ConformerConfig

MODEL_TYPE = "wav2vec2-bert"
PREFIX = "wav2vec2_bert."  # the base model's prefix inside transformers' heads (ForCTC, ...)
SKIPPED = ("masked_spec_embed",)
ACTIVATIONS = {"swish": "swish", "silu": "swish", "gelu": "gelu", "relu": "relu"}


class ImportRefused(UsageError, ValueError):
    """A source that is not an encoder usmkit can reproduce exactly (w2v-BERT 2.0, NEST)."""


class SourceTensors:
    """An imported state dict's tensors, each taken once by key with its shape checked (``take``); ``used`` holds
    the keys taken or left out on purpose, and ``check_all_used`` refuses a key none took. ``file`` and
    ``prefix`` name the keys in messages as the source file spells them."""

    def __init__(self, src: dict[str, torch.Tensor], file: str, used: set[str], prefix: str = "") -> None:
        self.src, self.file, self.used, self.prefix = src, file, used, prefix

    def take(self, key: str, shape: tuple[int, ...]) -> torch.Tensor:
        name = self.prefix + key
        if key not in self.src:
            raise ImportRefused(f"{self.file} has no tensor {name!r}, which the config's encoder needs")
        t = self.src[key]
        if tuple(t.shape) != shape:
            raise ImportRefused(f"{self.file}: {name!r} has shape {tuple(t.shape)}, the config says {shape}")
        self.used.add(key)
        return t

    def check_all_used(self, encoder: str, why: str) -> None:
        unknown = sorted(set(self.src) - self.used)
        if unknown:
            more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
            raise ImportRefused(
                f"{self.file} has tensor {self.prefix + unknown[0]!r}{more}, which usmkit's {encoder} encoder does "
                f"not have ({why})"
            )


def _require(hf: dict[str, Any], key: str) -> Any:
    if key not in hf:
        raise ImportRefused(f"config.json has no {key!r}: not a complete Wav2Vec2BertConfig")
    return hf[key]


def encoder_config(hf: dict[str, Any], stack: int = 2, **overrides: Any) -> ConformerConfig:
    """The ``ConformerConfig`` of a ``Wav2Vec2BertConfig`` dict; ``stack``: the feature extractor's stride (frames
    stacked into one, 2). ``overrides``: fields of the result (e.g. ``attention_impl``)."""
    if hf.get("model_type") != MODEL_TYPE:
        raise ImportRefused(
            f"config.json has model_type={hf.get('model_type')!r}, not {MODEL_TYPE!r} (w2v-BERT 2.0): "
            "usmkit imports facebook/w2v-bert-2.0 and models of its architecture only"
        )
    position = hf.get("position_embeddings_type", "relative_key")
    if position != "relative_key":
        raise ImportRefused(
            f"config.json has position_embeddings_type={position!r}; usmkit reproduces 'relative_key' only "
            "(w2v-BERT 2.0's)"
        )
    for flag in ("add_adapter", "use_intermediate_ffn_before_adapter"):
        if hf.get(flag):
            raise ImportRefused(f"config.json has {flag}=true; usmkit imports the encoder without the adapter only")
    act = _require(hf, "hidden_act")
    if act not in ACTIVATIONS:
        raise ImportRefused(f"config.json has hidden_act={act!r}; usmkit has {sorted(ACTIVATIONS)}")
    d_model, inner = int(_require(hf, "hidden_size")), int(_require(hf, "intermediate_size"))
    if inner % d_model:
        raise ImportRefused(
            f"config.json has intermediate_size={inner}, not a multiple of hidden_size={d_model} (usmkit's ff_mult)"
        )
    proj_in = int(_require(hf, "feature_projection_input_dim"))
    if proj_in % stack:
        raise ImportRefused(f"feature_projection_input_dim={proj_in} is not {stack} stacked frames of equal bins")
    fields: dict[str, Any] = dict(
        input_dim=proj_in // stack,
        d_model=d_model,
        num_layers=int(_require(hf, "num_hidden_layers")),
        num_heads=int(_require(hf, "num_attention_heads")),
        ff_mult=inner // d_model,
        conv_kernel=int(_require(hf, "conv_depthwise_kernel_size")),
        causal_conv=True,
        dropout=float(hf.get("hidden_dropout", 0.0)),
        chunk_size=None,
        left_chunks=0,
        zero_init_residual=False,
        position="relative_key",
        relative_left=int(_require(hf, "left_max_position_embeddings")),
        relative_right=int(_require(hf, "right_max_position_embeddings")),
        front_end="stack",
        subsampling_factor=stack,
        activation=ACTIVATIONS[act],
        layer_norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
    )
    try:
        return ConformerConfig(**(fields | overrides))
    except ValueError as e:
        raise ImportRefused(f"config.json does not make a usmkit encoder: {e}") from e


def _layer_map(i: int) -> dict[str, str]:
    """Source key (after ``encoder.layers.{i}.``) -> usmkit key, for the tensors that map one to one."""
    src, dst = f"encoder.layers.{i}.", f"blocks.{i}."
    pairs = {
        "ffn1_layer_norm": "ff1.norm",
        "ffn1.intermediate_dense": "ff1.up",
        "ffn1.output_dense": "ff1.down",
        "self_attn_layer_norm": "mhsa.norm",
        "self_attn.linear_out": "mhsa.out",
        "conv_module.layer_norm": "conv.norm_in",
        "conv_module.depthwise_layer_norm": "conv.norm_mid",
        "ffn2_layer_norm": "ff2.norm",
        "ffn2.intermediate_dense": "ff2.up",
        "ffn2.output_dense": "ff2.down",
        "final_layer_norm": "norm",
    }
    out = {f"{src}{a}.{p}": f"{dst}{b}.{p}" for a, b in pairs.items() for p in ("weight", "bias")}
    out[f"{src}self_attn.distance_embedding.weight"] = f"{dst}mhsa.distance_embedding.weight"
    return out


def convert_state_dict(
    source: dict[str, torch.Tensor], cfg: ConformerConfig
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The ``ConformerEncoder`` state dict of a ``Wav2Vec2BertModel``'s tensors, and the source keys left out
    (``SKIPPED``). Every other source key is used exactly once; an unknown, missing or misshapen one raises
    ``ImportRefused`` naming it. Tensors keep their dtype and device (the meta device works)."""
    src = {k.removeprefix(PREFIX): v for k, v in source.items()}
    skipped = sorted(k for k in src if k in SKIPPED)
    used: set[str] = set(skipped)
    out: dict[str, torch.Tensor] = {}
    D, K = cfg.d_model, cfg.conv_kernel

    tensors = SourceTensors(src, "model.safetensors", used)
    take = tensors.take

    stacked = cfg.subsampling_factor * cfg.input_dim
    for p in ("weight", "bias"):
        out[f"subsampling.norm.{p}"] = take(f"feature_projection.layer_norm.{p}", (stacked,))
    out["subsampling.proj.weight"] = take("feature_projection.projection.weight", (D, stacked))
    out["subsampling.proj.bias"] = take("feature_projection.projection.bias", (D,))
    inner = cfg.ff_mult * D
    shapes = {
        "ff1.up.weight": (inner, D), "ff1.up.bias": (inner,), "ff1.down.weight": (D, inner), "ff1.down.bias": (D,),
        "ff2.up.weight": (inner, D), "ff2.up.bias": (inner,), "ff2.down.weight": (D, inner), "ff2.down.bias": (D,),
        "mhsa.out.weight": (D, D), "mhsa.out.bias": (D,),
        "mhsa.distance_embedding.weight": (cfg.relative_left + cfg.relative_right + 1, cfg.head_dim),
    }  # fmt: skip
    for i in range(cfg.num_layers):
        for s, d in _layer_map(i).items():
            out[d] = take(s, shapes.get(d.split(".", 2)[2], (D,)))
        a = f"encoder.layers.{i}.self_attn."
        out[f"blocks.{i}.mhsa.qkv.weight"] = torch.cat([take(f"{a}linear_{n}.weight", (D, D)) for n in "qkv"])
        out[f"blocks.{i}.mhsa.qkv.bias"] = torch.cat([take(f"{a}linear_{n}.bias", (D,)) for n in "qkv"])
        c, b = f"encoder.layers.{i}.conv_module.", f"blocks.{i}.conv."
        w1 = take(f"{c}pointwise_conv1.weight", (2 * D, D, 1))
        out[f"{b}pointwise1.weight"], out[f"{b}pointwise1.bias"] = w1[:, :, 0], w1.new_zeros(2 * D)
        dw = take(f"{c}depthwise_conv.weight", (D, 1, K))
        out[f"{b}depthwise_conv.weight"], out[f"{b}depthwise_conv.bias"] = dw, dw.new_zeros(D)
        w2 = take(f"{c}pointwise_conv2.weight", (D, D, 1))
        out[f"{b}pointwise2.weight"], out[f"{b}pointwise2.bias"] = w2[:, :, 0], w2.new_zeros(D)
    tensors.check_all_used(
        "w2v-BERT", f"config.json says {cfg.num_layers} layers; an adapter or a head is not imported"
    )
    return out, skipped
