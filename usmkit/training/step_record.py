"""What the host keeps of each training step until the device has finished it.

The trainer never waits for the device in a step: each step's loss, whether its update was applied,
its gradients' norms and the device values of its log line are copied to pinned host memory without
waiting, and read a step later, once the device has passed them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from usmkit.training.grad_norms import describe_non_finite


@dataclass
class StepRecord:
    """One optimizer step's loss, whether its update was applied, each gradient's norm and the device
    values of its log line, copied to the host without waiting: the values are read once ``ready`` (a
    CUDA event after the copy) has passed, a step later."""

    step: int
    values: torch.Tensor  # (2 + P + L,) float32 on the host (pinned from CUDA): loss, 1.0 if applied, norms, logged
    ready: torch.cuda.Event | None
    names: tuple[str, ...] = ()  # the parameters of the gradient norms (none when not kept)
    logged: tuple[str, ...] = ()  # the names of the last L values

    @classmethod
    def of(
        cls,
        step: int,
        loss: torch.Tensor,
        applied: torch.Tensor,
        grad_norms: torch.Tensor | None = None,
        names: tuple[str, ...] = (),
        logged: dict[str, torch.Tensor] | None = None,
    ) -> StepRecord:
        parts = [loss.detach().float().reshape(1), applied.float().reshape(1)]
        if grad_norms is not None:
            parts.append(grad_norms.float())  # (P,)
        logged = logged or {}
        parts += [v.detach().float().reshape(1) for v in logged.values()]  # L x (1,)
        values = torch.cat(parts)  # (2 + P + L,)
        if values.device.type != "cuda":
            return cls(step, values.cpu(), None, names, tuple(logged))
        ready = torch.cuda.Event()
        host = values.to("cpu", non_blocking=True)  # into pinned memory
        ready.record()
        return cls(step, host, ready, names, tuple(logged))

    def read(self) -> tuple[float, bool]:
        if self.ready is not None:
            self.ready.synchronize()  # waits for this step's work only, not for the steps queued after it
        loss, applied = self.values[:2].tolist()
        return loss, applied == 1.0

    def logged_values(self) -> dict[str, float]:
        """The device values given for the step's log line, by name; after ``read``."""
        tail = self.values[self.values.numel() - len(self.logged) :].tolist()
        return dict(zip(self.logged, tail, strict=True))

    def non_finite_gradients(self) -> str:
        """The parameters whose gradient was not finite ('' when none or not kept); after ``read``."""
        norms = self.values[2 : self.values.numel() - len(self.logged)]
        return describe_non_finite(self.names, norms.tolist()) if self.names else ""
