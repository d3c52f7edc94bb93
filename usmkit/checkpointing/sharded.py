"""Checkpoints of sharded (``trainer.strategy=fsdp``) runs: the usual layout plus a sharded optimizer.

Layout (``usmkit.checkpointing.checkpoint`` describes the common files)::

    model.safetensors         the full weights, gathered to rank 0: evaluation, transcription,
                              ``init_from`` and checkpoint averaging read it as any other checkpoint
    train_state.json          as usual; the optimizer's hyper-parameters (``param_groups``, keyed by
                              parameter name), and the SHA-256 of every file below
    train_state.safetensors   the RNG states
    optimizer/                the optimizer's moments and step counts, one safetensors file per process,
                              written with ``torch.distributed.checkpoint`` (DCP)
    config.yaml

Every process writes its own shard of the optimizer state: no process holds it all. The files are
DCP's Hugging Face safetensors format (``HuggingFaceStorageWriter(save_distributed=True)``): each
holds the process's tensors, named ``state.<parameter>.<exp_avg|exp_avg_sq|step>``, and in the
safetensors JSON header the offset of each shard in its full tensor. DCP's default
``FileSystemWriter`` is not used: it writes its metadata file with ``pickle`` and non-tensor values
with ``torch.save`` (read back with ``weights_only=False``), and loading either can run code. The
Hugging Face reader rebuilds the metadata from the headers, and re-slices the shards to whatever
sharding the loading run has, so a checkpoint saved by N processes resumes on M.

Atomic as the unsharded ones: the processes write into ``.tmp-step-NNNNNN-sharded`` and rank 0
renames it into place once every file is complete and fsync'ed. A failure on any process stops all
of them with ``CheckpointWriteError``, the earlier checkpoints intact. Checked on load as the
unsharded ones: rank 0 checks the weights and train state against their SHA-256, the processes
share the check of the optimizer files, and any mismatch fails every process alike
(``CheckpointDamaged``: resume falls back to the checkpoint before).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from usmkit.checkpointing.atomic import disk_full_reason, fsync_tree, move_into_place
from usmkit.checkpointing.checkpoint import (
    CONFIG_FILE,
    MODEL_FILE,
    STATE_FILE,
    STATE_TENSORS_FILE,
    CheckpointDamaged,
    CheckpointError,
    CheckpointWriteError,
    _sha256,
    check_fit,
    encode_state,
    file_record,
    load_tensors,
    load_train_state,
    tensors_for_save,
)

OPTIMIZER_DIR = "optimizer"
SHARDED_DIGESTS = "sha256_sharded"  # train_state.json's key for the optimizer files' SHA-256


def _share(paths: list[Path]) -> list[Path]:
    """This process's share of ``paths`` (every process sees the same list), for parallel hashing."""
    return paths[dist.get_rank() :: dist.get_world_size()]


