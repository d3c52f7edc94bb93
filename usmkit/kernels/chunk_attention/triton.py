"""Triton chunk-wise attention: forward and backward kernels that skip fully masked blocks.

Shapes: B batch, H heads, T frames, D head dim (64, 96, 128; any D in 16..128 works, D is padded to a power
of two inside the kernel). q, k, v: (B, H, T, D), any strides with a unit last stride; lengths: (B,) int, or for
packed rows (several utterances per row) each frame's utterance bounds (B, 2, T) int: [start, end) frame
indices in its row, start = end at padding (``api.segment_bounds``).
Mask semantics: ``usmkit.kernels.masks``; ``reference.py`` is the oracle the tests hold this file to.

Block skipping. Query ``i`` sees keys ``[row_lo(i), row_hi(i))`` with (C chunk size, L left chunks)
``row_lo = max(0, (i // C - L) * C)`` (0 when L = -1) and ``row_hi = min((i // C + 1) * C, length)``.
Both bounds grow with ``i``, so a block of queries ``[m0, m1)`` needs only keys ``[row_lo(m0), row_hi(m1 - 1))``
and sees every key of ``[row_lo(m1 - 1), row_hi(m0))``. Each program walks the first range either in three
loops (masked key blocks, key blocks visible to all its queries without the element mask, masked blocks again)
or, with the ``SINGLE_LOOP`` config, in one masked loop; the autotuner picks per kernel and shape.
Everything outside is never loaded. The dK/dV kernel does the same over queries, with the inverse range
(key ``j`` is seen by queries ``[j // C * C, min((j // C + L + 1) * C, length))``).

Packed rows: query ``i`` of the utterance [s, e) sees the keys a query at ``i - s`` sees in an utterance of
``e - s`` frames alone, shifted by ``s``: ``row_lo = s + max(0, ((i - s) // C - L) * C)``, ``row_hi = min(s +
((i - s) // C + 1) * C, e)``; keys of other utterances fall outside. These bounds are not monotone across an
utterance edge inside a block, so a block walks [min row_lo, max row_hi) of its queries, every block with the
element mask (likewise for keys in the dK/dV kernel).

Numerics: fp32 accumulators, FlashAttention-2 online softmax in base 2, the log-sum-exp saved (log2 units,
+inf for padded queries so that they add exactly 0 to dK/dV) for the backward pass. bf16/fp16 dots run on
the tensor cores with fp32 accumulation; fp32 inputs use ``input_precision="ieee"`` unless
``torch.get_float32_matmul_precision()`` allows tf32 (then "tf32"), the same switch torch's matmul obeys.

Backward (FlashAttention-2): ``delta = rowsum(dO * O)``; a dK/dV kernel over key blocks; dQ either from a
kernel over query blocks (default, deterministic) or accumulated in fp32 with atomics inside the dK/dV
kernel (``dq_mode="atomic"``); ``bench/attention.py`` times both.

Host time: after a kernel is tuned for a key, launches skip ``Autotuner.run`` (see ``_launch``).

CPU: set ``TRITON_INTERPRET=1`` before this module is imported (triton reads it when kernels are defined);
the interpreter then runs one small block configuration. Triton 3.6's interpreter computes bf16 dots wrongly,
so under the interpreter bf16 dot operands are upcast to fp32 (exact); on the GPU the dots run natively in bf16.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from usmkit.kernels.interpreter import patch_interpreter_loop_bounds

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
if INTERPRET:
    patch_interpreter_loop_bounds()

DQ_MODES = ("kernel", "atomic")
DEFAULT_DQ_MODE = "kernel"
_NEG = tl.constexpr(-1.0e30)  # masked score: finite, so a row whose first key block is all masked makes no NaN


# ----------------------------------------------------------------------------------------------- configs


def _configs(table: list[tuple[int, int, int, int, bool]]) -> list[triton.Config]:
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n, "SINGLE_LOOP": single}, num_warps=w, num_stages=s)
        for m, n, w, s, single in table
    ]


# (BLOCK_M queries, BLOCK_N keys, num_warps, num_stages, SINGLE_LOOP). SINGLE_LOOP walks the whole visible range
# in one loop with the element mask on every block instead of three loops (masked, unmasked, masked): more
# ALU work per block, but in the dK/dV kernel the three loops make ptxas serialize the wgmma accumulators
# (warning C7515), so the autotuner chooses. The interpreter gets one small, asymmetric config so that tiny
# test shapes still cross block and chunk boundaries in every loop.
if INTERPRET:
    _FWD_CONFIGS = _configs([(32, 16, 4, 1, False)])
    _DKDV_CONFIGS = _configs([(32, 16, 4, 1, False)])
    _DQ_CONFIGS = _configs([(16, 32, 4, 1, False)])
else:
    _FWD_CONFIGS = _configs(
        [
            (64, 64, 4, 3, False),
            (128, 64, 8, 3, False),
            (64, 32, 4, 3, False),
            (64, 32, 4, 3, True),
            (128, 64, 8, 3, True),
        ]
    )
    _DKDV_CONFIGS = _configs(
        [
            (32, 64, 4, 3, False),
            (32, 64, 4, 3, True),
            (64, 128, 8, 3, False),
            (64, 128, 8, 3, True),
            (32, 128, 8, 3, True),
            (64, 64, 4, 3, True),
        ]
    )
    _DQ_CONFIGS = _configs(
        [
            (64, 32, 4, 3, False),
            (64, 32, 4, 3, True),
            (128, 64, 8, 3, False),
            (128, 64, 8, 3, True),
            (64, 64, 4, 3, False),
        ]
    )

_TUNE_KEY = ["HEAD_D", "CHUNK", "LEFT", "PACKED"]


def _tune_bench(kernel_call, quantiles):
    """Time one autotuning trial: 10 ms warm-up, 40 ms of runs (triton's 25/100 make first calls slow)."""
    from triton.testing import do_bench

    return do_bench(kernel_call, warmup=10, rep=40, quantiles=quantiles)


_TUNE_BENCH = {"do_bench": _tune_bench}


# ----------------------------------------------------------------------------------------------- helpers


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b (+ acc) in fp32. UPCAST only under the interpreter, whose bf16 dot is broken."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _query_block_ranges(m0, length, CHUNK, LEFT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key loop bounds for queries [m0, m0 + BLOCK_M): (start, full_start, full_end, end), see the module doc.

    [start, full_start) and [full_end, end) are walked with the element mask, [full_start, full_end) without.
    All four are 0 when the block holds no valid query.
    """
    m_last = tl.minimum(m0 + BLOCK_M, length) - 1  # last valid query of the block
    has_rows = m_last >= m0
    c_first = m0 // CHUNK
    c_last = tl.maximum(m_last, 0) // CHUNK
    lo_all = tl.where(LEFT >= 0, tl.maximum((c_first - LEFT) * CHUNK, 0), 0)
    lo_full = tl.where(LEFT >= 0, tl.maximum((c_last - LEFT) * CHUNK, 0), 0)
    hi_all = tl.minimum((c_last + 1) * CHUNK, length)
    hi_full = tl.minimum((c_first + 1) * CHUNK, length)
    hi_all = tl.where(has_rows, hi_all, 0)
    start = tl.where(has_rows, (lo_all // BLOCK_N) * BLOCK_N, 0)
    full_start = tl.minimum(tl.maximum((lo_full + BLOCK_N - 1) // BLOCK_N * BLOCK_N, start), hi_all)
    full_end = tl.maximum((hi_full // BLOCK_N) * BLOCK_N, full_start)
    full_end = tl.where(has_rows, full_end, 0)
    return start, full_start, full_end, hi_all


@triton.jit
def _key_block_ranges(n0, length, CHUNK, LEFT, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """Query loop bounds for keys [n0, n0 + BLOCK_N): (start, full_start, full_end, end), as above.

    Blocks that hold padded keys (n0 + BLOCK_N > length) get no unmasked range.
    """
    n_last = tl.minimum(n0 + BLOCK_N, length) - 1
    has_keys = n_last >= n0
    c_first = n0 // CHUNK
    c_last = tl.maximum(n_last, 0) // CHUNK
    lo_all = c_first * CHUNK
    lo_full = c_last * CHUNK
    hi_all = tl.where(LEFT >= 0, tl.minimum((c_last + LEFT + 1) * CHUNK, length), length)
    hi_full = tl.where(LEFT >= 0, tl.minimum((c_first + LEFT + 1) * CHUNK, length), length)
    hi_full = tl.where(n0 + BLOCK_N <= length, hi_full, 0)
    hi_all = tl.where(has_keys, hi_all, 0)
    start = tl.where(has_keys, (lo_all // BLOCK_M) * BLOCK_M, 0)
    full_start = tl.minimum(tl.maximum((lo_full + BLOCK_M - 1) // BLOCK_M * BLOCK_M, start), hi_all)
    full_end = tl.maximum((hi_full // BLOCK_M) * BLOCK_M, full_start)
    full_end = tl.where(has_keys, full_end, 0)
    return start, full_start, full_end, hi_all


@triton.jit
def _utterance_of(SEG, b, offs, T, CHUNK):
    """Packed rows: for the frames ``offs`` of row b, their utterance's [start, end) from SEG (B, 2, T), whether
    the frame is one (not padding) and its chunk counted from the utterance's first frame."""
    in_t = offs < T
    start = tl.load(SEG + b.to(tl.int64) * 2 * T + offs, mask=in_t, other=0).to(tl.int32)
    end = tl.load(SEG + b.to(tl.int64) * 2 * T + T + offs, mask=in_t, other=0).to(tl.int32)
    return start, end, in_t & (end > start), (offs - start) // CHUNK


@triton.jit
def _packed_rows(SEG, b, offs, T, CHUNK, LEFT):
    """Packed rows: (row_lo, row_hi, row_ok) of the queries ``offs``: the lengths' bounds shifted by the start of
    each query's utterance and cut at its end."""
    start, end, row_ok, chunk = _utterance_of(SEG, b, offs, T, CHUNK)
    row_lo = start + tl.where(LEFT >= 0, tl.maximum((chunk - LEFT) * CHUNK, 0), 0)
    row_hi = tl.where(row_ok, tl.minimum(start + (chunk + 1) * CHUNK, end), 0)
    return row_lo, row_hi, row_ok


@triton.jit
def _packed_cols(SEG, b, offs, T, CHUNK, LEFT):
    """Packed rows: (col_lo, col_hi, col_ok) of the keys ``offs``: the queries that see each (the inverse range)."""
    start, end, col_ok, chunk = _utterance_of(SEG, b, offs, T, CHUNK)
    col_hi = tl.where(LEFT >= 0, tl.minimum(start + (chunk + LEFT + 1) * CHUNK, end), end)
    return start + chunk * CHUNK, tl.where(col_ok, col_hi, 0), col_ok


@triton.jit
def _packed_range(lo, hi, ok, T, BLOCK: tl.constexpr):
    """Loop bounds over the other side for packed rows: every block of [min lo, max hi) walked with the element
    mask (start, full_start = full_end = start, end); all 0 when no row of the block is valid."""
    lo_min = tl.min(tl.where(ok, lo, T), axis=0)
    hi_max = tl.max(hi, axis=0)
    any_ok = hi_max > lo_min
    start = tl.where(any_ok, (lo_min // BLOCK) * BLOCK, 0)
    return start, start, start, tl.where(any_ok, hi_max, 0)


@triton.jit
def _query_rows(LENGTHS, b, m0, offs_m, T, CHUNK, LEFT, PACKED: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):  # fmt: skip
    """For the queries ``offs_m`` of a block starting at m0: (length for the key loads, row_lo, row_hi, row_ok,
    and the key loop bounds start, full_start, full_end, end), from lengths or packed rows' bounds."""
    if PACKED:
        length = T
        row_lo, row_hi, row_ok = _packed_rows(LENGTHS, b, offs_m, T, CHUNK, LEFT)
        start, full_start, full_end, end = _packed_range(row_lo, row_hi, row_ok, T, BLOCK_N)
    else:
        length = tl.minimum(tl.maximum(tl.load(LENGTHS + b).to(tl.int32), 0), T)
        row_ok = offs_m < length
        q_chunk = offs_m // CHUNK
        row_lo = tl.where(LEFT >= 0, tl.maximum((q_chunk - LEFT) * CHUNK, 0), 0)
        row_hi = tl.where(row_ok, tl.minimum((q_chunk + 1) * CHUNK, length), 0)
        start, full_start, full_end, end = _query_block_ranges(m0, length, CHUNK, LEFT, BLOCK_M, BLOCK_N)
    return length, row_lo, row_hi, row_ok, start, full_start, full_end, end


# ----------------------------------------------------------------------------------------------- forward


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_d, d_ok, row_lo, row_hi, length,
               qk_scale, lo, hi, MASKED: tl.constexpr, PAD_D: tl.constexpr, BLOCK_N: tl.constexpr,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if MASKED:
            kv_ok = (offs_n[:, None] < length) & d_ok[None, :]
            k = tl.load(k_base + offs_n[:, None] * stride_kt + offs_d[None, :], mask=kv_ok, other=0.0)
            v = tl.load(v_base + offs_n[:, None] * stride_vt + offs_d[None, :], mask=kv_ok, other=0.0)
        elif PAD_D:
            k = tl.load(k_base + offs_n[:, None] * stride_kt + offs_d[None, :], mask=d_ok[None, :], other=0.0)
            v = tl.load(v_base + offs_n[:, None] * stride_vt + offs_d[None, :], mask=d_ok[None, :], other=0.0)
        else:
            k = tl.load(k_base + offs_n[:, None] * stride_kt + offs_d[None, :])
            v = tl.load(v_base + offs_n[:, None] * stride_vt + offs_d[None, :])
        s = _dot(q, tl.trans(k), None, PRECISION, UPCAST) * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
        if MASKED:
            visible = (offs_n[None, :] >= row_lo[:, None]) & (offs_n[None, :] < row_hi[:, None])
            s = tl.where(visible, s, _NEG)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], PRECISION, UPCAST)
        m_i = m_new
    return acc, l_i, m_i


@triton.autotune(configs=_FWD_CONFIGS, key=_TUNE_KEY, **_TUNE_BENCH)
@triton.jit(do_not_specialize=["H", "T", "CHUNK", "LEFT"])
def _fwd_kernel(Q, K, V, O, LSE, LENGTHS, stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot, H, T, qk_scale, CHUNK, LEFT,
                HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                PACKED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                SINGLE_LOOP: tl.constexpr):  # fmt: skip
    """One program: BLOCK_M queries of one (batch, head). Grid (cdiv(T, BLOCK_M), B * H). PACKED: LENGTHS is the
    rows' (B, 2, T) utterance bounds."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_D
    length, row_lo, row_hi, row_ok, start, full_start, full_end, end = _query_rows(
        LENGTHS, b, m0, offs_m, T, CHUNK, LEFT, PACKED, BLOCK_M, BLOCK_N
    )

    q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    k_base = K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    q = tl.load(q_base + offs_m[:, None] * stride_qt + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], _NEG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    PAD_D: tl.constexpr = BLOCK_D != HEAD_D
    args = (q, k_base, v_base, stride_kt, stride_vt, offs_d, d_ok, row_lo, row_hi, length, qk_scale)
    if SINGLE_LOOP:
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, *args, start, end, True, PAD_D, BLOCK_N, PRECISION, UPCAST)
    else:
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, *args, start, full_start, True, PAD_D, BLOCK_N, PRECISION, UPCAST)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, *args, full_start, full_end, False, PAD_D, BLOCK_N, PRECISION, UPCAST)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, *args, full_end, end, True, PAD_D, BLOCK_N, PRECISION, UPCAST)

    l_safe = tl.where(row_ok, l_i, 1.0)
    out = tl.where(row_ok[:, None], acc / l_safe[:, None], 0.0)
    lse = tl.where(row_ok, m_i + tl.log2(l_safe), float("inf"))
    in_t = offs_m < T
    o_ptrs = O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + offs_m[:, None] * stride_ot
    tl.store(o_ptrs + offs_d[None, :], out.to(O.dtype.element_ty), mask=in_t[:, None] & d_ok[None, :])
    tl.store(LSE + pid_bh.to(tl.int64) * T + offs_m, lse, mask=in_t)


# ---------------------------------------------------------------------------------------------- backward


@triton.jit
def _bwd_preprocess_kernel(O, DO, DELTA, stride_ob, stride_oh, stride_ot, stride_dob, stride_doh, stride_dot, H, T,
                           HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):  # fmt: skip
    """delta[b, h, t] = sum_d O * dO, in fp32. Grid (cdiv(T, BLOCK_M), B * H)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (offs_m[:, None] < T) & (offs_d[None, :] < HEAD_D)
    o_ptrs = O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + offs_m[:, None] * stride_ot
    do_ptrs = DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh + offs_m[:, None] * stride_dot
    o = tl.load(o_ptrs + offs_d[None, :], mask=ok, other=0.0).to(tl.float32)
    do = tl.load(do_ptrs + offs_d[None, :], mask=ok, other=0.0).to(tl.float32)
    tl.store(DELTA + pid_bh.to(tl.int64) * T + offs_m, tl.sum(o * do, 1), mask=offs_m < T)


@triton.jit
def _dkdv_inner(dk, dv, k, v, q_base, do_base, dq_base, lse_base, delta_base, stride_qt, stride_dot, stride_dqt,
                offs_n, offs_d, d_ok, col_lo, col_hi, length, qk_scale, sm_scale, lo, hi, MASKED: tl.constexpr,
                PAD_D: tl.constexpr, ATOMIC_DQ: tl.constexpr, BLOCK_M: tl.constexpr, PRECISION: tl.constexpr,
                UPCAST: tl.constexpr):  # fmt: skip
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        if MASKED:
            row_ok = offs_m < length
            q_ok = row_ok[:, None] & d_ok[None, :]
            q = tl.load(q_base + offs_m[:, None] * stride_qt + offs_d[None, :], mask=q_ok, other=0.0)
            do = tl.load(do_base + offs_m[:, None] * stride_dot + offs_d[None, :], mask=q_ok, other=0.0)
            lse = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf"))
            delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        else:
            if PAD_D:
                q = tl.load(q_base + offs_m[:, None] * stride_qt + offs_d[None, :], mask=d_ok[None, :], other=0.0)
                do = tl.load(do_base + offs_m[:, None] * stride_dot + offs_d[None, :], mask=d_ok[None, :], other=0.0)
            else:
                q = tl.load(q_base + offs_m[:, None] * stride_qt + offs_d[None, :])
                do = tl.load(do_base + offs_m[:, None] * stride_dot + offs_d[None, :])
            lse = tl.load(lse_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        s_t = _dot(k, tl.trans(q), None, PRECISION, UPCAST) * qk_scale  # (BLOCK_N, BLOCK_M)
        p_t = tl.exp2(s_t - lse[None, :])
        if MASKED:
            visible = (offs_m[None, :] >= col_lo[:, None]) & (offs_m[None, :] < col_hi[:, None])
            p_t = tl.where(visible, p_t, 0.0)
        dv = _dot(p_t.to(do.dtype), do, dv, PRECISION, UPCAST)
        dp_t = _dot(v, tl.trans(do), None, PRECISION, UPCAST)  # (BLOCK_N, BLOCK_M)
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
        dk = _dot(ds_t, q, dk, PRECISION, UPCAST)
        if ATOMIC_DQ:
            dq = _dot(tl.trans(ds_t), k, None, PRECISION, UPCAST) * sm_scale  # (BLOCK_M, BLOCK_D)
            dq_ptrs = dq_base + offs_m[:, None] * stride_dqt + offs_d[None, :]
            tl.atomic_add(dq_ptrs, dq, mask=(offs_m[:, None] < length) & d_ok[None, :], sem="relaxed")
    return dk, dv


@triton.autotune(configs=_DKDV_CONFIGS, key=_TUNE_KEY + ["ATOMIC_DQ"], reset_to_zero=["DQ"], **_TUNE_BENCH)
@triton.jit(do_not_specialize=["H", "T", "CHUNK", "LEFT"])
def _dkdv_kernel(Q, K, V, DO, DQ, DK, DV, LSE, DELTA, LENGTHS, stride_qb, stride_qh, stride_qt, stride_kb, stride_kh,
                 stride_kt, stride_vb, stride_vh, stride_vt, stride_dob, stride_doh, stride_dot, stride_dqb,
                 stride_dqh, stride_dqt, stride_dkb, stride_dkh, stride_dkt, stride_dvb, stride_dvh, stride_dvt, H,
                 T, qk_scale, sm_scale, CHUNK, LEFT, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr,
                 PRECISION: tl.constexpr, UPCAST: tl.constexpr, ATOMIC_DQ: tl.constexpr, PACKED: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_LOOP: tl.constexpr):  # fmt: skip
    """One program: BLOCK_N keys of one (batch, head); dK, dV (and dQ with atomics). Grid (cdiv(T, BLOCK_N), B * H)."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_D
    if PACKED:
        length = T
        col_lo, col_hi, col_ok = _packed_cols(LENGTHS, b, offs_n, T, CHUNK, LEFT)
        start, full_start, full_end, end = _packed_range(col_lo, col_hi, col_ok, T, BLOCK_M)
    else:
        length = tl.minimum(tl.maximum(tl.load(LENGTHS + b).to(tl.int32), 0), T)
        col_ok = offs_n < length
        k_chunk = offs_n // CHUNK
        col_lo = k_chunk * CHUNK
        col_hi = tl.where(LEFT >= 0, tl.minimum((k_chunk + LEFT + 1) * CHUNK, length), length)
        col_hi = tl.where(col_ok, col_hi, 0)
        start, full_start, full_end, end = _key_block_ranges(n0, length, CHUNK, LEFT, BLOCK_N, BLOCK_M)
    kv_ok = col_ok[:, None] & d_ok[None, :]

    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    k = tl.load(
        K + b64 * stride_kb + h64 * stride_kh + offs_n[:, None] * stride_kt + offs_d[None, :], mask=kv_ok, other=0.0
    )
    v = tl.load(
        V + b64 * stride_vb + h64 * stride_vh + offs_n[:, None] * stride_vt + offs_d[None, :], mask=kv_ok, other=0.0
    )

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    PAD_D: tl.constexpr = BLOCK_D != HEAD_D
    args = (
        k,
        v,
        Q + b64 * stride_qb + h64 * stride_qh,
        DO + b64 * stride_dob + h64 * stride_doh,
        DQ + b64 * stride_dqb + h64 * stride_dqh,
        LSE + pid_bh.to(tl.int64) * T,
        DELTA + pid_bh.to(tl.int64) * T,
        stride_qt,
        stride_dot,
        stride_dqt,
        offs_n,
        offs_d,
        d_ok,
        col_lo,
        col_hi,
        length,
        qk_scale,
        sm_scale,
    )
    if SINGLE_LOOP:
        dk, dv = _dkdv_inner(dk, dv, *args, start, end, True, PAD_D, ATOMIC_DQ, BLOCK_M, PRECISION, UPCAST)
    else:
        dk, dv = _dkdv_inner(dk, dv, *args, start, full_start, True, PAD_D, ATOMIC_DQ, BLOCK_M, PRECISION, UPCAST)
        dk, dv = _dkdv_inner(dk, dv, *args, full_start, full_end, False, PAD_D, ATOMIC_DQ, BLOCK_M, PRECISION, UPCAST)
        dk, dv = _dkdv_inner(dk, dv, *args, full_end, end, True, PAD_D, ATOMIC_DQ, BLOCK_M, PRECISION, UPCAST)

    store_ok = (offs_n[:, None] < T) & d_ok[None, :]
    dk_ptrs = DK + b64 * stride_dkb + h64 * stride_dkh + offs_n[:, None] * stride_dkt + offs_d[None, :]
    dv_ptrs = DV + b64 * stride_dvb + h64 * stride_dvh + offs_n[:, None] * stride_dvt + offs_d[None, :]
    tl.store(dk_ptrs, (dk * sm_scale).to(DK.dtype.element_ty), mask=store_ok)
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=store_ok)


@triton.jit
def _dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kt, stride_vt, offs_d, d_ok, row_lo, row_hi, length,
              qk_scale, lo, hi, MASKED: tl.constexpr, PAD_D: tl.constexpr, BLOCK_N: tl.constexpr,
              PRECISION: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if MASKED:
            kv_ok = (offs_n[:, None] < length) & d_ok[None, :]
            k = tl.load(k_base + offs_n[:, None] * stride_kt + offs_d[None, :], mask=kv_ok, other=0.0)
            v = tl.load(v_base + offs_n[:, None] * stride_vt + offs_d[None, :], mask=kv_ok, other=0.0)
        elif PAD_D:
            k = tl.load(k_base + offs_n[:, None] * stride_kt + offs_d[None, :], mask=d_ok[None, :], other=0.0)
            v = tl.load(v_base + offs_n[:, None] * stride_vt + offs_d[None, :], mask=d_ok[None, :], other=0.0)
        else:
            k = tl.load(k_base + offs_n[:, None] * stride_kt + offs_d[None, :])
            v = tl.load(v_base + offs_n[:, None] * stride_vt + offs_d[None, :])
        s = _dot(q, tl.trans(k), None, PRECISION, UPCAST) * qk_scale  # (BLOCK_M, BLOCK_N)
        p = tl.exp2(s - lse[:, None])
        if MASKED:
            visible = (offs_n[None, :] >= row_lo[:, None]) & (offs_n[None, :] < row_hi[:, None])
            p = tl.where(visible, p, 0.0)
        dp = _dot(do, tl.trans(v), None, PRECISION, UPCAST)  # (BLOCK_M, BLOCK_N)
        ds = (p * (dp - delta[:, None])).to(k.dtype)
        dq = _dot(ds, k, dq, PRECISION, UPCAST)
    return dq


@triton.autotune(configs=_DQ_CONFIGS, key=_TUNE_KEY, **_TUNE_BENCH)
@triton.jit(do_not_specialize=["H", "T", "CHUNK", "LEFT"])
def _dq_kernel(Q, K, V, DO, DQ, LSE, DELTA, LENGTHS, stride_qb, stride_qh, stride_qt, stride_kb, stride_kh,
               stride_kt, stride_vb, stride_vh, stride_vt, stride_dob, stride_doh, stride_dot, stride_dqb,
               stride_dqh, stride_dqt, H, T, qk_scale, sm_scale, CHUNK, LEFT, HEAD_D: tl.constexpr,
               BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, PACKED: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_LOOP: tl.constexpr):  # fmt: skip
    """One program: dQ for BLOCK_M queries of one (batch, head). Grid (cdiv(T, BLOCK_M), B * H)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_D
    length, row_lo, row_hi, row_ok, start, full_start, full_end, end = _query_rows(
        LENGTHS, b, m0, offs_m, T, CHUNK, LEFT, PACKED, BLOCK_M, BLOCK_N
    )
    q_ok = row_ok[:, None] & d_ok[None, :]

    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    q = tl.load(
        Q + b64 * stride_qb + h64 * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :], mask=q_ok, other=0.0
    )
    do = tl.load(
        DO + b64 * stride_dob + h64 * stride_doh + offs_m[:, None] * stride_dot + offs_d[None, :], mask=q_ok, other=0.0
    )
    lse = tl.load(LSE + pid_bh.to(tl.int64) * T + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + pid_bh.to(tl.int64) * T + offs_m, mask=row_ok, other=0.0)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    PAD_D: tl.constexpr = BLOCK_D != HEAD_D
    args = (
        q,
        do,
        lse,
        delta,
        K + b64 * stride_kb + h64 * stride_kh,
        V + b64 * stride_vb + h64 * stride_vh,
        stride_kt,
        stride_vt,
        offs_d,
        d_ok,
        row_lo,
        row_hi,
        length,
        qk_scale,
    )
    if SINGLE_LOOP:
        dq = _dq_inner(dq, *args, start, end, True, PAD_D, BLOCK_N, PRECISION, UPCAST)
    else:
        dq = _dq_inner(dq, *args, start, full_start, True, PAD_D, BLOCK_N, PRECISION, UPCAST)
        dq = _dq_inner(dq, *args, full_start, full_end, False, PAD_D, BLOCK_N, PRECISION, UPCAST)
        dq = _dq_inner(dq, *args, full_end, end, True, PAD_D, BLOCK_N, PRECISION, UPCAST)

    dq = tl.where(row_ok[:, None], dq * sm_scale, 0.0)
    dq_ptrs = DQ + b64 * stride_dqb + h64 * stride_dqh + offs_m[:, None] * stride_dqt + offs_d[None, :]
    tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=(offs_m[:, None] < T) & d_ok[None, :])


