import os

# see usmkit/__init__.py: spinning OpenMP threads stall a shared CPU
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

# Triton kernels run on the CPU under the interpreter (slow but exact); it must be set before any
# @triton.jit function is defined.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(min(2, os.cpu_count() or 1))
