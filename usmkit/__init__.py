"""usmkit: the Universal Speech Model recipe (BEST-RQ, MOST, CTC/LAS) on a chunk-wise-attention Conformer."""

import os

# PyTorch's OpenMP worker threads spin while they wait for work. When the CPU is shared (data
# loader workers, other jobs), the spinning steals the cores the other threads need: on a loaded
# 2-core machine a tiny-model training step took 7.0 s with the default policy and 1.8 s with
# PASSIVE (same batch). It must be set before torch loads OpenMP; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