# ---------------------------------------------------------------------------------------------- launchers


_BEST_CONFIGS: dict[tuple, triton.Config] = {}


def _launch(tuner, grid, key: tuple, *args, **kwargs) -> None:
    """Launch an autotuned kernel; after the first call per key, skip ``Autotuner.run`` (host time: it rebuilds
    dicts over all ~40 arguments on every call) and launch the tuned config on the JIT function directly."""
    config = _BEST_CONFIGS.get((tuner, key))
    if config is None:
        tuner[grid](*args, **kwargs)
        _BEST_CONFIGS[(tuner, key)] = tuner.best_config
    else:
        tuner.fn[grid](*args, **kwargs, **config.all_kwargs())


def _as_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """int32 or int64 lengths are read by the kernels as they are (no cast kernel per call)."""
    if lengths.dtype not in (torch.int32, torch.int64):
        lengths = lengths.to(torch.int32)
    return lengths.contiguous()


def _strides(x: torch.Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _mask_args(T: int, chunk_size: int | None, left_chunks: int) -> tuple[int, int]:
    """(CHUNK, LEFT) for the kernels: full attention is one chunk of T frames; a left context that reaches
    frame 0 from every chunk is the same as -1 (and keeps the kernels' int32 bound arithmetic small)."""
    if chunk_size is None or chunk_size >= T:
        return max(T, 1), 0
    n_chunks = triton.cdiv(T, chunk_size)
    return chunk_size, (-1 if left_chunks < 0 or left_chunks >= n_chunks - 1 else left_chunks)


def _dot_options(dtype: torch.dtype) -> tuple[str, bool]:
    """(input_precision, upcast) for the dots; see the module doc."""
    if dtype == torch.float32:
        precision = "ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32"
    else:
        precision = "tf32"  # ignored for 16-bit operands
    return precision, INTERPRET and dtype == torch.bfloat16


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> None:
    """Raise ValueError for inputs the kernels cannot take."""
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"q, k, v must all be (B, H, T, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(
            f"triton chunk attention takes fp16, bf16 or fp32 q/k/v of one dtype; got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if q.shape[-1] < 16 or q.shape[-1] > 128:
        raise ValueError(f"triton chunk attention supports head dims 16..128, got D={q.shape[-1]}")
    B, T = q.shape[0], q.shape[2]
    if lengths.shape not in ((B,), (B, 2, T)) or lengths.dtype.is_floating_point:
        raise ValueError(
            f"lengths must be an integer tensor of shape (B,)=({B},), or packed rows' utterance bounds (B, 2, T)="
            f"({B}, 2, {T}); got {lengths.dtype} {tuple(lengths.shape)}"
        )
    devices = {t.device for t in (q, k, v, lengths)}
    if len(devices) != 1:
        raise ValueError(f"q, k, v and lengths must be on one device; got {sorted(map(str, devices))}")
    if q.device.type != "cuda" and not INTERPRET:
        raise ValueError(
            f"impl='triton' needs CUDA tensors (got {q.device}); on CPU set TRITON_INTERPRET=1 before importing "
            "usmkit.kernels.chunk_attention.triton, or use impl='reference'"
        )


def chunk_attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    chunk_size: int | None,
    left_chunks: int,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward pass. Returns (out (B, H, T, D) like q, lse (B, H, T) fp32 in log2 units; +inf at padded queries)."""
    check_inputs(q, k, v, lengths)
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    B, H, T, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    chunk, left = _mask_args(T, chunk_size, left_chunks)
    precision, upcast = _dot_options(q.dtype)
    out = q.new_empty((B, H, T, D))  # contiguous, like the op's fake implementation
    lse = q.new_empty((B, H, T), dtype=torch.float32)
    if out.numel() == 0:
        return out, lse
    lengths = _as_lengths(lengths)

    def grid(meta):
        return (triton.cdiv(T, meta["BLOCK_M"]), B * H)

    key = (q.device, q.dtype, lengths.dtype, lengths.dim(), D, chunk, left)
    _launch(
        _fwd_kernel, grid, key,
        q, k, v, out, lse, lengths,
        *_strides(q), *_strides(k), *_strides(v), *_strides(out),
        H, T, scale * math.log2(math.e), chunk, left,
        HEAD_D=D, BLOCK_D=triton.next_power_of_2(D), PRECISION=precision, UPCAST=upcast, PACKED=lengths.dim() == 3,
    )  # fmt: skip
    return out, lse


def chunk_attention_bwd(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    lengths: torch.Tensor,
    chunk_size: int | None,
    left_chunks: int,
    scale: float | None = None,
    dq_mode: str = DEFAULT_DQ_MODE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward pass from the forward's (out, lse). Returns contiguous (dq, dk, dv), each (B, H, T, D)."""
    if dq_mode not in DQ_MODES:
        raise ValueError(f"dq_mode must be one of {DQ_MODES}, got {dq_mode!r}")
    check_inputs(q, k, v, lengths)
    q, k, v, out, do = _unit_last(q), _unit_last(k), _unit_last(v), _unit_last(out), _unit_last(do)
    B, H, T, D = q.shape
    if q.numel() == 0:
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    chunk, left = _mask_args(T, chunk_size, left_chunks)
    precision, upcast = _dot_options(q.dtype)
    block_d = triton.next_power_of_2(D)
    lengths = _as_lengths(lengths)
    lse = lse.contiguous()

    delta = torch.empty((B, H, T), dtype=torch.float32, device=q.device)
    pre_block = 64 if not INTERPRET else 32
    _bwd_preprocess_kernel[(triton.cdiv(T, pre_block), B * H)](
        out, do, delta, *_strides(out), *_strides(do), H, T, HEAD_D=D, BLOCK_D=block_d, BLOCK_M=pre_block
    )

    dk = k.new_empty(k.shape)  # contiguous, like the op's fake implementation
    dv = v.new_empty(v.shape)
    atomic = dq_mode == "atomic"
    # Atomic dQ accumulates in fp32; it is zeroed here (and again by the autotuner before each trial).
    dq_acc = q.new_zeros(q.shape, dtype=torch.float32) if atomic else q.new_empty(q.shape)

    def grid_kv(meta):
        return (triton.cdiv(T, meta["BLOCK_N"]), B * H)

    key = (q.device, q.dtype, lengths.dtype, lengths.dim(), D, chunk, left, atomic)
    packed = lengths.dim() == 3
    _launch(
        _dkdv_kernel, grid_kv, key,
        q, k, v, do, dq_acc, dk, dv, lse, delta, lengths,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq_acc), *_strides(dk), *_strides(dv),
        H, T, scale * math.log2(math.e), scale, chunk, left,
        HEAD_D=D, BLOCK_D=block_d, PRECISION=precision, UPCAST=upcast, ATOMIC_DQ=atomic, PACKED=packed,
    )  # fmt: skip
    if atomic:
        return dq_acc.to(q.dtype), dk, dv

    dq = dq_acc

    def grid_q(meta):
        return (triton.cdiv(T, meta["BLOCK_M"]), B * H)

    _launch(
        _dq_kernel, grid_q, key,
        q, k, v, do, dq, lse, delta, lengths,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq),
        H, T, scale * math.log2(math.e), scale, chunk, left,
        HEAD_D=D, BLOCK_D=block_d, PRECISION=precision, UPCAST=upcast, PACKED=packed,
    )  # fmt: skip
    return dq, dk, dv


def tuning_report() -> dict[str, dict[str, object]]:
    """Per autotuned kernel: the config it picked last and its trial times (ms, median) by config, for bench notes."""
    kernels = {"fwd": _fwd_kernel, "dkdv": _dkdv_kernel, "dq": _dq_kernel}
    report = {}
    for name, kernel in kernels.items():
        timings = getattr(kernel, "configs_timings", None) or {}
        report[name] = {
            "best": str(getattr(kernel, "best_config", None)),
            "trials_ms": {str(cfg): (t[0] if isinstance(t, list | tuple) else t) for cfg, t in timings.items()},
        }
    return report
