"""Triton kernels for the convolution module's middle: GLU, mask, depthwise conv, LayerNorm and Swish in one pass.

Shapes: B batch, T frames, D channels, K taps; h (B, T, 2D) with a unit last stride, valid (B, T) bool, ids
(B, T) int (packed rows) or None, weight (D, K), bias / ln_weight / ln_bias (D,). ``reference.py`` is the oracle.

Under ``torch.compile`` inductor runs this stretch as one reduction kernel forward but five to seven kernels
backward, each reading and writing (B, T, D) tensors; here it is one kernel forward and two backward, and
nothing between the two pointwise projections is kept for the backward but h and two floats per frame (the
LayerNorm's mean and 1/std): the GLU and the convolution are recomputed from h, which costs K cached reads.

Forward, one program per (tile of BLOCK_T frames, row): for each tap k, the GLU of the frames t + k - left
(zero where not valid, outside the row, or in another utterance), times the tap's weights, summed; then bias,
LayerNorm over all D channels (BLOCK_D >= D, in registers) and Swish, stored in h's dtype.

Backward: (1) ``_bwd_dz_kernel`` recomputes the tile forward and takes the gradient through Swish and LayerNorm
to dz (the convolution's output gradient, fp32, written out); (2) ``_bwd_dh_kernel`` convolves dz with the
flipped taps under the same masks and takes it through the GLU to dh; the depthwise weight's gradient comes from
the same dz tiles and the GLU output it computes once per frame. Each backward program walks ``tiles`` tiles of a
row and keeps its share of the parameter gradients in registers, written once as a partial sum (one row of
``partials``); the partials are summed over programs afterwards (no atomics: deterministic).

CPU: set ``TRITON_INTERPRET=1`` before this module is imported (triton reads it when kernels are defined).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from usmkit.kernels.interpreter import patch_interpreter_loop_bounds

if os.environ.get("TRITON_INTERPRET", "0") == "1":
    patch_interpreter_loop_bounds()


# fmt: off
@triton.jit
def _glu_tile(H, VALID, IDS, b, src, my_id, row_ok, cols, cmask, T, D, stride_hb, stride_ht,
              HAS_IDS: tl.constexpr):
    """GLU of frames ``src`` [BLOCK_T] of row b, [BLOCK_T, BLOCK_D] fp32, zero where a tap may not read."""
    take = row_ok & (src >= 0) & (src < T)
    take = take & (tl.load(VALID + b * T + src, mask=take, other=0) != 0)
    if HAS_IDS:
        take = take & (tl.load(IDS + b * T + src, mask=take, other=-1) == my_id)
    m2 = take[:, None] & cmask[None, :]
    ptr = H + b * stride_hb + src[:, None] * stride_ht + cols[None, :]
    a = tl.load(ptr, mask=m2, other=0.0).to(tl.float32)
    g = tl.load(ptr + D, mask=m2, other=0.0).to(tl.float32)
    return a * tl.sigmoid(g)


@triton.jit
def _conv_tile(H, VALID, IDS, W, BIAS, b, rows, my_id, row_ok, cols, cmask, T, D, stride_hb, stride_ht,
               K: tl.constexpr, LEFT: tl.constexpr, HAS_IDS: tl.constexpr, BLOCK_T: tl.constexpr,
               BLOCK_D: tl.constexpr):
    """The depthwise convolution's output (with bias) for frames ``rows``, [BLOCK_T, BLOCK_D] fp32."""
    z = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for k in tl.static_range(K):
        y = _glu_tile(H, VALID, IDS, b, rows + (k - LEFT), my_id, row_ok, cols, cmask, T, D, stride_hb,
                      stride_ht, HAS_IDS)
        wk = tl.load(W + cols * K + k, mask=cmask, other=0.0).to(tl.float32)
        z += y * wk[None, :]
    bias = tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)
    return z + bias[None, :]


