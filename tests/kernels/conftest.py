"""Kernel tests run the Triton kernels on CPU through Triton's interpreter when there is no GPU.

TRITON_INTERPRET must be set before ``usmkit.kernels.chunk_attention.triton`` is imported (triton reads it when
the kernels are defined). ``api.py`` imports that module lazily, on the first Triton call, so setting it here,
while pytest collects this folder, is early enough as long as no test imports the kernel module at import time.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
