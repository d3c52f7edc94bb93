"""Processes of one training run: the process groups, rank-0-first preparation, named collectives, shutdown.

Two process groups, with two timeouts:

- the default group (NCCL on GPUs, gloo on CPUs) carries training: DDP's gradient all-reduce, FSDP's
  gathers and reduce-scatters, the trainer's agreements. A collective of it that does not complete within
  ``trainer.dist_timeout_s`` fails: on gloo as ``CollectiveError`` naming the rank and the operation (raised
  where ``collective`` wraps it); on NCCL the watchdog aborts the process with a message naming the rank, the
  operation type and its sequence number (``TORCH_NCCL_ASYNC_ERROR_HANDLING``, on by default). A rank whose
  process ended (SIGKILL, the out-of-memory killer) leaves no error of its own: every rank puts its host and
  process id in the group's store at setup, and a collective that fails names the ranks of this host whose
  process has ended (``lost_ranks``).
- the host group (gloo, CPU tensors) is where the other processes wait while rank 0 works alone: preparing
  what is cached on disk (tokenizer, stored features, statistics), evaluating on the dev set, writing an
  unsharded checkpoint. Its timeout is ``trainer.rank0_timeout_s`` (hours), so a long preparation does not
  trip the training timeout.

Every rank takes the same collectives in the same order; nothing here (or in the recipe or the trainer)
decides on one rank alone, from a file it sees or not, whether to take one. (A rank that skipped a barrier
because the tokenizer rank 0 had just trained was already on disk paired every later collective with the
wrong one: both processes hung in DDP's parameter check.) The order, per run:

setup (``usmkit.training.recipe``)
  1. ``init_process_group`` (the rendezvous), then ``new_group`` for the host group.
  2. each ``rank0_first`` (the tokenizer; each split's validation and stored features; the statistics; MOST:
     each stream's split), in the recipe's fixed order: a host broadcast (rank 0 done, or failed) and, after
     the others ran ``fn``, a host all-gather (which ranks failed).
  3. DDP: its parameter shape check and broadcast of rank 0's weights; FSDP: the device mesh.
  4. ``resume=true``: a host broadcast of rank 0's checkpoint list, then per checkpoint tried a host
     all-gather of what each rank found wrong (FSDP: and ``load_sharded_checkpoint``'s collectives).
training (``usmkit.training.trainer``), per optimizer step
  5. DDP's gradient all-reduce in the backward, or FSDP's gathers and reduce-scatters in the forward and
     backward and the gradient norm's all-reduce; the all-reduce of the finite flag; every ``log_every`` steps
     the all-reduce of the stop signal (and of whether rank 0's background checkpoint write failed: then the
     host broadcast of 7's outcome follows) and, with ``trainer.max_minutes``, a broadcast of rank 0's clock.
  6. a dev evaluation: FSDP gathers the model; a host broadcast of rank 0's result (the others wait there).
  7. a checkpoint: DDP with ``trainer.async_save``: first a host broadcast of the outcome of rank 0's write in
     flight (also at the end of training and after a stop signal's checkpoint). Then a host all-gather of
     every rank's random state and data position (the train state rank 0 writes holds each rank's); then
     FSDP: ``save_sharded_checkpoint``'s collectives; DDP: rank 0 writes in the background (or, without
     ``async_save``, writes while the others wait in a host barrier). Whether a step is already saved is
     known in memory, the same on every rank.
shutdown (``TrainingRecipe.cleanup``)
  8. after a run that trained to its end: a barrier on the default group; then both groups are destroyed.
     After an error, no barrier (the others may be gone): the groups are destroyed at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from usmkit.device import resolve_device
from usmkit.errors import UsageError

T = TypeVar("T")
log = logging.getLogger(__name__)


class CollectiveError(UsageError):
    """A collective that failed or timed out on this rank; the message names the rank and the operation."""

    exit_code = 1  # the machine's or another process's failure, not the user's input


class OtherRankFailed(UsageError):
    """Another rank failed where this one waited for it (its own error names the cause)."""

    exit_code = 1


@dataclass(frozen=True)
class _Session:
    """What ``setup_distributed`` set up: the timeouts, and the host group (None with one process)."""

    dist_timeout_s: float
    rank0_timeout_s: float
    host: Any  # torch.distributed.ProcessGroup | None


_session: _Session | None = None


def launched_distributed(strategy: str) -> bool:
    """Whether ``setup_distributed`` inits torch.distributed: torchrun started several processes, or one
    with ``trainer.strategy=fsdp`` (FSDP needs a process group even for one)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return world > 1 or (strategy == "fsdp" and "MASTER_ADDR" in os.environ)


