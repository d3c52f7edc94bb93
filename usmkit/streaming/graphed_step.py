"""``stream_step`` for a server's batches of independent streams, replayed as CUDA graphs.

Shapes as in ``usmkit.streaming.step``: B rows (streams), s C feature frames a chunk, F bins, C encoder frames.

An eager step launches every kernel of every layer from Python, whatever the batch size: on a GPU a round of
a few streams costs about what a round of a hundred does, and the worker thread, not the GPU, sets how many
streams keep real time. ``GraphedStreamStep`` records ``stream_step`` once per batch size of a ladder (1, 2, 4,
... ``max_batch``) as a CUDA graph and replays it: a batch of B rows runs in the smallest recorded size
>= B, its rows padded with copies of its first (whose outputs are dropped; rows never mix in a step). The
recorded graph reads fixed input buffers, so each call copies the rows in, replays, and returns copies of
the outputs (the next replay overwrites them). ``precision="bf16"`` records the step under bf16 autocast (the
state stays fp32).

Without ``capture`` (or on a CPU) the same padding and buffers run the eager step: the path the CPU tests
check against ``stream_step`` on the unpadded batch; the GPU tests check the replayed graphs likewise.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import torch

from usmkit.models.conformer import ConformerEncoder
from usmkit.streaming.step import EncoderStreamState, stream_step

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}
_BATCH_DIM = {"kv": 2, "cached": 0, "conv_tail": 1, "feat_ctx": 0, "offset": 0}  # each state tensor's row axis
_TENSOR_FIELDS = tuple(_BATCH_DIM)


def batch_sizes(max_batch: int) -> list[int]:
    """The recorded batch sizes: powers of two below ``max_batch``, then ``max_batch``."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes = [1]
    while sizes[-1] * 2 < max_batch:
        sizes.append(sizes[-1] * 2)
    return sizes if sizes[-1] == max_batch else [*sizes, max_batch]


def _pad_rows(t: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    """t with its rows along ``dim`` padded to ``n`` by repeating the first row."""
    extra = n - t.shape[dim]
    if extra == 0:
        return t
    first = t.narrow(dim, 0, 1)
    return torch.cat([t, first.expand(*[extra if d == dim else -1 for d in range(t.dim())])], dim=dim)


class _Recorded:
    """One batch size's input buffers, outputs and graph (None: run eagerly on the buffers)."""

    def __init__(self, chunk: torch.Tensor, state: EncoderStreamState, lengths: torch.Tensor) -> None:
        self.chunk, self.lengths = chunk.clone(), lengths.clone()
        self.state = replace(state, **{k: getattr(state, k).clone() for k in _TENSOR_FIELDS})
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: tuple[torch.Tensor, torch.Tensor, EncoderStreamState] | None = None

    def load(self, chunk: torch.Tensor, state: EncoderStreamState, lengths: torch.Tensor) -> None:
        self.chunk.copy_(chunk)
        self.lengths.copy_(lengths)
        for k in _TENSOR_FIELDS:
            getattr(self.state, k).copy_(getattr(state, k))


class GraphedStreamStep:
    """Called like ``stream_step(encoder, chunk, state, lengths)`` for states of per-row positions (``stack_states``).

    ``max_batch``: the largest batch it takes (the server's ``--max-batch``). ``capture``: record CUDA graphs
    (needs the encoder and the tensors on a GPU); otherwise run eagerly on the same padded buffers.
    ``precision``: ``"fp32"`` or ``"bf16"`` (autocast; on a GPU only).
    """

    def __init__(self, max_batch: int, capture: bool = True, precision: str = "fp32") -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
        self.sizes = batch_sizes(max_batch)
        self.capture = capture
        self.dtype = PRECISIONS[precision]
        self._recorded: dict[int, _Recorded] = {}
        self._pool = None

    def size_for(self, batch: int) -> int:
        """The recorded batch size a batch of ``batch`` rows runs in."""
        for size in self.sizes:
            if size >= batch:
                return size
        raise ValueError(f"a batch of {batch} streams is more than max_batch={self.sizes[-1]}")

    def _autocast(self, device: torch.device):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.dtype)

    def _record(self, encoder: ConformerEncoder, rec: _Recorded) -> None:
        """Record ``stream_step`` on ``rec``'s buffers (after two warm-up runs on a side stream, as CUDA requires)."""
        device = rec.chunk.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), self._autocast(device):
            for _ in range(2):
                stream_step(encoder, rec.chunk, rec.state, rec.lengths)
        torch.cuda.current_stream(device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        rec.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(rec.graph, pool=self._pool), self._autocast(device):
            rec.outputs = stream_step(encoder, rec.chunk, rec.state, rec.lengths)

    def __call__(
        self, encoder: ConformerEncoder, chunk: torch.Tensor, state: EncoderStreamState, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, EncoderStreamState]:
        B = chunk.shape[0]
        if state.cached.dim() != 1 or state.offset.dim() != 1:
            raise ValueError("GraphedStreamStep takes per-row positions: build the state with stack_states")
        n = self.size_for(B)
        chunk, lengths = _pad_rows(chunk, 0, n), _pad_rows(lengths, 0, n)  # (n, s C, F), (n,)
        state = replace(state, **{k: _pad_rows(getattr(state, k), _BATCH_DIM[k], n) for k in _TENSOR_FIELDS})
        rec = self._recorded.get(n)
        if rec is None:
            rec = self._recorded[n] = _Recorded(chunk, state, lengths)
            if self.capture:
                self._record(encoder, rec)
        rec.load(chunk, state, lengths)
        if rec.graph is not None:
            rec.graph.replay()
            out, out_lens, new = rec.outputs
        else:
            with self._autocast(chunk.device):
                out, out_lens, new = stream_step(encoder, rec.chunk, rec.state, rec.lengths)
        # The first B rows, copied out of the buffers the next replay overwrites.
        new = replace(new, **{k: getattr(new, k).narrow(_BATCH_DIM[k], 0, B).clone() for k in _TENSOR_FIELDS})
        return out[:B].to(torch.float32, copy=True), out_lens[:B].clone(), new  # out fp32 for the CTC head
