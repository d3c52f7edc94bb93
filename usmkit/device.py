"""Which device a run uses, and its mixed precision: the one definition every entry point shares."""

from __future__ import annotations

import contextlib

import torch

from usmkit.errors import UsageError


def resolve_device(name: str) -> torch.device:
    """``auto`` -> ``cuda`` where there is a GPU, else ``cpu``; any other name as torch spells it.

    ``UsageError`` for a name that is no device, or a CUDA device on a machine without one."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise UsageError(f"device={name} is not a device ({e}); use cpu, cuda, cuda:N or auto") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device={name} but this machine has no CUDA device; use cpu")
    return device


def autocast_context(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast for ``precision=bf16``, and for ``auto`` on CUDA; otherwise fp32."""
    use_bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    if use_bf16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