def setup_distributed(
    device_name: str, strategy: str = "ddp", *, dist_timeout_s: float = 600.0, rank0_timeout_s: float = 86400.0
) -> tuple[int, int, torch.device]:
    """Init torch.distributed when launched by torchrun (``launched_distributed``), the default group with
    ``dist_timeout_s`` and the host group with ``rank0_timeout_s``; returns (rank, world_size, device).
    A process group initialized by the caller is used as it is (the host group is added)."""
    global _session
    device = resolve_device(device_name)
    if launched_distributed(strategy) and not dist.is_initialized():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        backend = "gloo"
        if device.type == "cuda":
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
            backend = "nccl"
        dist.init_process_group(
            backend=backend,
            timeout=timedelta(seconds=dist_timeout_s),
            device_id=device if device.type == "cuda" else None,  # NCCL: the communicator now, bound to this GPU
        )
    if not dist.is_initialized():
        _session = None
        return 0, 1, device
    rank, world = dist.get_rank(), dist.get_world_size()
    if device.type == "cuda" and dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    host = dist.new_group(backend="gloo", timeout=timedelta(seconds=rank0_timeout_s)) if world > 1 else None
    _session = _Session(dist_timeout_s, rank0_timeout_s, host)
    if world > 1:
        _publish_process(rank)
    return rank, world, device


# ---------------------------------------------------------------- which rank is gone
PROCESS_KEY = "usmkit/process/{rank}"  # in the default group's store: "<hostname> <pid>" of each rank
LOST_SETTLE_S = 1.0  # after a failed collective, how long to look for a rank whose process ended


def _store() -> Any:
    return dist.distributed_c10d._get_default_store()  # torch has no public accessor of the group's store


def _publish_process(rank: int) -> None:
    """Put this rank's host and process id in the run's store, where a rank whose collective fails looks up
    which of the others ended (``lost_ranks``). A store write, not a collective: no rank waits for it."""
    try:
        _store().set(PROCESS_KEY.format(rank=rank), f"{socket.gethostname()} {os.getpid()}")
    except Exception as e:  # noqa: BLE001 - only the naming of a lost rank depends on it
        log.debug("could not publish this process in the store: %s", e)


def _process_ended(pid: int) -> bool:
    """Whether process ``pid`` of this host has ended: gone, or a zombie its parent (torchrun) has not reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc (not Linux): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def lost_ranks(settle_s: float = 0.0) -> list[tuple[int, int]]:
    """The other ranks on this host whose process has ended, as (rank, pid); empty where that cannot be known
    (no store, a rank on another host, or one that never published itself). ``settle_s``: look again for up to
    this long while none has ended (a killed process closes its connections a moment before it is gone)."""
    deadline = time.monotonic() + settle_s
    while True:
        lost = _lost_now()
        if lost or time.monotonic() >= deadline:
            return lost
        time.sleep(0.1)


def _lost_now() -> list[tuple[int, int]]:
    if not dist.is_initialized() or _world() < 2:
        return []
    me, host, lost = _rank(), socket.gethostname(), []
    try:
        store = _store()
        for rank in range(_world()):
            key = PROCESS_KEY.format(rank=rank)
            if rank == me or not store.check([key]):
                continue
            where, pid = store.get(key).decode().rsplit(" ", 1)
            if where == host and _process_ended(int(pid)):
                lost.append((rank, int(pid)))
    except Exception as e:  # noqa: BLE001 - the store may have gone with the rank that hosted it
        log.debug("could not look up the other ranks' processes: %s", e)
    return lost


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_collective_failure(e: BaseException) -> bool:
    """Whether ``e`` comes from a collective: torch's distributed errors (NCCL), or gloo's, which are plain
    ``RuntimeError``s whose message names gloo's source (a timeout, a peer that closed the connection)."""
    return isinstance(e, dist.DistError) or (isinstance(e, RuntimeError) and "gloo" in str(e))