@triton.jit
def _fwd_kernel(H, VALID, IDS, W, BIAS, LNW, LNB, OUT, MEAN, RSTD, T, D, eps, stride_hb, stride_ht, stride_ob,
                stride_ot, K: tl.constexpr, LEFT: tl.constexpr, HAS_IDS: tl.constexpr, BLOCK_T: tl.constexpr,
                BLOCK_D: tl.constexpr):
    b = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < T
    cmask = cols < D
    my_id = 0
    if HAS_IDS:
        my_id = tl.load(IDS + b * T + rows, mask=row_ok, other=-1)
    z = _conv_tile(H, VALID, IDS, W, BIAS, b, rows, my_id, row_ok, cols, cmask, T, D, stride_hb, stride_ht,
                   K, LEFT, HAS_IDS, BLOCK_T, BLOCK_D)
    z = tl.where(cmask[None, :], z, 0.0)
    mean = tl.sum(z, axis=1) / D
    zc = tl.where(cmask[None, :], z - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(zc * zc, axis=1) / D + eps)
    lnw = tl.load(LNW + cols, mask=cmask, other=0.0).to(tl.float32)
    lnb = tl.load(LNB + cols, mask=cmask, other=0.0).to(tl.float32)
    zn = zc * rstd[:, None] * lnw[None, :] + lnb[None, :]
    out = zn * tl.sigmoid(zn)
    m2 = row_ok[:, None] & cmask[None, :]
    tl.store(OUT + b * stride_ob + rows[:, None] * stride_ot + cols[None, :], out.to(OUT.dtype.element_ty), mask=m2)
    tl.store(MEAN + b * T + rows, mean, mask=row_ok)
    tl.store(RSTD + b * T + rows, rstd, mask=row_ok)


