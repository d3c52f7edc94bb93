"""NVIDIA's NEST (``ssl_en_nest_large_v1.0``, ``ssl_en_nest_xlarge_v1.0``; NeMo's FastConformer ``ConformerEncoder``)
as a usmkit ``ConformerEncoder``.

Pure conversion, no file I/O: ``encoder_config`` maps the ``.nemo`` archive's ``model_config.yaml`` (a dict) to a
``ConformerConfig``, ``convert_state_dict`` maps the tensors of its ``model_weights.ckpt`` to the encoder's state
dict. Reading the archive is ``usmkit.cli.import_encoder``'s. Anything the conversion cannot map exactly raises
``ImportRefused`` with the key or value named; nothing is guessed.

What maps to what (NeMo's ``ConformerLayer`` is usmkit's ``ConformerBlock`` with these options):

- ``pre_encode`` (``subsampling: dw_striding``) -> ``front_end="dw_striding"``: ``pre_encode.conv.N`` ->
  ``subsampling.conv.N``, ``pre_encode.out`` -> ``subsampling.proj``. With ``xscaling: true`` NeMo multiplies
  the front end's output by sqrt(d_model): the factor is folded into ``subsampling.proj``.
- ``self_attention_model: rel_pos`` (Transformer-XL) -> ``position="rel_pos_xl"``: ``linear_q/k/v`` fused into
  ``qkv``; ``linear_pos``, ``pos_bias_u``, ``pos_bias_v`` kept as they are (``untie_biases: true``: one pair
  per layer).
- ``conv`` (``norm_conv`` + ``ConformerConvolution``): ``conv_norm_type: batch_norm`` is, in inference, an affine
  map per channel; it is folded into the depthwise convolution's weight and bias (``conv_norm="none"``), so a
  frame's output never depends on its batch (fine-tuning trains the folded convolution, as a batch norm with
  frozen statistics). ``conv_norm_type: layer_norm`` maps to ``conv.norm_mid``.
- ``norm_feed_forwardN`` + ``feed_forwardN`` -> ``ffN``; ``norm_out`` -> ``norm``.

Tensors outside ``encoder.`` (the preprocessor's window and filterbank, NEST's quantizer, mask embedding,
decoder and loss) are not part of the encoder and are left out (listed in ``skipped``). Refused: other
subsamplings, ``abs_pos`` / local attention, shared position biases (``untie_biases: false``), a limited
attention context, causal convolutions, and linear layers without biases.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from usmkit.models.config import ConformerConfig
from usmkit.models.w2vbert import ImportRefused, SourceTensors

ENCODER_TARGET = "ConformerEncoder"
PREFIX = "encoder."
RECOMPUTED = ("pos_enc.pe",)  # the sinusoid table, if an archive stored it: usmkit computes it (xl_sinusoids)
BATCH_NORM_EPS = 1e-5  # torch.nn.BatchNorm1d's default, which NeMo's ConformerConvolution builds with
_INTERPOLATION = re.compile(r"^\$\{([A-Za-z0-9_.]+)\}$")


def resolve(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with OmegaConf's plain interpolations (``${model.preprocessor.features}``, ``${sample_rate}``)
    replaced by the values they name (looked up from the root, with or without a leading ``model.``).
    Anything else stays as it is (an unresolvable one is refused where it is read)."""

    def lookup(path: str, depth: int) -> Any:
        for parts in (path.split("."), path.split(".")[1:] if path.startswith("model.") else None):
            node: Any = cfg
            for p in parts or ():
                node = node.get(p) if isinstance(node, dict) else None
            if parts and node is not None:
                return walk(node, depth + 1)
        return "${" + path + "}"  # unresolvable: kept

    def walk(node: Any, depth: int) -> Any:
        if depth > 20:
            raise ImportRefused("model_config.yaml has interpolations that refer to each other in a loop")
        if isinstance(node, dict):
            return {k: walk(v, depth + 1) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, depth + 1) for v in node]
        if isinstance(node, str) and (m := _INTERPOLATION.match(node)):
            return lookup(m.group(1), depth)
        return node

    return walk(cfg, 0)


def _int(enc: dict[str, Any], key: str, default: Any = None) -> int:
    value = enc.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ImportRefused(f"model_config.yaml: encoder.{key}={value!r} is not an integer")
    return value


def _expect(enc: dict[str, Any], key: str, allowed: tuple[Any, ...], default: Any) -> Any:
    value = enc.get(key, default)
    if value not in allowed:
        raise ImportRefused(
            f"model_config.yaml: encoder.{key}={value!r}; usmkit reproduces {' or '.join(map(repr, allowed))} only "
            "(NEST's FastConformer)"
        )
    return value


