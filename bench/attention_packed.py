"""GPU benchmark: which attention for packed rows, at the trainer's `large` / `usm600m` attention shape.

    PYTHONPATH=. python bench/attention_packed.py [--rows 14] [--frames 512] [--json OUT]

`large` and `usm600m` share one attention shape (8 heads of 128, bf16); the trainer's packed batch
(``data.pack_to_frames=2048``, 300 s of audio per batch) is 14 rows of 512 encoder frames. Utterances of 0.5-8.2 s
(the embedded corpus's range, 13-205 encoder frames) are packed first-fit into the rows. Per mask (the
trainer's 8-s chunks, and 1.28-s chunks with 2 left chunks as a streaming model trains), forward + backward of:

- ``sdpa_packed``: PyTorch's fused attention with the packed rows' dense boolean mask (``impl="sdpa"``);
- ``flex_packed``: FlexAttention with the block mask built from the rows' utterance layout (``impl="flex"``);
- ``triton_packed``: the Triton chunk kernel with each frame's utterance bounds (``impl="triton"``);
- ``triton_unpacked``, ``sdpa_unpacked``, ``flex_unpacked``: the same utterances one per row, padded to the
  longest, i.e. bucketed batches' attention.

Every implementation is called through ``usmkit.kernels.chunk_attention.chunk_attention`` (masks built inside the
call, as in the trainer), checked against the fp32 reference first (relative error of out, dq, dk, dv on the
valid frames), then timed as CUDA-graph replays (GPU time alone; ``bench/attention.py``'s method). FLOP/s count
the visible (query, key) pairs only, so packed and unpacked rows compare on the same useful work.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attention import MAX_REL_ERR, _graph_ms  # noqa: E402

from tools.results import result_path, run_header, write_result  # noqa: E402
from usmkit.kernels.chunk_attention import chunk_attention  # noqa: E402
from usmkit.kernels.chunk_attention.reference import chunk_attention_reference  # noqa: E402
from usmkit.kernels.masks import Segments, segment_chunk_mask  # noqa: E402

H, DH = 8, 128
MASKS = [(200, 0), (32, 2)]  # (chunk_size, left_chunks) in encoder frames


def pack_rows(rows: int, frames: int, seed: int = 0) -> tuple[Segments, list[int]]:
    """First-fit packing of random utterance lengths into ``rows`` rows of ``frames``: the rows' ``Segments``
    (rows, frames) and the utterance lengths in id order."""
    rng = random.Random(seed)
    free = [frames] * rows
    ids = torch.full((rows, frames), -1, dtype=torch.long)
    pos = torch.zeros(rows, frames, dtype=torch.long)
    lengths, misses = [], 0
    while misses < 50:
        n = rng.randint(13, 205)
        fits = [r for r in range(rows) if free[r] >= n]
        if not fits:
            misses += 1
            continue
        r = fits[0]
        start = frames - free[r]
        ids[r, start : start + n] = len(lengths)
        pos[r, start : start + n] = torch.arange(n)
        free[r] -= n
        lengths.append(n)
    order = ids[ids >= 0].unique_consecutive().tolist()  # ids in row order are 0..U-1 only after renumbering
    renumber = {u: i for i, u in enumerate(order)}
    ids = ids.apply_(lambda u: renumber.get(u, -1))
    return Segments(ids, pos), [lengths[u] for u in order]


def unpack(x: torch.Tensor, seg: Segments, lengths: list[int]) -> torch.Tensor:
    """(R, H, T, Dh) packed -> (U, H, max_len, Dh), utterance u's frames first in row u."""
    out = x.new_zeros(len(lengths), x.shape[1], max(lengths), x.shape[3])
    for u, n in enumerate(lengths):
        r, t = (seg.ids == u).nonzero()[0].tolist()
        out[u, :, :n] = x[r, :, t : t + n]
    return out


def visible_pairs(seg: Segments, chunk: int, left: int) -> int:
    return int(segment_chunk_mask(seg, chunk, left).sum())


