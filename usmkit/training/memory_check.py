"""Whether the model fits the memory it will train in, checked before any data is read.

Training holds the weights (fp32, also under bf16 autocast), their gradients and AdamW's two moments:
4 + 4 + 8 = 16 bytes per trainable parameter, 4 per frozen one, plus the buffers. ``check_memory``
counts the task module's parameters on the meta device (nothing is allocated) and compares that, with
a margin for activations and workspace, to what the device has free: ``MemAvailable`` of
``/proc/meminfo`` (and the container's cgroup limit) on the CPU, ``torch.cuda.mem_get_info`` on a GPU.
Without it a model too large for the machine fails after data preparation with a long allocation
traceback (or is killed by the kernel).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from usmkit.config import ConfigError, TrainConfig
from usmkit.models.config import ConformerConfig
from usmkit.tasks import build_task

GIB = 2**30
BYTES_TRAINABLE = 16  # fp32 weight + gradient + AdamW exp_avg + exp_avg_sq
BYTES_FROZEN = 4
MARGIN = 1.1  # activations, the optimizer's temporaries, the allocator's slack
MARGIN_BYTES = 256 * 2**20


def training_bytes(cfg: TrainConfig, encoder_cfg: ConformerConfig) -> tuple[int, int]:
    """(parameters, bytes one process holds to train them) of the task module of ``cfg``, before the margin.
    FSDP (``trainer.strategy=fsdp``) divides the weights and their state over the processes."""
    with torch.device("meta"):
        module = build_task(cfg.task, encoder_cfg, cfg.vocab_size)
    params = sum(p.numel() for p in module.parameters())
    held = sum(p.numel() * (BYTES_TRAINABLE if p.requires_grad else BYTES_FROZEN) for p in module.parameters()) + sum(
        b.numel() * b.element_size() for b in module.buffers()
    )
    if cfg.trainer.strategy == "fsdp":
        held //= max(1, int(os.environ.get("WORLD_SIZE", "1")))
    return params, held


def available_cpu_bytes() -> int | None:
    """Memory this process can still take: ``MemAvailable`` (``/proc/meminfo``), capped by the cgroup's
    limit (``memory.max`` - ``memory.current``, cgroup v2) where one is set; else free physical pages
    (``os.sysconf``); None where neither can be read."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            available = min(available, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return available


def available_cuda_bytes(device: torch.device) -> int:
    """Free memory of the GPU this process trains on (its ``LOCAL_RANK``'s under torchrun)."""
    index = device.index if device.index is not None else int(os.environ.get("LOCAL_RANK", "0"))
    return torch.cuda.mem_get_info(index)[0]


def check_memory(cfg: TrainConfig, encoder_cfg: ConformerConfig, device: torch.device) -> None:
    """``ConfigError`` with the numbers and what to do when training ``cfg`` on ``device`` needs more
    memory than it has free. On the CPU the processes of this host (``LOCAL_WORLD_SIZE``) share it."""
    try:
        params, held = training_bytes(cfg, encoder_cfg)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"task: {e}") from e
    need = int(held * MARGIN) + MARGIN_BYTES
    if device.type == "cuda":
        available, where = available_cuda_bytes(device), f"the GPU ({device})"
    elif device.type == "cpu":
        available, where = available_cpu_bytes(), "this machine's memory"
        need *= max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    else:
        return
    if available is None or need <= available:
        return
    raise ConfigError(
        f"model={cfg.model.preset} ({cfg.task.kind}, {params / 1e6:.0f}M parameters) needs about {need / GIB:.1f} GiB "
        f"to train (weights, gradients and AdamW state, {BYTES_TRAINABLE} bytes a parameter, plus a margin) but "
        f"{where} has {available / GIB:.1f} GiB available: choose a smaller model= (e.g. model=base), train on a "
        "GPU (trainer.device=cuda), or shard it over several GPUs with trainer.strategy=fsdp under torchrun"
    )
