"""A plain-PyTorch transcription of NeMo's ``ConformerEncoder`` forward, the oracle of the NEST import tests.

``nemo_toolkit`` is not installed with usmkit (it pins its own torch and pulls in Lightning, Megatron and dozens
of other packages), so this file copies, with NeMo's module and parameter names (hence its state-dict keys),
the parts of nemo_toolkit 3.0.0 that a NEST / FastConformer encoder runs in inference, without the streaming
caches, adapters, layer drop and local attention:

- ``nemo/collections/asr/parts/submodules/subsampling.py``: ``ConvSubsampling(subsampling="dw_striding")``,
  ``MaskedConvSequential``, ``apply_channel_mask``, ``calculate_conv_output_size``, ``calc_length``;
- ``nemo/collections/asr/parts/submodules/multi_head_attention.py``: ``MultiHeadAttention.forward_qkv`` /
  ``forward_attention``, ``RelPositionMultiHeadAttention.rel_shift`` / ``forward`` (the non-SDPA branch),
  ``PositionalEncoding.create_pe``, ``RelPositionalEncoding.extend_pe`` / ``forward`` (``INF_VAL`` = 10000);
- ``nemo/collections/asr/parts/submodules/conformer_modules.py``: ``ConformerLayer.forward``,
  ``ConformerConvolution`` (``conv_norm_type`` batch_norm or layer_norm), ``ConformerFeedForward``;
- ``nemo/collections/asr/modules/conformer_encoder.py``: ``ConformerEncoder.__init__`` / ``forward_internal``
  and ``_create_masks`` for full attention (``att_context_size=[-1, -1]``).

Input and output are NeMo's: features (B, F, T), lengths (B,) -> (B, D, T'), (B,).
"""

from __future__ import annotations

import math

import torch
from torch import nn

INF_VAL = 10000.0


def calc_length(lengths, all_paddings, kernel_size, stride, ceil_mode, repeat_num=1):
    add_pad: float = all_paddings - kernel_size
    one: float = 1.0
    for _ in range(repeat_num):
        lengths = torch.div(lengths.to(dtype=torch.float) + add_pad, stride) + one
        lengths = torch.ceil(lengths) if ceil_mode else torch.floor(lengths)
    return lengths.to(dtype=torch.int)


def apply_channel_mask(tensor, mask):
    batch_size, channels, time, features = tensor.shape
    return tensor * mask.unsqueeze(1).expand(batch_size, channels, time, features)


def calculate_conv_output_size(input_size, kernel_size, stride, padding):
    return (input_size + padding[0] + padding[1] - kernel_size) // stride + 1


class MaskedConvSequential(nn.Sequential):
    def forward(self, x, lengths):
        x = x.unsqueeze(1)  # (batch, 1, time, features)
        current_lengths = lengths.clone().float()
        mask = self._create_mask(x, current_lengths.long())
        for layer in self:
            x = apply_channel_mask(x, mask)
            x = layer(x)
            if hasattr(layer, "stride") and layer.stride != (1, 1):
                current_lengths = calculate_conv_output_size(
                    current_lengths, layer.kernel_size[0], layer.stride[0], layer.padding
                )
                mask = self._create_mask(x, current_lengths.long())
        x = apply_channel_mask(x, mask)
        return x, current_lengths.long()

    def _create_mask(self, tensor, lengths):
        batch_size, channels, time, features = tensor.shape
        time_mask = torch.arange(time, device=tensor.device).expand(batch_size, time) < lengths.unsqueeze(1)
        return time_mask.unsqueeze(-1).expand(batch_size, time, features).to(tensor.dtype)


class ConvSubsampling(nn.Module):
    """``subsampling="dw_striding"``, not causal."""

    def __init__(self, subsampling_factor, feat_in, feat_out, conv_channels):
        super().__init__()
        self._sampling_num = int(math.log(subsampling_factor, 2))
        self._stride, self._kernel_size, self._ceil_mode = 2, 3, False
        self._left_padding = self._right_padding = (self._kernel_size - 1) // 2
        k, s, p = self._kernel_size, self._stride, self._left_padding
        layers = [nn.Conv2d(1, conv_channels, kernel_size=k, stride=s, padding=p), nn.ReLU()]
        for _ in range(self._sampling_num - 1):
            layers += [
                nn.Conv2d(conv_channels, conv_channels, kernel_size=k, stride=s, padding=p, groups=conv_channels),
                nn.Conv2d(conv_channels, conv_channels, kernel_size=1, stride=1, padding=0, groups=1),
                nn.ReLU(),
            ]
        out_length = calc_length(
            torch.tensor(feat_in, dtype=torch.float, device="cpu"), p + p, k, s, self._ceil_mode, self._sampling_num
        )
        self.out = nn.Linear(conv_channels * int(out_length), feat_out)
        self.conv = MaskedConvSequential(*layers)

    def forward(self, x, lengths):
        x, lengths = self.conv(x, lengths)
        b, c, t, f = x.size()
        return self.out(x.transpose(1, 2).reshape(b, t, -1)), lengths