def measure(seg: Segments, lengths: list[int], chunk: int, left: int) -> dict:
    dev = "cuda"
    segc = Segments(seg.ids.to(dev), seg.positions.to(dev))
    R, T = seg.ids.shape
    gen = torch.Generator(device=dev).manual_seed(0)
    packed = [torch.randn(R, H, T, DH, device=dev, generator=gen, dtype=torch.bfloat16) for _ in range(4)]
    packed = [x.masked_fill(~segc.valid[:, None, :, None], 0.0) for x in packed]
    unpacked = [unpack(x, segc, lengths) for x in packed]
    lens = torch.tensor(lengths, device=dev)
    cases = {
        "sdpa_packed": (packed, segc, "sdpa"),
        "flex_packed": (packed, segc, "flex"),
        "triton_packed": (packed, segc, "triton"),
        "triton_unpacked": (unpacked, lens, "triton"),
        "sdpa_unpacked": (unpacked, lens, "sdpa"),
        "flex_unpacked": (unpacked, lens, "flex"),
    }
    pairs = visible_pairs(seg, chunk, left)
    row = {"chunk": chunk, "left": left, "visible_pairs": pairs}
    for name, ((q, k, v, dout), frames, impl) in cases.items():
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        ref_leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
        ref = chunk_attention_reference(*ref_leaves, frames, chunk, left)
        ref.backward(dout.float())
        out = chunk_attention(*leaves, frames, chunk, left, impl=impl)
        out.backward(dout)
        errors = {}
        for n, got, want in zip(("out", "dq", "dk", "dv"), (out, *(x.grad for x in leaves)),
                                (ref, *(x.grad for x in ref_leaves)), strict=True):  # fmt: skip
            errors[n] = ((got.float() - want).norm() / want.norm()).item()
        if max(errors.values()) > MAX_REL_ERR:
            raise RuntimeError(f"{name}: relative error {errors} > {MAX_REL_ERR}")

        def step(impl=impl, frames=frames, leaves=leaves, dout=dout):
            for x in leaves:
                x.grad = None
            chunk_attention(*leaves, frames, chunk, left, impl=impl).backward(dout)

        ms = _graph_ms(step)
        row[name] = {"ms": ms, "max_rel_err": max(errors.values()), "shape": list(q.shape)}
        if ms:
            row[name]["tflops"] = round(3.5 * 4 * DH * pairs * H / (ms * 1e-3) / 1e12, 1)
        print(f"chunk {chunk:3d} left {left}  {name:16s} {ms if ms else float('nan'):8.3f} ms  "
              f"{row[name].get('tflops', 0):6.1f} TFLOP/s  rel.err {max(errors.values()):.2e}", flush=True)  # fmt: skip
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=14)
    ap.add_argument("--frames", type=int, default=512)
    ap.add_argument("--json", default=result_path("attention_packed"))
    args = ap.parse_args()
    seg, lengths = pack_rows(args.rows, args.frames)
    result = run_header(rows=args.rows, frames=args.frames, heads=H, head_dim=DH, utterances=len(lengths),
                        padding_packed=round(1 - sum(lengths) / seg.ids.numel(), 4),
                        padding_unpacked=round(1 - sum(lengths) / (len(lengths) * max(lengths)), 4))  # fmt: skip
    print(f"{len(lengths)} utterances in {args.rows} rows of {args.frames}: padding {result['padding_packed']:.1%} "
          f"packed, {result['padding_unpacked']:.1%} one per row")  # fmt: skip
    result["masks"] = [measure(seg, lengths, chunk, left) for chunk, left in MASKS]
    for row in result["masks"]:
        best = min((k for k in row if isinstance(row[k], dict) and row[k]["ms"]), key=lambda k: row[k]["ms"])
        row["fastest"] = best
        print(f"chunk {row['chunk']} left {row['left']}: fastest {best}")
    write_result(args.json, result)


if __name__ == "__main__":
    main()
