"""The command-line entry points: ``python -m usmkit.cli.X`` for X in train, evaluate, tune_lexicon,
transcribe_batch, pseudo_label, export, prepare and demo (Hydra overrides, ``usmkit.cli.compose``), and
the console scripts ``usmkit-transcribe``, ``usmkit-serve`` and
``usmkit-average`` (argparse, ``usmkit.cli.args``). The library under them never parses arguments.

Importing ``usmkit`` itself changes nothing in the process; importing this package (which Python does
before any of its modules, so before anything there loads torch) sets what OpenMP reads once, when
torch loads it:

- ``OMP_WAIT_POLICY=PASSIVE``: idle OpenMP threads sleep instead of spinning, so they do not take the
  cores that data-loader workers and other processes on a shared CPU need. A value the user set wins.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
