"""Which streams' chunks a round runs (``usmkit.serve.batcher.choose``): streams at real time first, those
sending ahead of it one chunk a round while a real-time stream is attached."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from usmkit.serve.batcher import AHEAD_S, BACKLOG_ROWS, choose


@dataclass(eq=False)
class FakeStream:
    name: str
    ahead: float  # s of audio received ahead of the clock
    last_round: int = -1

    def ahead_s(self, now: float) -> float:
        return self.ahead


def names(streams) -> list[str]:
    return [s.name for s in streams]


def test_with_a_real_time_stream_attached_streams_ahead_get_one_chunk_a_round_in_turn():
    live = [FakeStream(f"live{i}", ahead=a) for i, a in enumerate((-3.0, 0.0, AHEAD_S))]
    files = [FakeStream(f"file{i}", ahead=30.0 + i, last_round=r) for i, r in enumerate((7, 3, 5))]
    assert BACKLOG_ROWS == 1
    assert names(choose(live + files, now=0.0, real_time_attached=True)) == ["live0", "live1", "live2", "file1"]
    assert names(choose(files, now=0.0, real_time_attached=True)) == ["file1"]  # a real-time one waits for audio
    served = []
    for round_ in range(8, 14):  # in turn: the least recently served first
        (chosen,) = choose(files, now=0.0, real_time_attached=True)
        chosen.last_round = round_
        served.append(chosen.name)
    assert served == ["file1", "file2", "file0"] * 2


def test_without_a_real_time_stream_every_ready_chunk_runs():
    files = [FakeStream(f"file{i}", ahead=30.0) for i in range(5)]
    assert names(choose(files, now=0.0, real_time_attached=False)) == names(files)


def test_the_batched_ctc_head_gives_each_row_its_own_log_probs(audio_ckpt):
    """``Recognizer.log_probs`` runs the head once over a step's rows: row b's first n frames equal the head on
    them alone (what each stream computed before), and the result is on the CPU for the streams' decoders."""
    import torch
    from serve_helpers import recognizer_for

    recognizer = recognizer_for(audio_ckpt, "--step", "eager")
    out = torch.randn(3, 5, recognizer.model.encoder.output_dim)
    batched = recognizer.log_probs(out)
    assert batched.device.type == "cpu" and batched.dtype == torch.float32
    for b, n in enumerate([5, 2, 4]):
        with torch.no_grad():
            alone = recognizer.model.ctc(out[b : b + 1, :n])[0]
        torch.testing.assert_close(batched[b, :n], alone, atol=1e-5, rtol=1e-5)


def test_a_stream_decodes_the_same_with_the_batched_head(audio_ckpt, wavs):
    """The same audio through ``ServerStream.encoded`` with the batch's log-probs and without (its own head):
    the same events."""
    import soundfile as sf
    from serve_helpers import recognizer_for

    recognizer = recognizer_for(audio_ckpt, "--step", "eager")
    audio, _ = sf.read(next(iter(wavs.values())), dtype="int16")
    results = []
    for batched in (False, True):
        stream = recognizer.new_stream(continuous=True)
        stream.push(audio.tobytes())
        stream.end()
        events = []
        while True:
            stream.take(stream.collect())
            taken = stream.next_chunk() if stream.has_chunk else None
            if taken is None:
                break
            out, frames, states = recognizer.run([taken[0]], [taken[1]], [stream.state])
            log_probs = recognizer.log_probs(out)[0] if batched else None
            events += stream.encoded(out, frames[0], states[0], log_probs)
        events += stream.wrap_up()
        results.append(events)
    assert results[0] == results[1] and results[0]