def encoder_config(model_cfg: dict[str, Any], **overrides: Any) -> ConformerConfig:
    """The ``ConformerConfig`` of a NEST ``.nemo``'s ``model_config.yaml`` (a dict, interpolations resolved or
    not). ``overrides``: fields of the result (e.g. ``attention_impl``)."""
    cfg = resolve(model_cfg)
    enc = cfg.get("encoder")
    if not isinstance(enc, dict):
        raise ImportRefused("model_config.yaml has no encoder section: not a NeMo ASR / SSL model")
    target = str(enc.get("_target_", ""))
    if target.rsplit(".", 1)[-1] != ENCODER_TARGET:
        raise ImportRefused(
            f"model_config.yaml: encoder._target_={target!r}; usmkit imports NeMo's {ENCODER_TARGET} "
            "(NEST / FastConformer) only"
        )
    _expect(enc, "subsampling", ("dw_striding",), "striding")
    _expect(enc, "self_attention_model", ("rel_pos",), "rel_pos")
    _expect(enc, "untie_biases", (True,), True)
    _expect(enc, "use_bias", (True,), True)
    _expect(enc, "conv_norm_type", ("batch_norm", "layer_norm"), "batch_norm")
    _expect(enc, "conv_context_size", (None,), None)
    _expect(enc, "causal_downsampling", (False,), False)
    _expect(enc, "reduction", (None,), None)
    _expect(enc, "att_context_style", ("regular", "chunked_limited"), "regular")
    context = enc.get("att_context_size", [-1, -1])
    if context not in ([-1, -1], None):
        raise ImportRefused(
            f"model_config.yaml: encoder.att_context_size={context!r}; usmkit imports full attention ([-1, -1]) "
            "and sets its own chunk mask when fine-tuning"
        )
    d_model, factor = _int(enc, "d_model"), _int(enc, "subsampling_factor", 4)
    heads = _int(enc, "n_heads", 4)
    channels = _int(enc, "subsampling_conv_channels", -1)
    fields: dict[str, Any] = dict(
        input_dim=_int(enc, "feat_in"),
        d_model=d_model,
        num_layers=_int(enc, "n_layers"),
        num_heads=heads,
        ff_mult=_int(enc, "ff_expansion_factor", 4),
        conv_kernel=_int(enc, "conv_kernel_size", 31),
        causal_conv=False,
        dropout=float(enc.get("dropout", 0.1)),
        chunk_size=None,
        left_chunks=0,
        subsampling_channels=d_model if channels == -1 else channels,
        subsampling_factor=factor,
        zero_init_residual=False,
        position="rel_pos_xl",
        front_end="dw_striding",
        conv_norm="none" if enc.get("conv_norm_type", "batch_norm") == "batch_norm" else "layer_norm",
    )
    try:
        return ConformerConfig(**(fields | overrides))
    except ValueError as e:
        raise ImportRefused(f"model_config.yaml does not make a usmkit encoder: {e}") from e


def xscale(model_cfg: dict[str, Any]) -> float:
    """The factor NeMo multiplies the front end's output with: sqrt(d_model) with ``xscaling: true`` (default)."""
    enc = resolve(model_cfg).get("encoder", {})
    return math.sqrt(_int(enc, "d_model")) if enc.get("xscaling", True) else 1.0


def _layer_map(i: int, conv_norm: str) -> dict[str, str]:
    """Source key (after ``encoder.``) -> usmkit key, for the tensors of layer ``i`` that map one to one."""
    src, dst = f"layers.{i}.", f"blocks.{i}."
    pairs = {
        "norm_feed_forward1": "ff1.norm",
        "feed_forward1.linear1": "ff1.up",
        "feed_forward1.linear2": "ff1.down",
        "norm_self_att": "mhsa.norm",
        "self_attn.linear_out": "mhsa.out",
        "norm_conv": "conv.norm_in",
        "norm_feed_forward2": "ff2.norm",
        "feed_forward2.linear1": "ff2.up",
        "feed_forward2.linear2": "ff2.down",
        "norm_out": "norm",
    }
    if conv_norm == "layer_norm":
        pairs["conv.batch_norm"] = "conv.norm_mid"
    out = {f"{src}{a}.{p}": f"{dst}{b}.{p}" for a, b in pairs.items() for p in ("weight", "bias")}
    for name in ("linear_pos.weight", "pos_bias_u", "pos_bias_v"):
        out[f"{src}self_attn.{name}"] = f"{dst}mhsa.{name}"
    return out


