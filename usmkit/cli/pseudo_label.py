"""``python -m usmkit.cli.pseudo_label checkpoint=TEACHER inputs=AUDIO out=DIR threshold=0.9``: pseudo-labels.

The library is ``usmkit.inference.pseudo_label``; this module reads the overrides, checks ``out=`` and
prints what was kept (or, with ``calibrate=true``, the WER per threshold).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from usmkit.cli.compose import compose_dataclass
from usmkit.cli.logs import setup_logging
from usmkit.errors import strip_debug_flag, user_errors

COMMAND = "usmkit.cli.pseudo_label"

USAGE = """\
usage: python -m usmkit.cli.pseudo_label checkpoint=TEACHER inputs=AUDIO out=DIR [threshold=0.9] [corpus=pseudo]
       python -m usmkit.cli.pseudo_label checkpoint=TEACHER inputs=LABELED.jsonl.gz out=DIR calibrate=true

  checkpoint=PATH     the teacher: a CTC checkpoint dir or experiment dir
  inputs=PATH         audio to label: a folder, a file list or a cuts manifest (see usmkit.cli.transcribe_batch)
  out=DIR             the corpus folder: {corpus}_{recordings,supervisions,cuts}_{split}.jsonl.gz, the teacher's
                      transcripts ({corpus}_transcripts_{split}.jsonl, resumable) and tokenizer/tokenizer.model
  threshold=0.9       keep utterances whose confidence (mean posterior of their words' frames) is >= this
  corpus=pseudo       the manifests' corpus name; split=train; language=en for inputs that name none
  min_words=1         keep utterances with at least this many words
  calibrate=true      instead: on a labeled cuts manifest, the pseudo-labels' WER and the share kept per
                      threshold (thresholds=[...]): {corpus}_calibration_{split}.json and .png in out=
  decode=, device=, precision=, compile=, batch_seconds=, num_workers=, lexicon.*, progress=
                      as for python -m usmkit.cli.transcribe_batch

Train on it: python -m usmkit.cli.train data.manifest_dir=DIR data.corpus=pseudo ...; mix it with a labeled
corpus: python -m usmkit.cli.prepare pool labeled=true inputs=[data/an4:an4:train,DIR:pseudo:train] ... (docs/batch.md).
"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = strip_debug_flag(sys.argv[1:] if argv is None else argv)
    with user_errors():  # a bad value, file or checkpoint: one line, exit code 2 (--debug: the traceback)
        from usmkit.inference.pseudo_label import PseudoLabelConfig, calibrate, check_out, pseudo_label

        cfg = compose_dataclass(PseudoLabelConfig, argv, command=COMMAND, usage=USAGE)
        cfg.check()
        check_out(cfg)  # before the teacher is loaded
        setup_logging()
        if cfg.calibrate:
            calibrated = calibrate(cfg)
            if calibrated is not None:  # rank 0 (torchrun)
                points, json_path, png_path = calibrated
                print_calibration(points)
                print(f"wrote {json_path} and {png_path}", file=sys.stderr)
            return 0
        result = pseudo_label(cfg)
    if result is None:  # another rank than 0 (torchrun)
        return 0
    print(
        f"kept {result.kept} of {result.total} utterances ({result.kept_hours:.2f} of {result.total_hours:.2f} h) "
        f"with confidence >= {cfg.threshold}: {result.cuts}",
        file=sys.stderr,
    )
    return 0


def print_calibration(points) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="pseudo-labels against the confidence threshold")
    for col in ("threshold", "kept", "kept %", "audio kept %", "WER %", "CER %"):
        table.add_column(col, justify="right")
    for p in points:
        table.add_row(
            f"{p.threshold:.2f}",
            str(p.kept),
            f"{100 * p.kept_fraction:.1f}",
            f"{100 * p.kept_hours_fraction:.1f}",
            "-" if p.wer is None else f"{100 * p.wer:.2f}",
            "-" if p.cer is None else f"{100 * p.cer:.2f}",
        )
    Console(stderr=True).print(table)


if __name__ == "__main__":
    sys.exit(main())