def test_streams_batched_through_the_graphed_step_decode_as_through_the_eager_one(audio_ckpt, wavs):
    """``Recognizer(step="graphs")`` (on the CPU its padded eager fallback; the graphs are checked against the eager
    step in tests/streaming/test_step.py): three streams stepped together, batches padded to 4, the same events
    as the eager step; its warm-up visits every batch size. ``--step graphs`` without a GPU is refused."""
    import pytest
    import soundfile as sf
    from serve_helpers import recognizer_for

    from usmkit.cli.serve import build_parser, build_recognizer
    from usmkit.errors import UsageError
    from usmkit.serve.session import Recognizer

    eager = recognizer_for(audio_ckpt, "--step", "eager")
    graphed = Recognizer(eager.model, eager.tokenizer, eager.features, eager.stats, eager.decoder_cfg,
                         eager.chunk_size, eager.left_chunks, step="graphs", max_batch=4)  # fmt: skip
    graphed.warm_up()
    assert sorted(graphed.step._recorded) == [1, 2, 4]
    audio = [sf.read(w, dtype="int16")[0] for w in list(wavs.values())[:3]]
    results = []
    for recognizer in (eager, graphed):
        streams = [recognizer.new_stream(continuous=True) for _ in audio]
        for stream, a in zip(streams, audio, strict=True):
            stream.push(a.tobytes())
            stream.end()
        events = {s: [] for s in streams}
        while True:
            rows = []
            for s in streams:
                s.take(s.collect())
                taken = s.next_chunk() if s.has_chunk else None
                if taken is not None:
                    rows.append((s, taken))
            if not rows:
                break
            out, frames, states = recognizer.run(
                [t[0] for _, t in rows], [t[1] for _, t in rows], [s.state for s, _ in rows]
            )
            log_probs = recognizer.log_probs(out)
            for b, (s, _) in enumerate(rows):
                events[s] += s.encoded(out[b : b + 1], frames[b], states[b], log_probs[b])
        results.append([events[s] + s.wrap_up() for s in streams])
    assert results[0] == results[1] and all(results[0])
    with pytest.raises(UsageError, match="--step graphs records CUDA graphs"):
        build_recognizer(build_parser().parse_args(["--checkpoint", str(audio_ckpt), "--step", "graphs"]))
    with pytest.raises(UsageError, match="--bf16 is for --step graphs"):
        build_recognizer(build_parser().parse_args(["--checkpoint", str(audio_ckpt), "--bf16"]))


def _featurized_alone_and_together(checkpoint, device: str) -> None:
    """Three streams' audio: each stream's own ``feed`` (its CPU features, copied to the device) against the
    windows of all three featurized at once by ``Recognizer.featurize`` (one copy, one computation on the device)."""
    import numpy as np
    import torch
    from serve_helpers import recognizer_for, speechlike

    from usmkit.serve.session import _Inbox

    recognizer = recognizer_for(checkpoint, "--step", "eager", "--device", device)
    audio = [speechlike(s, seed=k, level=0.2) for k, s in enumerate((0.9, 1.7, 0.02))]
    pcm = [(np.clip(x, -1, 1) * 32767).astype("<i2").tobytes() for x in audio]
    alone, windows = [], []
    for p in pcm:
        a, b = recognizer.new_stream(), recognizer.new_stream()
        alone.append(a.transcriber.feed(a._pcm(p)))  # (1, t, F)
        windows.append(b.windows(_Inbox(pcm=p)))  # (t, L)
    together = recognizer.featurize(windows)
    assert [f.shape for f in together] == [f.shape for f in alone]
    assert together[2].shape[1] == 0  # 20 ms: shorter than one window, no frame before the end
    for f, g in zip(together, alone, strict=True):
        assert f.device == recognizer.device
        torch.testing.assert_close(f, g, atol=1e-4, rtol=1e-4)


def test_a_round_featurizes_every_stream_at_once_as_each_alone(audio_ckpt):
    _featurized_alone_and_together(audio_ckpt, "cpu")


@pytest.mark.gpu
def test_a_round_featurizes_every_stream_on_the_gpu_as_each_alone_on_the_cpu(audio_ckpt):
    _featurized_alone_and_together(audio_ckpt, "cuda")
