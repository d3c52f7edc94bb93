"""``usmkit-average exp/run --last 5``: average a run's last checkpoints into a new checkpoint
(``usmkit.checkpointing.average``)."""

from __future__ import annotations

import sys

from usmkit.checkpointing.average import average_last
from usmkit.cli.args import UsageParser, positive_int
from usmkit.errors import strip_debug_flag, user_errors


def main(argv: list[str] | None = None) -> int:
    with user_errors():  # one line and exit code 2 (--debug: the traceback)
        ap = UsageParser(prog="usmkit-average", description="Average the weights of a run's newest checkpoints.")
        ap.add_argument("exp_dir", help="experiment directory (or its checkpoints/ directory)")
        ap.add_argument("--last", type=positive_int, default=5, help="how many of the newest checkpoints (default 5)")
        ap.add_argument("--out", default=None, help="output checkpoint dir (default <exp_dir>/checkpoints/avg-lastN)")
        args = ap.parse_args(strip_debug_flag(sys.argv[1:] if argv is None else argv))
        out, steps = average_last(args.exp_dir, args.last, args.out)
    print(f"averaged steps {','.join(map(str, steps))} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
