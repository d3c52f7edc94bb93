"""AdamW with warm-up and decay over the task's parameter groups (``ParamGroup``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch.optim.lr_scheduler import LambdaLR

from usmkit.config import OptimConfig
from usmkit.training.spec import ParamGroup


def lr_lambda(cfg: OptimConfig, max_steps: int) -> Callable[[int], float]:
    """Linear warm-up to 1, then cosine decay to ``min_lr_ratio`` (or constant / Noam's inverse sqrt)."""
    warmup = max(cfg.warmup_steps, 1)

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.schedule == "constant":
            return 1.0
        if cfg.schedule == "noam":
            return math.sqrt(warmup / (step + 1))
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def group_lr_lambda(cfg: OptimConfig, max_steps: int, group: ParamGroup) -> Callable[[int], float]:
    """``group``'s multiplier: 0 while frozen, else the schedule times its scale."""
    base = lr_lambda(cfg, max_steps)
    if group.lr_scale == 1.0 and group.frozen_steps == 0:
        return base

    def f(step: int) -> float:
        return 0.0 if step < group.frozen_steps else group.lr_scale * base(step)

    return f


def param_groups(module: torch.nn.Module, groups: Sequence[ParamGroup]) -> tuple[ParamGroup, ...]:
    """``groups``, checked to hold every trainable parameter of ``module`` once; empty: one group of them all."""
    trainable = [p for p in module.parameters() if p.requires_grad]
    if not groups:
        return (ParamGroup("all", tuple(trainable)),)
    seen: dict[int, str] = {}
    for group in groups:
        for p in group.params:
            if id(p) in seen:
                raise ValueError(f"a parameter is in two parameter groups: {seen[id(p)]!r} and {group.name!r}")
            seen[id(p)] = group.name
    missing = sum(id(p) not in seen for p in trainable)
    if missing:
        raise ValueError(f"{missing} trainable parameters of {type(module).__name__} are in no parameter group")
    return tuple(groups)


def make_optimizer(groups: Sequence[ParamGroup], cfg: OptimConfig) -> torch.optim.Optimizer:
    """AdamW over two optimizer groups per ``ParamGroup``, in order: with weight decay, and without it
    (biases and norm gains, the 1-d parameters)."""
    torch_groups = []
    for group in groups:
        decay = [p for p in group.params if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in group.params if p.requires_grad and p.dim() < 2]
        torch_groups += [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
    # Fused: one kernel per parameter list, and it reads ``found_inf`` on the device, so a non-finite step
    # is skipped without the host waiting for the gradient norm (``Trainer.fit``).
    return torch.optim.AdamW(torch_groups, lr=cfg.lr, betas=cfg.betas, fused=True)


def keep_fused(optimizer: torch.optim.Optimizer) -> None:
    """Make a loaded optimizer state fused again: ``load_state_dict`` takes the saved groups' options,
    and a state saved by an unfused AdamW keeps its step counts on the host, where the fused kernel
    refuses them."""
    for group in optimizer.param_groups:
        group["fused"], group["foreach"] = True, None
        for p in group["params"]:
            state = optimizer.state.get(p)
            if state and "step" in state:
                state["step"] = state["step"].to(device=p.device, dtype=torch.float32)


def make_scheduler(
    optimizer: torch.optim.Optimizer, groups: Sequence[ParamGroup], cfg: OptimConfig, max_steps: int
) -> LambdaLR:
    """The schedule of ``lr_lambda`` for every group, scaled and frozen as each ``ParamGroup`` says."""
    lambdas = [group_lr_lambda(cfg, max_steps, group) for group in groups]
    return LambdaLR(optimizer, [f for f in lambdas for _ in range(2)])  # two optimizer groups per ParamGroup
