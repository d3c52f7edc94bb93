"""CTC loss with the lengths read on the device: no host synchronization, so the step can be queued ahead."""

from usmkit.kernels.ctc.api import ctc_nll_triton

__all__ = ["ctc_nll_triton"]
