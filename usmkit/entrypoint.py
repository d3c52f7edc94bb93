"""Process settings shared by the command-line entry points; ``import usmkit.entrypoint`` comes first in each.

Importing ``usmkit`` itself changes nothing in the process. The entry points (``python -m usmkit.train``,
``evaluate``, ``demo``, ``average``, ``data.synth``, ``data.recipes.*`` and the ``usmkit-transcribe`` script)
import this module before anything that loads torch, because OpenMP reads its settings once, when torch
loads it:

- ``OMP_WAIT_POLICY=PASSIVE``: idle OpenMP threads sleep instead of spinning, so they do not take the
  cores that data-loader workers and other processes on a shared CPU need. A value the user set wins.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