def _all_ok(ok: bool) -> bool:
    """True on every process iff ``ok`` on every process."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    flag = torch.tensor([1 if ok else 0], device=device)  # NCCL reduces device tensors only, gloo CPU ones
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def save_sharded_checkpoint(
    ckpt_root: Path, step: int, module: nn.Module, optimizer: torch.optim.Optimizer, train_state: dict[str, Any],
    config_yaml: str,
) -> Path:  # fmt: skip
    """Write ``ckpt_root/step-{step:06d}`` of a sharded run; every process calls it (collective).

    ``train_state``: what the unsharded train state holds except the optimizer. Returns the path on
    every process. Raises ``CheckpointWriteError`` on every process if any of them failed.
    """
    ckpt_root = Path(ckpt_root)
    final = ckpt_root / f"step-{step:06d}"
    tmp = ckpt_root / f".tmp-step-{step:06d}-sharded"
    rank = dist.get_rank()
    error: BaseException | None = None
    if rank == 0:
        try:
            ckpt_root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)  # a leftover of a crash mid-write
            tmp.mkdir()
        except OSError as e:
            error = e
    if not _all_ok(error is None):
        _fail(final, ckpt_root, tmp, error)
    # Collectives, in the same order on every process: the full weights (to rank 0) and the optimizer shards.
    weights = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    optim_state = get_optimizer_state_dict(
        module, optimizer
    )  # {"state": {name: {...: DTensor}}, "param_groups": [...]}
    try:
        writer = dcp.HuggingFaceStorageWriter(str(tmp / OPTIMIZER_DIR), save_distributed=True)
        dcp.save({"state": optim_state["state"]}, storage_writer=writer)
    except (Exception, dcp.api.CheckpointException) as e:  # on every process if one failed (a BaseException)
        error = error or e
    if not _all_ok(error is None):
        _fail(final, ckpt_root, tmp, error)
    digests: dict[str, str] = {}
    try:
        files = sorted((tmp / OPTIMIZER_DIR).iterdir())
        digests = {f"{OPTIMIZER_DIR}/{p.name}": _sha256(p) for p in _share(files)}
    except OSError as e:
        error = e
    if not _all_ok(error is None):
        _fail(final, ckpt_root, tmp, error)
    shares: list[dict[str, str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(shares, digests)  # in memory between the processes; nothing of it is unpickled from disk
    if rank == 0:
        try:
            sharded = {k: v for share in shares for k, v in (share or {}).items()}
            _write_rank0_files(tmp, weights, train_state, optim_state["param_groups"], sharded, config_yaml)
            move_into_place(tmp, final, durable=True)
        except Exception as e:
            error = e
    if not _all_ok(error is None):
        _fail(final, ckpt_root, tmp, error)
    return final


def _write_rank0_files(
    tmp: Path,
    weights: dict[str, torch.Tensor],
    train_state: dict[str, Any],
    param_groups: list[dict[str, Any]],
    sharded_digests: dict[str, str],
    config_yaml: str,
) -> None:
    save_file(tensors_for_save(weights), str(tmp / MODEL_FILE))
    tree, tensors = encode_state({**train_state, "optimizer": {"param_groups": param_groups}})
    save_file(tensors, str(tmp / STATE_TENSORS_FILE))
    (tmp / CONFIG_FILE).write_text(config_yaml)
    record = file_record(tmp, (MODEL_FILE, STATE_TENSORS_FILE, CONFIG_FILE))
    meta = {"format": 1, **record, SHARDED_DIGESTS: sharded_digests, "state": tree}
    (tmp / STATE_FILE).write_text(json.dumps(meta))
    fsync_tree(tmp)


def _fail(final: Path, ckpt_root: Path, tmp: Path, error: BaseException | None) -> None:
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    what = disk_full_reason(error, ckpt_root) if error is not None else "another process failed to write its part"
    raise CheckpointWriteError(
        f"could not write checkpoint {final} ({what}); earlier checkpoints in {ckpt_root} are untouched. "
        "Free disk space (or move the experiment folder to a disk with room and name it in trainer.exp_dir), "
        "then resume with resume=true."
    ) from error


def checkpoint_strategy(ckpt_dir: Path) -> str | None:
    """``"fsdp"`` for a checkpoint of a sharded run, ``"ddp"`` for another, None if its train state is unreadable."""
    try:
        meta = json.loads((Path(ckpt_dir) / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return "fsdp" if isinstance(meta, dict) and SHARDED_DIGESTS in meta else "ddp"


def load_sharded_checkpoint(ckpt_dir: Path, module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load the weights and optimizer state of a sharded checkpoint into the sharded ``module`` and its
    ``optimizer`` (at any number of processes); returns the rest of the train state. Every process
    calls it. ``CheckpointDamaged`` on every process if any file is missing or fails its SHA-256."""
    ckpt_dir = Path(ckpt_dir)
    problem = _verify(ckpt_dir)
    problems: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    found = [p for p in problems if p]
    if found:
        raise CheckpointDamaged(found[0])
    state = load_train_state(ckpt_dir, verify=False)  # rank 0 has checked it in _verify
    # The weights: every process checks the names and shapes (from the file's header), rank 0 reads
    # the tensors and sends each process its shards.
    model_path = ckpt_dir / MODEL_FILE
    with safe_open(str(model_path), framework="pt") as f:
        stored = {k: torch.Size(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (not a dict)
    check_fit({k: v.shape for k, v in module.state_dict().items()}, stored, ckpt_dir)
    weights = load_tensors(model_path) if dist.get_rank() == 0 else {}
    set_model_state_dict(module, weights, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    # The optimizer: its state's tensors are allocated (DCP loads into them), then re-sliced from the files.
    template = get_optimizer_state_dict(module, optimizer)
    loaded = {"state": template["state"]}
    dcp.load(loaded, storage_reader=dcp.HuggingFaceStorageReader(str(ckpt_dir / OPTIMIZER_DIR)))
    param_groups = state.pop("optimizer")["param_groups"]
    set_optimizer_state_dict(module, optimizer, {"state": loaded["state"], "param_groups": param_groups})
    return state


def _verify(ckpt_dir: Path) -> str | None:
    """This process's share of the checks: what is wrong, or None. Rank 0 checks the weights and the
    train state (``load_train_state``), each process its share of the optimizer files."""
    try:
        if dist.get_rank() == 0:
            load_train_state(ckpt_dir)
        meta = json.loads((ckpt_dir / STATE_FILE).read_text(encoding="utf-8"))
        digests = meta[SHARDED_DIGESTS]
    except CheckpointError as e:
        return str(e)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{ckpt_dir / STATE_FILE} is damaged or not of a sharded run ({type(e).__name__}: {e})"
    names = sorted(digests)
    on_disk = {p.name for p in (ckpt_dir / OPTIMIZER_DIR).iterdir()} if (ckpt_dir / OPTIMIZER_DIR).is_dir() else set()
    extra = sorted(on_disk - {Path(n).name for n in names})
    if extra:  # the reader would read every safetensors file of the folder
        return f"{ckpt_dir / OPTIMIZER_DIR} holds files its {STATE_FILE} does not list: {extra}"
    for name in _share([Path(n) for n in names]):
        path = ckpt_dir / name
        if not path.is_file():
            return f"{path} is missing"
        if _sha256(path) != digests[str(name)]:
            return f"{path} is damaged: its SHA-256 does not match the one in {STATE_FILE}"
    return None
