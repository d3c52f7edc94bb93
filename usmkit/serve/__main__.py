"""``python -m usmkit.serve``: the same as the ``usmkit-serve`` command."""

import sys

from usmkit.serve.server import main

sys.exit(main())