@triton.jit
def _bwd_dz_kernel(DOUT, H, VALID, IDS, W, BIAS, LNW, LNB, MEAN, RSTD, DZ, PART, T, D, tiles, stride_hb,
                   stride_ht, stride_dob, stride_dot, K: tl.constexpr, LEFT: tl.constexpr, HAS_IDS: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(1)
    pid = b * tl.num_programs(0) + tl.program_id(0)  # this program's row of the partial sums
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < D
    lnw = tl.load(LNW + cols, mask=cmask, other=0.0).to(tl.float32)
    lnb = tl.load(LNB + cols, mask=cmask, other=0.0).to(tl.float32)
    dlnw = tl.zeros([BLOCK_D], dtype=tl.float32)
    dlnb = tl.zeros([BLOCK_D], dtype=tl.float32)
    dbias = tl.zeros([BLOCK_D], dtype=tl.float32)
    for i in range(tiles):
        rows = (tl.program_id(0) * tiles + i) * BLOCK_T + tl.arange(0, BLOCK_T)
        row_ok = rows < T
        m2 = row_ok[:, None] & cmask[None, :]
        my_id = 0
        if HAS_IDS:
            my_id = tl.load(IDS + b * T + rows, mask=row_ok, other=-1)
        z = _conv_tile(H, VALID, IDS, W, BIAS, b, rows, my_id, row_ok, cols, cmask, T, D, stride_hb, stride_ht,
                       K, LEFT, HAS_IDS, BLOCK_T, BLOCK_D)
        mean = tl.load(MEAN + b * T + rows, mask=row_ok, other=0.0)
        rstd = tl.load(RSTD + b * T + rows, mask=row_ok, other=0.0)
        zhat = tl.where(m2, (z - mean[:, None]) * rstd[:, None], 0.0)
        zn = zhat * lnw[None, :] + lnb[None, :]
        s = tl.sigmoid(zn)
        dout = tl.load(DOUT + b * stride_dob + rows[:, None] * stride_dot + cols[None, :], mask=m2, other=0.0)
        dzn = tl.where(m2, dout.to(tl.float32) * s * (1.0 + zn * (1.0 - s)), 0.0)  # through Swish
        dlnw += tl.sum(dzn * zhat, axis=0)
        dlnb += tl.sum(dzn, axis=0)
        dzhat = dzn * lnw[None, :]
        c_hat = tl.sum(dzhat * zhat, axis=1) / D
        c_mean = tl.sum(dzhat, axis=1) / D
        dz = tl.where(m2, (dzhat - zhat * c_hat[:, None] - c_mean[:, None]) * rstd[:, None], 0.0)  # LayerNorm
        tl.store(DZ + (b * T + rows[:, None]) * D + cols[None, :], dz, mask=m2)
        dbias += tl.sum(dz, axis=0)
    part = PART + (pid * D + cols) * (K + 3)  # this program's partials: [K taps | bias, ln w, ln b]
    tl.store(part + K, dbias, mask=cmask)
    tl.store(part + K + 1, dlnw, mask=cmask)
    tl.store(part + K + 2, dlnb, mask=cmask)


@triton.jit
def _bwd_dh_kernel(DZ, H, VALID, IDS, W, DH, PART, T, D, tiles, stride_hb, stride_ht, stride_dhb, stride_dht,
                   K: tl.constexpr, LEFT: tl.constexpr, HAS_IDS: tl.constexpr, BLOCK_T: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    b = tl.program_id(1)
    pid = b * tl.num_programs(0) + tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < D
    lanes = tl.arange(0, BLOCK_T)
    # The weight gradient's partial sums: row k of a tile-shaped accumulator holds tap k (BLOCK_T >= K), so adding
    # a tap's column sums needs no change of register layout.
    dw = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for i in range(tiles):
        src = (tl.program_id(0) * tiles + i) * BLOCK_T + lanes  # the frames whose GLU output the taps read
        in_row = src < T
        src_ok = in_row & (tl.load(VALID + b * T + src, mask=in_row, other=0) != 0)  # y is 0 where not valid
        m2 = src_ok[:, None] & cmask[None, :]
        ptr = H + b * stride_hb + src[:, None] * stride_ht + cols[None, :]
        a = tl.load(ptr, mask=m2, other=0.0).to(tl.float32)
        sg = tl.sigmoid(tl.load(ptr + D, mask=m2, other=0.0).to(tl.float32))
        y = a * sg  # (masked frames: 0)
        src_id = 0
        if HAS_IDS:
            src_id = tl.load(IDS + b * T + src, mask=src_ok, other=-1)
        dy = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
        for k in tl.static_range(K):
            t = src - (k - LEFT)  # the output frame whose tap k reads src
            ok = src_ok & (t >= 0) & (t < T)
            if HAS_IDS:
                ok = ok & (tl.load(IDS + b * T + t, mask=ok, other=-2) == src_id)
            dz = tl.load(DZ + (b * T + t[:, None]) * D + cols[None, :], mask=ok[:, None] & cmask[None, :], other=0.0)
            wk = tl.load(W + cols * K + k, mask=cmask, other=0.0).to(tl.float32)
            dy += dz * wk[None, :]
            dw += tl.where(lanes[:, None] == k, tl.sum(dz * y, axis=0)[None, :], 0.0)
        da = tl.where(m2, dy * sg, 0.0)
        dg = tl.where(m2, dy * a * sg * (1.0 - sg), 0.0)
        out_ok = in_row[:, None] & cmask[None, :]  # every frame's gradient is written, 0 where y was masked
        dptr = DH + b * stride_dhb + src[:, None] * stride_dht + cols[None, :]
        tl.store(dptr, da.to(DH.dtype.element_ty), mask=out_ok)
        tl.store(dptr + D, dg.to(DH.dtype.element_ty), mask=out_ok)
    part = PART + (pid * D + cols[None, :]) * (K + 3) + lanes[:, None]
    tl.store(part, dw, mask=cmask[None, :] & (lanes[:, None] < K))
# fmt: on


def _block_t(D: int, elements: int) -> int:
    """Frames per tile: a [BLOCK_T, BLOCK_D] fp32 tile of about ``elements`` values."""
    return max(1, min(16, elements // triton.next_power_of_2(D)))


def _num_warps(block_t: int, block_d: int) -> int:
    """Warps per program: about 32 values of a tile per thread."""
    return max(4, min(16, block_t * block_d // 1024))


def _tiles_per_program(tiles: int, rows: int, device: torch.device) -> int:
    """Backward tiles per program: enough programs to fill the GPU about four times over, each with as many tiles
    as that leaves (fewer partial sums to add up). Under the interpreter: 2, so tests walk the loop."""
    if device.type != "cuda":
        return 2
    programs = 4 * torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(8, tiles * rows // programs))


def check_inputs(h, valid, ids, weight, bias, ln_weight, ln_bias, left) -> None:
    if h.dim() != 3 or h.shape[-1] % 2 or h.stride(-1) != 1:
        raise ValueError(f"h must be (B, T, 2D) with a unit last stride, got {tuple(h.shape)} strides {h.stride()}")
    B, T, D2 = h.shape
    D = D2 // 2
    if weight.dim() != 2 or weight.shape[0] != D:
        raise ValueError(f"weight must be (D, K) = ({D}, K), got {tuple(weight.shape)}")
    if not 0 <= left < weight.shape[1]:
        raise ValueError(f"left={left} must lie in [0, K) for K={weight.shape[1]} taps")
    for name, p in (("bias", bias), ("ln_weight", ln_weight), ("ln_bias", ln_bias)):
        if p.shape != (D,):
            raise ValueError(f"{name} must be (D,) = ({D},), got {tuple(p.shape)}")
    if valid.shape != (B, T) or valid.dtype != torch.bool:
        raise ValueError(f"valid must be bool (B, T) = ({B}, {T}), got {valid.dtype} {tuple(valid.shape)}")
    if ids is not None and (ids.shape != (B, T) or ids.dtype.is_floating_point):
        raise ValueError(f"ids must be integer (B, T) = ({B}, {T}), got {ids.dtype} {tuple(ids.shape)}")


def conv_mid_fwd(h, valid, ids, weight, bias, ln_weight, ln_bias, eps: float, left: int):
    """-> out (B, T, D) in h's dtype, mean (B, T) fp32, rstd (B, T) fp32."""
    check_inputs(h, valid, ids, weight, bias, ln_weight, ln_bias, left)
    B, T, D2 = h.shape
    D, K = D2 // 2, weight.shape[1]
    out = torch.empty(B, T, D, dtype=h.dtype, device=h.device)
    mean = torch.empty(B, T, dtype=torch.float32, device=h.device)
    rstd = torch.empty_like(mean)
    block_d = triton.next_power_of_2(D)
    block_t = _block_t(D, 8192)
    valid_u8 = valid.contiguous().view(torch.uint8)
    ids_arg = ids.contiguous() if ids is not None else valid_u8  # not read without ids
    grid = (triton.cdiv(T, block_t), B)
    _fwd_kernel[grid](
        h, valid_u8, ids_arg, weight.contiguous(), bias, ln_weight, ln_bias, out, mean, rstd, T, D, eps,
        h.stride(0), h.stride(1), out.stride(0), out.stride(1), K=K, LEFT=left, HAS_IDS=ids is not None,
        BLOCK_T=block_t, BLOCK_D=block_d, num_warps=_num_warps(block_t, block_d),
    )  # fmt: skip
    return out, mean, rstd


def conv_mid_bwd(dout, h, valid, ids, weight, bias, ln_weight, ln_bias, mean, rstd, left: int):
    """-> dh (B, T, 2D) in h's dtype, d weight (D, K), d bias, d ln_weight, d ln_bias (D,), each in its parameter's
    dtype."""
    B, T, D2 = h.shape
    D, K = D2 // 2, weight.shape[1]
    block_d = triton.next_power_of_2(D)
    block_t = max(_block_t(D, 4096), triton.next_power_of_2(K))  # the dh kernel keeps tap k in its row k
    tiles = _tiles_per_program(triton.cdiv(T, block_t), B, h.device)
    grid = (triton.cdiv(T, block_t * tiles), B)
    dz = torch.empty(B, T, D, dtype=torch.float32, device=h.device)
    partials = torch.empty(grid[0] * grid[1], D, K + 3, dtype=torch.float32, device=h.device)  # every slot written
    valid_u8 = valid.contiguous().view(torch.uint8)
    ids_arg = ids.contiguous() if ids is not None else valid_u8
    weight = weight.contiguous()
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    meta = dict(K=K, LEFT=left, HAS_IDS=ids is not None, BLOCK_T=block_t, BLOCK_D=block_d,
                num_warps=_num_warps(block_t, block_d))  # fmt: skip
    _bwd_dz_kernel[grid](
        dout, h, valid_u8, ids_arg, weight, bias, ln_weight, ln_bias, mean, rstd, dz, partials, T, D, tiles,
        h.stride(0), h.stride(1), dout.stride(0), dout.stride(1), **meta,
    )  # fmt: skip
    dh = torch.empty_like(h)
    _bwd_dh_kernel[grid](dz, h, valid_u8, ids_arg, weight, dh, partials, T, D, tiles, h.stride(0), h.stride(1),
                         dh.stride(0), dh.stride(1), **meta)  # fmt: skip
    sums = partials.sum(0)  # (D, K + 3); each gradient a copy of its own (a custom op's outputs may not alias)
    return (
        dh,
        sums[:, :K].to(weight.dtype, copy=True),
        sums[:, K].to(bias.dtype, copy=True),
        sums[:, K + 1].to(ln_weight.dtype, copy=True),
        sums[:, K + 2].to(ln_bias.dtype, copy=True),
    )