def convert_state_dict(
    source: dict[str, torch.Tensor], cfg: ConformerConfig, scale: float = 1.0
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The ``ConformerEncoder`` state dict of a NEST ``model_weights.ckpt``'s tensors, and the keys left out (those
    outside ``encoder.``, and ``encoder.pos_enc.pe`` where stored). ``scale``: ``xscale(model_cfg)``, folded into the front end's projection. Every
    ``encoder.`` key is used exactly once; an unknown, missing or misshapen one raises ``ImportRefused`` naming
    it. Folded tensors are computed in float64 and returned in the source's dtype."""
    skipped = sorted(k for k in source if not k.startswith(PREFIX) or k.removeprefix(PREFIX) in RECOMPUTED)
    src = {k.removeprefix(PREFIX): v for k, v in source.items() if k.startswith(PREFIX)}
    used: set[str] = {k for k in src if k in RECOMPUTED}
    out: dict[str, torch.Tensor] = {}
    D, K, H, C = cfg.d_model, cfg.conv_kernel, cfg.num_heads, cfg.conv_channels

    tensors = SourceTensors(src, "model_weights.ckpt", used, PREFIX)
    take = tensors.take

    stages = cfg.subsampling_factor.bit_length() - 1
    out["subsampling.conv.0.weight"], out["subsampling.conv.0.bias"] = (
        take("pre_encode.conv.0.weight", (C, 1, 3, 3)), take("pre_encode.conv.0.bias", (C,))
    )  # fmt: skip
    bins = cfg.input_dim
    for s in range(stages):
        bins = (bins - 1) // 2 + 1
        if s:
            dw, pw = 3 * s - 1, 3 * s  # conv.2, conv.3; conv.5, conv.6 (ReLUs in between)
            for n, shape in ((dw, (C, 1, 3, 3)), (pw, (C, C, 1, 1))):
                out[f"subsampling.conv.{n}.weight"] = take(f"pre_encode.conv.{n}.weight", shape)
                out[f"subsampling.conv.{n}.bias"] = take(f"pre_encode.conv.{n}.bias", (C,))
    w, b = take("pre_encode.out.weight", (D, C * bins)), take("pre_encode.out.bias", (D,))
    out["subsampling.proj.weight"] = (w.double() * scale).to(w.dtype)
    out["subsampling.proj.bias"] = (b.double() * scale).to(b.dtype)

    inner = cfg.ff_mult * D
    shapes = {
        "ff1.up.weight": (inner, D), "ff1.up.bias": (inner,), "ff1.down.weight": (D, inner), "ff1.down.bias": (D,),
        "ff2.up.weight": (inner, D), "ff2.up.bias": (inner,), "ff2.down.weight": (D, inner), "ff2.down.bias": (D,),
        "mhsa.out.weight": (D, D), "mhsa.linear_pos.weight": (D, D),
        "mhsa.pos_bias_u": (H, D // H), "mhsa.pos_bias_v": (H, D // H),
    }  # fmt: skip
    for i in range(cfg.num_layers):
        for s, d in _layer_map(i, cfg.conv_norm).items():
            out[d] = take(s, shapes.get(d.split(".", 2)[2], (D,)))
        a, c, b = f"layers.{i}.self_attn.", f"layers.{i}.conv.", f"blocks.{i}.conv."
        out[f"blocks.{i}.mhsa.qkv.weight"] = torch.cat([take(f"{a}linear_{n}.weight", (D, D)) for n in "qkv"])
        out[f"blocks.{i}.mhsa.qkv.bias"] = torch.cat([take(f"{a}linear_{n}.bias", (D,)) for n in "qkv"])
        out[f"{b}pointwise1.weight"] = take(f"{c}pointwise_conv1.weight", (2 * D, D, 1))[:, :, 0]
        out[f"{b}pointwise1.bias"] = take(f"{c}pointwise_conv1.bias", (2 * D,))
        out[f"{b}pointwise2.weight"] = take(f"{c}pointwise_conv2.weight", (D, D, 1))[:, :, 0]
        out[f"{b}pointwise2.bias"] = take(f"{c}pointwise_conv2.bias", (D,))
        dw_w, dw_b = take(f"{c}depthwise_conv.weight", (D, 1, K)), take(f"{c}depthwise_conv.bias", (D,))
        if cfg.conv_norm == "none":  # y = (conv(x) - mean) / sqrt(var + eps) * gamma + beta, per channel
            bn = {
                n: take(f"{c}batch_norm.{n}", (D,)).double() for n in ("weight", "bias", "running_mean", "running_var")
            }
            if f"{c}batch_norm.num_batches_tracked" in src:
                used.add(f"{c}batch_norm.num_batches_tracked")
            gain = bn["weight"] / torch.sqrt(bn["running_var"] + BATCH_NORM_EPS)  # (D,)
            out[f"{b}depthwise_conv.weight"] = (dw_w.double() * gain[:, None, None]).to(dw_w.dtype)
            out[f"{b}depthwise_conv.bias"] = ((dw_b.double() - bn["running_mean"]) * gain + bn["bias"]).to(dw_b.dtype)
        else:
            out[f"{b}depthwise_conv.weight"], out[f"{b}depthwise_conv.bias"] = dw_w, dw_b
    tensors.check_all_used("NEST", f"model_config.yaml says {cfg.num_layers} layers")
    return out, skipped
