"""``python -m usmkit.cli.evaluate checkpoint=exp/stage3_ctc test_sets=[test,test_other] decode=ctc_greedy``.

WER/CER per test set as a table and as JSON (``usmkit.inference.evaluate``); the JSON is rewritten after
each set, so a failure part way keeps the sets already scored.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from usmkit.checkpointing.atomic import write_result_file
from usmkit.checkpointing.output_dir import check_output_file
from usmkit.cli.compose import compose_yaml
from usmkit.cli.logs import setup_logging
from usmkit.config import from_dict
from usmkit.errors import interrupted_line, strip_debug_flag, user_errors
from usmkit.inference.evaluate import EvalConfig, evaluate

COMMAND = "usmkit.cli.evaluate"
OWN_KEYS = ("checkpoint", "decode", "sets")  # what every result this command writes holds


def print_table(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    members = len(results.get("ensemble", ()))
    ensemble = f" + {members - 1} more (ensemble)" if members else ""
    table = Table(title=f"{results['checkpoint']}{ensemble} ({results['decode']})")
    for col in ("set", "lang", "utts", "WER %", "CER %", "sub", "del", "ins", "RTF"):
        table.add_column(col, justify="left" if col in ("set", "lang") else "right")
    for name, e in results["sets"].items():
        rows = [("all", e)] + sorted(e.get("per_language", {}).items())
        for lang, s in rows:
            rtf = f"{e['rtf']:.3f}" if lang == "all" else ""
            table.add_row(
                name if lang == "all" else "",
                lang,
                str(s["utterances"]),
                f"{100 * s['wer']:.2f}",
                f"{100 * s['cer']:.2f}",
                str(s["substitutions"]),
                str(s["deletions"]),
                str(s["insertions"]),
                rtf,
            )
    Console().print(table)


def main(argv: Sequence[str] | None = None) -> int:
    argv = strip_debug_flag(sys.argv[1:] if argv is None else argv)
    with user_errors():  # a bad value or file: one line and exit code 2 (--debug: the traceback)
        cfg = from_dict(EvalConfig, compose_yaml("evaluate", argv, command=COMMAND, schema=EvalConfig))
        setup_logging()
        if cfg.output:  # before decoding: never over a file that is not an earlier evaluation's
            check_output_file(
                Path(cfg.output), option="output=", own_words="an evaluation result", own_keys=OWN_KEYS,
                home=[Path(c) for c in (cfg.checkpoint, *cfg.ensemble) if c],
            )  # fmt: skip

        written: list[Path] = []

        def write(results: dict[str, Any]) -> Path:  # after every set: nothing scored is lost
            out = Path(cfg.output) if cfg.output else Path(results["checkpoint"]) / f"eval_{cfg.decode}.json"
            written.append(write_result_file(out, json.dumps(results, indent=2), what="the evaluation result"))
            return written[-1]

        def kept() -> str:
            if not written:
                return "no test set was scored yet; run the same command again"
            return f"the test sets scored so far are in {written[-1]}; run the same command again for every set"

        with interrupted_line(kept):
            results = evaluate(cfg, on_set=write)
        print_table(results)
        print(f"wrote {write(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
