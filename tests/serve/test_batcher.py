"""Which streams' chunks a round runs (``usmkit.serve.batcher.choose``): streams at real time first, those
sending ahead of it one chunk a round while a real-time stream is attached."""

from __future__ import annotations

from dataclasses import dataclass

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