class RelPositionalEncoding(nn.Module):
    def __init__(self, d_model, xscale=None, max_len=5000):
        super().__init__()
        self.d_model, self.xscale = d_model, xscale
        self.extend_pe(max_len, "cpu", torch.float32)

    def create_pe(self, positions, dtype):
        pe = torch.zeros(positions.size(0), self.d_model, device=positions.device)
        div_term = torch.exp(
            torch.arange(0, self.d_model, 2, dtype=torch.float32, device=positions.device)
            * -(math.log(INF_VAL) / self.d_model)
        )
        pe[:, 0::2] = torch.sin(positions * div_term)
        pe[:, 1::2] = torch.cos(positions * div_term)
        self.register_buffer("pe", pe.unsqueeze(0).to(dtype), persistent=False)

    def extend_pe(self, length, device, dtype):
        positions = torch.arange(length - 1, -length, -1, dtype=torch.float32, device=device).unsqueeze(1)
        self.create_pe(positions=positions, dtype=dtype)

    def forward(self, x):
        if self.xscale:
            x = x * self.xscale
        input_len = x.size(1)
        center_pos = self.pe.size(1) // 2 + 1
        return x, self.pe[:, center_pos - input_len : center_pos + input_len - 1]


class RelPositionMultiHeadAttention(nn.Module):
    def __init__(self, n_head, n_feat):
        super().__init__()
        self.d_k = n_feat // n_head
        self.s_d_k = math.sqrt(self.d_k)
        self.h = n_head
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k = nn.Linear(n_feat, n_feat)
        self.linear_v = nn.Linear(n_feat, n_feat)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(self.h, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(self.h, self.d_k))

    def forward_qkv(self, query, key, value):
        n_batch = query.size(0)
        q = self.linear_q(query).view(n_batch, -1, self.h, self.d_k).transpose(1, 2)
        k = self.linear_k(key).view(n_batch, -1, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(value).view(n_batch, -1, self.h, self.d_k).transpose(1, 2)
        return q, k, v

    def forward_attention(self, value, scores, mask):
        n_batch = value.size(0)
        mask = mask.unsqueeze(1)
        scores = scores.masked_fill(mask, -INF_VAL)
        attn = torch.softmax(scores, dim=-1).masked_fill(mask, 0.0)
        x = torch.matmul(attn, value)
        return self.linear_out(x.transpose(1, 2).reshape(n_batch, -1, self.h * self.d_k))

    def rel_shift(self, x):
        b, h, qlen, pos_len = x.size()
        x = torch.nn.functional.pad(x, pad=(1, 0))
        x = x.view(b, h, -1, qlen)
        return x[:, :, 1:].view(b, h, qlen, pos_len)

    def forward(self, query, key, value, mask, pos_emb):
        q, k, v = self.forward_qkv(query, key, value)
        q = q.transpose(1, 2)  # (batch, time1, head, d_k)
        p = self.linear_pos(pos_emb).view(pos_emb.size(0), -1, self.h, self.d_k).transpose(1, 2)
        q_with_bias_u = (q + self.pos_bias_u).transpose(1, 2)
        q_with_bias_v = (q + self.pos_bias_v).transpose(1, 2)
        matrix_bd = self.rel_shift(torch.matmul(q_with_bias_v, p.transpose(-2, -1)))
        matrix_ac = torch.matmul(q_with_bias_u, k.transpose(-2, -1))
        matrix_bd = matrix_bd[:, :, :, : matrix_ac.size(-1)]
        return self.forward_attention(v, (matrix_ac + matrix_bd) / self.s_d_k, mask)


class ConformerFeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.activation = nn.SiLU()  # NeMo's Swish
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear2(self.activation(self.linear1(x)))


class ConformerConvolution(nn.Module):
    def __init__(self, d_model, kernel_size, norm_type="batch_norm"):
        super().__init__()
        self.norm_type = norm_type
        self.pointwise_conv1 = nn.Conv1d(d_model, 2 * d_model, kernel_size=1)
        self.depthwise_conv = nn.Conv1d(
            d_model, d_model, kernel_size, padding=(kernel_size - 1) // 2, groups=d_model
        )  # NeMo's CausalConv1D with symmetric padding
        self.batch_norm = nn.BatchNorm1d(d_model) if norm_type == "batch_norm" else nn.LayerNorm(d_model)
        self.activation = nn.SiLU()
        self.pointwise_conv2 = nn.Conv1d(d_model, d_model, kernel_size=1)

    def forward(self, x, pad_mask):
        x = nn.functional.glu(self.pointwise_conv1(x.transpose(1, 2)), dim=1)
        x = x.masked_fill(pad_mask.unsqueeze(1), 0.0)
        x = self.depthwise_conv(x)
        if self.norm_type == "layer_norm":
            x = self.batch_norm(x.transpose(1, 2)).transpose(1, 2)
        else:
            x = self.batch_norm(x)
        return self.pointwise_conv2(self.activation(x)).transpose(1, 2)


class ConformerLayer(nn.Module):
    def __init__(self, d_model, d_ff, n_heads, conv_kernel_size, conv_norm_type):
        super().__init__()
        self.fc_factor = 0.5
        self.norm_feed_forward1 = nn.LayerNorm(d_model)
        self.feed_forward1 = ConformerFeedForward(d_model, d_ff)
        self.norm_conv = nn.LayerNorm(d_model)
        self.conv = ConformerConvolution(d_model, conv_kernel_size, conv_norm_type)
        self.norm_self_att = nn.LayerNorm(d_model)
        self.self_attn = RelPositionMultiHeadAttention(n_heads, d_model)
        self.norm_feed_forward2 = nn.LayerNorm(d_model)
        self.feed_forward2 = ConformerFeedForward(d_model, d_ff)
        self.norm_out = nn.LayerNorm(d_model)

    def forward(self, x, att_mask, pos_emb, pad_mask):
        residual = x
        x = self.feed_forward1(self.norm_feed_forward1(x))
        residual = residual + x * self.fc_factor
        x = self.norm_self_att(residual)
        residual = residual + self.self_attn(query=x, key=x, value=x, mask=att_mask, pos_emb=pos_emb)
        residual = residual + self.conv(self.norm_conv(residual), pad_mask=pad_mask)
        x = self.feed_forward2(self.norm_feed_forward2(residual))
        residual = residual + x * self.fc_factor
        return self.norm_out(residual)


class ConformerEncoder(nn.Module):
    """``self_attention_model="rel_pos"``, ``untie_biases=True``, ``subsampling="dw_striding"``, full attention."""

    def __init__(
        self,
        feat_in,
        n_layers,
        d_model,
        subsampling_factor=8,
        subsampling_conv_channels=256,
        ff_expansion_factor=4,
        n_heads=8,
        xscaling=True,
        conv_kernel_size=9,
        conv_norm_type="batch_norm",
    ):
        super().__init__()
        self.pre_encode = ConvSubsampling(subsampling_factor, feat_in, d_model, subsampling_conv_channels)
        self.pos_enc = RelPositionalEncoding(d_model, xscale=math.sqrt(d_model) if xscaling else None)
        self.layers = nn.ModuleList(
            ConformerLayer(d_model, d_model * ff_expansion_factor, n_heads, conv_kernel_size, conv_norm_type)
            for _ in range(n_layers)
        )

    def forward(self, audio_signal, length):
        audio_signal, length = self.pre_encode(x=torch.transpose(audio_signal, 1, 2), lengths=length)
        length = length.to(torch.int64)
        max_audio_length = audio_signal.size(1)
        audio_signal, pos_emb = self.pos_enc(x=audio_signal)
        # _create_masks, att_context_size [-1, -1]
        att_mask = torch.ones(1, max_audio_length, max_audio_length, dtype=torch.bool)
        pad_mask = torch.arange(0, max_audio_length).expand(length.size(0), -1) < length.unsqueeze(-1)
        pad_mask_for_att_mask = pad_mask.unsqueeze(1).repeat([1, max_audio_length, 1])
        pad_mask_for_att_mask = torch.logical_and(pad_mask_for_att_mask, pad_mask_for_att_mask.transpose(1, 2))
        att_mask = ~torch.logical_and(pad_mask_for_att_mask, att_mask[:, :max_audio_length, :max_audio_length])
        pad_mask = ~pad_mask
        for layer in self.layers:
            audio_signal = layer(x=audio_signal, att_mask=att_mask, pos_emb=pos_emb, pad_mask=pad_mask)
        return torch.transpose(audio_signal, 1, 2), length