@contextlib.contextmanager
def collective(op: str, *, host: bool = False) -> Iterator[None]:
    """Run the collectives inside as ``op`` (e.g. ``"the gradient all-reduce of step 5"``): one that fails or
    times out raises ``CollectiveError`` naming this rank, ``op`` and the timeout that applied (``host``:
    the host group's); other errors pass through unchanged."""
    try:
        yield
    except Exception as e:
        if not (dist.is_initialized() and is_collective_failure(e)):
            raise
        if _session is None:  # a process group set up by the caller
            limit = "the process group's timeout"
        elif host:
            limit = f"trainer.rank0_timeout_s={_session.rank0_timeout_s:g} s"
        else:
            limit = f"trainer.dist_timeout_s={_session.dist_timeout_s:g} s"
        reason = " ".join(str(e).split())
        lost = lost_ranks(settle_s=LOST_SETTLE_S)
        if lost:
            gone = " and ".join(f"rank {r} (process {pid})" for r, pid in lost)
            raise CollectiveError(
                f"rank {_rank()} of {_world()}: {gone} of this run ended (killed, or out of memory) during {op} "
                f"({reason}); the run cannot go on without it. Checkpoints already written are "
                "complete: continue with resume=true (torchrun --max-restarts N restarts the run by itself)"
            ) from e
        raise CollectiveError(
            f"rank {_rank()} of {_world()}: {op} did not complete ({reason}). Either it timed out after {limit}, "
            "a process having stopped taking part, or another process failed first (its own error names the "
            "cause). Checkpoints already written are complete: continue with resume=true"
        ) from e


def _host() -> tuple[bool, Any]:
    """Whether there are other processes to wait for, and the group to wait on: the host group, or the
    default group of a run whose caller set torch.distributed up itself (``group=None``)."""
    if _session is not None and _session.host is not None:
        return True, _session.host
    return _world() > 1, None


def _from_rank0(obj: Any, op: str) -> Any:
    active, group = _host()
    if not active:
        return obj
    box = [obj]  # sent in memory between the run's processes (pickled); nothing is read from disk
    with collective(op, host=group is not None):
        dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def _gather(obj: Any, op: str) -> list[Any]:
    active, group = _host()
    if not active:
        return [obj]
    out: list[Any] = [None] * _world()
    with collective(op, host=group is not None):
        dist.all_gather_object(out, obj, group=group)
    return out


def rank0_first(rank: int, fn: Callable[[], T], what: str = "preparation") -> T:
    """Run ``fn`` on rank 0 first, then on the other ranks, which reuse what it cached on disk (a tokenizer,
    stored features, statistics). The others wait on the host group (``trainer.rank0_timeout_s``): rank 0
    may take long. A failure on any rank fails every rank: rank 0's before the others start, with
    ``OtherRankFailed`` on the ranks that did not fail. ``what`` names the step in those errors."""
    if not _host()[0]:
        return fn()
    if rank == 0:
        try:
            out = fn()
        except BaseException:
            _from_rank0(False, f"telling the other ranks that {what} failed on rank 0")
            raise
        _from_rank0(True, f"telling the other ranks that {what} is done on rank 0")
        error = None
    else:
        if not _from_rank0(None, f"waiting for rank 0's {what}"):
            raise OtherRankFailed(f"rank {rank}: rank 0 failed at {what}; its error names the cause")
        error = None
        try:
            out = fn()
        except Exception as e:
            error = e
    oks = _gather(error is None, f"checking that every rank finished {what}")
    if error is not None:
        raise error
    failed = [r for r, ok in enumerate(oks) if not ok]
    if failed:
        raise OtherRankFailed(f"rank {rank}: rank(s) {failed} failed at {what}; their errors name the cause")
    return out


def from_rank0(obj: T, what: str) -> T:
    """Rank 0's ``obj`` on every rank (a host-group broadcast: the others wait for rank 0 there, e.g. while it
    evaluates)."""
    return _from_rank0(obj, f"waiting for rank 0's {what}")


def wait_for_rank0(what: str) -> None:
    """Every rank waits here until rank 0 arrives (on the host group: ``trainer.rank0_timeout_s``)."""
    _from_rank0(None, f"waiting for rank 0's {what}")


def gather(obj: T, what: str) -> list[T]:
    """Every rank's ``obj``, by rank, on every rank (a host-group all-gather, in memory)."""
    return _gather(obj, what)


def agree(ok: bool, what: str) -> list[int]:
    """The ranks whose ``ok`` is False, the same list on every rank (a host-group all-gather)."""
    return [r for r, each in enumerate(_gather(ok, what)) if not each]


def shutdown_distributed(finished: bool) -> None:
    """End the run's process groups. ``finished`` (every rank trained to its end): a barrier on the default
    group first, so no rank tears its connections down while another still talks to it. After an error no
    barrier (the others may be gone). Safe to call twice, and without a process group."""
    global _session
    if not dist.is_initialized():
        _session = None
        return
    if finished and _world() > 1:
        with collective("the final barrier"):
            dist.barrier()
    host, _session = (_session.host if _session else None), None
    if host is not None:
        dist.destroy_process_group(host)
    dist.destroy_process_group()
